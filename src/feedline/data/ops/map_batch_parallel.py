"""``map(fn, num_parallel_calls=...).batch(n)`` for a function that cannot run on whole batches
(a Pillow transform, any per-element Python): the map's threads write each result straight into
its row of a batch allocated once (TensorFlow's ``map_and_batch`` kernel).

``BatchDataset`` uses it when ``map_batch.fusion_plan`` has no plan for a batch that reads a
parallel ``map`` on threads and ``Options.experimental_optimization.map_and_batch_fusion`` is
not False; the source needs no random access. Against the unfused pipeline it saves, per
element, the hand-off through the map's queue and, per batch, the ``np.stack`` copy in the
consumer's thread: the copy is spread over the threads, one row each as it is computed.

* Each batch's input rows are pulled in the consumer's thread and cut into chunks for the pool;
  two batches are in flight, so the threads never wait for the consumer. With ``AUTOTUNE`` the
  level is the CPU budget from the start: the first batch decides whether the fusion pays.
* A batch's memory comes from a ``BufferPool``: the memory of batches the program has dropped,
  used again instead of a fresh allocation that page-faults every page of a large batch in.
* The first result of a batch fixes its layout (structure, and the shape and dtype of every
  leaf); a result of another layout, or of strings or composites, is kept as it is and the
  batch is stacked from its rows as ``batch`` stacks them.
* Light functions (under ``_MIN_ROW_SECONDS`` per row on the first batch) hand over to the
  unfused pipeline, whose chunks may span batches.

What comes out is what ``map`` then ``batch`` give, in the input's order: the same batches, an
error raised by the element that causes it (the elements of the batch before it are dropped and
the next batch starts after it) and the same positions. The state has the unfused pipeline's
shape: ``{"input": {"input": <source>, "input_done": bool, "ready": [<outcome>, ...]}}``, the
results computed ahead element by element, so a state restores with or without the fusion.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from feedline import structure
from feedline.data.autotune import cpu_budget
from feedline.data.dataset import AUTOTUNE, DatasetIterator, IteratorContext
from feedline.data.ops._buffer_pool import BufferPool
from feedline.data.ops._functions import Outcome, UserFunction
from feedline.data.ops._fused import FusedIterator
from feedline.data.ops.map import _CHUNK_SECONDS, MapDataset

if TYPE_CHECKING:
    from feedline.data.ops.batch import BatchDataset

#: Below this many seconds per row on its first batch, a function runs unfused: its rows are too
#: cheap for a batch's worth of them to be worth handing out in chunks of one batch.
_MIN_ROW_SECONDS = 100e-6
#: Batches in flight: the head one being finished and the next one keeping the threads busy.
_BATCHES_AHEAD = 2
#: Dtype kinds that are not written into a preallocated batch: strings and objects stack by
#: their own rules.
_NOT_WRITTEN = frozenset("OSUV")


def parallel_fusable(dataset: BatchDataset, ctx: IteratorContext) -> bool:
    """Whether ``dataset`` (a batch without a ``fusion_plan``) reads a parallel map on threads
    that this fusion may run."""
    source = dataset.inputs[0]
    return (
        type(source) is MapDataset
        and not source._use_processes
        and source._num_parallel_calls is not None
        and ctx.options.experimental_optimization.map_and_batch_fusion is not False
    )


class _Batch:
    """One batch in flight: its rows are written by the pool's threads."""

    def __init__(self, n: int, memory: BufferPool) -> None:
        self.n = n
        self._memory = memory
        # Per row: None where the result was written into ``buffers``, else its outcome.
        self.outcomes: list[Outcome | None] = [None] * n
        self.treespec: Any = None
        self.leaf_layout: list[tuple[tuple[int, ...], np.dtype, bool]] | None = None
        self.buffers: list[np.ndarray] = []
        self.writable = True
        # An error the input raised after these rows: it comes after them, where the input had it.
        self.input_error: Exception | None = None
        self.seconds = 0.0
        self.futures: list[Future] = []
        self._lock = threading.Lock()

    def run(self, fn: UserFunction, start: int, elements: list[Any]) -> None:
        """Applies ``fn`` to ``elements`` (rows ``start``, ``start + 1``, ...); in a thread."""
        began = time.perf_counter()
        for i, element in enumerate(elements, start):
            try:
                result = fn(element)
            except Exception as error:
                self.outcomes[i] = (False, error)
                continue
            if not self._write(i, result):
                self.outcomes[i] = (True, result)
        with self._lock:
            self.seconds += time.perf_counter() - began

    def _write(self, i: int, result: Any) -> bool:
        if not self.writable:
            return False
        leaves, treespec = structure.flatten(result)
        if self.leaf_layout is None:
            with self._lock:
                if self.leaf_layout is None and self.writable:
                    self._allocate(leaves, treespec)
            if not self.writable:
                return False
        layout = self.leaf_layout
        assert layout is not None
        if treespec != self.treespec or len(leaves) != len(layout):
            return False
        for leaf, (shape, dtype, generic) in zip(leaves, layout, strict=True):
            if (
                isinstance(leaf, np.generic) is not generic
                or not isinstance(leaf, np.ndarray | np.generic)
                or leaf.shape != shape
                or leaf.dtype != dtype
            ):
                return False
        for buffer, leaf in zip(self.buffers, leaves, strict=True):
            buffer[i] = leaf
        return True

    def _allocate(self, leaves: list[Any], treespec: Any) -> None:
        layout = []
        for leaf in leaves:
            if not isinstance(leaf, np.ndarray | np.generic) or leaf.dtype.kind in _NOT_WRITTEN:
                self.writable = False
                return
            layout.append((leaf.shape, leaf.dtype, isinstance(leaf, np.generic)))
        self.buffers = [self._memory.take((self.n, *shape), dtype) for shape, dtype, _ in layout]
        self.treespec = treespec
        self.leaf_layout = layout

    def wait(self) -> None:
        for future in self.futures:
            future.result()

    def row(self, i: int) -> Any:
        """Row ``i`` as the map gave it (a view of the batch where it was written)."""
        outcome = self.outcomes[i]
        if outcome is not None:
            return outcome[1]
        assert self.leaf_layout is not None
        leaves = [
            buffer[i] if generic else buffer[i, ...]
            for buffer, (_, _, generic) in zip(self.buffers, self.leaf_layout, strict=True)
        ]
        return structure.unflatten(self.treespec, leaves)

    def element_outcomes(self) -> list[Outcome]:
        """Every row's outcome, in order, then the input's error (after ``wait``)."""
        out = [o if o is not None else (True, self.row(i)) for i, o in enumerate(self.outcomes)]
        if self.input_error is not None:
            out.append((False, self.input_error))
        return out

    def assembled(self) -> Any:
        """The batch, or None where a row or the input failed (after ``wait``)."""
        if self.input_error is not None or any(o is not None and not o[0] for o in self.outcomes):
            return None
        if self.leaf_layout is not None and all(o is None for o in self.outcomes):
            return structure.unflatten(self.treespec, self.buffers)
        return structure.batch_elements([self.row(i) for i in range(self.n)])


