"""Tests of feedline/data/ops/map_batch.py and the rule of feedline/data/ops/_vectorise.py: a fused
``map().batch()`` gives what the unfused pipeline gives, errors and positions included."""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from feedline.data import AUTOTUNE, Dataset, Options, TensorSpec
from feedline.data.ops import _vectorise, map_batch
from feedline.data.ops.map_batch import MapBatchIterator
from tests.data.checkpoint_utils import assert_checkpointing, assert_elements_equal, checkpoint_test

X = np.random.default_rng(1).integers(0, 256, (23, 4, 3), dtype=np.uint8)
Y = np.arange(23, dtype=np.int64) % 7


def normalise(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return x.astype(np.float32) / np.float32(255), y


def to_dict(x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    return {"scaled": np.clip(x, 10, 200).astype(np.int32) * 3, "label": y + 1}


def branches(x: np.ndarray) -> np.ndarray:
    if int(x) % 2:
        return x * 3
    return x


def explode_at_3(x: np.ndarray) -> np.ndarray:
    if int(x) == 3:
        raise KeyError("bad element")
    return x * 2


def unfused(dataset: Dataset) -> Dataset:
    options = Options()
    options.experimental_optimization.map_and_batch_fusion = False
    return dataset.with_options(options)


def outcomes(dataset: Dataset, limit: int = 100) -> list[tuple[str, Any]]:
    """Every batch, or the error in its place (type, message, notes), to the end."""
    out: list[tuple[str, Any]] = []
    it = iter(dataset)
    while len(out) < limit:
        try:
            out.append(("batch", next(it)))
        except StopIteration:
            break
        except Exception as error:
            out.append(("error", (type(error), str(error), getattr(error, "__notes__", []))))
    it.close()
    return out


def assert_same_outcomes(fused: Dataset, plain: Dataset) -> None:
    a, b = outcomes(fused), outcomes(plain)
    assert [kind for kind, _ in a] == [kind for kind, _ in b]
    for (kind, x), (_, y) in zip(a, b, strict=True):
        if kind == "batch":
            assert_elements_equal(x, y)
        else:
            assert x == y


def fused_iterator(dataset: Dataset) -> MapBatchIterator:
    it = iter(dataset)
    assert isinstance(it, MapBatchIterator), type(it).__name__
    return it


CASES: dict[str, Callable[[], Dataset]] = {
    "range_scalars": lambda: Dataset.range(10).map(lambda i: i * 2 - 1).batch(3),
    "range_pair": lambda: Dataset.range(11).map(lambda i: (i, i)).batch(4),
    "tuples": lambda: Dataset.from_tensor_slices((X, Y)).map(normalise).batch(5),
    "dict_out": lambda: Dataset.from_tensor_slices((X, Y)).map(to_dict).batch(6),
    "dict_in": lambda: Dataset.from_tensor_slices({"a": Y, "b": Y * 2}).map(lambda d: d).batch(4),
    "python_scalar": lambda: Dataset.range(7).map(lambda i: 1).batch(3),
    "strings": lambda: (
        Dataset.from_tensor_slices(["a", "bb", "", "ccc", "d"]).map(lambda s: (s, 2.5)).batch(2)
    ),
    "branches": lambda: Dataset.range(9).map(branches).batch(4),
    "drop_remainder": lambda: (
        Dataset.from_tensor_slices((X, Y)).map(normalise).batch(5, drop_remainder=True)
    ),
    "parallel": lambda: (
        Dataset.from_tensor_slices((X, Y)).map(normalise, num_parallel_calls=2).batch(4)
    ),
    "autotune": lambda: (
        Dataset.range(30).map(lambda i: i + 1, num_parallel_calls=AUTOTUNE).batch(7)
    ),
    "unordered": lambda: (
        Dataset.range(30).map(lambda i: i * 3, num_parallel_calls=2, deterministic=False).batch(8)
    ),
    "zip": lambda: (
        Dataset.zip((Dataset.range(12), Dataset.from_tensor_slices(Y[:12])))
        .map(lambda a, b: a * b)
        .batch(5)
    ),
    "batch_larger_than_input": lambda: Dataset.range(5).map(lambda i: -i).batch(64),
}

VECTORISED = {
    "range_scalars",
    "range_pair",
    "tuples",
    "dict_out",
    "dict_in",
    "drop_remainder",
    "parallel",
    "autotune",
    "unordered",
    "zip",
    "batch_larger_than_input",
}


@pytest.mark.parametrize("name", sorted(set(CASES) - {"unordered"}))
def test_fused_outputs_equal_the_unfused_pipeline(name: str) -> None:
    make = CASES[name]
    assert_same_outcomes(make(), unfused(make()))


def test_unordered_yields_every_element_in_batches_of_its_size() -> None:
    # deterministic=False lets the unfused map reorder; the fused one keeps the input's order,
    # which is one of the orders allowed.
    make = CASES["unordered"]
    fused = [b.tolist() for b in make()]
    assert fused == [[3 * i for i in range(j, min(j + 8, 30))] for j in range(0, 30, 8)]
    plain = [b.tolist() for b in unfused(make())]
    assert [len(b) for b in plain] == [len(b) for b in fused]
    assert sorted(x for b in plain for x in b) == [x for b in fused for x in b]


@pytest.mark.parametrize("name", sorted(CASES))
def test_which_batches_run_the_function_once(name: str) -> None:
    it = iter(CASES[name]())
    vectorised = isinstance(it, MapBatchIterator) and it._vectorised
    assert vectorised == (name in VECTORISED)
    it.close()


def test_an_error_names_the_element_and_the_next_batch_starts_after_it() -> None:
    make = lambda: Dataset.range(10).map(explode_at_3).batch(4)  # noqa: E731
    fused_iterator(make()).close()
    result = outcomes(make())
    assert [kind for kind, _ in result] == ["error", "batch", "batch"]
    error_type, message, notes = result[0][1]
    assert error_type is KeyError and "bad element" in message
    assert any("map(" in note and "explode_at_3" in note for note in notes)
    assert [b.tolist() for _, b in result[1:]] == [[8, 10, 12, 14], [16, 18]]
    assert_same_outcomes(make(), unfused(make()))


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # learning the spec on zeros
def test_an_error_inside_a_whole_batch_call_is_raised_by_its_element() -> None:
    values = np.array([1.0, 2.0, 4.0, 8.0, 5.0, 0.0, 2.0, 1.0, 3.0], np.float32)
    make = lambda: Dataset.from_tensor_slices(values).map(lambda v: 1 / v).batch(4)  # noqa: E731
    assert fused_iterator(make())._vectorised  # the trial rows (the first 4) have no zero
    with np.errstate(divide="raise"):
        fused, plain = outcomes(make()), outcomes(unfused(make()))
    assert [kind for kind, _ in fused] == ["batch", "error", "batch"]
    assert fused[1][1][0] is FloatingPointError
    assert any("map(" in note for note in fused[1][1][2])
    np.testing.assert_array_equal(fused[2][1], 1 / values[6:])  # after element 5
    for (kind, x), (_, y) in zip(fused, plain, strict=True):
        if kind == "batch":
            assert_elements_equal(x, y)


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
@pytest.mark.parametrize("handed_over", [False, True], ids=["fused", "handed_over"])
def test_an_error_inside_a_whole_batch_call_of_a_parallel_map(
    handed_over: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if handed_over:
        monkeypatch.setattr(map_batch, "_HEAVY_ROW_SECONDS", -1.0)
    values = np.array([1.0, 2.0, 4.0, 8.0, 5.0, 0.0, 2.0, 1.0, 3.0, 6.0], np.float32)
    make = lambda: (  # noqa: E731
        Dataset.from_tensor_slices(values).map(lambda v: 1 / v, num_parallel_calls=2).batch(4)
    )
    assert fused_iterator(make())._vectorised
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # seen by every thread
        fused, plain = outcomes(make()), outcomes(unfused(make()))
    assert [kind for kind, _ in fused] == ["batch", "error", "batch"]
    assert fused[1][1][0] is RuntimeWarning
    assert any("map(" in note for note in fused[1][1][2])
    np.testing.assert_array_equal(fused[2][1], 1 / values[6:])
    for (kind, x), (_, y) in zip(fused, plain, strict=True):
        if kind == "batch":
            assert_elements_equal(x, y)
        else:
            assert x == y


def test_the_option_off_or_a_source_without_random_access_is_not_fused() -> None:
    assert type(iter(unfused(CASES["tuples"]()))).__name__ == "_BatchIterator"
    filtered = Dataset.range(10).filter(lambda i: i > 2).map(lambda i: i * 2).batch(3)
    assert type(iter(filtered)).__name__ == "_BatchIterator"
    generated = Dataset.from_generator(
        lambda: iter(range(5)), output_signature=TensorSpec((), np.int64)
    )
    assert type(iter(generated.map(lambda i: i).batch(2))).__name__ == "_BatchIterator"
    assert [b.tolist() for b in filtered] == [[6, 8, 10], [12, 14, 16], [18]]


def test_a_parallel_map_that_cannot_run_on_batches_keeps_its_threads() -> None:
    ds = Dataset.range(9).map(branches, num_parallel_calls=2).batch(4)
    assert type(iter(ds)).__name__ == "ParallelMapBatchIterator"
    inline = Dataset.range(9).map(branches).batch(4)
    assert not fused_iterator(inline)._vectorised


def test_processes_are_not_fused() -> None:
    ds = Dataset.range(4).map(lambda i: i, use_processes=True).batch(2)
    assert type(iter(ds)).__name__ == "_BatchIterator"


def test_trials_reject_a_function_that_reads_the_batch_as_one() -> None:
    # Per element y broadcasts over x's row; on a batch it would broadcast over x's last axis.
    rows = Dataset.from_tensor_slices((np.arange(12.0).reshape(4, 3), np.arange(4.0)))
    make = lambda: rows.map(lambda x, y: np.add(x, y)).batch(3)  # noqa: E731
    assert _vectorise.screen(lambda x, y: np.add(x, y))
    assert not fused_iterator(make())._vectorised
    assert_same_outcomes(make(), unfused(make()))


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (normalise, True),
        (to_dict, True),
        (lambda i: (i, i), True),
        (lambda x: -x * 2.0 + 1 > 0.5, True),
        (branches, False),
        (lambda x: x - x.mean(), False),
        (lambda x: x[0], False),
        (lambda x: x**2, False),
        (lambda x: np.exp(x), False),
        (lambda x: np.random.rand() + x, False),
        (lambda x: [x, x], False),
        (lambda x: np.add(x, 1, out=x), False),
        (lambda x: len(x), False),
        (lambda x: x if x > 0 else -x, False),
        (lambda x: sum(v for v in x), False),
        (print, False),
    ],
)
def test_screen(fn: Callable[..., Any], expected: bool) -> None:
    assert _vectorise.screen(fn) is expected


def test_screen_reads_closures_and_globals() -> None:
    scale = np.float32(2)
    table = [1, 2]
    assert _vectorise.screen(lambda x: x * scale)
    assert not _vectorise.screen(lambda x: x * table)


def test_writable_and_distinct_outputs() -> None:
    a, b = next(iter(Dataset.range(6).map(lambda i: (i, i)).batch(3)))
    assert a.flags.writeable and b.flags.writeable and not np.shares_memory(a, b)
    x, _ = next(iter(Dataset.from_tensor_slices((X, Y)).map(lambda x, y: (x, y)).batch(3)))
    x[0] = 0  # a batch is the caller's to write into; the source stays as it was
    assert X[0].any()


def test_fused_state_restores_without_fusion_and_back() -> None:
    for name in ("tuples", "parallel", "branches", "range_pair"):
        make = CASES[name]
        expected = outcomes(make())
        for a, b in (
            (make, lambda make=make: unfused(make())),
            (lambda make=make: unfused(make()), make),
        ):
            for step in range(len(expected)):
                it = iter(a())
                for _ in range(step):
                    next(it)
                state = pickle.loads(pickle.dumps(it.get_state()))
                restored = iter(b())
                restored.set_state(state)
                rest = list(restored)
                assert len(rest) == len(expected) - step, name
                for got, (_, want) in zip(rest, expected[step:], strict=True):
                    assert_elements_equal(got, want)


def test_restores_a_parallel_map_state_with_outputs_computed_ahead() -> None:
    make = CASES["parallel"]
    plain = iter(unfused(make()))
    first = next(plain)
    state = plain.get_state()
    assert state["input"]["ready"], "the unfused parallel map computed ahead"
    restored = fused_iterator(make())
    restored.set_state(state)
    rest = list(restored)
    expected = outcomes(make())
    assert_elements_equal(first, expected[0][1])
    assert len(rest) == len(expected) - 1
    for got, (_, want) in zip(rest, expected[1:], strict=True):
        assert_elements_equal(got, want)


def test_the_dataset_pickles_after_it_was_iterated() -> None:
    ds = Dataset.from_tensor_slices((X, Y)).map(normalise).batch(5)
    list(ds)
    again = pickle.loads(pickle.dumps(ds))
    assert_same_outcomes(again, ds)


test_checkpointing = checkpoint_test(
    __name__,
    fused_vectorised=CASES["tuples"],
    fused_dict=CASES["dict_out"],
    fused_drop=CASES["drop_remainder"],
    fused_parallel=CASES["parallel"],
    fused_per_element=CASES["branches"],
    fused_strings=CASES["strings"],
)


@pytest.fixture
def heavy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch counts as heavy: a fused parallel map hands over after its timed batches."""
    monkeypatch.setattr(map_batch, "_HEAVY_ROW_SECONDS", -1.0)


@pytest.mark.usefixtures("heavy")
@pytest.mark.parametrize("name", ["parallel", "autotune"])
def test_heavy_batches_hand_over_to_the_threads_of_the_unfused_map(name: str) -> None:
    make = CASES[name]
    it = fused_iterator(make())
    for _ in range(map_batch._TIMED_BATCHES):
        next(it)
    assert type(it._delegate).__name__ == "_BatchIterator"
    it.close()
    assert_same_outcomes(make(), unfused(make()))
    assert_checkpointing(make)
    assert_checkpointing(lambda: make().repeat(2))


def test_light_batches_stay_in_the_consumer_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(map_batch, "_HEAVY_ROW_SECONDS", 1e9)
    it = fused_iterator(CASES["parallel"]())
    list(it)
    assert it._delegate is None
