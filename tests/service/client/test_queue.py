"""Tests of feedline/service/client/queue.py: the queue between a consumer's fetch threads and
its reader, without sockets."""

from __future__ import annotations

import threading
import time

import pytest

from feedline.errors import InvalidArgumentError
from feedline.service.client import queue as queue_module
from feedline.service.client.queue import ElementQueue, Item
from feedline.service.protocol import TaskView


def running(*task_ids: int) -> list[TaskView]:
    return [TaskView(t, f"host:{t}", "running") for t in task_ids]


def one_task_queue(max_elements: int) -> ElementQueue:
    """A queue of ``max_elements`` (and 1 MiB) of a job whose one task, 1, runs."""
    queue = ElementQueue(max_elements=max_elements, max_bytes=1 << 20)
    queue.update(running(1), asked_after=0)
    return queue


def fetch(queue: ElementQueue, task_id: int, values: list[int]) -> None:
    """A fetch thread: one element per request, then the end of the task's input; after the
    last task's end, a view of the job that lists no other task."""
    for value in values:
        credits = queue.acquire()
        number = queue.start_reading(task_id)
        queue.put(task_id, [Item(value, 8, task_id)], credits)
        queue.done_reading(task_id, number)
    if not queue.end_tasks([task_id], completed=True):
        queue.update([], asked_after=queue.ends())


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The queue's clock, which only the test moves (``now[0]``)."""
    now = [0.0]
    monkeypatch.setattr(queue_module.time, "monotonic", lambda: now[0])
    return now


def read_paced(queue: ElementQueue, now: list[float], count: int, seconds_each: float) -> list[int]:
    """Reads ``count`` elements of task 1 ``seconds_each`` apart on the ``clock``, fetched as
    credits allow; the queue's size after each."""
    sizes = []
    for _ in range(count):
        if not len(queue):
            credits = queue.acquire()
            queue.put(1, [Item(i, 8, 1) for i in range(credits)], credits)
        now[0] += seconds_each
        assert queue.get(0) is not None
        sizes.append(queue.max_elements)
    return sizes


def drain(queue: ElementQueue) -> list[Item]:
    got = []
    while True:
        try:
            item = queue.get(5.0)
        except StopIteration:
            return got
        assert item is not None, "no element and no end within 5 s"
        got.append(item)


def test_fetch_threads_put_and_the_reader_takes_in_order_per_task() -> None:
    # task 1: [100, 101, ..., 149]; task 2: [200, 201, ..., 249], each read by its own thread.
    queue = ElementQueue(max_elements=3, max_bytes=1 << 20)
    assert queue.update(running(2, 1), asked_after=0) == [1, 2]
    threads = [
        threading.Thread(target=fetch, args=(queue, t, [100 * t + i for i in range(50)]))
        for t in (1, 2)
    ]
    for thread in threads:
        thread.start()
    got = drain(queue)
    for thread in threads:
        thread.join(5)
    assert [i.element for i in got if i.task_id == 1] == list(range(100, 150))
    assert [i.element for i in got if i.task_id == 2] == list(range(200, 250))
    assert (queue.returned(1), queue.returned(2), queue.credits) == (50, 50, 3)


def test_credits_bound_what_is_in_flight_and_buffered() -> None:
    queue = ElementQueue(max_elements=4, max_bytes=1 << 20)
    queue.update(running(1, 2), asked_after=0)
    assert queue.acquire() == 2  # an even share for each of the two tasks
    assert queue.acquire() == 1
    assert queue.acquire() == 1
    waited = threading.Event()

    def blocked() -> None:
        queue.acquire()
        waited.set()

    thread = threading.Thread(target=blocked, daemon=True)
    thread.start()
    time.sleep(0.2)
    assert not waited.is_set()  # no credit left
    queue.put(1, [Item("a", 1, 1)], 2)  # a request of 2 brought 1: one credit comes back
    assert waited.wait(5)
    assert len(queue) == 1 and queue.credits == 0


def test_bytes_buffered_bound_the_requests() -> None:
    queue = ElementQueue(max_elements=10, max_bytes=100)
    queue.update(running(1), asked_after=0)
    queue.put(1, [Item("big", 100, 1)], queue.acquire())
    got: list[int] = []
    thread = threading.Thread(target=lambda: got.append(queue.acquire()), daemon=True)
    thread.start()
    time.sleep(0.2)
    assert got == []  # 100 bytes buffered: no request
    item = queue.get(0)
    assert item is not None and item.element == "big"
    thread.join(5)
    assert got == [10]


