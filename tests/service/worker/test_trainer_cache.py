"""Tests of feedline/service/worker/trainer_cache.py: trainers reading one task's ``TrainerCache``
while a producer thread fills its ``TaskBuffer``, without sockets."""

from __future__ import annotations

import doctest
import threading
from typing import Any

import numpy as np
import pytest

from feedline.service.worker import trainer_cache
from feedline.service.worker.buffer import Ending, TaskBuffer
from feedline.service.worker.trainer_cache import TrainerCache

pytestmark = pytest.mark.timeout(60)

ELEMENT_BYTES = 8 * 16  # an element: 16 int64


def produce(buffer: TaskBuffer, values: range) -> threading.Thread:
    """Puts ``[np.full(16, value)]`` for each of ``values`` on a thread, then finishes."""

    def run() -> None:
        for value in values:
            if not buffer.put([np.full(16, value)], ELEMENT_BYTES):
                return
        buffer.finish(drained=False)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def read_all(cache: TrainerCache, trainer: str, start: int = 0, batch: int = 5) -> list[int]:
    """What ``trainer`` reads from position ``start`` to the end, as ints (the first value of
    each element), following the positions the cache gives back; it returns each reply's
    elements before it asks again."""
    got: list[int] = []
    index = start
    for _ in range(10_000):
        reply: Any = cache.read(trainer, index, index, batch, 1 << 20, 1.0)
        if reply is Ending.INPUT_ENDED:
            return got
        if reply is None:
            continue
        first, elements = reply
        got.extend(int(leaves[0][0]) for leaves in elements)
        index = first + len(elements)
    raise AssertionError("the trainer never got to the end")


def test_every_trainer_reads_every_element_of_a_finite_epoch_past_the_memory_bound() -> None:
    buffer = TaskBuffer(1, max_elements=8)
    cache = TrainerCache(buffer, max_bytes=10 * ELEMENT_BYTES, window=False)
    thread = produce(buffer, range(200))
    fast = read_all(cache, "fast")  # it pulls all 200; only 10 stay in memory
    state = cache.state()
    assert state["end"] == 200 and state["memory_bytes"] <= 10 * ELEMENT_BYTES
    assert state["spilled"] == 190  # the rest went to disk, none dropped
    slow = read_all(cache, "slow", batch=7)  # read back from the spill, then memory
    late = read_all(cache, "late", start=123)  # a restored trainer starts at its position
    thread.join(10)
    assert fast == list(range(200)) and slow == list(range(200))
    assert late == list(range(123, 200))
    assert cache.positions() == {"fast": 200, "slow": 200, "late": 200}
    assert cache.completed()
    cache.close()


def test_a_task_is_not_completed_while_a_known_trainer_has_not_read_to_the_end() -> None:
    buffer = TaskBuffer(1)
    cache = TrainerCache(buffer, window=False)
    produce(buffer, range(10)).join(10)
    assert read_all(cache, "a") == list(range(10))
    reply: Any = cache.read("b", 0, 0, 4, 1 << 20, 0)  # b is known from now on
    assert reply[0] == 0 and [int(e[0][0]) for e in reply[1]] == [0, 1, 2, 3]
    assert cache.positions() == {"a": 10, "b": 0}  # what each returned
    assert not cache.completed() and not cache.drained_out()
    assert read_all(cache, "b", start=4) == list(range(4, 10))
    assert cache.completed() and cache.drained_out()
    # A trainer that received everything but returned less (it died) holds the task.
    cache.read("c", 10, 6, 4, 1 << 20, 0)
    assert not cache.completed() and cache.drained_out()


def test_an_infinite_dataset_keeps_a_sliding_window_and_a_laggard_skips_ahead() -> None:
    buffer = TaskBuffer(1, max_elements=4)
    cache = TrainerCache(buffer, max_bytes=10 * ELEMENT_BYTES, window=True)
    thread = produce(buffer, range(100))  # "infinite": the trainers stop reading first
    index = asked = 0
    while index < 50:  # the fast trainer reads 50
        asked = index
        reply: Any = cache.read("fast", index, index, 50 - index, 1 << 20, 1.0)
        first, elements = reply
        index = first + len(elements)
    state = cache.state()
    assert (state["start"], state["end"]) == (40, 50)  # the newest 10 elements' bytes
    assert state["spilled"] == 0
    # The slow trainer is at 3, which left the window: it skips ahead to the window's start.
    first, elements = cache.read("slow", 3, 3, 4, 1 << 20, 1.0)
    assert first == 40 and [int(e[0][0]) for e in elements] == [40, 41, 42, 43]
    assert cache.positions() == {"fast": asked, "slow": 3}  # returned before the last reply
    buffer.stop()
    thread.join(10)
    cache.close()


def test_a_failed_task_ends_every_trainer_with_its_error_and_a_stopped_one_as_gone() -> None:
    buffer = TaskBuffer(1)
    cache = TrainerCache(buffer, window=False)
    buffer.put([np.zeros(16)], ELEMENT_BYTES)
    buffer.fail({"type": "ValueError", "message": "bad element"})
    buffer.finish(drained=False)
    assert cache.read("a", 0, 0, 8, 1 << 20, 0)[0] == 0  # what was made still comes
    assert cache.read("a", 1, 1, 8, 1 << 20, 0) is Ending.FAILED
    stopped = TaskBuffer(2)
    other = TrainerCache(stopped, window=False)
    stopped.stop()
    assert other.read("a", 0, 0, 8, 1 << 20, 0) is Ending.GONE


def test_doctests() -> None:
    assert doctest.testmod(trainer_cache).failed == 0


def test_nothing_yet_is_none_after_the_wait() -> None:
    cache = TrainerCache(TaskBuffer(1), window=True)
    assert cache.read("a", 0, 0, 8, 1 << 20, 0.05) is None
    assert cache.positions() == {"a": 0}


def test_each_elements_split_tag_comes_with_it_from_memory_and_from_the_spill() -> None:
    """In an exactly-once job every element carries its ``[split, offset]`` (``ledger``): the
    cache keeps it, in memory and on disk, and hands it out with the element."""
    buffer = TaskBuffer(1)
    for value in range(30):
        buffer.put([np.full(16, value)], ELEMENT_BYTES, [value // 10, value % 10])
    buffer.finish(drained=False)
    cache = TrainerCache(buffer, max_bytes=5 * ELEMENT_BYTES, window=False)
    tags: list[list[int]] = []
    index, values = 0, []
    while True:
        reply: Any = cache.read("a", index, index, 7, 1 << 20, 1.0, tags)
        if reply is Ending.INPUT_ENDED:
            break
        first, elements = reply
        values.extend(int(leaves[0][0]) for leaves in elements)
        index = first + len(elements)
    assert cache.state()["spilled"] == 25
    late: list[list[int]] = []
    reply = cache.read("b", 3, 3, 4, 1 << 20, 1.0, late)  # from the spill file
    assert reply[0] == 3 and [int(leaves[0][0]) for leaves in reply[1]] == [3, 4, 5, 6]
    assert values == list(range(30))
    assert tags == [[v // 10, v % 10] for v in range(30)]
    assert late == [[0, 3], [0, 4], [0, 5], [0, 6]]
    cache.close()
