"""Run-time tuning of ``AUTOTUNE`` parallelism and buffer sizes from measured rates.

Two small controllers, each owned by one iterator and called from its consumer thread:

* ``BufferTuner`` grows a prefetch buffer while the consumer finds it empty (the producer is the
  bottleneck at that moment), doubling up to the RAM budget divided by the element size.
* ``ParallelismTuner`` tries parallelism levels on windows of elements, measures the elements per
  second that the consumer actually receives, and keeps the best: a hill climb that stops when a
  step up no longer pays by more than ``min_gain``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from feedline import structure
from feedline.data.options import Options

__all__ = [
    "BufferTuner",
    "ConcurrencyLimit",
    "ParallelismTuner",
    "cpu_budget",
    "element_nbytes",
    "ram_budget",
]


def cpu_budget(options: Options) -> int:
    """The most threads an autotuned operation may use."""
    budget = options.autotune.cpu_budget or options.threading.private_threadpool_size
    return budget or len(os.sched_getaffinity(0))


def ram_budget(options: Options) -> int:
    """Bytes that the autotuned buffers of one pipeline may hold."""
    if options.autotune.ram_budget:
        return options.autotune.ram_budget
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 << 30
    return total // 2


def element_nbytes(element: Any) -> int:
    """The bytes an element holds, counting the payload of byte strings and the arrays that
    make up a ``SparseArray`` or ``RaggedArray``."""
    leaves, _ = structure.flatten(element)
    total = 0
    for leaf in leaves:
        if isinstance(leaf, structure.SparseArray):
            leaves.extend((leaf.indices, leaf.values, leaf.dense_shape))
            continue
        if isinstance(leaf, structure.RaggedArray):
            leaves.extend((leaf.flat_values, *leaf.nested_row_splits))
            continue
        array = np.asarray(leaf)
        if array.dtype == object:
            total += sum(len(item) for item in array.flat)
        total += array.nbytes
    return total or 1


class BufferTuner:
    """Doubles a buffer each time the consumer waits, within ``max_bytes``."""

    def __init__(self, options: Options, initial: int = 1, maximum: int = 1024) -> None:
        self.enabled = options.autotune.enabled is not False
        self.size = initial if self.enabled else 2
        self._maximum = maximum
        self._max_bytes = ram_budget(options) // 4
        self._element_bytes = 0

    def observe(self, element: Any, waited: bool) -> None:
        if not self.enabled:
            return
        if not self._element_bytes:
            self._element_bytes = element_nbytes(element)
        if waited:
            limit = min(self._maximum, max(1, self._max_bytes // self._element_bytes))
            self.size = min(limit, self.size * 2)


class ParallelismTuner:
    """Chooses a parallelism level in ``[0, maximum]`` (0: run inline) from measured rates."""

    def __init__(
        self,
        maximum: int,
        window: float = 0.05,
        min_gain: float = 1.1,
        start: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._clock = clock
        self.maximum = maximum
        self.level = min(start, maximum)
        self._best_level = self.level
        self._best_rate = 0.0
        self._window = window
        self._min_gain = min_gain
        self._settled = maximum == 0
        self._count = 0
        self._start: float | None = None  # the first delivered element starts the first window

    @property
    def settled(self) -> bool:
        return self._settled

    def observe(self, n: int = 1) -> None:
        """Counts ``n`` elements delivered; at the end of a window, moves to the next level."""
        if self._settled:
            return
        now = self._clock()
        if self._start is None:
            self._start = now
            return
        self._count += n
        elapsed = now - self._start
        if elapsed < self._window:
            return
        rate = self._count / elapsed
        if rate > self._best_rate * self._min_gain or self._best_rate == 0.0:
            self._best_rate, self._best_level = rate, self.level
            if self.level < self.maximum:
                self.level += 1
            else:
                self._settled = True
        else:
            self.level = self._best_level
            self._settled = True
        self._count = 0
        self._start = self._clock()


class ConcurrencyLimit:
    """A context manager that lets at most ``limit`` threads in at once; the limit can change
    while threads wait (a semaphore whose size a tuner sets)."""

    def __init__(self, limit: int) -> None:
        self._cond = threading.Condition()
        self._limit = max(1, limit)
        self._active = 0

    @property
    def limit(self) -> int:
        return self._limit

    def set_limit(self, limit: int) -> None:
        with self._cond:
            if max(1, limit) != self._limit:
                self._limit = max(1, limit)
                self._cond.notify_all()

    def __enter__(self) -> ConcurrencyLimit:
        with self._cond:
            while self._active >= self._limit:
                self._cond.wait()
            self._active += 1
        return self

    def __exit__(self, *exc_info: object) -> None:
        with self._cond:
            self._active -= 1
            self._cond.notify()
