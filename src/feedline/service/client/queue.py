"""``ElementQueue``: what a consumer's fetch threads hand its job reader.

The reader (``job_reader._JobReader``) owns the queue and gives it to its fetch threads
(``fetch.Fetchers``); neither reaches into the other. The queue is bounded twice: by
*credits* (elements in flight and buffered: a fetch thread ``acquire``\\ s them before a request
and ``put`` returns those the reply did not use) and by bytes buffered. It also keeps what is
known of the job's tasks (their addresses, which ended and how, which have a request in flight),
so that ``get`` can tell the end of the job from a pause:

====================================================  ==========================================
``get`` finds                                         it
====================================================  ==========================================
an error (``fail``)                                   raises it, at every call
an element                                            returns it (in the order they were put;
                                                      per task, in the order the task gave them)
every task ended, none with a request in flight,      raises ``StopIteration``
one at least because its input did (``done``), and
a view asked for after the last end lists no other
task (or the dispatcher ended the job)
the queue closed                                      returns None at once
nothing yet                                           waits up to ``timeout``, then returns None
====================================================  ==========================================

Example:
  >>> queue = ElementQueue(max_elements=2, max_bytes=1 << 20)
  >>> queue.update([TaskView(7, "host:1", "running")], asked_after=0)
  [7]
  >>> credits = queue.acquire(); credits
  2
  >>> queue.put(7, [Item("a", 1, 7), Item("b", 1, 7)], credits)
  >>> queue.get(0).element, queue.get(0).element
  ('a', 'b')
  >>> queue.end_tasks([7], completed=True)  # no task left to read
  False
  >>> queue.get(0) is None  # until a view asked for since then lists no other task
  True
  >>> queue.update([], asked_after=queue.ends())
  []
  >>> queue.get(0)
  Traceback (most recent call last):
  ...
  StopIteration
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from feedline.service.protocol import TaskView

__all__ = ["ElementQueue", "Item"]


class Item(NamedTuple):
    """An element in the queue: its ``size`` in bytes, the task it came from, and in
    exactly-once jobs its ``[split, offset]`` (``tag``). (A tuple: one is made per element.)"""

    element: Any
    size: int
    task_id: int
    tag: Sequence[int] | None = None


class ElementQueue:
    """A bounded, thread-safe queue of a job's elements, and what is known of the job's tasks.

    Fetch threads call ``acquire``, ``start_reading``, ``done_reading``, ``put``,
    ``end_tasks``, ``fail`` and ``wait_closed``; the reader calls ``update`` (with each view of
    the job), ``get``, ``nudge`` and ``close``, its heartbeat ``wait_nudged``. See the module's
    docstring for what ``get`` does.

    Args:
      max_elements: the most elements in flight and buffered.
      max_bytes: no request is made while this many bytes are buffered.
      most_elements: with it, ``max_elements`` follows the reader: about ``HOLD_S`` of what
        ``get`` returned lately (measured over ``RATE_S`` at a time), never fewer than the
        first ``max_elements`` nor more than ``most_elements``.
    """

    #: With ``most_elements``: the seconds of reading that the queue holds ahead.
    HOLD_S = 0.05
    #: With ``most_elements``: how long each measurement of the reading rate lasts (at most).
    RATE_S = 0.2
    #: With ``most_elements``, until the first measurement of ``RATE_S``: a measurement also
    #: ends once this many times the queue's size was read, and grows it at most as many times.
    GROWTH = 4

    def __init__(self, max_elements: int, max_bytes: int, most_elements: int | None = None) -> None:
        self._cond = threading.Condition()
        self._closed = threading.Event()
        self._nudged = threading.Event()  # the reader's heartbeat goes now (``nudge``)
        self._items: collections.deque[Item] = collections.deque()
        self._credits = max_elements
        self.max_elements = max_elements
        self._least = max_elements
        self._most = most_elements
        self._taken = 0  # elements ``get`` returned since ``_since``
        self._starting = True  # no measurement of RATE_S yet (``_follow_reader``)
        self._since: float | None = None
        self._bytes = 0
        self._max_bytes = max_bytes
        self._error: BaseException | None = None
        self._tasks: dict[int, str] = {}
        self._completed: set[int] = set()  # the task's input ended and it handed out all
        self._lost: set[int] = set()  # its worker left or was dropped
        # Requests in flight, by task: elements a worker handed out before it said it was
        # done may still be on their way here.
        self._in_flight: collections.Counter[int] = collections.Counter()
        # Every request gets a number (``start_reading``); those still in flight.
        self._requests = 0
        self._outstanding: set[int] = set()
        self._returned: collections.Counter[int] = collections.Counter()
        # How many times a task ended here, and that count when the newest view applied was
        # asked for: the end of the tasks known here is the end of the job only once a view
        # asked for after it lists no other task (a worker that registers mid-job gets a task
        # of it, which the consumer may not have heard of yet).
        self._ends = 0
        self._viewed_ends = 0
        self._job_finished = False
        #: The end of the tasks known here is never the end of the input; only a view that
        #: says the job ended is (a trainer of an exactly-once cross-trainer job: the
        #: dispatcher also says when it has every element, and a done split it lacks, of a
        #: lost task, may run again in a new task after the others ended).
        self.ends_by_view = False
        self._idle_since: float | None = None  # since when no task of the job can be read

    # -- the job's tasks ----------------------------------------------------------------------
    def update(
        self,
        tasks: Iterable[TaskView],
        asked_after: int,
        finished: bool = False,
        consumers: int = 1,
        error: BaseException | None = None,
    ) -> list[int]:
        """Takes in a view of the job: its ``tasks``, whether it ``finished`` (with ``error``
        if it failed) and how many ``consumers`` read it, asked for once ``asked_after`` tasks
        had ended here (``ends``). The ids of the tasks new here, sorted.

        A failed job's view ends it and fails it at once: a reader that it wakes raises the
        error, never ``StopIteration`` (the view lists the failed task as done)."""
        with self._cond:
            if error is not None:
                self._fail(error)
            if consumers > 1:  # it shares its job: no fast start (``_follow_reader``)
                self._starting = False
            listed = list(tasks)
            for task in listed:
                if task.state == "done":
                    self._completed.add(task.task_id)
                elif task.state == "lost":
                    self._lost.add(task.task_id)
            new = sorted({t.task_id for t in listed if t.task_id not in self._tasks})
            self._tasks.update((t.task_id, t.address) for t in listed if t.task_id in new)
            self._viewed_ends = max(self._viewed_ends, asked_after)
            # A job never starts again: an older view answered late does not undo the end.
            self._job_finished = self._job_finished or finished
            self._note_liveness()
            self._cond.notify_all()
            return new

    def end_tasks(self, task_ids: Iterable[int], completed: bool) -> bool:
        """``task_ids`` ended (their input, if ``completed``; else they are gone). Whether a
        task known here can still be read."""
        with self._cond:
            (self._completed if completed else self._lost).update(task_ids)
            self._ends += 1
            self._note_liveness()
            self._cond.notify_all()
            return any(self._readable(t) for t in self._tasks)

    def readable(self, task_id: int) -> bool:
        """Whether ``task_id`` has neither ended nor been lost."""
        with self._cond:
            return self._readable(task_id)

    def is_lost(self, task_id: int) -> bool:
        """Whether ``task_id``'s worker left or was dropped."""
        with self._cond:
            return task_id in self._lost

    def tasks(self) -> list[tuple[int, str]]:
        """The tasks known here, ``(task_id, address)`` sorted by id."""
        with self._cond:
            return sorted(self._tasks.items())

    def address(self, task_id: int) -> str | None:
        """The address of ``task_id``'s worker, None if the task is not known here."""
        with self._cond:
            return self._tasks.get(task_id)

    def lost_addresses(self) -> list[str]:
        """The addresses of the lost tasks' workers, sorted."""
        with self._cond:
            return sorted(self._tasks[t] for t in self._lost if t in self._tasks)

    @property
    def job_finished(self) -> bool:
        """Whether a view said that the dispatcher ended the job."""
        with self._cond:
            return self._job_finished

    def ends(self) -> int:
        """How many times tasks ended here (``asked_after`` of ``update``)."""
        with self._cond:
            return self._ends

    def returned(self, task_id: int) -> int:
        """The elements of ``task_id`` that ``get`` returned."""
        with self._cond:
            return self._returned[task_id]

    @property
    def idle_since(self) -> float | None:
        """Since when (``time.monotonic``) no task of the job could be read; None while one
        can, or the job ended."""
        with self._cond:
            return self._idle_since

    def idle_overdue(self, limit_s: float) -> float | None:
        """How long no task of the job could be read, if longer than ``limit_s``; the clock
        starts again (each overdue wait is reported once)."""
        now = time.monotonic()
        with self._cond:
            if self._idle_since is None or now - self._idle_since <= limit_s:
                return None
            waited, self._idle_since = now - self._idle_since, now
            return waited

    # -- the fetch threads ---------------------------------------------------------------------
    def acquire(self, minimum: int = 1, *, parts: int = 1, wait: bool = True) -> int:
        """Credits for one request, waiting for room (for ``minimum`` credits, or as many as
        the queue holds when it is empty): at most an even share among the tasks that can be
        read, divided by ``parts`` (the requests a fetch thread keeps in flight to its task);
        0 once the queue is closed, or without ``wait`` when there is no room now."""
        with self._cond:
            while not self._closed.is_set() and (
                self._credits <= 0
                or self._bytes >= self._max_bytes
                or (self._credits < minimum and self._items)
            ):
                if not wait:
                    return 0
                self._cond.wait(0.5)
            if self._closed.is_set():
                return 0
            active = max(1, sum(1 for t in self._tasks if self._readable(t)))
            share = max(1, self._credits // (active * max(1, parts)))
            self._credits -= share
            return share

    def start_reading(self, task_id: int) -> int:
        """Marks a request to ``task_id`` as in flight (the job cannot end meanwhile): its
        number, for ``done_reading``."""
        with self._cond:
            self._in_flight[task_id] += 1
            self._requests += 1
            self._outstanding.add(self._requests)
            return self._requests

    def done_reading(self, task_id: int, number: int) -> None:
        """The request ``number`` to ``task_id`` (``start_reading``) ended."""
        with self._cond:
            self._in_flight[task_id] -= 1
            if self._in_flight[task_id] <= 0:
                del self._in_flight[task_id]
            self._outstanding.discard(number)
            self._cond.notify_all()

    def requests_made(self) -> int:
        """How many requests were made so far (a mark for ``answered_through``)."""
        with self._cond:
            return self._requests

    def answered_through(self, mark: int) -> bool:
        """Whether every request up to ``mark`` (``requests_made``) has its reply delivered."""
        with self._cond:
            return all(number > mark for number in self._outstanding)

    def put(self, task_id: int, items: Sequence[Item], credits: int) -> None:
        """Adds ``items`` of ``task_id``, which a request of ``credits`` brought (those it did
        not use are returned)."""
        with self._cond:
            self._items.extend(items)
            self._credits += credits - len(items)
            self._bytes += sum(item.size for item in items)
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """The job failed: ``get`` raises ``error`` from now on (the first error counts, and
        none once the queue is closed)."""
        with self._cond:
            self._fail(error)
            self._cond.notify_all()

    def close(self) -> None:
        """Nothing more comes: waiting fetch threads and ``get`` return. Idempotent."""
        with self._cond:
            self._closed.set()
            self._nudged.set()
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self._closed.is_set()

    @property
    def credits(self) -> int:
        """The elements that may still be asked for (neither in flight nor buffered)."""
        with self._cond:
            return self._credits

    def wait_closed(self, seconds: float) -> bool:
        """Sleeps ``seconds`` or until the queue closes; whether it is closed."""
        return self._closed.wait(seconds)

    def nudge(self) -> None:
        """Ends the heartbeat's ``wait_nudged`` now (the reader waits for what a report of
        its receipts lets come)."""
        self._nudged.set()

    def wait_nudged(self, seconds: float) -> bool:
        """Sleeps ``seconds``, or until ``nudge`` is called or the queue closes; whether it is
        closed."""
        self._nudged.wait(seconds)
        self._nudged.clear()
        return self._closed.is_set()

    def held(self) -> list[Any]:
        """The elements buffered, in order."""
        with self._cond:
            return [item.element for item in self._items]

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    # -- the reader ----------------------------------------------------------------------------
    def get(self, timeout: float) -> Item | None:
        """The next element, or None if the queue is closed or none came within ``timeout``.

        Raises:
          StopIteration: the job's input ended.
          BaseException: the error the job failed with (``fail``).
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                if self._items:
                    item = self._items.popleft()
                    self._returned[item.task_id] += 1
                    self._credits += 1
                    self._bytes -= item.size
                    if self._most is not None:
                        self._follow_reader()
                    self._cond.notify_all()
                    return item
                if self._finished():
                    raise StopIteration
                remaining = deadline - time.monotonic()
                if self._closed.is_set() or remaining <= 0:
                    return None
                self._cond.wait(remaining)

    # -- under the lock ------------------------------------------------------------------------
    def _follow_reader(self) -> None:
        """Counts an element returned; once per ``RATE_S``, sizes ``max_elements`` to hold
        ``HOLD_S`` of the rate at which they were returned (credits move with it: a queue
        that shrinks below what it holds makes no request until it is under again). Until the
        first such measurement, and while the consumer has its job to itself (``update``), one
        also ends once ``GROWTH`` times the queue's size was returned, growing it at most
        ``GROWTH`` times: so a reader that reads fast from the start has 1,024 in ~1,300
        elements, not after ``RATE_S`` at 16, and one that reads a few and pauses still holds
        few. Consumers that share a job grow by measurements of ``RATE_S`` only, so that none
        holds many elements ahead at the job's end when all read fast."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
            return
        self._taken += 1
        elapsed = now - self._since
        if elapsed < self.RATE_S and not (
            self._starting and self._taken >= self.GROWTH * self.max_elements
        ):
            return
        assert self._most is not None
        wanted = round(self._taken / max(elapsed, 1e-6) * self.HOLD_S)
        if elapsed < self.RATE_S:
            wanted = min(wanted, self.GROWTH * self.max_elements)
        else:
            self._starting = False
        size = min(self._most, max(self._least, wanted))
        self._credits += size - self.max_elements
        self.max_elements = size
        self._taken, self._since = 0, now

    def _readable(self, task_id: int) -> bool:
        return task_id not in self._completed and task_id not in self._lost

    def _finished(self) -> bool:
        if self._error is not None or self._in_flight:
            return False
        if not self._tasks:
            return self._job_finished
        if not set(self._tasks) <= self._completed | self._lost:
            return False
        if self._job_finished:
            return True
        return not self.ends_by_view and bool(self._completed) and self._viewed_ends >= self._ends

    def _fail(self, error: BaseException) -> None:
        if self._error is None and not self._closed.is_set():
            self._error = error

    def _note_liveness(self) -> None:
        readable = any(self._readable(t) for t in self._tasks)
        if readable or self._job_finished or self._finished():
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = time.monotonic()
