"""Tests of feedline/data/ops/map_batch_parallel.py: a parallel ``map().batch()`` whose threads
write each row into its batch gives what the unfused pipeline gives, errors and positions
included."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest

from feedline.data import AUTOTUNE, Dataset
from feedline.data.ops import map_batch_parallel
from feedline.data.ops.map_batch_parallel import ParallelMapBatchIterator
from tests.data.checkpoint_utils import checkpoint_test
from tests.data.test_map_batch import assert_same_outcomes, outcomes, unfused

IMAGES = np.random.default_rng(2).integers(0, 256, (29, 6, 5, 3), dtype=np.uint8)
LABELS = np.arange(29, dtype=np.int64) % 5


def augment(image: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A per-element transform (Python branching on the value): never vectorised; it sleeps so
    that its rows count as heavy however fast the machine."""
    time.sleep(2e-4)
    out = image[:, ::-1] if int(label) % 2 else image
    return np.ascontiguousarray(out.transpose(2, 0, 1)).astype(np.float32) / 255, label


def to_dict(image: np.ndarray, label: np.ndarray) -> dict[str, np.ndarray]:
    time.sleep(2e-4)
    return {"mean": image.mean(axis=(0, 1)), "label": int(label)}


def ragged(i: np.ndarray) -> np.ndarray:
    time.sleep(2e-4)
    return np.arange(int(i) % 3 + 1)


def strings(i: np.ndarray) -> tuple[str, np.ndarray]:
    time.sleep(2e-4)
    return "x" * (int(i) % 4), i


def explode_at(bad: int) -> Callable[[np.ndarray], np.ndarray]:
    def explode(i: np.ndarray) -> np.ndarray:
        time.sleep(2e-4)
        if int(i) == bad:
            raise KeyError(f"bad element {bad}")
        return np.full((2, 2), i, np.int32)

    return explode


def stop_at_4(i: np.ndarray) -> np.ndarray:
    time.sleep(2e-4)
    if int(i) == 4:
        raise StopIteration
    return i * 3


def images(shuffled: bool = True) -> Dataset:
    ds = Dataset.from_tensor_slices((IMAGES, LABELS))
    return ds.shuffle(29, seed=7) if shuffled else ds


CASES: dict[str, Callable[[], Dataset]] = {
    "shuffled": lambda: images().map(augment, num_parallel_calls=AUTOTUNE).batch(8),
    "random_access": lambda: images(False).map(augment, num_parallel_calls=2).batch(8),
    "drop_remainder": lambda: (
        images().map(augment, num_parallel_calls=3).batch(8, drop_remainder=True)
    ),
    "dict_and_python_int": lambda: images().map(to_dict, num_parallel_calls=2).batch(6),
    "strings": lambda: Dataset.range(11).map(strings, num_parallel_calls=2).batch(4),
    "one_thread": lambda: images().map(augment, num_parallel_calls=1).batch(5),
    "unordered": lambda: images().map(augment, num_parallel_calls=2, deterministic=False).batch(7),
    "error": lambda: Dataset.range(20).map(explode_at(9), num_parallel_calls=2).batch(4),
    "stop_iteration": lambda: Dataset.range(11).map(stop_at_4, num_parallel_calls=2).batch(3),
}


def fused(dataset: Dataset) -> ParallelMapBatchIterator:
    it = iter(dataset)
    assert isinstance(it, ParallelMapBatchIterator), type(it).__name__
    return it


@pytest.mark.parametrize("name", sorted(set(CASES) - {"unordered"}))
def test_outputs_equal_the_unfused_pipeline(name: str) -> None:
    make = CASES[name]
    fused(make()).close()
    assert_same_outcomes(make(), unfused(make()))


def test_unordered_keeps_the_input_order() -> None:
    fused(CASES["unordered"]()).close()
    ordered = images().map(augment, num_parallel_calls=2).batch(7)
    assert_same_outcomes(CASES["unordered"](), unfused(ordered))


def test_rows_are_written_into_one_batch_and_handed_out_as_it() -> None:
    it = fused(CASES["shuffled"]())
    first = next(it)
    pending = it._pending[0]
    pending.wait()
    assert pending.leaf_layout is not None and all(o is None for o in pending.outcomes)
    assert first[0].shape == (8, 3, 6, 5) and first[0].dtype == np.float32
    second = next(it)
    assert second[0] is pending.buffers[0]  # the buffer the threads wrote, not a stacked copy
    it.close()


