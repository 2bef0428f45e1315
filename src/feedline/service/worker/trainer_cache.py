"""A task's cross-trainer cache: every trainer of a cross-trainer job (``CrossTrainerCache``)
reads every element of the task, which the producer makes once.

The elements are numbered by their position in the task's stream. A trainer asks for the
element at its position (``GetElementsRequest.index``); the first trainer to ask for one that
is not cached yet takes it from the task's buffer (``buffer.TaskBuffer``), so the producer runs
as fast as the fastest trainer reads, and the others read what it passed from the cache:

====================  ===========================================================================
infinite dataset      TensorFlow's sliding window: the cache keeps the newest elements, at most
                      ``max_bytes``; a trainer whose position left the window skips ahead to its
                      oldest element (the reply's ``first`` says where it resumes).
finite epoch          nothing is dropped before the task ends: past ``max_bytes`` in memory the
                      oldest elements go to a spill file on the worker's local disk, from which
                      a slow trainer (or one restarted from its checkpoint) reads them, so it
                      never holds the others back and gets every element once.
====================  ===========================================================================

A trainer is known by its id from its first request on, and each request says how much of the
stream the trainer has *returned* (its saved position can be no further). A task is complete
for the worker (``completed``), and its job may end, once the input ended and every trainer it
knows returned all of it: a trainer killed mid-epoch holds the task, and what the others
passed, until it comes back from its checkpoint.

Example:
  >>> from feedline.service.worker.buffer import TaskBuffer
  >>> buffer = TaskBuffer(task_id=1)
  >>> for x in range(3):
  ...     _ = buffer.put([x], 8)
  >>> buffer.finish(drained=False)
  >>> cache = TrainerCache(buffer, max_bytes=1 << 20, window=False)
  >>> cache.read("a", 0, 0, 2, 1 << 20, 0)
  (0, [[0], [1]])
  >>> cache.read("b", 0, 0, 8, 1 << 20, 0)
  (0, [[0], [1], [2]])
  >>> cache.read("a", 2, 2, 8, 1 << 20, 0)
  (2, [[2]])
  >>> cache.read("a", 3, 3, 8, 1 << 20, 0), cache.completed()  # b returned none yet
  (<Ending.INPUT_ENDED: 'eos'>, False)
  >>> cache.read("b", 3, 3, 8, 1 << 20, 0), cache.completed()
  (<Ending.INPUT_ENDED: 'eos'>, True)
"""

from __future__ import annotations

import collections
import os
import tempfile
import threading
import time
from typing import Any

from feedline._net.elements import pack_elements, unpack_elements
from feedline.service.worker.buffer import Ending, TaskBuffer

__all__ = ["CACHE_BYTES", "TrainerCache"]

#: The bytes of elements a task's cross-trainer cache keeps in memory (TensorFlow's
#: ``WorkerConfig.cross_trainer_cache_size_bytes``; feedline's is per task).
CACHE_BYTES = 64 << 20

#: Where a spilled element is: its offset, its buffers' lengths, its meta, its tag.
_Where = tuple[int, list[int], dict[str, Any], list[int] | None]


class _Spill:
    """The spilled elements of a finite epoch, in order, in a file of the worker's temporary
    directory (mode 0600) whose name is removed at once: it goes when closed, or with the
    worker's process."""

    def __init__(self, task_id: int) -> None:
        fd, path = tempfile.mkstemp(prefix=f"feedline-trainer-cache-{task_id}-")
        os.unlink(path)  # the file lives while its descriptor is open
        self._fd = fd
        self._size = 0
        # Per element spilled: (offset, buffer lengths, meta, tag).
        self._index: list[_Where] = []
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._index)

    def append(self, leaves: list[Any], tag: list[int] | None) -> None:
        """Writes an element (and its tag) at the end (the caller holds the cache's lock)."""
        meta, buffers = pack_elements([leaves])
        lengths = [len(memoryview(b).cast("B")) for b in buffers]
        offset = self._size
        for buffer in buffers:
            written = os.pwrite(self._fd, buffer, self._size)
            self._size += written
        self._index.append((offset, lengths, meta, tag))
        self.nbytes = self._size

    def locations(self, start: int, stop: int) -> list[_Where]:
        """Where elements ``start..stop-1`` are (under the cache's lock)."""
        return self._index[start:stop]

    def read(self, where: _Where) -> list[Any]:
        """The element at ``where`` (no lock needed: spilled bytes never change)."""
        offset, lengths, meta, _ = where
        buffers = []
        for length in lengths:
            buffers.append(memoryview(os.pread(self._fd, length, offset)))
            offset += length
        return unpack_elements(meta, buffers)[0]

    def close(self) -> None:
        os.close(self._fd)


