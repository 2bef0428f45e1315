"""Dynamic sharding on a worker: the dataset's source replaced by the splits it is handed.

``with_split_source(dataset, provider)`` rebuilds ``dataset`` over a ``SplitSourceDataset``: a
source that asks its ``SplitProvider`` (the dispatcher, through an RPC, in the service) for
splits, lists of unit indices of the source's ``SplitPlan`` (``splits``), and yields the source's
elements of each; everything above it (map, shuffle, batch, ...) runs as usual.

Example:
  >>> from feedline.data import Dataset
  >>> from feedline.service.splits import SplitCursor, split_plan
  >>> dataset = Dataset.range(6).map(lambda x: x * 10)
  >>> plan = split_plan(dataset)
  >>> plan
  SplitPlan(num_units=6, shuffle=False, seed=None, unit='element', unit_bytes=None)
  >>> cursors = {}  # the dispatcher's: one per repetition
  >>> class Dispatcher:
  ...     def next_split(self, repetition):
  ...         cursor = cursors.setdefault(repetition, SplitCursor.start(plan, repetition, 1))
  ...         return cursor.next()
  >>> worker = with_split_source(dataset, Dispatcher())
  >>> [int(x) for x in worker]
  [0, 10, 20, 30, 40, 50]
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol, cast

import numpy as np

from feedline.data.auto_shard import rebuild_graph
from feedline.data.dataset import (
    UNKNOWN_CARDINALITY,
    Dataset,
    DatasetIterator,
    IteratorContext,
    RandomAccess,
)
from feedline.data.readers.list_files import ListFilesDataset, _NamesAccess
from feedline.errors import FailedPreconditionError, InvalidArgumentError
from feedline.service.splits import SplitPlan, _plan_of, _source_of

__all__ = ["SplitProvider", "SplitSourceDataset", "with_split_source"]


class SplitProvider(Protocol):
    """Where a worker's split source gets its splits (an RPC to the dispatcher, in the service)."""

    def next_split(self, repetition: int) -> Sequence[int] | None:
        """The unit indices of the next split of ``repetition``, None when it has no more."""
        ...


def with_split_source(dataset: Dataset, provider: SplitProvider) -> Dataset:
    """``dataset`` with its source replaced by a ``SplitSourceDataset`` reading from ``provider``.

    Every node above the source is rebuilt over the new one (``Dataset._with_inputs``); the
    result is made on the worker and does not pickle.

    Raises:
      InvalidArgumentError: ``dataset`` has no splittable source (see ``split_plan``).
    """
    source = _source_of(dataset)
    split_source = SplitSourceDataset(source, provider)
    return rebuild_graph(dataset, lambda node: split_source if node is source else None)


class SplitSourceDataset(Dataset):
    """A source that yields only the splits its provider hands out, one repetition per pass.

    Each iterator is one repetition: when it first needs a split it takes the next repetition
    number (0, 1, ...; counted per ``SplitSourceDataset``, thread-safe), then asks
    ``provider.next_split(repetition)`` until it returns None. So ``repeat(2)`` above it asks
    for repetitions 0 then 1; an iterator made but never read (as ``repeat(n)`` makes after its
    last epoch) takes no number. Elements come as the source gives them:

    ==================================  ==================================================
    source                              each split yields
    ==================================  ==================================================
    random-access                       its rows, read with ``get`` (``gather`` for batch)
    ``list_files``                      its files' names, in the split's order
    file reader given names             the reader over the split's files, iterated
    ==================================  ==================================================

    Its iterators cannot be checkpointed: a worker's splits are the dispatcher's to track.

    Args:
      source: the dataset's source (a dataset without inputs) that ``split_plan`` accepts.
      provider: where splits come from, an object with ``next_split(repetition)``.

    Raises:
      InvalidArgumentError: a source with inputs or that cannot be split, or no provider.
    """

    def __init__(self, source: Dataset, provider: SplitProvider) -> None:
        super().__init__()
        if not isinstance(source, Dataset) or source.inputs:
            raise InvalidArgumentError(
                f"SplitSourceDataset wraps a source (a Dataset without inputs), got "
                f"{type(source).__name__}; use with_split_source(dataset, provider)"
            )
        if not callable(getattr(provider, "next_split", None)):
            raise InvalidArgumentError(
                f"SplitSourceDataset: provider must have a next_split(repetition) method, got "
                f"{type(provider).__name__}"
            )
        self._plan = _plan_of(source)
        self._source = source
        self._provider = provider
        self._element_spec = source.element_spec
        self._own_options = source._own_options
        self._repetitions = 0
        self._repetition_lock = threading.Lock()

    @property
    def plan(self) -> SplitPlan:
        """The plan of the wrapped source: what the dispatcher's splits index."""
        return self._plan

    @property
    def source(self) -> Dataset:
        """The wrapped source, as the dataset had it."""
        return self._source

    def next_repetition(self) -> int:
        """Takes the next repetition number (what each iterator does once)."""
        with self._repetition_lock:
            repetition = self._repetitions
            self._repetitions += 1
        return repetition

    def _cardinality(self) -> int:
        return UNKNOWN_CARDINALITY

    def _make_iterator(self, ctx: IteratorContext) -> DatasetIterator:
        if self._plan.unit == "file" and not isinstance(self._source, ListFilesDataset):
            return _SplitFilesIterator(self, ctx)
        return _SplitRowsIterator(self, ctx)

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(
            "SplitSourceDataset cannot be pickled: it reads splits through this worker's "
            "provider; ship the original dataset and call with_split_source on the worker"
        )

    def __repr__(self) -> str:
        return f"<SplitSourceDataset of {type(self._source).__name__} {self._plan}>"


