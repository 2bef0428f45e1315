"""Tests of feedline/data/ops/scan.py and feedline.data.experimental.scan."""

from __future__ import annotations

import numpy as np
import pytest

from feedline.data import INFINITE_CARDINALITY, Dataset, TensorSpec, experimental
from tests.data.checkpoint_utils import checkpoint_test


def test_tensorflow_docstring_example() -> None:
    # TensorFlow: dataset = tf.data.Dataset.range(10)
    # initial_state = tf.constant(0, dtype=tf.int64)
    # scan_func = lambda state, i: (state + i, state)
    # list(dataset.scan(initial_state=initial_state, scan_func=scan_func).as_numpy_iterator())
    # -> [0, 0, 1, 3, 6, 10, 15, 21, 28, 36]
    ds = Dataset.range(10).scan(np.int64(0), lambda state, i: (state + i, state))
    assert [int(x) for x in ds] == [0, 0, 1, 3, 6, 10, 15, 21, 28, 36]
    assert ds.element_spec == TensorSpec((), np.int64)
    assert ds.cardinality() == 10


def test_the_experimental_form_is_the_same_operation() -> None:
    ds = Dataset.range(10).apply(experimental.scan(np.int64(0), lambda s, i: (s + i, s)))
    assert type(ds).__name__ == "ScanDataset"
    assert [int(x) for x in ds] == [0, 0, 1, 3, 6, 10, 15, 21, 28, 36]


def test_structured_state_and_tuple_elements() -> None:
    ds = Dataset.from_tensor_slices(([1, 2, 3], [10.0, 20.0, 30.0])).scan(
        {"count": 0, "total": 0.0},
        lambda state, element: (
            {"count": state["count"] + 1, "total": state["total"] + element[1]},
            (state["count"], element[0] * 2),
        ),
    )
    assert [(int(c), int(x)) for c, x in ds] == [(0, 2), (1, 4), (2, 6)]
    assert ds.element_spec == (TensorSpec((), np.int32), TensorSpec((), np.int32))


def test_a_state_whose_shape_grows_has_unknown_dimensions() -> None:
    ds = Dataset.range(3).scan(np.zeros(0, np.int64), lambda s, x: (np.append(s, x), s))
    assert [x.tolist() for x in ds] == [[], [0], [0, 1]]
    assert ds.element_spec == TensorSpec((None,), np.int64)


def test_a_state_whose_rank_changes_has_unknown_rank() -> None:
    ds = Dataset.range(3).scan(np.int64(7), lambda s, x: (np.stack([s, s]), s))
    assert [x.tolist() for x in ds] == [7, [7, 7], [[7, 7], [7, 7]]]
    assert ds.element_spec == TensorSpec(None, np.int64)


def test_cardinality_is_the_inputs() -> None:
    assert Dataset.range(3).repeat().scan(0, lambda s, x: (s, x)).cardinality() == (
        INFINITE_CARDINALITY
    )


def test_a_new_state_of_another_dtype_is_a_type_error() -> None:
    ds = Dataset.range(3).scan(np.int64(0), lambda s, x: (np.float32(1.5), x))
    with pytest.raises(TypeError, match=r"element types for the new state must match"):
        next(iter(ds))


def test_a_new_state_of_another_structure_is_a_type_error() -> None:
    ds = Dataset.range(3).scan((0, 0), lambda s, x: (s[0], x))
    with pytest.raises(TypeError, match=r"structure of the initial state"):
        next(iter(ds))


def test_a_function_that_returns_no_pair_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"must return a pair \(new_state, output_element\)"):
        next(iter(Dataset.range(3).scan(0, lambda s, x: s + x)))


def test_function_errors_keep_their_type_and_name_the_operation() -> None:
    def explode(state: np.int64, x: np.int64) -> tuple[np.int64, np.int64]:
        raise KeyError("boom")

    with pytest.raises(KeyError) as info:
        next(iter(Dataset.range(3).scan(0, explode)))
    assert any("scan(" in note for note in info.value.__notes__)


def test_in_place_writes_do_not_reach_a_saved_state() -> None:
    def accumulate(state: np.ndarray, x: np.int64) -> tuple[np.ndarray, np.int64]:
        state += x
        return state, state[0]

    it = iter(Dataset.range(1, 5).scan(np.zeros(1, np.int64), accumulate))
    next(it)
    saved = it.get_state()
    rest = [int(x) for x in it]
    restored = iter(Dataset.range(1, 5).scan(np.zeros(1, np.int64), accumulate))
    restored.set_state(saved)
    assert [int(x) for x in restored] == rest == [3, 6, 10]


test_checkpointing = checkpoint_test(
    __name__,
    running_sum=lambda: Dataset.range(10).scan(np.int64(0), lambda s, i: (s + i, s)),
    structured=lambda: Dataset.range(8).scan(
        (np.int64(1), np.int64(0)), lambda s, x: ((s[1], s[0] + s[1]), (s[0], x))
    ),
)
