"""Tests of feedline/data/ops/sparse_batch.py: ``Dataset.sparse_batch`` and
``data.experimental.dense_to_sparse_batch``."""

from __future__ import annotations

import numpy as np
import pytest

from feedline.data import Dataset, SparseArray, SparseTensorSpec, TensorSpec
from feedline.data.experimental import dense_to_sparse_batch
from feedline.errors import InvalidArgumentError
from tests.data.checkpoint_utils import checkpoint_test

LETTERS = [[b"a", b"b", b"c"], [b"a", b"b"], [b"a", b"b", b"c", b"d"]]


def _letters() -> Dataset:
    return Dataset.from_generator(
        lambda: (np.array(row, dtype=object) for row in LETTERS),
        output_signature=TensorSpec((None,), bytes),
    )


def test_the_tensorflow_docstring_example() -> None:
    # a.apply(tf.data.experimental.dense_to_sparse_batch(batch_size=2, row_shape=[6]))
    ds = _letters().apply(dense_to_sparse_batch(batch_size=2, row_shape=[6]))
    assert ds.element_spec == SparseTensorSpec((None, 6), bytes)
    first, second = list(ds)
    assert first.indices.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1]]
    assert first.values.tolist() == [b"a", b"b", b"c", b"a", b"b"]
    assert first.dense_shape.tolist() == [2, 6]
    assert second.indices.tolist() == [[0, 0], [0, 1], [0, 2], [0, 3]]
    assert second.values.tolist() == [b"a", b"b", b"c", b"d"]
    assert second.dense_shape.tolist() == [1, 6]


def test_the_method_and_unknown_dimensions() -> None:
    ds = Dataset.range(1, 4).map(lambda x: np.arange(x, dtype=np.int64)).sparse_batch(2, [None])
    assert ds.element_spec == SparseTensorSpec((None, None), np.int64)
    first, second = list(ds)
    # Every value is stored, zeros too, as TF's DenseToSparseBatch does.
    assert first.indices.tolist() == [[0, 0], [1, 0], [1, 1]] and first.values.tolist() == [0, 0, 1]
    assert first.dense_shape.tolist() == [2, 2]
    assert second.to_dense().tolist() == [[0, 1, 2]]
    assert ds.cardinality() == 2


def test_matrices() -> None:
    ds = Dataset.from_tensor_slices(np.arange(8, dtype=np.float32).reshape(2, 2, 2))
    (batch,) = list(ds.sparse_batch(2, row_shape=[3, -1]))
    assert batch.dense_shape.tolist() == [2, 3, 2]
    assert batch.to_dense()[1].tolist() == [[4.0, 5.0], [6.0, 7.0], [0.0, 0.0]]


def test_unbatch_gives_sparse_rows() -> None:
    rows = _letters().sparse_batch(2, [6]).unbatch()
    assert rows.element_spec == SparseTensorSpec((6,), bytes)
    out = list(rows)
    assert [r.to_dense().tolist()[:4] for r in out] == [
        [b"a", b"b", b"c", b""],
        [b"a", b"b", b"", b""],
        [b"a", b"b", b"c", b"d"],
    ]
    assert all(isinstance(r, SparseArray) for r in out)


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(InvalidArgumentError, match="element 0 of the batch has shape \\(4,\\)"):
        list(_letters().skip(2).sparse_batch(2, [3]))
    with pytest.raises(InvalidArgumentError, match="needs rank 1"):
        _letters().sparse_batch(2, [3, 3])
    with pytest.raises(InvalidArgumentError, match="one dense array"):
        Dataset.zip((Dataset.range(2), Dataset.range(2))).sparse_batch(2, [])
    with pytest.raises(InvalidArgumentError, match="row_shape must be a list of ints"):
        _letters().sparse_batch(2, "6")


def test_as_torch_gives_sparse_coo_tensors() -> None:
    torch = pytest.importorskip("torch")
    ds = Dataset.range(1, 4).map(lambda x: np.arange(x, dtype=np.float32)).sparse_batch(2, [3])
    tensors = list(ds.as_torch())
    assert all(t.layout == torch.sparse_coo for t in tensors)
    assert tensors[0].to_dense().tolist() == [[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]


test_checkpointing = checkpoint_test(
    __name__,
    sparse=lambda: Dataset.range(1, 8).map(lambda x: np.arange(x % 4)).sparse_batch(3, [None]),
)


def test_map_and_autotuned_prefetch_keep_sparse_and_ragged_batches() -> None:
    # TensorFlow traces map's function on SparseTensor / RaggedTensor inputs: the specs stay
    # composite, and an autotuned prefetch buffers them.
    sparse = Dataset.range(1, 5).map(lambda x: np.arange(x)).sparse_batch(2, [5])
    mapped = sparse.map(lambda s: (s, 1)).prefetch(-1)
    assert mapped.element_spec == (SparseTensorSpec((None, 5), np.int64), TensorSpec((), np.int32))
    assert next(iter(mapped))[0].values.tolist() == [0, 0, 1]
    ragged = Dataset.range(1, 5).map(lambda x: np.arange(x)).ragged_batch(2)
    assert ragged.map(lambda r: r).element_spec == ragged.element_spec
    assert next(iter(ragged.prefetch(-1))).to_list() == [[0], [0, 1]]
