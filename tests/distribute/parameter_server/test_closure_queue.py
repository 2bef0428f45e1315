"""``ClosureQueue`` alone, with threads in place of the worker agents: order, batches, requeue
at the front, waiting, a function's error (kept, raised once, the queue cancelled), an unrecoverable
error, stop, and four takers finishing 1,000 closures."""

from __future__ import annotations

import doctest
import threading
import time
from collections.abc import Callable

import pytest

from feedline.distribute.parameter_server import closure_queue
from feedline.distribute.parameter_server.closure_queue import Closure, ClosureQueue
from feedline.distribute.parameter_server.values import RemoteValue
from feedline.errors import FailedPreconditionError, UnavailableError


def _closure(queue: ClosureQueue, name: str) -> Closure:
    return Closure(name, name.encode(), {}, RemoteValue(name, queue.raise_if_aborted))


def _put(queue: ClosureQueue, *names: str) -> list[Closure]:
    closures = [_closure(queue, name) for name in names]
    for closure in closures:
        queue.put(closure)
    return closures


def _take(queue: ClosureQueue) -> Closure:
    closure = queue.take(timeout=0)
    assert closure is not None
    return closure


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Runs ``fn`` in a daemon thread; the list gets what it returned or raised."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as error:
            out.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_closures_are_taken_in_the_order_they_were_put() -> None:
    queue = ClosureQueue(max_pending=8)
    _put(queue, "a", "b", "c")
    assert [_take(queue).name for _ in range(3)] == ["a", "b", "c"]
    assert queue.take(timeout=0) is None
    assert queue.unfinished == 3  # all three in flight


def test_a_requeued_closure_goes_back_to_the_front() -> None:
    queue = ClosureQueue(max_pending=8)
    _put(queue, "a", "b", "c")
    a = _take(queue)
    queue.requeue(a)
    assert queue.unfinished == 3
    assert [_take(queue).name for _ in range(3)] == ["a", "b", "c"]
    assert not a.result.done


def test_a_batch_takes_at_most_its_limit_and_share_of_the_oldest_closures() -> None:
    queue = ClosureQueue(max_pending=8)
    _put(queue, "a", "b", "c")
    assert [c.name for c in queue.take_batch(2, timeout=0)] == ["a", "b"]
    assert [c.name for c in queue.take_batch(5, timeout=0)] == ["c"]
    assert queue.take_batch(5, timeout=0) == []
    assert queue.unfinished == 3  # all three in flight
    _put(queue, "d", "e", "f", "g", "h")
    # A share of 2 (two takers): half of those queued, rounded up.
    assert [c.name for c in queue.take_batch(10, timeout=0, share=2)] == ["d", "e", "f"]
    assert [c.name for c in queue.take_batch(10, timeout=0, share=2)] == ["g"]
    assert [c.name for c in queue.take_batch(10, timeout=0, share=2)] == ["h"]


def test_closures_of_a_batch_after_one_that_failed_are_cancelled() -> None:
    queue = ClosureQueue(max_pending=8)
    _put(queue, "a", "b", "c", "d")
    a, b, c = queue.take_batch(3, timeout=0)
    queue.finish(a, 1)
    error = ValueError("b failed")
    queue.fail(b, error)
    queue.cancel(c, error)
    assert a.result.fetch() == 1
    with pytest.raises(ValueError, match="b failed"):
        b.result.fetch()
    with pytest.raises(FailedPreconditionError, match=r"cancelled: .*\(ValueError: b failed\)"):
        c.result.fetch(timeout=1)
    assert queue.take(timeout=0) is None  # "d", queued, cancelled by the failure
    with pytest.raises(ValueError, match="b failed"):  # kept once, as for any failure
        queue.wait(timeout=1)
    assert queue.unfinished == 0


