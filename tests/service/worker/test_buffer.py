"""Tests of feedline/service/worker/buffer.py: a producer thread and consumer threads on one
``TaskBuffer``, without sockets."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from feedline.errors import OutOfRangeError
from feedline.service.worker.buffer import Ending, TaskBuffer

pytestmark = pytest.mark.timeout(60)


def produce(buffer: TaskBuffer, values: range, size: int = 8) -> threading.Thread:
    """Puts ``[value]`` for each of ``values`` on a thread, then finishes."""

    def run() -> None:
        for value in values:
            if not buffer.put([value], size):
                return
        buffer.finish(drained=False)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_put_waits_while_the_buffer_holds_max_elements() -> None:
    buffer = TaskBuffer(1, max_elements=3)
    thread = produce(buffer, range(10))
    time.sleep(0.2)
    assert len(buffer) == 3  # the producer waits for room
    taken = []
    while len(taken) < 10:
        with buffer.cond:
            while not len(buffer):
                buffer.cond.wait(1.0)
            assert len(buffer) <= 3
            taken.append(buffer.take())
    thread.join(5)
    assert taken == [[x] for x in range(10)]  # in order
    assert buffer.completed()


def test_put_waits_while_the_next_element_would_pass_max_bytes() -> None:
    buffer = TaskBuffer(1, max_bytes=20)
    produce(buffer, range(5), size=8)
    time.sleep(0.2)
    assert buffer.state() == (2, 16, "running")  # a third one would make 24 bytes
    assert buffer.take() == [0]
    time.sleep(0.2)
    assert buffer.state() == (2, 16, "running")


def test_an_element_larger_than_max_bytes_goes_in_alone() -> None:
    buffer = TaskBuffer(1, max_bytes=10)
    assert buffer.put(["big"], 100)
    assert buffer.state() == (1, 100, "running")


def test_the_end_reaches_every_waiting_consumer() -> None:
    buffer = TaskBuffer(1)
    seen: list[Ending | None] = []

    def consume() -> None:
        with buffer.cond:
            while not buffer.ended:
                buffer.cond.wait(5.0)
            seen.append(buffer.ending())

    threads = [threading.Thread(target=consume) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.1)
    buffer.finish(drained=False)
    for thread in threads:
        thread.join(5)
    assert seen == [Ending.INPUT_ENDED] * 3
    assert buffer.completed() and buffer.drained_out()


def test_an_error_reaches_every_waiting_consumer_of_a_round() -> None:
    buffer = TaskBuffer(1)
    results: list[Any] = [None, None]

    def consume(index: int) -> None:
        results[index] = buffer.take_round(0, index, 2, timeout=5.0)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(0.1)
    assert buffer.put([0], 8)  # less than a round
    assert buffer.fail({"type": "ValueError", "message": "bad"})
    buffer.finish(drained=False)
    for thread in threads:
        thread.join(5)
    assert results == [Ending.FAILED, Ending.FAILED]
    assert buffer.failure() == {"type": "ValueError", "message": "bad"}
    assert len(buffer) == 0  # what was less than a round is dropped
    assert not buffer.completed()
    assert buffer.state()[2] == "failed: ValueError: bad"


def test_round_robin_gives_consumer_i_element_i_of_each_round() -> None:
    buffer = TaskBuffer(1, max_elements=4)
    produce(buffer, range(9))
    got: dict[int, list[Any]] = {0: [], 1: [], 2: []}

    def consume(consumer: int) -> None:
        for round_index in range(4):
            got[consumer].append(buffer.take_round(round_index, consumer, 3, timeout=5.0))

    threads = [threading.Thread(target=consume, args=(c,)) for c in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert got == {
        0: [[0], [3], [6], Ending.INPUT_ENDED],
        1: [[1], [4], [7], Ending.INPUT_ENDED],
        2: [[2], [5], [8], Ending.INPUT_ENDED],
    }


def test_a_round_not_complete_in_time_is_none_and_a_consumer_ahead_waits_for_the_slowest() -> None:
    buffer = TaskBuffer(1, round_window=2)
    assert buffer.put([0], 8)
    assert buffer.take_round(0, 0, 2, timeout=0.05) is None  # ask again
    for value in range(1, 10):
        assert buffer.put([value], 8)
    # Rounds 0 and 1 are cut and consumer 0 took neither: consumer 1 cannot be 4 ahead.
    assert buffer.take_round(4, 1, 2, timeout=0.05) is None
    got: list[Any] = []
    ahead = threading.Thread(target=lambda: got.append(buffer.take_round(4, 1, 2, timeout=10)))
    ahead.start()
    for round_index in range(3):
        assert buffer.take_round(round_index, 0, 2, timeout=0) == [2 * round_index]
        assert buffer.take_round(round_index, 1, 2, timeout=0) == [2 * round_index + 1]
    ahead.join(10)  # woken when rounds 2 and 3 are cut
    assert got == [[9]]
    assert buffer.take_round(3, 0, 2, timeout=0) == [6]
    assert buffer.take_round(3, 0, 2, timeout=0) == [6]  # again (a reply that was lost)
    assert buffer.take_round(3, 1, 2, timeout=0) == [7]
    with pytest.raises(OutOfRangeError, match="round 3 of task 1 is gone: every consumer"):
        buffer.take_round(3, 0, 2, timeout=0)


def test_stop_wakes_the_producer_and_drops_what_is_buffered() -> None:
    buffer = TaskBuffer(1, max_elements=1)
    assert buffer.put([0], 8)
    outcome: list[bool] = []
    thread = threading.Thread(target=lambda: outcome.append(buffer.put([1], 8)))
    thread.start()
    time.sleep(0.1)
    buffer.stop()
    thread.join(5)
    assert outcome == [False]
    assert buffer.state() == (0, 0, "stopped")
    assert buffer.ending() is Ending.GONE
    assert not buffer.fail({"type": "ValueError"})  # a stopped task's failure is not recorded
    assert not buffer.pause(1.0)


def test_a_drained_end_is_gone() -> None:
    buffer = TaskBuffer(1)
    buffer.drain()
    assert buffer.draining and buffer.state()[2] == "draining"
    buffer.finish(drained=True)
    assert buffer.ending() is Ending.GONE and not buffer.completed()


def test_a_split_is_handed_out_once_its_last_element_is_taken() -> None:
    buffer = TaskBuffer(1)
    assert not buffer.splits_in_hand()
    for offset in range(2):
        assert buffer.put([offset], 8, [5, offset])
    assert buffer.splits_in_hand()
    buffer.split_done(5)
    buffer.split_done(6)  # produced nothing: handed out at once
    assert buffer.handed_out_splits() == [6]
    tags: list[list[int]] = []
    assert buffer.take(tags) == [0]
    assert buffer.handed_out_splits() == [] and buffer.splits_in_hand()
    assert buffer.take(tags) == [1]
    assert tags == [[5, 0], [5, 1]]
    assert not buffer.splits_in_hand()
    assert buffer.handed_out_splits() == [5]
    assert buffer.handed_out_splits() == []


def test_take_many_hands_out_up_to_a_count_and_bytes_and_wakes_the_producer() -> None:
    buffer = TaskBuffer(1, max_elements=4)
    for offset in range(4):
        assert buffer.put([offset], 8 if offset else 100, [5, offset])
    buffer.split_done(5)
    blocked = produce(buffer, range(4, 6))  # waits: the buffer holds max_elements
    tags: list[list[int]] = []
    # The first element always goes, even past max_bytes; the next ones only within it.
    assert buffer.take_many(4, 50, tags) == ([[0]], 100)
    assert buffer.take_many(2, 50, tags) == ([[1], [2]], 16)
    assert buffer.handed_out_splits() == []
    assert buffer.take_many(10, 8, tags) == ([[3]], 8)
    assert tags == [[5, 0], [5, 1], [5, 2], [5, 3]]
    assert buffer.handed_out_splits() == [5]
    blocked.join(10)  # woken by the takes
    assert not blocked.is_alive()
    assert buffer.take_many(10, 1 << 20) == ([[4], [5]], 16)
    assert buffer.take_many(10, 1 << 20) == ([], 0) and buffer.nbytes == 0