def test_an_error_reaches_the_reader_at_every_call_even_with_elements_left() -> None:
    queue = one_task_queue(4)
    queue.put(1, [Item("a", 1, 1)], queue.acquire())
    error = InvalidArgumentError("bad element")
    queue.fail(error)
    queue.fail(ValueError("a later error"))  # the first counts
    for _ in range(2):
        with pytest.raises(InvalidArgumentError) as raised:
            queue.get(0)
        assert raised.value is error


@pytest.mark.parametrize("failed", [False, True], ids=["ended", "failed"])
def test_a_view_that_ends_the_job_wakes_the_reader_with_the_end_or_the_error(
    failed: bool,
) -> None:
    # A failed job's view lists its failed task as done: the reader it wakes raises the error,
    # never StopIteration (a consumer of a failed job that ended cleanly lost the error).
    queue = one_task_queue(4)
    raised: list[BaseException] = []

    def read() -> None:
        try:
            queue.get(10)
        except BaseException as error:
            raised.append(error)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.05)  # the reader waits
    error = KeyError("element 37 has no label") if failed else None
    queue.update([TaskView(1, "host:1", "done")], queue.ends(), finished=True, error=error)
    reader.join(5)
    assert not reader.is_alive()
    if failed:
        assert raised == [error]
    else:
        assert [type(e) for e in raised] == [StopIteration]


def test_the_end_waits_for_a_request_in_flight_and_for_a_newer_view() -> None:
    queue = one_task_queue(4)
    number = queue.start_reading(1)
    assert queue.end_tasks([1], completed=True) is False  # no task left to read
    assert queue.get(0) is None  # a reply may still be on its way
    queue.done_reading(1, number)
    assert queue.get(0) is None  # the task ended after the newest view was asked for
    queue.update(running(1), asked_after=queue.ends())  # a newer view lists no other task
    with pytest.raises(StopIteration):
        queue.get(0)


def test_two_requests_in_flight_to_a_task_each_hold_off_the_end() -> None:
    queue = one_task_queue(8)
    assert queue.acquire(parts=2) == 4  # half the task's share: another request may follow
    assert queue.acquire(parts=2, wait=False) == 2
    first, second = queue.start_reading(1), queue.start_reading(1)
    queue.end_tasks([1], completed=True)
    queue.update(running(1), asked_after=queue.ends())
    queue.done_reading(1, first)
    assert queue.get(0) is None  # the second reply may still bring elements
    queue.put(1, [Item("late", 8, 1)], 2)
    queue.done_reading(1, second)
    item = queue.get(0)
    assert item is not None and item.element == "late"
    with pytest.raises(StopIteration):
        queue.get(0)


def test_acquire_without_waiting_returns_nothing_when_there_is_no_room() -> None:
    queue = one_task_queue(2)
    assert queue.acquire() == 2
    assert queue.acquire(wait=False) == 0  # waiting, it would wait for ever: none come back
    queue.put(1, [], 2)
    assert queue.acquire(wait=False) == 2


def test_a_newer_view_with_another_task_is_no_end() -> None:
    queue = one_task_queue(4)
    queue.end_tasks([1], completed=True)
    assert queue.update(running(1, 2), asked_after=queue.ends()) == [2]
    assert queue.get(0) is None
    assert queue.end_tasks([2], completed=True) is False
    queue.update([], asked_after=queue.ends())
    with pytest.raises(StopIteration):
        queue.get(0)


def test_a_job_whose_tasks_were_all_lost_is_idle_not_ended(clock: list[float]) -> None:
    queue = ElementQueue(max_elements=4, max_bytes=1 << 20)
    queue.update([TaskView(1, "host:1", "lost")], asked_after=0)
    assert queue.get(0) is None
    assert queue.lost_addresses() == ["host:1"]
    clock[0] += 0.05
    assert queue.idle_overdue(0.01) == pytest.approx(0.05)
    assert queue.idle_overdue(0.01) is None  # reported once; the clock starts again
    clock[0] += 0.02
    assert queue.idle_overdue(0.01) == pytest.approx(0.02)
    queue.update([], asked_after=0, finished=True)  # the dispatcher ended the job
    with pytest.raises(StopIteration):
        queue.get(0)