class TrainerCache:
    """The elements of one task, kept for the trainers of a cross-trainer job.

    Args:
      buffer: the task's buffer, which its producer fills; the cache is its only reader.
      max_bytes: the bytes kept in memory (the window of an infinite dataset).
      window: TensorFlow's sliding window (an infinite dataset); False: a finite epoch, which
        spills past ``max_bytes`` to disk and drops nothing.
    """

    def __init__(self, buffer: TaskBuffer, max_bytes: int = CACHE_BYTES, window: bool = True):
        self._buffer = buffer
        self.max_bytes = max_bytes
        self.window = window
        # Elements [_memory_start, _end) in memory: (leaves, bytes); below, spilled (finite) or
        # dropped (window) down to _start.
        # An element: its leaves, its bytes, and its tag (``[split, offset]`` in an
        # exactly-once job, ``ledger``), else None.
        self._memory: collections.deque[tuple[list[Any], int, list[int] | None]] = (
            collections.deque()
        )
        self._memory_start = 0
        self._memory_bytes = 0
        self._start = 0
        self._end = 0
        self._spill: _Spill | None = None
        #: Per trainer: the position of the next element it asked for, the elements it said
        #: it returned, and when it last asked.
        self._trainers: dict[str, list[float]] = {}
        self._closed = False
        self._lock = threading.Lock()  # the spill file's closing; everything else: buffer.cond

    def set_window(self, window: bool) -> None:
        """Whether the task's dataset is infinite (known once the producer has it)."""
        with self._buffer.cond:
            self.window = window

    def read(
        self,
        trainer_id: str,
        index: int,
        returned: int,
        max_elements: int,
        max_bytes: int,
        timeout: float,
        tags: list[list[int]] | None = None,
    ) -> tuple[int, list[list[Any]]] | Ending | None:
        """The elements from ``index`` on for ``trainer_id``, which returned ``returned`` of
        the stream: ``(first, elements)``, where ``first`` is past ``index`` if the trainer
        fell out of the window; why there are none when the task ended; None when none came
        within ``timeout`` seconds (ask again). The elements' tags, where they have them, are
        appended to ``tags``."""
        buffer = self._buffer
        deadline = time.monotonic() + timeout
        spilled: list[_Where] = []
        with buffer.cond:
            trainer = self._trainers.setdefault(trainer_id, [index, 0, 0.0])
            trainer[1] = returned  # the latest word: a restored trainer may say less
            trainer[2] = time.monotonic()
            index = max(index, self._start)  # a window trainer that fell behind skips ahead
            while index >= self._end:
                if len(buffer):
                    self._pull()
                    continue
                ending = buffer.ending()
                if ending is not None:
                    trainer[0] = index
                    return ending
                remaining = deadline - time.monotonic()
                if remaining <= 0 or buffer.stopped:
                    trainer[0] = index
                    return None
                buffer.cond.wait(remaining)
            while (  # what is ready, in one go, short of pushing anything out of memory
                len(buffer)
                and self._end < index + max_elements
                and self._memory_bytes + buffer.front_bytes() <= self.max_bytes
            ):
                self._pull()
            index = max(index, self._start)
            stop = min(self._end, index + max(1, max_elements))
            if index < self._memory_start:  # spilled: read from disk below, out of the lock
                assert self._spill is not None
                stop = min(stop, self._memory_start)
                spilled = self._spill.locations(index, stop)
                elements: list[list[Any]] = []
            else:
                elements, taken = [], 0
                for position in range(index, stop):
                    leaves, size, tag = self._memory[position - self._memory_start]
                    if elements and taken + size > max_bytes:
                        break
                    taken += size
                    elements.append(leaves)
                    if tag is not None and tags is not None:
                        tags.append(tag)
            trainer[0] = index + (len(spilled) or len(elements))
            buffer.cond.notify_all()
        if spilled:
            with self._lock:
                if self._closed or self._spill is None:
                    return Ending.GONE
                elements = [self._spill.read(where) for where in spilled]
            if tags is not None:
                tags.extend(where[3] for where in spilled if where[3] is not None)
        return index, elements

    def _pull(self) -> None:
        """(Under the lock, with elements buffered.) Moves the buffer's next element into the
        cache, dropping (window) or spilling (finite) the oldest past ``max_bytes``."""
        size = self._buffer.front_bytes()
        taken: list[list[int]] = []
        leaves = self._buffer.take(taken)
        self._memory.append((leaves, size, taken[0] if taken else None))
        self._memory_bytes += size
        self._end += 1
        while len(self._memory) > 1 and self._memory_bytes > self.max_bytes:
            old, old_size, old_tag = self._memory.popleft()
            self._memory_bytes -= old_size
            self._memory_start += 1
            if self.window:
                self._start = self._memory_start
                continue
            if self._spill is None:
                self._spill = _Spill(self._buffer.task_id)
            self._spill.append(old, old_tag)

    def completed(self) -> bool:
        """Whether the task's input ended, everything was pulled and every trainer known read
        to the end."""
        with self._buffer.cond:
            return (
                self._buffer.ending() is Ending.INPUT_ENDED
                and not len(self._buffer)
                and all(returned >= self._end for _, returned, _ in self._trainers.values())
            )

    def drained_out(self) -> bool:
        """Whether nothing more comes and every trainer known read what was made."""
        with self._buffer.cond:
            return (
                self._buffer.ending() is not None
                and not len(self._buffer)
                and all(position >= self._end for position, _, _ in self._trainers.values())
            )

    def positions(self) -> dict[str, int]:
        """Each trainer's position: the elements of the task's stream it returned."""
        with self._buffer.cond:
            return {trainer: int(returned) for trainer, (_, returned, _) in self._trainers.items()}

    def state(self) -> dict[str, Any]:
        """What the status pages show: the cache's range, its bytes, the trainers' positions."""
        with self._buffer.cond:
            return {
                "mode": "sliding window" if self.window else "finite epoch",
                "start": self._start,
                "end": self._end,
                "memory_bytes": self._memory_bytes,
                "spilled": 0 if self._spill is None else len(self._spill),
                "spilled_bytes": 0 if self._spill is None else self._spill.nbytes,
                "trainers": {t: int(r) for t, (_, r, _) in sorted(self._trainers.items())},
            }

    def close(self) -> None:
        """Drops what is cached and deletes the spill file; idempotent."""
        with self._buffer.cond:
            self._memory.clear()
            self._memory_bytes = 0
        with self._lock:
            self._closed = True
            if self._spill is not None:
                self._spill.close()
                self._spill = None
