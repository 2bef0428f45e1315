"""Tests of feedline/data/ops/sample_from_datasets.py."""

from __future__ import annotations

import collections
import pickle

import numpy as np
import pytest

from feedline.data import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, TensorSpec
from feedline.errors import InvalidArgumentError
from tests.data.checkpoint_utils import checkpoint_test


def _ints(ds: Dataset) -> list[int]:
    return [int(x) for x in ds]


def _two() -> list[Dataset]:
    return [Dataset.range(0, 3), Dataset.range(100, 103)]


def test_seed_example_every_element_once() -> None:
    ds = Dataset.sample_from_datasets(_two(), weights=[0.5, 0.5])
    assert sorted(_ints(ds)) == [0, 1, 2, 100, 101, 102]
    assert ds.cardinality() == 6
    assert ds.element_spec == TensorSpec((), np.int64)


def test_a_seed_fixes_the_order_and_every_pass_repeats_it() -> None:
    ds = Dataset.sample_from_datasets(_two(), seed=1)
    first = _ints(ds)
    assert first == [0, 1, 100, 2, 101, 102]
    assert _ints(ds) == first
    assert _ints(Dataset.sample_from_datasets(_two(), seed=1)) == first
    assert _ints(pickle.loads(pickle.dumps(ds))) == first


def test_rerandomize_each_iteration() -> None:
    ds = Dataset.sample_from_datasets(_two(), seed=1, rerandomize_each_iteration=True)
    passes = [_ints(ds) for _ in range(4)]
    assert all(sorted(p) == [0, 1, 2, 100, 101, 102] for p in passes)
    assert len({tuple(p) for p in passes}) > 1


def test_exhausted_inputs_are_dropped_and_weights_renormalised() -> None:
    long = Dataset.from_tensors(1).repeat(20)
    short = Dataset.from_tensors(0).repeat(2)
    out = _ints(Dataset.sample_from_datasets([short, long], weights=[0.9, 0.1], seed=0))
    assert sorted(out) == [0] * 2 + [1] * 20
    assert out[-1] == 1  # once ``short`` is empty, only ``long`` is drawn


def test_stop_on_empty_dataset_ends_at_the_first_exhausted_draw() -> None:
    ds = Dataset.sample_from_datasets(_two(), seed=1, stop_on_empty_dataset=True)
    assert _ints(ds) == [0, 1, 100, 2, 101]  # the next draw picks the exhausted first dataset
    assert ds.cardinality() == UNKNOWN_CARDINALITY


def test_weights_set_the_proportions() -> None:
    zeros, ones = Dataset.from_tensors(0).repeat(), Dataset.from_tensors(1).repeat()
    ds = Dataset.sample_from_datasets([zeros, ones], weights=[0.25, 0.75], seed=3)
    counts = collections.Counter(_ints(ds.take(8000)))
    assert abs(counts[1] / 8000 - 0.75) < 0.03
    assert ds.cardinality() == INFINITE_CARDINALITY


def test_zero_weight_is_never_drawn() -> None:
    ds = Dataset.sample_from_datasets(_two(), weights=[0.0, 1.0], seed=5)
    assert _ints(ds) == [100, 101, 102]
    assert ds.cardinality() == 3


def test_weights_from_a_dataset() -> None:
    weights = Dataset.from_tensor_slices(np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
    ds = Dataset.sample_from_datasets(_two(), weights=weights, seed=2)
    assert _ints(ds) == [100, 0, 1, 101]  # one draw per weight vector, until they run out
    assert ds.cardinality() == UNKNOWN_CARDINALITY


def test_common_spec_of_the_inputs() -> None:
    a = Dataset.from_tensors(np.zeros(2, np.float32))
    b = Dataset.from_tensors(np.zeros(3, np.float32))
    assert Dataset.sample_from_datasets([a, b]).element_spec == TensorSpec((None,), np.float32)
    # Different ranks: unknown rank, as TensorFlow's most specific compatible shape.
    c = Dataset.from_tensors(np.zeros((), np.float32))
    ds = Dataset.sample_from_datasets([a, c], seed=1)
    assert ds.element_spec == TensorSpec(None, np.float32)
    assert sorted(np.ndim(x) for x in ds) == [0, 1]


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ([1.0], r"weights has shape \(1,\), but there are 2 datasets"),
        ([1.0, -1.0], r"finite, >= 0 and not all 0, got \[1.0, -1.0\]"),
        ([0.0, 0.0], "not all 0"),
        ([np.nan, 1.0], "finite"),
        (["a", "b"], "weights must be numbers"),
        (Dataset.from_tensors([1.0, 1.0, 1.0]), r"vectors of 2 numbers.*shape=\(3,\)"),
    ],
)
def test_bad_weights(weights, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        Dataset.sample_from_datasets(_two(), weights=weights)


def test_bad_datasets() -> None:
    with pytest.raises(TypeError, match="non-empty list of Datasets"):
        Dataset.sample_from_datasets([])
    with pytest.raises(TypeError, match=r"datasets\[1\] is a int, not a Dataset"):
        Dataset.sample_from_datasets([Dataset.range(2), 3])
    with pytest.raises(InvalidArgumentError, match=r"datasets\[1\] has element_spec .*float32"):
        Dataset.sample_from_datasets([Dataset.range(2), Dataset.from_tensors(1.0)])
    with pytest.raises(TypeError, match="seed must be an int"):
        Dataset.sample_from_datasets(_two(), seed="x")


test_checkpointing = checkpoint_test(
    __name__,
    uniform=lambda: Dataset.sample_from_datasets([Dataset.range(6), Dataset.range(10, 16)], seed=4),
    stop_on_empty=lambda: Dataset.sample_from_datasets(
        [Dataset.range(4), Dataset.range(10, 20).shuffle(5, seed=1)],
        weights=[0.7, 0.3],
        seed=8,
        stop_on_empty_dataset=True,
    ),
    rerandomized=lambda: Dataset.sample_from_datasets(
        [Dataset.range(5), Dataset.range(10, 13)], seed=6, rerandomize_each_iteration=True
    ),
    weights_dataset=lambda: Dataset.sample_from_datasets(
        [Dataset.range(8), Dataset.range(10, 18)],
        weights=Dataset.from_tensor_slices(np.array([[1.0, 3.0], [3.0, 1.0]])).repeat(6),
        seed=9,
    ),
)
