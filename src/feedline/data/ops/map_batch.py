"""``map(fn).batch(n)`` over a random-access source as one stage (TensorFlow's
``map_and_batch`` fusion).

``BatchDataset`` asks ``fusion_plan`` when it makes an iterator. The stage is fused when the batch
reads a ``map`` (threads or inline, not worker processes) whose input has random access (range,
from_tensor_slices, from_list, in-memory caches, zips of them) and
``Options.experimental_optimization.map_and_batch_fusion`` is not False. Then:

* where the function passes the rule of ``_vectorise`` (straight-line NumPy arithmetic that gives
  exactly the same batch when called once on the stacked rows), each batch is one gather of the
  input rows and one call of the function (``vectorised``);
* otherwise an inline map is fused element by element: the function is called in a tight loop
  over the pulled rows and the results are stacked per component once; a parallel map whose
  function does not pass the rule is left unfused, so that it keeps its threads;
* a fused parallel map runs its batches in the consumer's thread, when asked for, as long as
  they are light (the cheapest of its first three batches under ``_HEAVY_ROW_SECONDS`` of CPU
  per row); where they are heavier, the iterator hands its position to the unfused pipeline,
  whose threads then compute elements in parallel and ahead of the consumer (the states of the
  two have the same shape). The order is always the input's.

What comes out is what ``map`` then ``batch`` give: the same batches, an error raised by the
element that causes it (the elements of the batch before it are dropped and the next batch
starts after it, as without fusion), and the same positions. The state has the shape of the
unfused pipeline's (``{"input": <map's state>}``), so a state saved with fusion restores without
it and the other way round.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from feedline import structure
from feedline.data.dataset import DatasetIterator, IteratorContext
from feedline.data.ops import _vectorise
from feedline.data.ops._functions import Outcome
from feedline.data.ops._fused import FusedIterator
from feedline.data.ops.map import MapDataset

if TYPE_CHECKING:
    from feedline.data.dataset import Dataset
    from feedline.data.ops.batch import BatchDataset


@dataclasses.dataclass(frozen=True)
class MapBatchPlan:
    """How a fused ``map().batch()`` computes its batches.

    Attributes:
      vectorised: the function runs once per batch on the stacked input rows.
      layout: with ``vectorised``, the row shape and dtype of every output component.
      treespec: with ``vectorised``, the structure of the function's output.
    """

    vectorised: bool
    layout: tuple[tuple[tuple[int, ...], Any], ...] = ()
    treespec: Any = None

    def iterator(
        self,
        dataset: BatchDataset,
        ctx: IteratorContext,
        unfused: Callable[[], DatasetIterator],
    ) -> MapBatchIterator:
        """The fused iterator; ``unfused`` makes the iterator of the unfused pipeline."""
        return MapBatchIterator(dataset, self, ctx, unfused)


_PER_ELEMENT = MapBatchPlan(vectorised=False)
#: A fused parallel map hands over to the unfused pipeline's threads once a batch takes more
#: CPU seconds per row than this: there the per-element cost of the threads (a few µs) is small
#: next to the function, and they compute in parallel and ahead of the consumer.
_HEAVY_ROW_SECONDS = 20e-6
#: How many first batches are timed: the cheapest of them decides.
_TIMED_BATCHES = 3


def fusion_plan(dataset: BatchDataset, ctx: IteratorContext) -> MapBatchPlan | None:
    """The plan of ``dataset`` (a batch) fused with the map it reads, or None: not a map over a
    random-access source, a map on worker processes, the option off, or a parallel map whose
    function cannot run on whole batches. Found once per input and kept."""
    source = dataset.inputs[0]
    if type(source) is not MapDataset or source._use_processes:
        return None
    if ctx.options.experimental_optimization.map_and_batch_fusion is False:
        return None
    origin = source.inputs[0]
    if origin._random_access() is None:  # asked each time: a cache has it once it is filled
        return None
    cached = dataset.__dict__.get("_fusion_cache")
    if cached is None or cached[0] is not source or cached[1] is not origin:
        plan = _plan(source, dataset._batch_size, ctx)
        cached = dataset.__dict__["_fusion_cache"] = (source, origin, plan)
    plan = cached[2]
    if not plan.vectorised and source._num_parallel_calls is not None:
        return None
    return plan


def _plan(map_dataset: MapDataset, batch_size: int, ctx: IteratorContext) -> MapBatchPlan:
    fn = map_dataset._fn.fn
    origin = map_dataset.inputs[0]
    spec = origin.element_spec
    if not (_vectorise.screen(fn) and _vectorise.numeric_known(spec)):
        return _PER_ELEMENT
    layout = _vectorise.output_layout(fn, spec)
    if layout is None:
        return _PER_ELEMENT
    stand_in = _vectorise.stand_in_rows(spec)
    writable = structure.map_structure(lambda a: a.copy(), stand_in)
    if not _vectorise.agrees(fn, writable, _vectorise.split_rows(stand_in, len_rows(stand_in))):
        return _PER_ELEMENT
    if not _agrees_on_first_rows(fn, origin, _vectorise.trial_rows(batch_size), ctx):
        return _PER_ELEMENT
    shapes, treespec = layout
    return MapBatchPlan(True, tuple(shapes), treespec)


def len_rows(batch: Any) -> int:
    """The number of rows of a batch (0 for one without components)."""
    leaf = batch
    while type(leaf) is tuple and leaf:
        leaf = leaf[0]
    if type(leaf) is not np.ndarray:
        leaves = structure.flatten(batch)[0]
        if not leaves:
            return 0
        leaf = leaves[0]
    return int(leaf.shape[0])


def _agrees_on_first_rows(fn: Any, origin: Dataset, n: int, ctx: IteratorContext) -> bool:
    """Rule 3 on the real input: its first ``n`` rows, per element and as one gathered batch."""
    with contextlib.closing(origin._iterator(ctx)) as each:
        rows = []
        try:
            for _ in range(n):
                rows.append(each._next())
        except StopIteration:
            pass
    if not rows:
        return True
    with contextlib.closing(origin._iterator(ctx)) as whole:
        fast = whole._next_batch
        batch = fast(len(rows)) if fast is not None else structure.batch_elements(rows)
    return _vectorise.agrees(fn, batch, rows)


class MapBatchIterator(FusedIterator):
    """The fused ``map().batch()``. Its API is single-threaded.

    A parallel map (``num_parallel_calls``) whose batches turn out heavy hands over to the
    unfused pipeline (made by ``unfused``), restored at its position.

    Its state is the unfused pipeline's: ``{"input": {"input": <source>}}`` for an inline map,
    with ``input_done`` and ``ready`` (the outputs computed but not yet handed out, element by
    element, as a parallel map keeps them) for a parallel one; ``ready`` is used up first after
    restoring.
    """

    def __init__(
        self,
        dataset: BatchDataset,
        plan: MapBatchPlan,
        ctx: IteratorContext,
        unfused: Callable[[], DatasetIterator],
    ) -> None:
        super().__init__(dataset, ctx, unfused)
        map_dataset = self._map
        self._user = map_dataset._fn
        self._fn = map_dataset._fn.fn
        self._parallel = map_dataset._num_parallel_calls is not None
        self._vectorised = plan.vectorised
        self._layout = list(plan.layout)
        self._treespec = plan.treespec
        self._input_done = False
        self._ready: collections.deque[Outcome] = collections.deque()
        # CPU seconds per row of a parallel map's first batches, while they are being timed.
        self._timed: list[float] | None = [] if self._parallel else None

    def _next(self) -> Any:
        delegate = self._delegate
        if delegate is not None:
            return delegate._next()
        timed = self._timed
        if timed is None:
            return self._compute()
        # A parallel map's first batches are timed in CPU seconds (a batch preempted on a busy
        # machine is not heavy; reading that clock costs µs, so only these few are timed).
        start = time.thread_time()
        out = self._compute()
        timed.append((time.thread_time() - start) / max(1, len_rows(out)))
        if len(timed) == _TIMED_BATCHES:
            self._timed = None
            if min(timed) > _HEAVY_ROW_SECONDS:
                self._hand_over()
        return out

    def _compute(self) -> Any:
        if self._vectorised and not self._ready and not self._input_done:
            return self._next_vectorised()
        return self._next_per_element()

    def _next_vectorised(self) -> Any:
        n = self._batch_size
        source = self._input
        saved = source.get_state()
        fast = source._next_batch
        try:
            inputs = fast(n) if fast is not None else structure.batch_elements(_pull(source, n))
        except StopIteration:
            self._input_done = self._parallel
            raise
        rows = len_rows(inputs)
        if rows == n or not self._drop_remainder:
            try:
                out = _vectorise.accepted(
                    _vectorise.call(self._fn, inputs), self._layout, self._treespec, rows
                )
            except Exception:
                out = None  # computed again element by element: the failing one raises
            else:
                if out is None:
                    self._vectorised = False  # not what the trials showed: never again
            if out is not None:
                return out
        source.set_state(saved)
        return self._next_per_element()

    def _next_per_element(self) -> Any:
        n = self._batch_size
        outputs: list[Any] = []
        ready = self._ready
        while ready and len(outputs) < n:
            ok, value = ready.popleft()
            if not ok:
                raise value
            outputs.append(value)
        if len(outputs) < n and not self._input_done:
            self._map_into(outputs, n - len(outputs))
        if not outputs or (self._drop_remainder and len(outputs) < n):
            raise StopIteration
        return structure.batch_elements(outputs)

    def _map_into(self, outputs: list[Any], count: int) -> None:
        """Appends the function's results on up to ``count`` more input elements: the loop of
        map then batch, without an iterator call per element in between."""
        pull = self._input._next
        fn = self._fn
        normalize = structure.normalize
        append = outputs.append
        for _ in range(count):
            try:
                element = pull()
            except StopIteration:
                self._input_done = self._parallel
                return
            try:
                append(normalize(fn(*element) if type(element) is tuple else fn(element)))
            except StopIteration as error:  # ends the batch here, as it ends map's input
                self._user.annotate(error)
                return
            except Exception as error:
                self._user.annotate(error)
                raise

    def _own_state(self) -> dict[str, Any]:
        inner: dict[str, Any] = {"input": self._input.get_state()}
        if self._parallel:
            inner["input_done"] = self._input_done
            inner["ready"] = list(self._ready)
        return {"input": inner}

    def _set_own_state(self, state: dict[str, Any]) -> None:
        inner = state["input"]
        self._input.set_state(inner["input"])
        if self._parallel:
            self._input_done = bool(inner["input_done"])
            self._ready = collections.deque(inner["ready"])

    def _close_own(self) -> None:
        self._input.close()


def _pull(source: DatasetIterator, n: int) -> list[Any]:
    pull = source._next
    rows: list[Any] = []
    try:
        for _ in range(n):
            rows.append(pull())
    except StopIteration:
        if not rows:
            raise
    return rows
