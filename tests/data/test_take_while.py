"""Tests of feedline/data/ops/take_while.py."""

from __future__ import annotations

import numpy as np
import pytest

from feedline.data import UNKNOWN_CARDINALITY, Dataset, TensorSpec
from feedline.errors import InvalidArgumentError
from tests.data.checkpoint_utils import checkpoint_test


def test_tensorflow_docstring_example() -> None:
    # TensorFlow: dataset = tf.data.Dataset.range(10).take_while(lambda x: x < 5)
    # list(dataset.as_numpy_iterator()) -> [0, 1, 2, 3, 4]
    ds = Dataset.range(10).take_while(lambda x: x < 5)
    assert [int(x) for x in ds] == [0, 1, 2, 3, 4]
    assert ds.element_spec == TensorSpec((), np.int64)
    assert ds.cardinality() == UNKNOWN_CARDINALITY


def test_stops_at_the_first_rejected_element_and_never_resumes() -> None:
    ds = Dataset.from_tensor_slices([1, 2, 9, 3, 4]).take_while(lambda x: x < 5)
    assert [int(x) for x in ds] == [1, 2]
    it = iter(ds)
    assert [int(next(it)), int(next(it))] == [1, 2]
    for _ in range(2):
        with pytest.raises(StopIteration):
            next(it)


def test_tuple_elements_are_unpacked() -> None:
    ds = Dataset.from_tensor_slices(([1, 2, 3], [10, 20, 30])).take_while(lambda x, y: x + y < 30)
    assert [(int(x), int(y)) for x, y in ds] == [(1, 10), (2, 20)]


def test_cardinality() -> None:
    assert Dataset.range(0).take_while(lambda x: True).cardinality() == 0
    assert Dataset.range(5).repeat().take_while(lambda x: True).cardinality() == (
        UNKNOWN_CARDINALITY
    )
    assert [int(x) for x in Dataset.range(3).take_while(lambda x: np.bool_(True))] == [0, 1, 2]


def test_a_predicate_that_returns_no_scalar_bool_is_named() -> None:
    with pytest.raises(InvalidArgumentError, match=r"take_while: the predicate .* scalar bool"):
        next(iter(Dataset.range(3).take_while(lambda x: np.array([True, False]))))


def test_predicate_errors_keep_their_type_and_name_the_operation() -> None:
    def explode(x: np.int64) -> bool:
        raise KeyError("boom")

    with pytest.raises(KeyError) as info:
        next(iter(Dataset.range(3).take_while(explode)))
    assert any("take_while(" in note for note in info.value.__notes__)


def test_not_callable() -> None:
    with pytest.raises(TypeError, match="take_while expects a callable"):
        Dataset.range(3).take_while(3)


test_checkpointing = checkpoint_test(
    __name__,
    take_while=lambda: Dataset.range(20).take_while(lambda x: x < 7),
    take_while_all=lambda: Dataset.range(5).take_while(lambda x: True),
)