def test_wait_returns_once_every_closure_finished() -> None:
    queue = ClosureQueue(max_pending=8)
    assert queue.wait(timeout=0) and queue.done()
    a, b = _put(queue, "a", "b")
    assert not queue.wait(timeout=0.05) and not queue.done()
    waiter, waited = _in_thread(lambda: queue.wait(timeout=10))
    queue.finish(_take(queue), 1)
    assert queue.unfinished == 1 and not queue.done()
    time.sleep(0.05)
    assert waiter.is_alive()
    queue.finish(_take(queue), 2)
    waiter.join(10)
    assert waited == [True] and queue.done() and queue.unfinished == 0
    assert (a.result.fetch(), b.result.fetch()) == (1, 2)


def test_take_waits_for_a_closure_at_most_its_timeout() -> None:
    queue = ClosureQueue(max_pending=8)
    start = time.monotonic()
    assert queue.take(timeout=0.2) is None
    assert time.monotonic() - start >= 0.19
    taker, taken = _in_thread(lambda: queue.take(timeout=10))
    time.sleep(0.05)
    (a,) = _put(queue, "a")
    taker.join(10)
    assert taken == [a]


def test_put_waits_for_room() -> None:
    queue = ClosureQueue(max_pending=2)
    _put(queue, "a", "b")
    putter, put = _in_thread(lambda: queue.put(_closure(queue, "c")))
    time.sleep(0.1)
    assert putter.is_alive() and queue.unfinished == 2
    assert _take(queue).name == "a"
    putter.join(10)
    assert put == [None]
    assert [_take(queue).name for _ in range(2)] == ["b", "c"]


def test_a_failed_closure_cancels_the_queue_and_its_error_is_raised_once() -> None:
    queue = ClosureQueue(max_pending=8)
    _, b, c = _put(queue, "a", "b", "c")
    a = _take(queue)
    waiter, waited = _in_thread(lambda: queue.wait(timeout=10))
    error = ValueError("a failed")
    queue.fail(a, error)
    waiter.join(10)
    assert waited == [error]
    with pytest.raises(ValueError, match="a failed"):
        a.result.fetch()
    for cancelled in (b, c):
        with pytest.raises(FailedPreconditionError, match=r"cancelled: .*\(ValueError: a failed\)"):
            cancelled.result.fetch(timeout=1)
    # Raised once; then the queue runs closures again.
    assert queue.done() and queue.wait(timeout=0)
    (d,) = _put(queue, "d")
    queue.finish(_take(queue), 4)
    assert d.result.fetch() == 4


def test_a_put_waiting_for_room_raises_the_error_that_emptied_the_queue() -> None:
    queue = ClosureQueue(max_pending=2)
    _put(queue, "a", "b")
    putter, put = _in_thread(lambda: queue.put(_closure(queue, "c")))
    time.sleep(0.1)
    queue.fail(_take(queue), ValueError("a failed"))
    putter.join(10)
    assert len(put) == 1 and isinstance(put[0], ValueError)
    assert queue.unfinished == 0  # "b" cancelled, "c" not queued


def test_the_first_error_is_kept_until_raised() -> None:
    queue = ClosureQueue(max_pending=8)
    _put(queue, "a", "b")
    a, b = _take(queue), _take(queue)
    queue.fail(a, ValueError("first"))
    queue.fail(b, KeyError("second"))
    queue.report(RuntimeError("no closure"))
    with pytest.raises(ValueError, match="first"):
        queue.done()
    with pytest.raises(KeyError, match="second"):
        b.result.fetch()
    assert queue.done()
    queue.report(RuntimeError("a dataset that cannot be made"))
    with pytest.raises(RuntimeError, match="cannot be made"):
        queue.raise_if_error()
    queue.raise_if_error()


def test_a_reported_error_cancels_nothing() -> None:
    queue = ClosureQueue(max_pending=8)
    (a,) = _put(queue, "a")
    queue.report(RuntimeError("a dataset that cannot be made"))
    with pytest.raises(RuntimeError, match="cannot be made"):
        queue.wait(timeout=10)
    queue.finish(_take(queue), 1)
    assert a.result.fetch() == 1 and queue.done()


