"""Tests of feedline/data/ops/interleave.py."""

from __future__ import annotations

import os
import threading
import time
import traceback
from typing import Any

import numpy as np
import pytest

from feedline.data import AUTOTUNE, Dataset, Options, TensorSpec
from feedline.errors import InvalidArgumentError
from tests.data.checkpoint_utils import assert_checkpointing, checkpoint_test

SEED_ORDER = [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3, 4, 4, 5, 5, 5, 5,
              5, 5]  # fmt: skip


def _six_times(x: np.int64) -> Dataset:
    return Dataset.from_tensors(x).repeat(6)


@pytest.mark.parametrize("num_parallel_calls", [None, 1, 2, AUTOTUNE])
def test_seed_example(num_parallel_calls: int | None) -> None:
    ds = Dataset.range(1, 6).interleave(
        _six_times, cycle_length=2, block_length=4, num_parallel_calls=num_parallel_calls
    )
    assert [int(x) for x in ds] == SEED_ORDER
    assert ds.element_spec == TensorSpec((), np.int64)


@pytest.mark.parametrize("num_parallel_calls", [None, 3])
def test_datasets_of_different_lengths(num_parallel_calls: int | None) -> None:
    ds = Dataset.range(1, 6).interleave(
        lambda x: Dataset.range(x), cycle_length=3, num_parallel_calls=num_parallel_calls
    )
    assert [int(x) for x in ds] == [0, 0, 0, 1, 1, 0, 2, 1, 0, 2, 1, 3, 2, 3, 4]


def test_cycle_length_defaults_to_the_number_of_cores() -> None:
    cores = len(os.sched_getaffinity(0))
    default = Dataset.range(1, 6).interleave(lambda x: Dataset.range(x))
    explicit = Dataset.range(1, 6).interleave(lambda x: Dataset.range(x), cycle_length=cores)
    assert [int(x) for x in default] == [int(x) for x in explicit]
    budget = Dataset.range(1, 6).with_options(_cpu_budget(3)).interleave(lambda x: Dataset.range(x))
    assert budget._cycle_length == 3


def _cpu_budget(n: int) -> Options:
    options = Options()
    options.autotune.cpu_budget = n
    return options


def test_cycle_length_one_is_flat_map() -> None:
    ds = Dataset.range(4).interleave(lambda x: Dataset.range(x), cycle_length=1, block_length=2)
    assert [int(x) for x in ds] == [0, 0, 1, 0, 1, 2]


def _write_files(directory: os.PathLike, contents: dict[str, list[str]]) -> list[bytes]:
    names = []
    for name, lines in contents.items():
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            f.write("".join(line + "\n" for line in lines))
        names.append(os.fsencode(path))
    return names


def _lines(path: np.ndarray) -> Dataset:
    # A file name is a 0-d object array holding its bytes: ``.item()`` gives them.
    assert isinstance(path, np.ndarray) and path.shape == () and type(path.item()) is bytes
    return Dataset.from_generator(
        lambda p: (line.rstrip("\n") for line in open(p.item(), encoding="utf-8")),
        output_signature=TensorSpec((), np.str_),
        args=(path,),
    )


@pytest.mark.parametrize("num_parallel_calls", [None, 2])
def test_reading_files_named_by_0d_bytes(tmp_path, num_parallel_calls: int | None) -> None:
    names = _write_files(tmp_path, {"a.txt": ["a1", "a2", "a3"], "b.txt": ["b1"], "c.txt": ["c1"]})
    ds = Dataset.from_tensor_slices(names).interleave(
        _lines, cycle_length=2, num_parallel_calls=num_parallel_calls
    )
    assert [x.item() for x in ds] == [b"a1", b"b1", b"a2", b"a3", b"c1"]


def _write_records(directory: os.PathLike, files: dict[str, list[bytes]]) -> None:
    from feedline.io import TFRecordWriter

    for name, records in files.items():
        with TFRecordWriter(os.path.join(directory, name)) as writer:
            for record in records:
                writer.write(record)


