"""Tests of feedline/data/ops/concatenate.py."""

from __future__ import annotations

import numpy as np
import pytest

from feedline.data import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, TensorSpec
from tests.data.checkpoint_utils import checkpoint_test


def test_seed_example() -> None:
    a = Dataset.range(1, 4)
    b = Dataset.range(4, 8)
    assert [int(x) for x in a.concatenate(b)] == [1, 2, 3, 4, 5, 6, 7]


def test_spec_is_the_common_spec() -> None:
    a = Dataset.from_tensors(np.zeros((2, 3), np.float32))
    b = Dataset.from_tensors(np.ones((4, 3), np.float32))
    ds = a.concatenate(b)
    assert ds.element_spec == TensorSpec((None, 3), np.float32)
    assert [x.shape for x in ds] == [(2, 3), (4, 3)]


def test_elements_of_different_ranks_have_unknown_rank() -> None:
    # TensorFlow: TensorSpec(shape=<unknown>, dtype=tf.int32).
    ds = Dataset.from_tensors(np.int32([1, 2])).concatenate(Dataset.from_tensors(np.int32(3)))
    assert ds.element_spec == TensorSpec(None, np.int32)
    assert [x.tolist() for x in ds] == [[1, 2], 3]
    assert [x.tolist() for x in ds.batch(1)] == [[[1, 2]], [3]]


def test_incompatible_specs_are_named() -> None:
    # TensorFlow raises TypeError for datasets of incompatible elements.
    a = Dataset.range(3)
    b = Dataset.from_tensor_slices([1.0, 2.0])
    with pytest.raises(TypeError, match=r"dtype=int64.*dtype=float32.*not compatible"):
        a.concatenate(b)
    with pytest.raises(TypeError, match="not compatible"):
        a.concatenate(Dataset.zip((a, a)))


def test_cardinality() -> None:
    a = Dataset.range(3)
    assert a.concatenate(Dataset.range(4)).cardinality() == 7
    assert a.concatenate(a.repeat()).cardinality() == INFINITE_CARDINALITY
    assert a.concatenate(a.filter(lambda x: True)).cardinality() == UNKNOWN_CARDINALITY


def test_empty_inputs() -> None:
    assert [int(x) for x in Dataset.range(0).concatenate(Dataset.range(2))] == [0, 1]
    assert [int(x) for x in Dataset.range(2).concatenate(Dataset.range(0))] == [0, 1]


def test_second_pass_of_a_shuffle_is_a_new_order() -> None:
    shuffled = Dataset.range(20).shuffle(20, seed=3)
    out = [int(x) for x in shuffled.concatenate(shuffled)]
    assert sorted(out[:20]) == sorted(out[20:]) == list(range(20))
    assert out[:20] != out[20:]


def test_random_access_gather_keeps_the_order_asked_for() -> None:
    ds = Dataset.range(3).concatenate(Dataset.range(10, 13))
    access = ds._random_access()
    assert access is not None and len(access) == 6
    assert access.gather(np.array([4, 0, 5, 1])).tolist() == [11, 0, 12, 1]
    assert int(access.get(3)) == 10
    (batch,) = list(ds.shuffle(6, seed=0).batch(6))
    assert sorted(batch.tolist()) == [0, 1, 2, 10, 11, 12]


test_checkpointing = checkpoint_test(
    __name__,
    two_ranges=lambda: Dataset.range(5).concatenate(Dataset.range(10, 16)),
    shuffled_second=lambda: Dataset.range(4).concatenate(Dataset.range(8).shuffle(4, seed=9)),
    empty_first=lambda: Dataset.range(0).concatenate(Dataset.range(3).map(lambda x: x * 2)),
)
