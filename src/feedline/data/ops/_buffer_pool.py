"""Batch memory used again once its batch is dropped: ``BufferPool``.

A batch of 64 images of 3x224x224 float32 is 38.5 MB. glibc's malloc serves an allocation that
large with a fresh ``mmap`` every time (it is above the largest threshold it adapts to), so
each new batch page-faults all of its pages in, zero-filled by the kernel, and gives them back
with ``munmap`` when it is freed: ~10,000 page faults a batch, taken under the process's memory
lock by whichever threads write the batch. A pool keeps the memory of batches the program has
dropped and hands it out again for the next batch of the same size.

``take`` returns an ordinary writable NumPy array whose ``base`` is a lease on a pool block:
views of it (slices, ``torch.from_numpy``, a row kept by the program) keep the lease, so a block
goes back to the pool only when nothing refers to any part of it. The pool keeps at most
``keep`` free blocks of a size (one by default: a loop drops a batch as it takes the next); more
are freed, and ``close`` frees them all. Blocks outlive their pool only while leased.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any

import numpy as np

__all__ = ["BufferPool"]


class BufferPool:
    """Reusable blocks of memory for arrays, by byte size. Thread-safe."""

    def __init__(self, keep: int = 1) -> None:
        self._keep = keep
        self._free: dict[int, collections.deque[np.ndarray]] = {}
        self._lock = threading.Lock()
        self._ref = weakref.ref(self)

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A new writable array of ``shape`` and ``dtype`` (its contents undefined), on a block
        the pool had free where it had one."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes == 0:
            return np.empty(shape, dtype)
        with self._lock:
            free = self._free.get(nbytes)
            block = free.pop() if free else None
        if block is None:
            block = np.empty(nbytes, np.uint8)
        return np.asarray(_Lease(block, shape, dtype, self._ref))

    def _give_back(self, block: np.ndarray) -> None:
        with self._lock:
            free = self._free.setdefault(block.nbytes, collections.deque())
            if len(free) < self._keep:
                free.append(block)

    def close(self) -> None:
        """Frees the free blocks and keeps none from now on (arrays still leased stay valid)."""
        with self._lock:
            self._keep = 0
            self._free.clear()

    def free_blocks(self) -> int:
        """How many blocks wait to be taken again."""
        with self._lock:
            return sum(len(free) for free in self._free.values())


class _Lease:
    """The ``base`` of an array on a pool block: the block goes back when the lease dies."""

    __slots__ = ("__array_interface__", "_block", "_pool")

    def __init__(
        self,
        block: np.ndarray,
        shape: tuple[int, ...],
        dtype: np.dtype,
        pool: weakref.ReferenceType[BufferPool],
    ) -> None:
        self._block = block
        self._pool = pool
        self.__array_interface__: dict[str, Any] = {
            "data": (block.ctypes.data, False),
            "shape": tuple(shape),
            "typestr": dtype.str,
            "descr": dtype.descr,
            "version": 3,
        }

    def __del__(self) -> None:
        pool = self._pool()
        if pool is not None:
            pool._give_back(self._block)
