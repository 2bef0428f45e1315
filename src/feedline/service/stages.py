"""Busy time per stage of a pipeline: what ``feedline diagnose`` names a bottleneck from.

``timed(dataset, clock)`` returns the same pipeline with a pass-through node above each stage
that adds, to ``clock`` (a ``StageClock``), the time its stage spent making elements *without*
the time its inputs spent (each thread keeps its own account, so a stage that waits for a
background thread of its own counts that wait as its own time, which is what its consumer
sees). Stage names are the operation with its depth from the top: ``map#1``, ``range#3``.
A service worker times each task's pipeline this way; ``profile`` times one in this process.

The nodes pass everything else through: element spec, cardinality, random access (a stage
that gathers rows by index from its input is then timed as one with it), options. Only the
stages a rewrite may safely wrap are timed: the inputs of operations that look at their input's
type (``flat_map`` over windows) are left as they are.
"""

from __future__ import annotations

import collections
import threading
from time import perf_counter
from typing import Any

from feedline.data.dataset import (
    Dataset,
    DatasetIterator,
    IteratorContext,
    RandomAccess,
    raw_elements,
)

__all__ = ["StageClock", "profile", "source_stage", "stage_kind", "timed"]

# Operations whose inputs are not wrapped: they look at their input's type.
_KEEP_INPUTS = frozenset({"FlatMapDataset", "InterleaveDataset", "ParallelInterleaveDataset"})
_local = threading.local()


class StageClock:
    """Seconds spent in each stage, by name; thread-safe.

    Each iterator of a stage adds to an account of its own (``account``: one writer, so no
    lock on the way of every element), which ``close`` folds into the stage's total when the
    iterator is done (a task of an exactly-once job makes an iterator per split); ``seconds``
    sums the totals and the open accounts of each name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, list[list[float]]] = collections.defaultdict(list)
        self._closed: dict[str, float] = collections.defaultdict(float)

    def account(self, name: str) -> list[float]:
        """A new account of stage ``name``: ``[seconds]``, which one thread adds to."""
        cell = [0.0]
        with self._lock:
            self._open[name].append(cell)
        return cell

    def close(self, name: str, cell: list[float]) -> None:
        """The account ``cell`` of stage ``name`` gets no more time: its seconds join the
        stage's total."""
        with self._lock:
            cells = self._open[name]
            for index, open_cell in enumerate(cells):
                if open_cell is cell:  # by identity: two accounts may hold the same seconds
                    del cells[index]
                    self._closed[name] += cell[0]
                    return

    def seconds(self) -> dict[str, float]:
        """Seconds per stage so far (a copy)."""
        with self._lock:
            names = set(self._open) | set(self._closed)
            return {
                name: self._closed.get(name, 0.0) + sum(c[0] for c in self._open.get(name, ()))
                for name in names
            }


def stage_kind(name: str) -> str:
    """The operation of a stage name: ``"map#1"`` -> ``"map"``."""
    return name.partition("#")[0]


def source_stage(name: str) -> bool:
    """Whether the stage named ``name`` is a source (it reads: a file, a range, a list)."""
    return name.endswith("$")


def _name(node: Dataset, depth: int) -> str:
    kind = type(node).__name__.removesuffix("Dataset").lower() or "dataset"
    return f"{kind}#{depth}" + ("$" if not node.inputs else "")


def timed(dataset: Dataset, clock: StageClock) -> Dataset:
    """``dataset`` with every stage timed into ``clock`` (the module's docstring)."""
    return _wrap(dataset, clock, 0, {})


def _wrap(node: Dataset, clock: StageClock, depth: int, done: dict[int, Dataset]) -> Dataset:
    if id(node) in done:
        return done[id(node)]
    inner = node
    if node.inputs and type(node).__name__ not in _KEEP_INPUTS:
        inputs = tuple(_wrap(item, clock, depth + 1, done) for item in node.inputs)
        inner = node._with_inputs(inputs)
    wrapped = _TimedDataset(inner, _name(node, depth), clock)
    done[id(node)] = wrapped
    return wrapped


def profile(dataset: Dataset, elements: int) -> dict[str, float]:
    """Runs the first ``elements`` of ``dataset`` in this process; the seconds per stage.

    Example:
      >>> from feedline.data import Dataset
      >>> sorted(profile(Dataset.range(10).map(lambda x: x + 1), 10))
      ['map#0', 'range#1$']
    """
    clock = StageClock()
    iterator = iter(timed(dataset, clock))
    try:
        for count, _ in enumerate(raw_elements(iterator), start=1):
            if count >= elements:
                break
    finally:
        iterator.close()
    return clock.seconds()


class _TimedDataset(Dataset):
    """``input_dataset`` as it is, its time added to ``clock`` under ``name``."""

    def __init__(self, input_dataset: Dataset, name: str, clock: StageClock) -> None:
        super().__init__((input_dataset,))
        self._name = name
        self._clock = clock
        self._element_spec = input_dataset.element_spec

    def _cardinality(self) -> int:
        return self._inputs[0].cardinality()

    def _random_access(self) -> RandomAccess | None:
        return self._inputs[0]._random_access()

    def _is_sharded_elsewhere(self) -> bool:
        return self._inputs[0]._is_sharded_elsewhere()

    def _make_iterator(self, ctx: IteratorContext) -> _TimedIterator:
        return _TimedIterator(self, ctx)


class _TimedIterator(DatasetIterator):
    def __init__(self, dataset: _TimedDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)
        self._clock, self._name = dataset._clock, dataset._name
        self._account = self._clock.account(self._name)

    def _next(self) -> Any:
        # ``_local.inner``: the time the stages below this one spent, in this thread.
        local = _local
        outer = getattr(local, "inner", 0.0)
        local.inner = 0.0
        started = perf_counter()
        try:
            return self._input._next()
        finally:
            elapsed = perf_counter() - started
            own = elapsed - local.inner
            if own > 0.0:
                self._account[0] += own
            local.inner = outer + elapsed

    def _get_state(self) -> dict[str, Any]:
        return {"input": self._input.get_state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._input.set_state(state["input"])

    def _close(self) -> None:
        self._input.close()
        self._clock.close(self._name, self._account)
