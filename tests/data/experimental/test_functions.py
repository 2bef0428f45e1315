"""Tests of feedline/data/experimental/functions.py, against TensorFlow 2.21's outputs."""

from __future__ import annotations

import numpy as np
import pytest

import feedline as tf
from feedline import structure
from feedline.data import Dataset, TensorSpec, TFRecordDataset
from feedline.data.experimental import (
    at,
    enable_debug_mode,
    get_next_as_optional,
    get_structure,
    pad_to_cardinality,
    parse_example_dataset,
    unbatch,
)
from feedline.errors import InvalidArgumentError, OutOfRangeError
from feedline.io import FixedLenFeature, TFRecordWriter, VarLenFeature
from feedline.train import Example, Feature, Features, FloatList, Int64List
from tests.data.checkpoint_utils import checkpoint_test


def test_at_reads_the_element_at_an_index() -> None:
    # TensorFlow: tf.data.experimental.at(tf.data.Dataset.range(5), 2) -> 2
    assert int(at(Dataset.range(5), 2)) == 2
    assert int(at(Dataset.range(5).map(lambda x: x * 10), 4)) == 40
    # TensorFlow has no random access through filter; feedline reads up to the element.
    assert int(at(Dataset.range(10).filter(lambda x: x % 2 == 1), 1)) == 3
    assert int(at(Dataset.range(3).repeat(), 7)) == 1


@pytest.mark.parametrize("index", [5, -1])
def test_at_out_of_range(index: int) -> None:
    # TensorFlow: OutOfRangeError "Index out of range [0, 5):5"
    with pytest.raises(OutOfRangeError, match=rf"index {index} is out of range \[0, 5\)"):
        at(Dataset.range(5), index)


def test_at_past_the_end_of_a_dataset_of_unknown_cardinality() -> None:
    with pytest.raises(OutOfRangeError, match="ended before it"):
        at(Dataset.range(5).filter(lambda x: x > 2), 2)


def test_get_structure_and_get_next_as_optional() -> None:
    ds = Dataset.range(1)
    assert get_structure(ds) == TensorSpec((), np.int64)
    it = iter(ds)
    assert get_structure(it) == TensorSpec((), np.int64)
    first = get_next_as_optional(it)
    assert first.has_value() and int(first.get_value()) == 0
    assert not get_next_as_optional(it).has_value()
    with pytest.raises(InvalidArgumentError, match="expected a Dataset"):
        get_structure([1, 2])


def test_enable_debug_mode_changes_nothing() -> None:
    enable_debug_mode()
    assert [int(x) for x in Dataset.range(3).map(lambda x: x + 1)] == [1, 2, 3]


def test_unbatch_is_the_method() -> None:
    ds = Dataset.range(5).batch(2).apply(unbatch())
    assert type(ds).__name__ == "UnbatchDataset"
    assert [int(x) for x in ds] == [0, 1, 2, 3, 4]


def test_pad_to_cardinality_as_tensorflow() -> None:
    # TensorFlow: from_tensor_slices({'a': [1, 2, 3]}).apply(pad_to_cardinality(5)) ->
    # [{'a': 1, 'valid': True}, {'a': 2, ...True}, {'a': 3, ...True}, {'a': 0, 'valid': False},
    #  {'a': 0, 'valid': False}], cardinality 5.
    ds = Dataset.from_tensor_slices({"a": np.array([1, 2, 3], np.int32)})
    padded = ds.apply(pad_to_cardinality(5))
    assert padded.cardinality() == 5
    assert [(int(e["a"]), bool(e["valid"])) for e in padded] == [
        (1, True),
        (2, True),
        (3, True),
        (0, False),
        (0, False),
    ]
    assert padded.element_spec["valid"] == TensorSpec((), np.bool_)


