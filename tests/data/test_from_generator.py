"""Tests of feedline/data/ops/from_generator.py."""

from __future__ import annotations

import numpy as np
import pytest

import feedline
from feedline.data import Dataset, TensorSpec
from feedline.errors import InvalidArgumentError
from tests.data.checkpoint_utils import checkpoint_test


def test_seed_example_types_and_shapes() -> None:
    def input_gen():
        while True:
            yield np.random.rand(4)

    ds = Dataset.from_generator(
        input_gen, output_types=(feedline.float32), output_shapes=feedline.TensorShape([4])
    )
    assert ds.element_spec == TensorSpec((4,), np.float32)
    first = next(iter(ds))
    assert first.dtype == np.float32 and first.shape == (4,)


def test_output_signature_and_args() -> None:
    def gen(n):
        for i in range(int(n)):
            yield i, [i] * i

    ds = Dataset.from_generator(
        gen, args=(3,), output_signature=(TensorSpec((), np.int64), TensorSpec((None,), np.int32))
    )
    out = list(ds)
    assert [int(a) for a, _ in out] == [0, 1, 2]
    assert out[2][1].tolist() == [2, 2] and out[2][1].dtype == np.int32


def test_types_without_shapes_have_unknown_rank_as_in_tensorflow() -> None:
    # TF 2.21: from_generator(gen, output_types=tf.int64).element_spec is
    # TensorSpec(shape=<unknown>, dtype=tf.int64, name=None); elements of any rank pass.
    ds = Dataset.from_generator(lambda: iter([[1, 2], 3, [[4]]]), output_types=np.int64)
    assert ds.element_spec == TensorSpec(None, np.int64)
    assert ds.element_spec.rank is None
    assert repr(ds.element_spec) == "TensorSpec(shape=<unknown>, dtype=int64)"
    assert [np.asarray(v).tolist() for v in ds] == [[1, 2], 3, [[4]]]
    pairs = Dataset.from_generator(
        lambda: iter([(1, b"a")]), output_types=(np.int64, feedline.string)
    )
    assert pairs.element_spec == (TensorSpec(None, np.int64), TensorSpec(None, bytes))
    # output_shapes=tf.TensorShape(None) is the same unknown rank; () is a scalar
    unknown = feedline.TensorShape(None)
    mixed = Dataset.from_generator(
        lambda: iter([(1, [2])]),
        output_types=(np.int64, np.int64),
        output_shapes=(feedline.TensorShape([]), unknown),
    )
    assert mixed.element_spec == (TensorSpec((), np.int64), TensorSpec(None, np.int64))
    assert TensorSpec(unknown, np.int64).rank is None


def _vectors() -> Dataset:
    return Dataset.from_generator(lambda: iter([[1], [2, 3], [4, 5, 6]]), output_types=np.int64)


def test_unknown_rank_through_batch_unbatch_and_map() -> None:
    # TensorShape([2]).concatenate(TensorShape(None)) is TensorShape(None): batch keeps the
    # rank unknown, and so do unbatch and a map that keeps the rank of its input.
    ds = _vectors()
    assert ds.batch(2).element_spec == TensorSpec(None, np.int64)
    assert ds.batch(2).unbatch().element_spec == TensorSpec(None, np.int64)
    assert ds.map(lambda x: x * 2).element_spec == TensorSpec(None, np.int64)
    assert ds.map(lambda x: x.sum()).element_spec == TensorSpec((), np.int64)
    assert [v.tolist() for v in ds.map(lambda x: x * 2)] == [[2], [4, 6], [8, 10, 12]]
    with pytest.raises(InvalidArgumentError, match="different shapes"):
        list(ds.batch(2))  # as in TensorFlow, a batch needs one shape at run time
    same = Dataset.from_generator(lambda: iter([[1, 2], [3, 4]]), output_types=np.int64)
    assert next(iter(same.batch(2))).tolist() == [[1, 2], [3, 4]]
    known = Dataset.from_tensors(np.array([7], np.int64))
    assert ds.concatenate(known).element_spec == TensorSpec(None, np.int64)
    assert [v.tolist() for v in ds.take(1).concatenate(known)] == [[1], [7]]


def test_padded_batch_of_unknown_rank_needs_padded_shapes() -> None:
    # TF: padded_batch without padded_shapes raises ValueError for components of unknown rank.
    with pytest.raises(ValueError, match=r"unknown rank.*padded_shapes"):
        _vectors().padded_batch(2)
    padded = _vectors().padded_batch(2, padded_shapes=[None])
    assert padded.element_spec == TensorSpec((None, None), np.int64)
    assert [b.tolist() for b in padded] == [[[1, 0], [2, 3]], [[4, 5, 6]]]


def test_unknown_rank_specs_check_compatibility_and_travel() -> None:
    from feedline._net.specs import decode_spec, encode_spec

    spec = TensorSpec(None, np.float32)
    assert spec.is_compatible_with(np.zeros((2, 3), np.float32))
    assert spec.is_compatible_with(TensorSpec((), np.float32))
    assert TensorSpec((None,), np.float32).is_compatible_with(spec)
    assert not spec.is_compatible_with(np.zeros(2, np.int64))
    assert spec.most_specific_common(TensorSpec((3,), np.float32)) == spec
    assert decode_spec(encode_spec((spec, {"a": spec}))) == (spec, {"a": spec})


def test_element_that_does_not_fit_is_named() -> None:
    ds = Dataset.from_generator(
        lambda: iter([np.zeros(3)]), output_signature=TensorSpec((4,), np.float32)
    )
    with pytest.raises(InvalidArgumentError, match=r"shape \(3,\).*\(4,\)"):
        list(ds)