class ParallelMapBatchIterator(FusedIterator):
    """The fused ``map(num_parallel_calls=...).batch()`` of a per-element function. Its API is
    single-threaded.

    A function lighter than ``_MIN_ROW_SECONDS`` per row hands over to the unfused pipeline
    (made by ``unfused``), restored at its position.
    """

    def __init__(
        self,
        dataset: BatchDataset,
        ctx: IteratorContext,
        unfused: Callable[[], DatasetIterator],
    ) -> None:
        super().__init__(dataset, ctx, unfused)
        self._fn = self._map._fn
        requested = self._map._num_parallel_calls
        self._level = cpu_budget(ctx.options) if requested in (None, AUTOTUNE) else requested
        self._pool: ThreadPoolExecutor | None = None
        self._memory = BufferPool()  # the memory of batches the program dropped
        self._pending: collections.deque[_Batch] = collections.deque()
        self._ready: collections.deque[Outcome] = collections.deque()
        self._input_done = False
        self._chunk = 1
        self._timed = False

    def _next(self) -> Any:
        if self._delegate is not None:
            return self._delegate._next()
        if self._ready:
            return self._next_from_ready()
        self._fill()
        if not self._pending:
            raise StopIteration
        batch = self._pending.popleft()
        self._fill()
        batch.wait()
        out = batch.assembled()
        if out is None:  # a row failed: the batches regroup around it, as without fusion
            self._ready.extend(batch.element_outcomes())
            self._drain()
            return self._next_from_ready()
        self._measure(batch)
        if not self._timed:
            self._timed = True
            if batch.seconds / batch.n < _MIN_ROW_SECONDS:
                self._hand_over()
        if self._drop_remainder and batch.n < self._batch_size:
            raise StopIteration
        return out

    def _measure(self, batch: _Batch) -> None:
        per_row = max(batch.seconds / batch.n, 1e-9)
        self._chunk = max(1, min(self._batch_size, int(_CHUNK_SECONDS / per_row)))

    def _launch(self, count: int) -> _Batch | None:
        """Pulls up to ``count`` input elements and hands them to the pool as one batch."""
        pull = self._input._next
        elements: list[Any] = []
        error = None
        try:
            for _ in range(count):
                elements.append(pull())
        except StopIteration:
            self._input_done = True
        except Exception as raised:  # raised in its place, after the rows before it
            error = raised
        if not elements and error is None:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._level, thread_name_prefix="feedline-map-batch")
        batch = _Batch(len(elements), self._memory)
        batch.input_error = error
        chunk = max(1, min(self._chunk, -(-len(elements) // self._level)))
        for start in range(0, len(elements), chunk):
            part = elements[start : start + chunk]
            batch.futures.append(self._pool.submit(batch.run, self._fn, start, part))
        return batch

    def _fill(self) -> None:
        pending = self._pending
        while not self._input_done and len(pending) < _BATCHES_AHEAD:
            if pending and pending[-1].input_error is not None:
                return  # no input past its error until the error is handed out
            batch = self._launch(self._batch_size)
            if batch is not None:
                pending.append(batch)

    def _drain(self) -> None:
        """Moves every batch in flight into ``ready``, element by element."""
        while self._pending:
            batch = self._pending.popleft()
            batch.wait()
            self._ready.extend(batch.element_outcomes())

    def _next_from_ready(self) -> Any:
        """A batch from the results computed ahead, then from new input: ``batch`` over ``map``
        element by element."""
        n = self._batch_size
        outputs: list[Any] = []
        ready = self._ready
        while len(outputs) < n:
            if not ready:
                batch = None if self._input_done else self._launch(n - len(outputs))
                if batch is None:
                    break
                batch.wait()
                ready.extend(batch.element_outcomes())
            ok, value = ready.popleft()
            if not ok:
                if isinstance(value, StopIteration):  # ends the batch, as it ends map's input
                    break
                raise value
            outputs.append(value)
        if not outputs or (self._drop_remainder and len(outputs) < n):
            raise StopIteration
        return structure.batch_elements(outputs)

    def _own_state(self) -> dict[str, Any]:
        self._drain()
        return {
            "input": {
                "input": self._input.get_state(),
                "input_done": self._input_done,
                "ready": list(self._ready),
            }
        }

    def _set_own_state(self, state: dict[str, Any]) -> None:
        inner = state["input"]
        self._drain()
        self._input.set_state(inner["input"])
        self._input_done = bool(inner["input_done"])
        self._ready = collections.deque(inner["ready"])

    def _close_own(self) -> None:
        self._memory.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._input.close()