def test_pad_to_cardinality_pads_arrays_and_strings() -> None:
    ds = Dataset.from_tensor_slices(
        {"x": np.ones((1, 2), np.float32), "s": np.array([b"q"], dtype=object)}
    )
    last = list(ds.apply(pad_to_cardinality(2, mask_key="real")))[-1]
    assert last["x"].tolist() == [0.0, 0.0] and last["s"].item() == b"" and not last["real"]


def test_pad_to_cardinality_refusals() -> None:
    three = Dataset.from_tensor_slices({"a": np.array([1, 2, 3])})
    # TensorFlow: ValueError "... must have a cardinalty less than the target cardinality (2),
    # but has cardinality 3"
    with pytest.raises(
        InvalidArgumentError, match=r"target cardinality \(2\), but has cardinality 3"
    ):
        three.apply(pad_to_cardinality(2))
    # TensorFlow: ValueError "`pad_to_cardinality` requires its input dataset to be a dictionary."
    with pytest.raises(InvalidArgumentError, match="requires a dataset of dicts"):
        Dataset.range(3).apply(pad_to_cardinality(5))
    with pytest.raises(InvalidArgumentError, match="known, finite cardinality"):
        three.filter(lambda e: e["a"] > 1).apply(pad_to_cardinality(5))
    with pytest.raises(InvalidArgumentError, match="already have the key 'a'"):
        three.apply(pad_to_cardinality(5, mask_key="a"))


def _examples(path: str) -> None:
    with TFRecordWriter(path) as writer:
        for i in range(5):
            example = Example(
                features=Features(
                    feature={
                        "x": Feature(float_list=FloatList(value=[i, i + 0.5])),
                        "ids": Feature(int64_list=Int64List(value=list(range(i % 3)))),
                    }
                )
            )
            writer.write(example.SerializeToString())


def test_parse_example_dataset(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "examples.tfrecord")
    _examples(path)
    features = {"x": FixedLenFeature([2], np.float32), "ids": VarLenFeature(np.int64)}
    parsed = list(TFRecordDataset(path).batch(2).apply(parse_example_dataset(features)))
    assert [b["x"].tolist() for b in parsed] == [
        [[0.0, 0.5], [1.0, 1.5]],
        [[2.0, 2.5], [3.0, 3.5]],
        [[4.0, 4.5]],
    ]
    ids = [b["ids"] for b in parsed]  # VarLenFeature: SparseArray, rows of 0, 1, 2, 0, 1 ids
    assert [i.indices.tolist() for i in ids] == [[[1, 0]], [[0, 0], [0, 1]], [[0, 0]]]
    assert [i.dense_shape.tolist() for i in ids] == [[2, 1], [2, 2], [1, 1]]
    assert [i.values.tolist() for i in ids] == [[0], [0, 1], [0]]
    spec = TFRecordDataset(path).batch(2).apply(parse_example_dataset(features)).element_spec
    assert spec == {
        "x": structure.TensorSpec((None, 2), np.float32),
        "ids": structure.SparseTensorSpec((None, None), np.int64),
    }
    full = TFRecordDataset(path).batch(2, drop_remainder=True)
    full = full.apply(parse_example_dataset(features))
    assert full.element_spec["ids"] == structure.SparseTensorSpec((2, None), np.int64)
    with pytest.raises(InvalidArgumentError, match="vectors of serialized records"):
        TFRecordDataset(path).apply(parse_example_dataset(features))


def test_tensorflow_spellings() -> None:
    assert tf.data.experimental.at is at
    assert tf.data.experimental.pad_to_cardinality is pad_to_cardinality
    assert tf.data.Iterator is tf.data.DatasetIterator
    assert isinstance(Dataset.range(2).as_numpy_iterator(), tf.data.NumpyIterator)


test_checkpointing = checkpoint_test(
    __name__,
    pad_to_cardinality=lambda: Dataset.from_tensor_slices({"a": np.arange(4)}).apply(
        pad_to_cardinality(7)
    ),
)
