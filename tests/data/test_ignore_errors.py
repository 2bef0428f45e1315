"""Tests of feedline/data/ops/ignore_errors.py."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from feedline.data import UNKNOWN_CARDINALITY, Dataset
from tests.data.checkpoint_utils import checkpoint_test


def _reciprocal(x: np.float32) -> np.float32:
    if x == 0:
        raise ZeroDivisionError("x is 0")
    return np.float32(1) / x


def _fails_on_2_mod_3(x: np.int64) -> np.int64:
    if x % 3 == 2:
        raise ValueError(f"{x} is 2 modulo 3")
    return x


def test_drops_elements_whose_map_raised() -> None:
    ds = Dataset.from_tensor_slices([1.0, 2.0, 0.0, 4.0]).map(_reciprocal).ignore_errors()
    assert [float(x) for x in ds] == [1.0, 0.5, 0.25]
    assert ds.cardinality() == UNKNOWN_CARDINALITY


def test_without_ignore_errors_the_error_reaches_the_user() -> None:
    ds = Dataset.from_tensor_slices([1.0, 0.0]).map(_reciprocal)
    it = iter(ds)
    assert float(next(it)) == 1.0
    with pytest.raises(ZeroDivisionError):
        next(it)


def test_errors_through_prefetch_are_dropped_too() -> None:
    ds = Dataset.range(10).map(_fails_on_2_mod_3).prefetch(2).ignore_errors()
    assert [int(x) for x in ds] == [0, 1, 3, 4, 6, 7, 9]


def test_log_warning(caplog: pytest.LogCaptureFixture) -> None:
    ds = Dataset.range(7).map(_fails_on_2_mod_3).ignore_errors(log_warning=True)
    with caplog.at_level(logging.WARNING, logger="feedline.data.ops.ignore_errors"):
        assert [int(x) for x in ds] == [0, 1, 3, 4, 6]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "(2 so far)" in messages[-1] and "ValueError: 5 is 2 modulo 3" in messages[-1]


def test_silent_by_default(caplog: pytest.LogCaptureFixture) -> None:
    ds = Dataset.range(4).map(_fails_on_2_mod_3).ignore_errors()
    with caplog.at_level(logging.WARNING):
        assert [int(x) for x in ds] == [0, 1, 3]
    assert not caplog.records


@pytest.mark.parametrize("parallel", [None, 2])
def test_errors_of_the_code_are_raised_not_dropped(parallel: int | None) -> None:
    # TensorFlow meets these when it traces the function; dropping them would drop every element.
    import feedline as tf

    ds = Dataset.from_tensor_slices([1.0, 0.0])
    misspelt = ds.map(lambda x: np.reciprocall(x), num_parallel_calls=parallel).ignore_errors()
    with pytest.raises(AttributeError, match="reciprocall"):
        list(misspelt)
    ported = ds.map(lambda x: tf.debugging.check_numerics(1 / x, ""), num_parallel_calls=parallel)
    with pytest.raises(AttributeError, match=r"feedline has no tf\.debugging"):
        list(ported.ignore_errors())
    with pytest.raises(NameError, match="undefined_name"):
        list(ds.map(lambda x: undefined_name(x)).ignore_errors())  # type: ignore[name-defined] # noqa: F821


def test_keyboard_interrupt_is_not_swallowed() -> None:
    def interrupt(x: np.int64) -> np.int64:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        next(iter(Dataset.range(3).map(interrupt).ignore_errors()))


test_checkpointing = checkpoint_test(
    __name__,
    some_fail=lambda: Dataset.range(16).map(_fails_on_2_mod_3).ignore_errors(),
    all_fail=lambda: Dataset.range(2, 14, 3).map(_fails_on_2_mod_3).ignore_errors(),
)