def test_a_dropped_batch_s_memory_is_used_again_and_a_kept_one_never() -> None:
    """Batches come from the iterator's BufferPool: the memory of one the program dropped is
    written again; one it keeps (or a view of one) keeps its values."""
    source = Dataset.range(64).repeat(3)
    dataset = source.map(lambda i: augment(IMAGES[int(i) % 29], LABELS[int(i) % 29]),
                         num_parallel_calls=2).batch(8)  # fmt: skip
    expected = [
        b[0].copy()
        for b in Dataset.range(64).repeat(3)
        .map(lambda i: augment(IMAGES[int(i) % 29], LABELS[int(i) % 29])).batch(8)
    ]  # fmt: skip
    it = fused(dataset)
    kept = next(it)[0]
    view = next(it)[0][3:5]  # the rest of the second batch is dropped
    addresses = set()
    for i, (images, _) in enumerate(it, start=2):
        assert np.array_equal(images, expected[i])
        addresses.add(images.ctypes.data)
    assert np.array_equal(kept, expected[0]) and np.array_equal(view, expected[1][3:5])
    assert len(addresses) < len(expected) - 2  # dropped batches' memory came back
    assert kept.ctypes.data not in addresses
    assert not any(view.ctypes.data - 3 * kept[0].nbytes == a for a in addresses)


def test_an_error_names_the_function_and_the_next_batch_starts_after_it() -> None:
    got = outcomes(CASES["error"]())
    assert [kind for kind, _ in got] == ["batch", "batch", "error", "batch", "batch", "batch"]
    error_type, message, notes = got[2][1]
    assert error_type is KeyError and "bad element 9" in message
    named = "raised by the function of map(explode_at.<locals>.explode)"
    assert any(named in note for note in notes)
    assert got[3][1][:, 0, 0].tolist() == [10, 11, 12, 13]


def test_a_state_taken_after_an_error_restores_the_rest() -> None:
    want = outcomes(CASES["error"]())
    it = fused(CASES["error"]())
    next(it), next(it)
    with pytest.raises(KeyError):
        next(it)
    state = it.get_state()
    it.close()
    restored = fused(CASES["error"]())
    restored.set_state(state)
    rest = list(restored)
    assert [b[:, 0, 0].tolist() for b in rest] == [b[:, 0, 0].tolist() for _, b in want[3:]]


def test_rows_of_different_shapes_fail_as_batch_fails() -> None:
    ds = Dataset.range(6).map(ragged, num_parallel_calls=2).batch(3)
    fused(ds).close()
    got, want = outcomes(ds), outcomes(unfused(ds))
    assert got == want and got[0][0] == "error"
    assert "cannot batch component 0" in got[0][1][1]


def test_light_functions_hand_over_to_the_unfused_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(map_batch_parallel, "_MIN_ROW_SECONDS", 1e9)
    make = CASES["shuffled"]
    it = fused(make())
    first = next(it)
    assert type(it._delegate).__name__ == "_BatchIterator"
    rest = list(it)
    assert_same_outcomes(make(), unfused(make()))
    want = [b for _, b in outcomes(unfused(make()))]
    for got, expected in zip([first, *rest], want, strict=True):
        assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])


def test_the_option_off_and_processes_are_not_fused() -> None:
    assert type(iter(unfused(CASES["shuffled"]()))).__name__ == "_BatchIterator"
    ds = Dataset.range(4).map(lambda i: i, use_processes=True).batch(2)
    assert type(iter(ds)).__name__ == "_BatchIterator"
    inline = Dataset.range(4).filter(lambda i: i > 0).map(lambda i: i).batch(2)
    assert type(iter(inline)).__name__ == "_BatchIterator"


def test_a_state_saved_unfused_restores_fused_and_back() -> None:
    make = CASES["shuffled"]
    want = [b for _, b in outcomes(make())]
    plain = iter(unfused(make()))
    next(plain)
    state = plain.get_state()
    plain.close()
    restored = fused(make())
    restored.set_state(state)
    first_rest = next(restored)
    assert np.array_equal(first_rest[0], want[1][0])
    state = restored.get_state()
    assert state["input"]["ready"], "the fused iterator computed ahead"
    restored.close()
    back = iter(unfused(make()))
    back.set_state(state)
    rest = list(back)
    assert len(rest) == len(want) - 2
    for got, expected in zip(rest, want[2:], strict=True):
        assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])


test_checkpointing = checkpoint_test(
    __name__,
    parallel_fused_shuffled=lambda: images().map(augment, num_parallel_calls=2).batch(7),
    parallel_fused_drop=lambda: (
        images().take(17).map(augment, num_parallel_calls=2).batch(4, drop_remainder=True)
    ),
    parallel_fused_strings=CASES["strings"],
)


def test_an_error_of_the_input_comes_in_its_place() -> None:
    def check(i: np.ndarray) -> np.ndarray:
        if int(i) == 6:
            raise ValueError("input element 6")
        return i

    def slow(i: np.ndarray) -> np.ndarray:
        time.sleep(2e-4)
        return i * 2

    source = Dataset.range(15).map(check)
    fused(source.map(slow, num_parallel_calls=2).batch(4)).close()
    # As an inline map gives them:
    assert_same_outcomes(
        source.map(slow, num_parallel_calls=2).batch(4), unfused(source.map(slow).batch(4))
    )
    got = outcomes(source.map(slow, num_parallel_calls=2).batch(4))
    assert [kind for kind, _ in got] == ["batch", "error", "batch", "batch"]
    assert got[2][1].tolist() == [14, 16, 18, 20]