def test_generator_that_returns_a_non_iterable() -> None:
    ds = Dataset.from_generator(lambda: 5, output_signature=TensorSpec((), np.int64))
    with pytest.raises(TypeError, match="not iterable"):
        list(ds)


def test_missing_signature() -> None:
    with pytest.raises(TypeError, match="output_signature"):
        Dataset.from_generator(lambda: iter([]))


test_checkpointing = checkpoint_test(
    __name__,
    generator=lambda: Dataset.from_generator(
        lambda: (np.full(2, i) for i in range(9)), output_signature=TensorSpec((2,), np.int64)
    ),
)


def test_bytes_signature_gives_object_arrays_of_exact_bytes() -> None:
    values = [b"a\x00", "é", np.bytes_(b"x"), [b"p", b"\x00"], np.array([b"q", b"r"])]
    scalars = Dataset.from_generator(
        lambda: iter(values[:3]), output_signature=TensorSpec((), feedline.string)
    )
    elements = list(scalars)
    assert all(e.shape == () and e.dtype == object for e in elements)
    assert [e.item() for e in elements] == [b"a\x00", "é".encode(), b"x"]
    vectors = Dataset.from_generator(
        lambda: iter(values[3:]), output_signature=TensorSpec((2,), feedline.string)
    )
    assert [v.tolist() for v in vectors] == [[b"p", b"\x00"], [b"q", b"r"]]
    bad = Dataset.from_generator(lambda: iter([5]), output_signature=TensorSpec((), np.bytes_))
    with pytest.raises(InvalidArgumentError, match="cannot convert 5 to bytes"):
        list(bad)


def test_unknown_rank_batches_split_over_replicas() -> None:
    # TF's rebatch leaves a component of unknown rank to be split at run time.
    from feedline.distribute import MirroredStrategy, PerReplicaSpec

    strategy = MirroredStrategy(["cpu:0", "cpu:1"])
    ds = Dataset.from_generator(lambda: iter([[i, i] for i in range(4)]), output_types=np.int64)
    dist = strategy.experimental_distribute_dataset(ds.batch(4))
    assert dist.element_spec == PerReplicaSpec(
        TensorSpec(None, np.int64), TensorSpec(None, np.int64)
    )
    a, b = strategy.experimental_local_results(next(iter(dist)))
    assert a.tolist() == [[0, 0], [1, 1]] and b.tolist() == [[2, 2], [3, 3]]


def test_unknown_rank_is_saved_and_loaded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ds = Dataset.from_generator(lambda: iter([[1], [2, 3], 4]), output_types=np.int64)
    ds.save(str(tmp_path))
    loaded = Dataset.load(str(tmp_path))
    assert loaded.element_spec == TensorSpec(None, np.int64)
    assert [np.asarray(v).tolist() for v in loaded] == [[1], [2, 3], 4]


def test_ragged_and_sparse_signatures() -> None:
    # The guide's example: a ragged component in output_signature.
    def gen():  # type: ignore[no-untyped-def]
        yield 42, feedline.data.RaggedArray.from_list([[1, 2], [3]])
        yield 43, [[4], [5, 6, 7], []]  # nested lists, as tf.ragged.constant takes them

    ragged_spec = feedline.RaggedTensorSpec(shape=(None, None), dtype=feedline.int32)
    ds = Dataset.from_generator(gen, output_signature=(TensorSpec((), np.int32), ragged_spec))
    assert ds.element_spec == (TensorSpec((), np.int32), ragged_spec)
    (n, first), (_, second) = list(ds)
    assert int(n) == 42 and first.to_list() == [[1, 2], [3]] and first.dtype == np.int32
    assert second.to_list() == [[4], [5, 6, 7], []] and second.dtype == np.int32
    batch = next(iter(ds.batch(2)))
    assert batch[1].to_list() == [[[1, 2], [3]], [[4], [5, 6, 7], []]]

    sparse = feedline.data.SparseArray([[0, 1]], [3], [2, 3])
    sparse_ds = Dataset.from_generator(
        lambda: iter([sparse]), output_signature=feedline.SparseTensorSpec((2, 3), np.float32)
    )
    (only,) = list(sparse_ds)
    assert only.values.dtype == np.float32 and only.to_dense().tolist() == [[0, 3, 0], [0, 0, 0]]


def test_ragged_and_sparse_values_that_do_not_fit_are_named() -> None:
    ragged_spec = feedline.RaggedTensorSpec(shape=(2, None), dtype=np.int64)
    wrong_rows = Dataset.from_generator(
        lambda: iter([(1, [[1], [2], [3]])]),
        output_signature=(TensorSpec((), np.int64), ragged_spec),
    )
    with pytest.raises(InvalidArgumentError, match="does not fit the declared RaggedTensorSpec"):
        list(wrong_rows)
    dense = Dataset.from_generator(
        lambda: iter([[1, 2]]), output_signature=feedline.SparseTensorSpec((2,), np.int64)
    )
    with pytest.raises(InvalidArgumentError, match=r"yield a feedline\.data\.SparseArray"):
        list(dense)
    with pytest.raises(TypeError, match="RaggedTensorSpecs or SparseTensorSpecs"):
        Dataset.from_generator(lambda: iter([]), output_signature=(1, 2))


def test_a_component_that_does_not_fit_says_why_inside_a_tuple() -> None:
    ds = Dataset.from_generator(
        lambda: iter([(1, [1, 2, 3])]),
        output_signature=(TensorSpec((), np.int32), TensorSpec((2,), np.int32)),
    )
    with pytest.raises(InvalidArgumentError, match=r"shape \(3,\).*\(2,\)"):
        list(ds)