def test_an_abort_fails_every_closure_and_every_wait() -> None:
    queue = ClosureQueue(max_pending=8)
    a, b, c = _put(queue, "a", "b", "c")
    taken_a, taken_b = _take(queue), _take(queue)
    error = UnavailableError("ps 0 is gone")
    queue.abort(error, taken_a)
    assert queue.aborted
    # The closure it came with and the queued one fail with it; the one in flight fails with
    # it when it comes back.
    for closure in (a, c):
        with pytest.raises(UnavailableError, match="ps 0 is gone"):
            closure.result.fetch(timeout=1)
    assert not b.result.done
    with pytest.raises(UnavailableError, match="ps 0 is gone"):
        b.result.fetch(timeout=0.3)  # a fetch that waits raises it too
    queue.requeue(taken_b)
    with pytest.raises(UnavailableError, match="ps 0 is gone"):
        b.result.fetch(timeout=1)
    assert queue.unfinished == 0 and queue.take(timeout=0) is None
    for _ in range(2):  # for good
        with pytest.raises(UnavailableError, match="ps 0 is gone"):
            queue.wait(timeout=1)
        with pytest.raises(UnavailableError, match="ps 0 is gone"):
            queue.done()
    queue.abort(UnavailableError("a later one"))
    with pytest.raises(UnavailableError, match="ps 0 is gone"):
        queue.raise_if_aborted()


def test_stop_wakes_takers_and_a_put_waiting_for_room() -> None:
    queue = ClosureQueue(max_pending=1)
    takers = [_in_thread(queue.take) for _ in range(3)]  # no timeout
    time.sleep(0.05)
    queue.stop()
    for thread, taken in takers:
        thread.join(10)
        assert taken == [None]
    _put(queue, "a")  # not full: queued, never taken
    assert queue.take(timeout=10) is None  # at once
    putter, put = _in_thread(lambda: queue.put(_closure(queue, "b")))
    putter.join(10)
    assert len(put) == 1 and isinstance(put[0], FailedPreconditionError)

    queue = ClosureQueue(max_pending=1)
    _put(queue, "a")
    putter, put = _in_thread(lambda: queue.put(_closure(queue, "b")))
    time.sleep(0.1)
    assert putter.is_alive()
    queue.stop()
    putter.join(10)
    assert len(put) == 1 and isinstance(put[0], FailedPreconditionError)
    assert queue.unfinished == 1
    queue.stop()  # idempotent


def test_four_takers_finish_every_closure_exactly_once() -> None:
    queue = ClosureQueue(max_pending=64)  # the producer waits for room now and then
    count = 1000
    finished: list[list[str]] = [[] for _ in range(4)]
    lost: set[str] = set()

    def take_and_finish(mine: list[str]) -> None:
        while (closure := queue.take(timeout=10)) is not None:
            if int(closure.name) % 7 == 0 and closure.name not in lost:  # its worker was lost
                lost.add(closure.name)
                queue.requeue(closure)
            else:
                mine.append(closure.name)
                queue.finish(closure, int(closure.name))

    takers = [
        threading.Thread(target=take_and_finish, args=(mine,), daemon=True) for mine in finished
    ]
    for taker in takers:
        taker.start()
    closures = _put(queue, *map(str, range(count)))
    assert queue.wait(timeout=60)
    queue.stop()
    for taker in takers:
        taker.join(10)
        assert not taker.is_alive()
    names = sorted(int(name) for mine in finished for name in mine)
    assert names == list(range(count))  # each finished once
    assert len(lost) == len(range(0, count, 7))
    assert [c.result.fetch(timeout=0) for c in closures] == list(range(count))


def test_the_docstring_example_runs() -> None:
    results = doctest.testmod(closure_queue)
    assert results.attempted and not results.failed
