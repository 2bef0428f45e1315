"""``Dataset.cache``: the first complete pass kept, in memory or in files, for later passes.

A pass over a cache that is not complete reads the input and writes what it reads; when it
reaches the end it commits, and every later pass reads the cache instead. A pass that stops
early (``cache().take(k)``, an iterator closed halfway) leaves nothing behind.

The iterator's state is small: its mode, its position, its pass seed and, while writing, the
input's state. A writing pass restored from a checkpoint reads on from the input without writing
(it lacks the elements before its position); the pass that then writes the cache reads the input
with the restored pass's seed, so that it holds what the original run cached. A reading pass
restored where the cache is gone (a new process, deleted files) replays the input from the start
with the seed of the pass that filled it, refilling the cache, up to its position. Both are
exact when the input is deterministic for a given pass seed (seeded shuffles are).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import numpy as np

from feedline import structure
from feedline.data.dataset import (
    Dataset,
    DatasetIterator,
    IteratorContext,
    RandomAccess,
    RowCursor,
)
from feedline.data.ops._cache_files import FileStore
from feedline.data.ops.from_tensor_slices import TensorSliceDataset
from feedline.errors import InvalidArgumentError

logger = logging.getLogger(__name__)


class CacheDataset(Dataset):
    """Caches the elements of the first complete pass, in memory or in ``filename``'s files.

    In memory (``filename=""``) the cache belongs to this dataset object: new iterators of it
    and later ``repeat`` epochs read it, and once full it is random-access, so ``shuffle`` and
    ``batch`` take their fast paths. Elements are shared with the cache: do not modify them in
    place. A pickled CacheDataset travels without its contents.

    With a ``filename`` the elements go to ``{filename}.data`` (NumPy ``.npy`` records, no
    pickle; byte strings as their lengths and their concatenated bytes, so they read back
    exactly) and ``{filename}.index``, written when the pass completes; any later pass, in any
    process, reads them. ``{filename}.lock`` keeps a second writer out: it is an error to
    write the same cache from two iterators at once. ``filename`` may be a URL
    (``s3://bucket/cache/train``): the data is then one upload the store shows once the pass
    completes, and later passes read it in ranged requests, ahead of the reader. A complete
    cache on a local disk is random-access too, in any process (the data memory-mapped, its
    rows read-only views): ``shuffle``, ``shard`` and ``GlobalBatches`` read it by index.

    Example:
      >>> from feedline.data import Dataset
      >>> calls = []
      >>> ds = Dataset.range(3).map(lambda x: calls.append(1) or x * 10).cache()
      >>> [int(x) for x in ds], [int(x) for x in ds], len(calls)
      ([0, 10, 20], [0, 10, 20], 3)
    """

    def __init__(self, input_dataset: Dataset, filename: str | os.PathLike[str] = "") -> None:
        super().__init__((input_dataset,))
        if not isinstance(filename, str | os.PathLike):
            raise TypeError(f"cache: filename must be a str or path, got {filename!r}")
        self._filename = os.fspath(filename)
        self._store = self._new_store()

    def _new_store(self) -> FileStore | _MemoryStore:
        if self._filename:
            return FileStore(self._filename, self._inputs[0])
        return _MemoryStore()

    def _with_inputs(self, inputs: tuple[Dataset, ...]) -> CacheDataset:
        """The same cache over other inputs, empty: it never shares what this one holds. A
        file cache keeps its ``filename``, so the rewritten pipeline reads files written by
        this one (give each rewritten pipeline its own filename where their data differ)."""
        clone = super()._with_inputs(inputs)
        clone._store = clone._new_store()
        return clone

    @property
    def element_spec(self) -> Any:
        return self._inputs[0].element_spec

    def _cardinality(self) -> int:
        return self._inputs[0].cardinality()

    def _random_access(self) -> RandomAccess | None:
        return self._store.random_access()

    def _make_iterator(self, ctx: IteratorContext) -> _CacheIterator:
        return _CacheIterator(self, ctx)


# -- in memory ------------------------------------------------------------------------------


class _Rows:
    """A complete in-memory cache: the elements stacked into the rows of a random-access
    ``from_tensor_slices`` source where their shapes allow, else kept as a list. Byte strings
    (object arrays of ``bytes``) stack exactly; unicode strings stay a list, since a NumPy
    ``U`` row would lose trailing NUL characters, and so do ragged and sparse leaves."""

    def __init__(self, elements: list[Any], seed: int) -> None:
        self.seed = seed  # of the pass that filled the cache
        self.access: RandomAccess | None = None  # where the rows can be gathered
        self._elements = elements  # emptied once stacked into ``access``
        leaves = structure.flatten(elements[0])[0] if elements else []
        if leaves and all(
            isinstance(a, np.ndarray | np.generic) and a.dtype.kind != "U" for a in leaves
        ):
            try:
                stacked = structure.batch_elements(elements, "cache")
            except InvalidArgumentError:
                return  # elements of different shapes stay a list
            self.access = TensorSliceDataset(stacked)._random_access()
            self._elements = []

    def __len__(self) -> int:
        return len(self.access) if self.access is not None else len(self._elements)

    def get(self, index: int) -> Any:
        if self.access is not None:
            return self.access.get(index)
        return self._elements[index]

    def gather(self, indices: np.ndarray) -> Any:
        """The rows at ``indices`` stacked; an error where their shapes differ (why they are a
        list). Readers gather only from ``access``; this makes ``_Rows`` a ``RandomAccess``."""
        if self.access is not None:
            return self.access.gather(indices)
        return structure.batch_elements([self._elements[i] for i in indices], "cache")


class _MemoryStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: _Rows | None = None
        self.pending_seed: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {}  # a description travels without the data of this process

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(_MemoryStore().__dict__)

    def complete(self) -> bool:
        return self._rows is not None

    def remember_seed(self, seed: int) -> None:
        """A complete pass that could not write (see ``_CacheIterator``) read the input with
        ``seed``; the pass that writes the cache reads it the same way."""
        if self._rows is None and self.pending_seed is None:
            self.pending_seed = seed

    def random_access(self) -> RandomAccess | None:
        return None if self._rows is None else self._rows.access

    def open_reader(self, position: int, offset: int, row: int) -> _MemoryReader:
        if self._rows is None:
            raise InvalidArgumentError("cache: the in-memory cache is not complete")
        return _MemoryReader(self._rows, position)

    def open_writer(self, seed: int) -> _MemoryWriter | None:
        """A writer for the pass of ``seed``; None if another pass completed the cache."""
        return None if self.complete() else _MemoryWriter(self, seed)

    def commit(self, elements: list[Any], seed: int) -> None:
        with self._lock:
            if self._rows is None:
                self._rows = _Rows(elements, seed)


class _MemoryReader(RowCursor):
    def __init__(self, rows: _Rows, position: int) -> None:
        super().__init__(rows.access if rows.access is not None else rows, position)
        self.seed = rows.seed
        self.offset = self.row = 0
        self.batched = rows.access is not None

    def close(self) -> None:
        return None


class _MemoryWriter:
    def __init__(self, store: _MemoryStore, seed: int) -> None:
        self._store = store
        self._seed = seed
        self._elements: list[Any] = []

    def add(self, element: Any) -> None:
        self._elements.append(element)

    def commit(self) -> None:
        self._store.commit(self._elements, self._seed)

    def abort(self) -> None:
        self._elements = []


# -- the iterator ---------------------------------------------------------------------------

_READ, _WRITE, _PASS = "read", "write", "pass"  # modes: from the cache, filling it, neither


class _CacheIterator(DatasetIterator):
    def __init__(self, dataset: CacheDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._store = dataset._store
        self._input: Any = None  # a DatasetIterator while not reading from the cache
        self._reader: Any = None
        self._writer: Any = None
        self._position = 0
        self._mode = _READ
        if self._store.complete():
            self._read(0)
        else:
            if self._store.pending_seed is not None:
                self._restore_seed(self._store.pending_seed)
            self._start_input(_WRITE)

    def _read(self, position: int, offset: int = 0, row: int = 0) -> None:
        self._mode = _READ
        self._reader = self._store.open_reader(position, offset, row)
        self._next_batch = self._reader.next_batch if self._reader.batched else None

    def _start_input(self, mode: str) -> DatasetIterator:
        self._mode = mode
        self._position = 0
        self._next_batch = None
        self._input = self._dataset._inputs[0]._iterator(self._ctx)
        return self._input

    def _next(self) -> Any:
        if self._mode == _READ:
            return self._reader.next()
        if self._mode == _WRITE and self._writer is None:
            self._writer = self._store.open_writer(self._ctx.seed)
            if self._writer is None:  # another pass completed the cache meanwhile
                self._close_parts()
                self._read(0)
                return self._reader.next()
        try:
            element = self._input._next()
        except StopIteration:
            if self._writer is not None:
                self._writer.commit()
                self._writer = None
            else:
                self._store.remember_seed(self._ctx.seed)
            self._mode = _PASS
            raise
        if self._writer is not None:
            self._writer.add(element)
        self._position += 1
        return element

    def _get_state(self) -> dict[str, Any]:
        if self._mode == _READ:
            # The seed of the pass that filled the cache: a replay must see the same input.
            reader = self._reader
            seed, position, offset, row = reader.seed, reader.position, reader.offset, reader.row
            rest = []
        else:
            seed, position, offset, row = self._ctx.seed, self._position, 0, 0
            rest = [self._input.get_state()]
        return {
            "seed": seed,
            "mode": self._mode,
            "position": position,
            "offset": offset,  # of the file chunk being read
            "row": row,  # in that chunk
            "input": rest,
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        self._restore_seed(state["seed"])
        self._close_parts()
        mode, position = state["mode"], int(state["position"])
        if mode == _READ and self._store.complete():
            self._read(position, int(state["offset"]), int(state["row"]))
        elif mode == _READ:
            self._replay(position)
        else:
            # A pass restored at its start can still fill the cache; later on it cannot.
            fill = mode == _WRITE and position == 0
            self._start_input(_WRITE if fill else _PASS).set_state(state["input"][0])
            self._position = position

    def _replay(self, position: int) -> None:
        """A new filling pass, moved on to ``position``: the cache was read, but is gone."""
        self._start_input(_WRITE)
        for _ in range(position):
            try:
                self._next()
            except StopIteration:
                raise InvalidArgumentError(
                    f"cache: the state was saved at element {position}, but the input now ends "
                    f"after {self._position}; it cannot be restored on this input"
                ) from None

    def _close_parts(self) -> None:
        if self._writer is not None:
            logger.warning(
                "cache: the iterator stopped after %d elements, before the end of the dataset "
                "being cached; the partial cache is discarded. A pipeline like "
                "`dataset.cache().take(k)` never fills its cache: use `dataset.take(k).cache()`",
                self._position,
            )
            self._writer.abort()
            self._writer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._input is not None:
            self._input.close()
            self._input = None

    def _close(self) -> None:
        self._close_parts()