@pytest.mark.parametrize("num_parallel_calls", [None, 2])
def test_list_files_interleave_tfrecord(tmp_path, num_parallel_calls: int | None) -> None:
    from feedline.data import TFRecordDataset

    _write_records(tmp_path, {"a.tfrecord": [b"a1", b"a2", b"a3"], "b.tfrecord": [b"b1", b"b2"]})
    files = Dataset.list_files(str(tmp_path / "*.tfrecord"), shuffle=False)
    ds = files.interleave(TFRecordDataset, cycle_length=2, num_parallel_calls=num_parallel_calls)
    assert [r.item() for r in ds] == [b"a1", b"b1", b"a2", b"b2", b"a3"]
    assert_checkpointing(lambda: files.interleave(TFRecordDataset, 2, 2, num_parallel_calls))


def _slow_first(x: np.int64) -> Dataset:
    def slow(v: np.int64) -> np.int64:
        if v == 0:
            time.sleep(0.3)
        return v

    return Dataset.from_tensors(x).repeat(3).map(slow)


def test_non_deterministic_takes_what_is_ready() -> None:
    kwargs = {"cycle_length": 3, "num_parallel_calls": 3}
    out = [int(x) for x in Dataset.range(3).interleave(_slow_first, deterministic=False, **kwargs)]
    assert sorted(out) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert out[0] != 0  # the slow dataset did not hold the others back
    strict = [int(x) for x in Dataset.range(3).interleave(_slow_first, **kwargs)]
    assert strict == [0, 1, 2, 0, 1, 2, 0, 1, 2]


def test_options_deterministic_false_applies() -> None:
    options = Options()
    options.deterministic = False
    ds = Dataset.range(3).interleave(_slow_first, cycle_length=3, num_parallel_calls=3)
    out = [int(x) for x in ds.with_options(options)]
    assert sorted(out) == [0, 0, 0, 1, 1, 1, 2, 2, 2] and out[0] != 0


def _fails_on_2(x: np.int64) -> Dataset:
    def check(v: np.int64) -> np.int64:
        if v == 2:
            raise ValueError("bad element 2")
        return v

    return Dataset.from_tensors(x).map(check)


@pytest.mark.parametrize("num_parallel_calls", [None, 2])
def test_errors_reach_the_consumer_with_their_traceback(num_parallel_calls: int | None) -> None:
    ds = Dataset.range(4).interleave(
        _fails_on_2, cycle_length=2, num_parallel_calls=num_parallel_calls
    )
    it = iter(ds)
    assert [int(next(it)), int(next(it))] == [0, 1]
    with pytest.raises(ValueError, match="bad element 2") as info:
        next(it)
    assert "in check" in "".join(traceback.format_tb(info.value.__traceback__))
    assert int(next(it)) == 3  # the pipeline goes on after the error, as tf.data does
    it.close()
    ignored = [int(x) for x in Dataset.range(4).interleave(_fails_on_2, 2, 1, 2).ignore_errors()]
    assert ignored == [0, 1, 3]


def _outcomes(it: Any, limit: int = -1) -> list[object]:
    """The elements of iterator ``it``, and each error as its message: ``limit`` of them, or
    all to the end."""
    got: list[object] = []
    while len(got) != limit:
        try:
            got.append(int(next(it)))
        except StopIteration:
            return got
        except ValueError as error:
            got.append(str(error))
    return got


def _fails_to_map_3(x: np.int64) -> Dataset:
    if x == 3:
        raise ValueError("no dataset for 3")
    return Dataset.from_tensors(x).repeat(2)


def _input_fails_on_3(x: np.int64) -> np.int64:
    if x == 3:
        raise ValueError("bad input 3")
    return x