def test_close_wakes_the_reader_and_the_fetch_threads() -> None:
    queue = one_task_queue(1)
    assert queue.acquire() == 1
    results: list[object] = []
    threads = [
        threading.Thread(target=lambda: results.append(queue.acquire()), daemon=True),
        threading.Thread(target=lambda: results.append(queue.get(30)), daemon=True),
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.1)
    started = time.monotonic()
    queue.close()
    for thread in threads:
        thread.join(5)
    assert time.monotonic() - started < 2
    assert sorted(results, key=str) == [0, None]
    queue.fail(ValueError("after close"))  # ignored: the reader was released
    assert queue.get(0) is None and queue.closed


def test_a_queue_that_follows_its_reader_holds_what_it_reads_in_hold_s(
    clock: list[float],
) -> None:
    queue = ElementQueue(max_elements=16, max_bytes=1 << 30, most_elements=1024)
    queue.update(running(1), asked_after=0)

    def read(seconds: float, seconds_each: float) -> None:
        """Elements read ``seconds_each`` apart for ``seconds`` (two measurements of the rate
        at least: the last one of this rate alone)."""
        read_paced(queue, clock, round(seconds / seconds_each), seconds_each)

    read(0.5, 1e-4)  # 10,000 elements a second
    assert queue.max_elements == round(10_000 * ElementQueue.HOLD_S) == 500
    read(0.5, 1e-5)  # 100,000 a second: at most most_elements
    assert queue.max_elements == 1024
    while len(queue):
        assert queue.get(0) is not None
    # A slower reader: the queue shrinks back, never below where it started; credits follow,
    # so that what it holds beyond its new size makes no request until it is read.
    credits = queue.acquire()
    queue.put(1, [Item(i, 8, 1) for i in range(900)], credits)
    read(0.5, 0.01)  # 100 a second: 5 in HOLD_S
    assert queue.max_elements == 16
    assert queue.credits == 16 - len(queue) < 0
    got: list[int] = []
    thread = threading.Thread(target=lambda: got.append(queue.acquire()), daemon=True)
    thread.start()
    thread.join(0.3)
    assert got == []  # nothing asked for while it holds more than its size
    while len(queue):  # read at the same slow pace
        clock[0] += 0.01
        assert queue.get(0) is not None
    thread.join(5)
    assert got and got[0] >= 1 and queue.credits == 16 - got[0]


def test_a_queue_that_starts_fast_grows_within_a_few_hundred_elements(
    clock: list[float],
) -> None:
    fast = ElementQueue(max_elements=16, max_bytes=1 << 30, most_elements=1024)
    fast.update(running(1), asked_after=0)
    sizes = read_paced(fast, clock, 1400, 1e-5)  # 100,000 a second, for 14 ms: well within RATE_S
    assert sorted(set(sizes)) == [16, 64, 256, 1024]  # at most 4x a measurement
    assert sizes.index(1024) < 1400 - 50
    # A reader that takes 200 elements as fast and pauses holds at most 64 meanwhile; after
    # the pause its queue follows measurements of RATE_S only: reading as fast again, it
    # does not grow within a few hundred elements (a consumer that shares a job with others).
    pausing = ElementQueue(max_elements=16, max_bytes=1 << 30, most_elements=1024)
    pausing.update(running(1), asked_after=0)
    assert read_paced(pausing, clock, 200, 1e-5)[-1] == 64
    clock[0] += 0.5
    assert read_paced(pausing, clock, 1, 1e-5) == [16]
    assert set(read_paced(pausing, clock, 1000, 1e-5)) == {16}
    # A consumer that shares its job with another does not start fast either.
    shared = ElementQueue(max_elements=16, max_bytes=1 << 30, most_elements=1024)
    shared.update(running(1), asked_after=0, consumers=2)
    assert set(read_paced(shared, clock, 1400, 1e-5)) == {16}


def test_a_queue_of_a_fixed_size_does_not_follow_its_reader(clock: list[float]) -> None:
    queue = ElementQueue(max_elements=16, max_bytes=1 << 30)
    queue.update(running(1), asked_after=0)
    read_paced(queue, clock, 1600, 1e-4)
    assert (queue.max_elements, queue.credits) == (16, 16)
