"""A task's buffer: what its producer thread and its replies to consumers share.

The producer (``task.Task``) ``put``s each element, waiting while the buffer holds
``max_bytes`` or ``max_elements`` already, and ends with ``finish`` (after ``fail`` when the
input raised). The replies (``replies.TaskReplies``) ``take`` elements first come, first served,
or read them in rounds (``take_round``): the buffer cuts its elements into rounds of
``num_consumers`` and consumer ``i`` gets element ``i`` of each round, and keeps at most
``round_window`` rounds that not every consumer took: a consumer further ahead of the slowest
one waits (as in TensorFlow, where round-robin consumers move in lockstep). Whoever must see
several of its values at once holds ``cond`` (a reentrant condition) around the calls; every
method is thread-safe alone.

In exactly-once jobs each element carries its tag ``[split key, offset]``, and the buffer keeps
track of the splits whose every element was handed out (``handed_out_splits``).

Example:
  >>> buffer = TaskBuffer(task_id=7)
  >>> for x in range(4):
  ...     _ = buffer.put([x], 8)
  >>> buffer.finish(drained=False)
  >>> buffer.take_round(0, 1, num_consumers=2, timeout=0), buffer.take_round(1, 0, 2, 0)
  ([1], [2])
  >>> buffer.take_round(2, 0, 2, 0)
  <Ending.INPUT_ENDED: 'eos'>
"""

from __future__ import annotations

import collections
import enum
import operator
import threading
import time
from typing import Any

from feedline.errors import OutOfRangeError
from feedline.service.worker.memory import BufferMemory

__all__ = ["BUFFER_BYTES", "BUFFER_ELEMENTS", "ROUND_WINDOW", "Ending", "TaskBuffer"]

#: A task's buffer holds at most this many bytes and elements.
BUFFER_BYTES = 64 << 20
BUFFER_ELEMENTS = 4096
#: The most round-robin rounds a task keeps cut and not yet taken by every consumer: a consumer
#: that asks for a round further ahead of the slowest one waits for it.
ROUND_WINDOW = 256
# How often a producer held back by the worker's shared bound (not its own) looks again: other
# tasks' buffers free that memory, and they do not notify this one.
_SHARED_POLL_S = 0.02


class Ending(enum.Enum):
    """Why a task gives nothing more (the key of the reply that says so)."""

    #: The task failed: its consumers get its error report (``TaskBuffer.failure``).
    FAILED = "error"
    #: The worker gives nothing more though the input did not end (it drained or stops).
    GONE = "gone"
    #: The task's input ended and everything was handed out.
    INPUT_ENDED = "eos"