@pytest.mark.parametrize("failing", ["map_func", "input"])
def test_datasets_made_ahead_raise_their_errors_in_their_turn(failing: str) -> None:
    # The parallel interleave makes the next cycle's datasets ahead: an error of the input or
    # of map_func meanwhile still comes where the sequential interleave raises it.
    source = Dataset.range(7)
    fn = _fails_to_map_3
    if failing == "input":
        source, fn = source.map(_input_fails_on_3), _six_times
    sequential = _outcomes(iter(source.interleave(fn, cycle_length=2)))
    assert len([x for x in sequential if isinstance(x, str)]) == 1
    parallel = source.interleave(fn, cycle_length=2, num_parallel_calls=2)
    assert _outcomes(iter(parallel)) == sequential
    for stop in range(1, len(sequential)):  # states holding the error, made ahead or not
        it = iter(parallel)
        assert _outcomes(it, stop) == sequential[:stop]
        restored = iter(parallel)
        restored.set_state(it.get_state())
        it.close()
        assert _outcomes(restored) == sequential[stop:]
        restored.close()


def test_the_next_cycles_datasets_are_made_ahead() -> None:
    made: list[int] = []

    def record(x: np.int64) -> Dataset:
        made.append(int(x))
        return Dataset.from_tensors(x).repeat(3)

    parallel = iter(Dataset.range(10).interleave(record, cycle_length=3, num_parallel_calls=3))
    assert int(next(parallel)) == 0
    assert made == [0, 1, 2, 3, 4, 5]  # the cycle, and the next cycle_length made ahead
    state = parallel.get_state()
    rest = [int(x) for x in parallel]
    restored = iter(Dataset.range(10).interleave(record, cycle_length=3, num_parallel_calls=3))
    restored.set_state(state)
    assert [int(x) for x in restored] == rest
    made.clear()
    sequential = iter(Dataset.range(10).interleave(record, cycle_length=3))
    next(sequential)
    assert made == [0]


def test_threads_are_named_and_stop_on_close() -> None:
    ds = Dataset.range(4).interleave(
        lambda x: Dataset.range(100), cycle_length=2, num_parallel_calls=2
    )
    it = iter(ds)
    next(it)
    names = [t.name for t in threading.enumerate()]
    assert "feedline-interleave" in names
    it.close()
    assert not any(t.name == "feedline-interleave" and t.is_alive() for t in threading.enumerate())


def test_map_func_must_return_a_dataset() -> None:
    ds = Dataset.range(3).interleave(lambda x: x, cycle_length=2)
    with pytest.raises(TypeError, match=r"interleave\(.*\) must return a Dataset, got int64"):
        list(ds)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cycle_length": 0}, "cycle_length must be >= 1, got 0"),
        ({"block_length": -3}, "block_length must be >= 1, got -3"),
        ({"num_parallel_calls": 0}, r"num_parallel_calls must be >= 1 or AUTOTUNE \(-1\), got 0"),
    ],
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        Dataset.range(3).interleave(lambda x: Dataset.range(x), **kwargs)


def test_restoring_with_another_cycle_length_is_refused() -> None:
    it = iter(Dataset.range(5).interleave(lambda x: Dataset.range(x), cycle_length=2))
    next(it)
    state = it.get_state()
    other = iter(Dataset.range(5).interleave(lambda x: Dataset.range(x), cycle_length=3))
    with pytest.raises(InvalidArgumentError, match=r"state has 2 cycle slots.*cycle_length=3"):
        other.set_state(state)


def test_autotuned_parallel_interleave_tunes_its_readers() -> None:
    ds = Dataset.range(8).interleave(
        lambda x: Dataset.range(200).map(lambda y: y + x), cycle_length=4, num_parallel_calls=-1
    )
    it = iter(ds)
    values = [int(v) for v in it]
    assert sorted(values) == sorted(y + x for x in range(8) for y in range(200))
    assert it._tuner is not None and 1 <= it._workers.limit <= 4


test_checkpointing = checkpoint_test(
    __name__,
    seed_example=lambda: Dataset.range(1, 5).interleave(_six_times, cycle_length=2, block_length=4),
    ragged=lambda: Dataset.range(1, 7).interleave(lambda x: Dataset.range(x), cycle_length=3),
    parallel=lambda: Dataset.range(1, 5).interleave(
        _six_times, cycle_length=2, block_length=3, num_parallel_calls=2
    ),
    parallel_shuffled=lambda: Dataset.range(1, 6).interleave(
        lambda x: Dataset.range(x).shuffle(4, seed=1), cycle_length=3, num_parallel_calls=AUTOTUNE
    ),
)