def _not_checkpointable() -> FailedPreconditionError:
    return FailedPreconditionError(
        "a SplitSourceDataset iterator cannot be checkpointed: the dispatcher tracks which "
        "splits each worker has read (DYNAMIC sharding, processing_mode='distributed_epoch')"
    )


class _SplitIterator(DatasetIterator):
    """One repetition of a split source: asks the provider for splits until it has none."""

    _dataset: SplitSourceDataset

    def __init__(self, dataset: SplitSourceDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._provider = dataset._provider
        self._num_units = dataset._plan.num_units
        self.repetition: int | None = None  # taken when the first split is asked for
        self._splits_read = 0
        self._exhausted = False

    def _next_split(self) -> np.ndarray:
        """The unit indices of the next split; StopIteration when the repetition has no more."""
        if self._exhausted:
            raise StopIteration
        if self.repetition is None:
            self.repetition = self._dataset.next_repetition()
        split = self._provider.next_split(self.repetition)
        if split is None:
            self._exhausted = True
            raise StopIteration
        self._splits_read += 1
        return _check_split(split, self._num_units, self.repetition)

    def _get_state(self) -> dict[str, Any]:
        raise _not_checkpointable()

    def _set_state(self, state: dict[str, Any]) -> None:
        raise _not_checkpointable()


def _check_split(split: Sequence[int], num_units: int, repetition: int) -> np.ndarray:
    indices = np.asarray(split)
    if indices.size == 0:
        return np.empty(0, np.int64)
    if indices.ndim != 1 or indices.dtype.kind not in "iu":
        raise InvalidArgumentError(
            f"the split provider gave {split!r} for repetition {repetition}; a split is a "
            "sequence of unit indices (ints)"
        )
    indices = indices.astype(np.int64, copy=False)
    outside = indices[(indices < 0) | (indices >= num_units)]
    if outside.size:
        raise FailedPreconditionError(
            f"the split provider gave unit {int(outside[0])} for repetition {repetition}, "
            f"outside [0, {num_units}) for this worker's source; the dispatcher's SplitPlan does "
            "not match the dataset the worker built (did the files matched change?)"
        )
    return indices


class _SplitRowsIterator(_SplitIterator):
    """Rows of a random-access source (or list_files' names), split after split."""

    def __init__(self, dataset: SplitSourceDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        source = dataset._source
        access: RandomAccess | None
        if isinstance(source, ListFilesDataset):
            access = _NamesAccess(source._encoded)  # the sorted names, which units index
            source.pin_versions(ctx)  # a split run again reads the objects as listed
        else:
            access = source._random_access()
        if access is None:  # split_plan accepted the source, so it has random access
            raise FailedPreconditionError(f"{type(source).__name__} lost its random access")
        self._access = access
        self._split = np.empty(0, np.int64)
        self._position = 0
        self._next_batch = self._gather

    def _next(self) -> Any:
        while self._position >= len(self._split):
            self._split, self._position = self._next_split(), 0
        index = int(self._split[self._position])
        self._position += 1
        return self._access.get(index)

    def _gather(self, n: int) -> Any:
        """Up to ``n`` rows stacked, across splits (batch's fast path)."""
        parts: list[np.ndarray] = []
        count = 0
        while count < n:
            if self._position >= len(self._split):
                try:
                    self._split, self._position = self._next_split(), 0
                except StopIteration:
                    break
                continue
            part = self._split[self._position : self._position + n - count]
            self._position += len(part)
            count += len(part)
            parts.append(part)
        if not count:
            raise StopIteration
        return self._access.gather(parts[0] if len(parts) == 1 else np.concatenate(parts))


class _SplitFilesIterator(_SplitIterator):
    """The records of a file reader, reading each split's files with the same reader."""

    def __init__(self, dataset: SplitSourceDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        # A file reader given names (FileReaderMixin), which split_plan accepted.
        self._source: Any = cast(Any, dataset._source)
        self._names: tuple[str, ...] = self._source._filenames
        self._reader: DatasetIterator | None = None

    def _next(self) -> Any:
        while True:
            if self._reader is not None:
                try:
                    return self._reader._next()
                except StopIteration:
                    self._reader.close()
                    self._reader = None
            split = self._next_split()
            if len(split):
                reader = self._source._with_files([self._names[i] for i in split.tolist()])
                self._reader = reader._iterator(self._ctx.child(self._splits_read))
