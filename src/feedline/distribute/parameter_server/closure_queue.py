"""``ClosureQueue``: the scheduled functions that the coordinator and its worker agents share.

The shape of TensorFlow's ``_CoordinatedClosureQueue``: the coordinator ``put``s closures and
``wait``s for them; each agent ``take``s one (or a batch, ``take_batch``), runs it on its worker
and then ``finish``es it (its value), ``fail``s it (the function raised), ``requeue``s it (the
worker was lost: the closure goes back to the front, for another worker) or ``cancel``s it (an
earlier closure of its batch failed, so it did not run). A closure is in flight from ``take``
to one of those four. Two kinds of error stop the queue:

* a function's error (``fail``): the closures still queued are cancelled, and the error is kept
  and raised by the next ``put`` that waits for room, ``wait``, ``done`` or ``raise_if_error``,
  once; then closures run again;
* an unrecoverable error (``abort``, a lost parameter server): the queued closures, and every
  one put back later, fail with it; ``take`` hands out nothing more, and every wait raises it.

All methods are thread-safe.

>>> from feedline.distribute.parameter_server.values import RemoteValue
>>> queue = ClosureQueue(max_pending=8)
>>> queue.put(Closure("f", b"", {}, RemoteValue("f", queue.raise_if_aborted)))
>>> closure = queue.take(timeout=0)
>>> queue.finish(closure, 42)
>>> queue.wait(timeout=0), closure.result.fetch()
(True, 42)
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any

from feedline.distribute.parameter_server.values import PerWorkerValues, RemoteValue
from feedline.errors import FailedPreconditionError

__all__ = ["Closure", "ClosureQueue"]


@dataclasses.dataclass
class Closure:
    """A scheduled function: its pickle, the PerWorkerValues it refers to, its result."""

    name: str
    data: bytes
    values: dict[int, PerWorkerValues]
    result: RemoteValue


class ClosureQueue:
    """Closures waiting for a worker, first in first out, and a count of those in flight.

    Args:
      max_pending: how many closures may wait before ``put`` blocks.
    """

    def __init__(self, max_pending: int) -> None:
        self._max_pending = max_pending
        self._cond = threading.Condition()
        self._queue: collections.deque[Closure] = collections.deque()
        self._in_flight = 0
        self._error: BaseException | None = None  # a function's, until raised
        self._aborted: BaseException | None = None  # unrecoverable: kept for good
        self._stopped = False

    # -- the coordinator's side -----------------------------------------------------------------
    def put(self, closure: Closure) -> None:
        """Queues ``closure``; while ``max_pending`` closures wait, first waits for room.

        Raises:
          while waiting: a kept error (as ``raise_if_error``), or ``FailedPreconditionError``
          once the queue is stopped (``closure`` is not queued then).
        """
        with self._cond:
            if self._full():
                self._cond.wait_for(lambda: not self._full() or self._stopped or self._has_error())
                self._raise_if_error()
                if self._stopped:
                    raise FailedPreconditionError("the coordinator stopped; nothing was scheduled")
            self._queue.append(closure)
            self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until every closure put has finished (at most ``timeout`` s when given).

        Returns:
          True when all have finished, False when ``timeout`` passed first.

        Raises:
          a kept error (as ``raise_if_error``), as soon as there is one.
        """
        with self._cond:
            self._cond.wait_for(lambda: self._has_error() or not self._unfinished(), timeout)
            self._raise_if_error()
            return not self._unfinished()

    def done(self) -> bool:
        """Whether every closure put has finished; raises as ``wait`` does."""
        with self._cond:
            self._raise_if_error()
            return not self._unfinished()

    @property
    def unfinished(self) -> int:
        """How many closures are queued or in flight."""
        with self._cond:
            return self._unfinished()

    def raise_if_error(self) -> None:
        """Raises the unrecoverable error, or else a function's error (which is then dropped)."""
        with self._cond:
            self._raise_if_error()

    def raise_if_aborted(self) -> None:
        """Raises the unrecoverable error, if ``abort`` was called."""
        error = self._aborted
        if error is not None:
            raise error

    def stop(self) -> None:
        """Wakes every ``take`` (it returns None from now on) and every ``put`` waiting for
        room (it raises); closures still queued are not run. Idempotent."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    # -- the agents' side -----------------------------------------------------------------------
    def take(self, timeout: float | None = None) -> Closure | None:
        """The oldest queued closure, now in flight; waits for one at most ``timeout`` s (None:
        until there is one). None when none came, and once stopped or aborted."""
        taken = self.take_batch(1, timeout)
        return taken[0] if taken else None

    def take_batch(self, limit: int, timeout: float | None = None, share: int = 1) -> list[Closure]:
        """The oldest queued closures, in flight: at most ``limit``, and at most one
        ``share``-th (rounded up) of those queued now; waits for one at most ``timeout`` s
        (None: until there is one). Empty when none came, and once stopped or aborted."""
        with self._cond:
            self._cond.wait_for(
                lambda: (self._queue and self._aborted is None) or self._stopped, timeout
            )
            if not self._queue or self._stopped or self._aborted is not None:
                return []
            if self._full():
                self._cond.notify_all()  # a put waits for this room
            count = min(limit, -(-len(self._queue) // max(1, share)))
            self._in_flight += count
            return [self._queue.popleft() for _ in range(count)]

    def requeue(self, closure: Closure) -> None:
        """Puts ``closure``, in flight, back at the front of the queue (its worker was lost);
        after ``abort`` it fails with the unrecoverable error instead."""
        with self._cond:
            self._in_flight -= 1
            if self._aborted is not None:
                closure.result._fail(self._aborted)
            else:
                self._queue.appendleft(closure)
            self._cond.notify_all()

    def finish(self, closure: Closure, value: Any) -> None:
        """``closure``, in flight, returned ``value``."""
        closure.result._set(value)
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def fail(self, closure: Closure, error: BaseException) -> None:
        """``closure``, in flight, raised ``error``: its result raises it, the closures still
        queued are cancelled (their results raise ``FailedPreconditionError``), and ``error`` is
        kept unless an earlier one still is."""
        closure.result._fail(error)
        cancelled = _cancelled(error)
        with self._cond:
            if self._error is None:
                self._error = error
            pending, self._queue = list(self._queue), collections.deque()
            for other in pending:
                other.result._fail(cancelled)
            self._in_flight -= 1
            self._cond.notify_all()

    def cancel(self, closure: Closure, error: BaseException) -> None:
        """``closure``, in flight, was not run because ``error`` ended the functions sent with
        it: its result fails with the unrecoverable error after ``abort``, else with a
        cancellation naming ``error`` (as ``fail`` cancels the queued closures)."""
        closure.result._fail(self._aborted if self._aborted is not None else _cancelled(error))
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def report(self, error: BaseException) -> None:
        """Keeps ``error``, raised by no closure (a per-worker dataset that cannot be made), to
        raise as a function's error, unless an earlier one still is; cancels nothing."""
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    def abort(self, error: BaseException, closure: Closure | None = None) -> None:
        """An unrecoverable ``error``: the queued closures fail with it, and so does
        ``closure`` (in flight, when given); the first such error is kept for good."""
        with self._cond:
            if self._aborted is None:
                self._aborted = error
            pending, self._queue = list(self._queue), collections.deque()
            if closure is not None:
                self._in_flight -= 1
            self._cond.notify_all()
        if closure is not None:
            closure.result._fail(error)
        for other in pending:
            other.result._fail(error)

    @property
    def aborted(self) -> bool:
        """Whether ``abort`` was called."""
        return self._aborted is not None

    # -- under _cond ----------------------------------------------------------------------------
    def _full(self) -> bool:
        return len(self._queue) >= self._max_pending

    def _unfinished(self) -> int:
        return len(self._queue) + self._in_flight

    def _has_error(self) -> bool:
        return self._error is not None or self._aborted is not None

    def _raise_if_error(self) -> None:
        if self._aborted is not None:
            raise self._aborted
        error, self._error = self._error, None
        if error is not None:
            raise error


def _cancelled(error: BaseException) -> FailedPreconditionError:
    return FailedPreconditionError(
        f"cancelled: an earlier scheduled function failed ({type(error).__name__}: "
        f"{error}); schedule it again"
    )
