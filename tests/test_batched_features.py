"""Tests of feedline/_batched_features.py: ``data.experimental.make_batched_features_dataset``."""

from __future__ import annotations

import doctest
import pathlib

import numpy as np
import pytest

import feedline
from feedline import _batched_features as module
from feedline.data.experimental import make_batched_features_dataset
from feedline.errors import InvalidArgumentError, NotFoundError
from feedline.io import FixedLenFeature, TFRecordWriter, VarLenFeature
from feedline.structure import SparseArray, SparseTensorSpec, TensorSpec
from feedline.train import BytesList, Example, Feature, Features, Int64List


def _files(folder: pathlib.Path, count: int = 2, per_file: int = 3) -> str:
    for k in range(count):
        with TFRecordWriter(str(folder / f"part{k}.tfrecord")) as writer:
            for j in range(per_file):
                v = 10 * k + j
                example = Example(
                    features=Features(
                        feature={
                            "age": Feature(int64_list=Int64List(value=[v])),
                            "kws": Feature(bytes_list=BytesList(value=[b"k"] * (j + 1))),
                            "label": Feature(int64_list=Int64List(value=[v % 2])),
                        }
                    )
                )
                writer.write(example.SerializeToString())
    return str(folder / "*.tfrecord")


FEATURES = {
    "age": FixedLenFeature([], np.int64),
    "kws": VarLenFeature(feedline.string),
    "label": FixedLenFeature([], np.int64, default_value=-1),
}


def test_the_docstring() -> None:
    assert doctest.testmod(module).failed == 0


def test_features_and_label(tmp_path: pathlib.Path) -> None:
    pattern = _files(tmp_path)
    ds = make_batched_features_dataset(
        pattern, 4, FEATURES, label_key="label", num_epochs=1, shuffle=False
    )
    batches = list(ds)
    assert [b[0]["age"].tolist() for b in batches] == [[0, 1, 2, 10], [11, 12]]
    assert [b[1].tolist() for b in batches] == [[0, 1, 0, 0], [1, 0]]
    assert set(batches[0][0]) == {"age", "kws"}
    kws = batches[1][0]["kws"]  # VarLenFeature: a SparseArray, as TF's SparseTensor
    assert isinstance(kws, SparseArray)
    assert kws.indices.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1], [1, 2]]
    assert kws.values.tolist() == [b"k"] * 5 and kws.dense_shape.tolist() == [2, 3]
    spec = ds.element_spec
    assert spec[0]["kws"] == SparseTensorSpec((None, None), feedline.string)
    assert spec[0]["age"] == TensorSpec((None,), np.int64)
    assert spec[1] == TensorSpec((None,), np.int64)


def test_var_len_features_batch_unbatch_and_checkpoint(tmp_path: pathlib.Path) -> None:
    pattern = _files(tmp_path)
    ds = make_batched_features_dataset(pattern, 2, FEATURES, shuffle=False)  # repeats: full
    assert ds.element_spec["kws"] == SparseTensorSpec((2, None), feedline.string)
    first = next(iter(ds))["kws"]
    assert first.to_dense().tolist() == [[b"k", b""], [b"k", b"k"]]
    rows = list(ds.take(3).unbatch().map(lambda e: e["kws"]))
    # a row keeps its batch's dense shape, as TensorFlow's unbatch of a SparseTensor does
    assert [r.dense_shape.tolist() for r in rows] == [[2], [2], [3], [3], [3], [3]]
    assert [len(r.values) for r in rows] == [1, 2, 3, 1, 2, 3]
    assert rows[2] == SparseArray([[0], [1], [2]], np.array([b"k"] * 3, dtype=object), [3])
    it = iter(ds)
    next(it)
    state = it.get_state()
    expected = next(it)["kws"]
    it.set_state(state)
    assert next(it)["kws"] == expected


def test_repeats_forever_with_full_batches_and_shuffles_with_a_seed(tmp_path: pathlib.Path) -> None:
    pattern = _files(tmp_path)
    ds = make_batched_features_dataset(pattern, 4, {"age": FEATURES["age"]}, shuffle_seed=3)
    assert ds.element_spec["age"].shape == (4,)
    it = iter(ds)
    seen = [v for _ in range(3) for v in next(it)["age"].tolist()]
    assert sorted(seen) == sorted([0, 1, 2, 10, 11, 12] * 2)
    again = iter(
        make_batched_features_dataset(pattern, 4, {"age": FEATURES["age"]}, shuffle_seed=3)
    )
    assert [v for _ in range(3) for v in next(again)["age"].tolist()] == seen


def test_drop_final_batch_and_threads(tmp_path: pathlib.Path) -> None:
    pattern = _files(tmp_path)
    ds = make_batched_features_dataset(
        pattern,
        4,
        {"age": FEATURES["age"]},
        num_epochs=1,
        shuffle=False,
        drop_final_batch=True,
        reader_num_threads=2,
        parser_num_threads=2,
    )
    batches = [b["age"].tolist() for b in ds]
    assert len(batches) == 1 and sorted(batches[0]) == [0, 1, 10, 11]


def test_bad_arguments_are_clear_errors(tmp_path: pathlib.Path) -> None:
    pattern = _files(tmp_path)
    with pytest.raises(InvalidArgumentError, match="label_key 'y' is not one of the features"):
        make_batched_features_dataset(pattern, 2, FEATURES, label_key="y")
    with pytest.raises(NotFoundError, match="no files match"):
        make_batched_features_dataset(str(tmp_path / "*.nope"), 2, FEATURES)
    with pytest.raises(InvalidArgumentError):
        make_batched_features_dataset(pattern, 2, {"age": np.int64})
