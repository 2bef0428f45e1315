"""Tests of feedline/data/ops/reduce.py."""

from __future__ import annotations

import numpy as np
import pytest

from feedline.data import Dataset


def test_tensorflow_docstring_examples() -> None:
    # TensorFlow: tf.data.Dataset.range(5).reduce(np.int64(0), lambda x, _: x + 1).numpy() -> 5
    # tf.data.Dataset.range(5).reduce(np.int64(0), lambda x, y: x + y).numpy() -> 10
    assert Dataset.range(5).reduce(np.int64(0), lambda x, _: x + 1) == 5
    total = Dataset.range(5).reduce(np.int64(0), lambda x, y: x + y)
    assert total == 10 and np.asarray(total).dtype == np.int64


def test_an_empty_dataset_gives_the_initial_state() -> None:
    assert Dataset.range(0).reduce(np.int64(7), lambda x, y: x + y) == 7


def test_structured_state_and_tuple_elements() -> None:
    ds = Dataset.from_tensor_slices(([1, 2, 3], [10, 20, 30]))
    state = ds.reduce((0, 0), lambda s, e: (s[0] + e[0], s[1] + e[1]))
    assert (int(state[0]), int(state[1])) == (6, 60)


def test_a_new_state_of_another_dtype_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"element types for the new state must match"):
        Dataset.range(3).reduce(np.int64(0), lambda x, y: np.float32(0.5))


def test_function_errors_keep_their_type_and_name_the_operation() -> None:
    def explode(state: np.int64, x: np.int64) -> np.int64:
        raise KeyError("boom")

    with pytest.raises(KeyError) as info:
        Dataset.range(3).reduce(0, explode)
    assert any("reduce(" in note for note in info.value.__notes__)