class TaskBuffer:
    """The elements a task produced and has not handed out yet, bounded in bytes and elements,
    and the task's state (running, draining, ended, failed, stopped).

    Args:
      task_id: the task (named in errors).
      max_bytes: ``put`` waits while the buffer holds elements and the new one would pass
        this many bytes...
      max_elements: ...or while it holds this many elements.
      round_window: the most round-robin rounds cut and not yet taken by every consumer.
      memory: the bound this buffer shares with the worker's other buffers
        (``memory.BufferMemory``); None: only its own bounds.
    """

    def __init__(
        self,
        task_id: int,
        max_bytes: int = BUFFER_BYTES,
        max_elements: int = BUFFER_ELEMENTS,
        round_window: int = ROUND_WINDOW,
        memory: BufferMemory | None = None,
    ) -> None:
        self.task_id = task_id
        self._memory = memory
        self.max_bytes = max_bytes
        self.max_elements = max_elements
        self.round_window = round_window
        #: The lock of every value here; notified whenever one changes.
        self.cond = threading.Condition(threading.RLock())
        # (leaves, bytes, tag): tag is [split key, offset] in exactly-once jobs, else None.
        self._elements: collections.deque[tuple[list[Any], int, list[int] | None]] = (
            collections.deque()
        )
        self._bytes = 0
        # Exactly-once jobs: elements of each split still buffered, the splits produced whole
        # and not yet handed out whole, and those handed out whole since last asked.
        self._pending: collections.Counter[int] = collections.Counter()
        self._produced: set[int] = set()
        self._splits_out: list[int] = []
        self._ended = False
        self._drained = False  # ended because the worker drains, not because the input did
        self._draining = False
        # The producer's load (``load``): when it first put an element and when it ended, the
        # elements it put, and the seconds it waited for room (or paused) instead of making
        # elements.
        self._started_at: float | None = None
        self._ended_at: float | None = None
        self._put_count = 0
        self._idle_s = 0.0
        self._report: dict[str, Any] | None = None  # the task's error, as consumers get it
        self._stopped = False
        # Round robin: the elements of each round cut and not taken by every consumer yet.
        self._rounds: dict[int, list[list[Any]]] = {}
        self._round_taken: dict[int, set[int]] = {}
        self._next_round = 0

    # -- the producer ------------------------------------------------------------------------
    def put(self, leaves: list[Any], size: int, tag: list[int] | None = None) -> bool:
        """Adds an element (its ``leaves``, ``size`` bytes, its ``tag``), waiting for room;
        False once stopped (the element is dropped)."""
        with self.cond:
            if self._started_at is None:  # its load counts from here: not the task's setup
                self._started_at = time.monotonic()
            waited_from: float | None = None
            while not self._stopped:
                if self._elements and (
                    self._bytes + size > self.max_bytes or len(self._elements) >= self.max_elements
                ):
                    waited_from = waited_from or time.monotonic()
                    self.cond.wait()  # its own bound: a take here notifies
                elif self._memory is None or self._memory.take(size, alone=not self._elements):
                    break
                else:  # the worker's bound: other tasks' buffers free memory
                    waited_from = waited_from or time.monotonic()
                    self.cond.wait(_SHARED_POLL_S)
            if waited_from is not None:
                self._idle_s += time.monotonic() - waited_from
            if self._stopped:
                return False
            self._put_count += 1
            self._elements.append((leaves, size, tag))
            self._bytes += size
            if tag is not None:
                self._pending[tag[0]] += 1
            self.cond.notify_all()
        return True

    def split_done(self, key: int) -> None:
        """Every element of split ``key`` was put: it is handed out whole once none is left."""
        with self.cond:
            if self._pending[key]:
                self._produced.add(key)
            else:
                self._splits_out.append(key)

    def splits_in_hand(self) -> bool:
        """Whether an element of a split put is still here (its split is not handed out whole:
        news that the producer's next GetSplit carries)."""
        with self.cond:
            return bool(self._pending)

    def handed_out_splits(self) -> list[int]:
        """The splits handed out whole since the last call."""
        with self.cond:
            handed_out, self._splits_out = self._splits_out, []
        return handed_out

    def fail(self, report: dict[str, Any]) -> bool:
        """The task failed with ``report``: what every consumer gets from now on. False (and
        nothing recorded) when the task was stopped: the failure is of no interest then."""
        with self.cond:
            if self._stopped:
                return False
            self._report = report
            self.cond.notify_all()
        return True

    def finish(self, drained: bool) -> None:
        """The producer ended (``drained``: because the worker drains, not because the input
        did, or after ``fail``); what is buffered is still handed out."""
        with self.cond:
            self._drained = self._drained or drained
            self._ended = True
            self._ended_at = self._ended_at or time.monotonic()
            self.cond.notify_all()

    def pause(self, seconds: float) -> bool:
        """Waits ``seconds`` (less when something changes); False, at once, once stopped."""
        with self.cond:
            if self._stopped:
                return False
            started = time.monotonic()
            self.cond.wait(seconds)
            self._idle_s += time.monotonic() - started
        return True

    @property
    def draining(self) -> bool:
        """Whether the worker drains (``drain``)."""
        with self.cond:
            return self._draining

    # -- the worker --------------------------------------------------------------------------
    def stop(self) -> None:
        """Drops what is buffered; the producer's next ``put`` returns False."""
        with self.cond:
            self._stopped = True
            self._clear()
            self.cond.notify_all()

    def drain(self) -> None:
        """The worker drains: the producer stops when it can (``draining``)."""
        with self.cond:
            self._draining = True
            self.cond.notify_all()

    def completed(self) -> bool:
        """Whether the task's input ended and every element was handed out."""
        with self.cond:
            return self.ending() is Ending.INPUT_ENDED and not self._elements

    def failure(self) -> dict[str, Any] | None:
        """The task's error report, or None."""
        with self.cond:
            return self._report

    def drained_out(self) -> bool:
        """Whether the task produces nothing more and has handed out what it had."""
        with self.cond:
            return (self._ended or self._stopped) and not self._elements

    def made_not_kept(self) -> None:
        """The producer made an element that it does not put (its consumers had it: a replayed
        split): it counts in ``load`` as made, for the rate at which this worker makes them."""
        with self.cond:
            self._put_count += 1

    def load(self) -> tuple[int, float, float, float]:
        """``(elements made, busy seconds, seconds since the producer first put one, fill)``:
        the producer was busy while it did not wait for room (nor pause); its time starts with
        its first element (not the task's setup) and stops when it ends. Fill is the fuller of
        the element and byte bounds, 0..1."""
        with self.cond:
            started = self._started_at
            wall = 0.0 if started is None else (self._ended_at or time.monotonic()) - started
            fill = max(len(self._elements) / self.max_elements, self._bytes / self.max_bytes)
            return self._put_count, max(0.0, wall - self._idle_s), wall, min(1.0, fill)

    def __len__(self) -> int:
        """The elements buffered."""
        with self.cond:
            return len(self._elements)

    def state(self) -> tuple[int, int, str]:
        """The elements and bytes buffered, and the task's state in words (status pages)."""
        with self.cond:
            if self._report is not None:
                state = f"failed: {self._report.get('type')}: {self._report.get('message')}"
            elif self._stopped or (self._ended and self._drained):
                state = "stopped"
            elif self._ended:
                state = "input ended"
            else:
                state = "draining" if self._draining else "running"
            return len(self._elements), self._bytes, state

    # -- the replies -------------------------------------------------------------------------
    @property
    def ended(self) -> bool:
        """Whether the producer ended (``finish``)."""
        with self.cond:
            return self._ended

    @property
    def stopped(self) -> bool:
        """Whether the task was stopped (``stop``)."""
        with self.cond:
            return self._stopped

    def ending(self) -> Ending | None:
        """Why the task gives nothing more once its buffer is empty; None while more may come."""
        with self.cond:
            if self._report is not None:
                return Ending.FAILED
            if self._stopped or (self._ended and self._drained):
                return Ending.GONE
            if self._ended:
                return Ending.INPUT_ENDED
            return None

    def front_bytes(self) -> int:
        """The bytes of the next element (0 when none)."""
        with self.cond:
            return self._elements[0][1] if self._elements else 0

    def take(self, tags: list[list[int]] | None = None) -> list[Any]:
        """The next element's leaves (there must be one: hold ``cond`` and check ``len``);
        its tag, if any, is appended to ``tags``.

        Raises:
          IndexError: the buffer is empty.
        """
        with self.cond:
            leaves, size, tag = self._elements.popleft()
            self._bytes -= size
            if self._memory is not None:
                self._memory.give_back(size)
            self.cond.notify_all()
            if tag is not None:
                self._tags_taken([tag], tags)
        return leaves

    def take_many(
        self, limit: int, max_bytes: int, tags: list[list[int]] | None = None
    ) -> tuple[list[list[Any]], int]:
        """The next elements' leaves, at most ``limit`` of them and, beyond the first, no more
        than ``max_bytes`` in all, and their bytes (``take`` for several at once: the producer
        is woken once); their tags, if any, are appended to ``tags``."""
        with self.cond:
            elements: list[list[Any]] = []
            taken = 0
            queue = self._elements
            tagged: list[list[int]] = []
            while queue and len(elements) < limit:
                size = queue[0][1]
                if elements and taken + size > max_bytes:
                    break
                leaves, _, tag = queue.popleft()
                taken += size
                elements.append(leaves)
                if tag is not None:
                    tagged.append(tag)
            if tagged:
                self._tags_taken(tagged, tags)
            if elements:
                self._bytes -= taken
                if self._memory is not None:
                    self._memory.give_back(taken)
                self.cond.notify_all()
        return elements, taken

    @property
    def nbytes(self) -> int:
        """The bytes buffered."""
        with self.cond:
            return self._bytes

    def _tags_taken(self, taken: list[list[int]], tags: list[list[int]] | None) -> None:
        """(Under the lock.) The elements of tags ``taken`` were taken; their tags are appended
        to ``tags``."""
        pending = self._pending
        for key, count in collections.Counter(map(operator.itemgetter(0), taken)).items():
            left = pending[key] - count
            if left:
                pending[key] = left
                continue
            del pending[key]
            if key in self._produced:
                self._produced.discard(key)
                self._splits_out.append(key)
        if tags is not None:
            tags.extend(taken)

    def take_round(
        self, round_index: int, consumer: int, num_consumers: int, timeout: float
    ) -> list[Any] | Ending | None:
        """Element ``consumer`` of round ``round_index`` of ``num_consumers`` elements; why
        there is none when the input ended with less than a round (what was left is dropped:
        nobody can take it in step); None when the round is not complete within ``timeout``
        seconds (ask again).

        Raises:
          OutOfRangeError: every consumer took the round already (this one too).
        """
        deadline = time.monotonic() + timeout
        with self.cond:
            while self._next_round <= round_index:
                if len(self._elements) >= num_consumers and self._oldest_round() is None:
                    self._cut_round(num_consumers)
                    continue
                if self._ended or self._stopped:
                    self._clear()
                    return self.ending()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.cond.wait(remaining)
            if round_index not in self._rounds:
                raise OutOfRangeError(
                    f"round {round_index} of task {self.task_id} is gone: every consumer took "
                    f"it, consumer {consumer} too (round-robin consumers read each round once, "
                    "from round 0: one that starts again cannot)"
                )
            element = self._rounds[round_index][consumer]
            taken = self._round_taken[round_index]
            taken.add(consumer)
            if len(taken) == num_consumers:
                del self._rounds[round_index], self._round_taken[round_index]
                self.cond.notify_all()  # a consumer ahead may wait for room (round_window)
        return element

    def laggards(self, num_consumers: int) -> tuple[int, list[int]]:
        """When the buffer keeps ``round_window`` rounds (a consumer further ahead waits): the
        oldest round kept and the consumers that have not taken it; ``(-1, [])`` otherwise."""
        with self.cond:
            oldest = self._oldest_round()
            if oldest is None:
                return -1, []
            taken = self._round_taken[oldest]
            return oldest, [c for c in range(num_consumers) if c not in taken]

    def _oldest_round(self) -> int | None:
        """(Under the lock.) The oldest round kept when ``round_window`` rounds are (no more
        is cut until every consumer took it); None while there is room for another."""
        # Rounds are cut in order, so the dict's first key is the oldest one kept.
        oldest = next(iter(self._rounds), self._next_round)
        return oldest if self._next_round - oldest >= self.round_window else None

    def _cut_round(self, num_consumers: int) -> None:
        """(Under the lock.) The next round, from the first ``num_consumers`` elements."""
        self._rounds[self._next_round] = [self.take() for _ in range(num_consumers)]
        self._round_taken[self._next_round] = set()
        self._next_round += 1

    def _clear(self) -> None:
        """(Under the lock.) Drops what is buffered."""
        self._elements.clear()
        if self._memory is not None:
            self._memory.give_back(self._bytes)
        self._bytes = 0
