"""``Dataset.load``: the elements of a dataset that ``Dataset.save`` (or ``snapshot``) wrote.

``load`` reads the snapshot's ``DONE`` file and metadata when it is called (so a missing or
unfinished snapshot is an error at once), then builds the dataset that reads it: one
``SnapshotShardDataset`` per shard, given as a dataset of datasets to ``reader_func``, which
combines them, as in TensorFlow. The iterator's state is the reader's: where ``reader_func``
interleaves the shards, the chunk and row reached in each open shard.

With ``wait=True`` a snapshot that ``distributed_save`` writes (or wrote) is read by
``load_while_writing.LoadWhileWritingDataset``, which follows its streams as their chunks are
committed and ends with the save.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from feedline import structure
from feedline.data.autotune import cpu_budget
from feedline.data.dataset import AUTOTUNE, Dataset, DatasetIterator, IteratorContext
from feedline.data.ops import _snapshot_fs as fs
from feedline.data.ops._snapshot_format import (
    METADATA,
    ChunkCursor,
    Finished,
    read_finished,
    read_json,
    resolve_codec,
    shard_dir,
    spec_from_json,
)
from feedline.data.ops._snapshot_streams import STREAMS, read_saving
from feedline.data.ops.load_while_writing import LoadWhileWritingDataset
from feedline.data.ops.snapshot_positions import DEFAULT_TIMEOUT_S, SnapshotPositions
from feedline.errors import InvalidArgumentError, NotFoundError

ROUND_ROBIN = "round_robin"


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """The spec of an element that is itself a dataset (``tf.data.DatasetSpec``); its shape
    is that of one dataset, ``()``."""

    element_spec: Any
    shape: tuple[int, ...] = ()


class SnapshotShardDataset(Dataset):
    """The elements of one shard of a finished snapshot, chunk after chunk."""

    def __init__(self, path: str, chunks: tuple[tuple[str, int], ...], element_spec: Any) -> None:
        super().__init__()
        self._path = path
        self._chunks = chunks
        self._element_spec = element_spec

    def _cardinality(self) -> int:
        return sum(count for _, count in self._chunks)

    def _make_iterator(self, ctx: IteratorContext) -> _SnapshotShardIterator:
        return _SnapshotShardIterator(self, ctx)

    def __repr__(self) -> str:
        return f"<SnapshotShardDataset {self._path} element_spec={self.element_spec}>"


class _SnapshotShardIterator(DatasetIterator):
    """Single-threaded, as every iterator's API; its place is a chunk and a row in it."""

    def __init__(self, dataset: SnapshotShardDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._cursor = ChunkCursor(dataset._path, dataset._chunks, dataset.element_spec)

    def _next(self) -> Any:
        return self._cursor.next()

    def _get_state(self) -> dict[str, Any]:
        return self._cursor.state()

    def _set_state(self, state: dict[str, Any]) -> None:
        self._cursor.restore(state)


class SnapshotShardListDataset(Dataset):
    """A dataset whose elements are the ``SnapshotShardDataset`` of each shard, in shard order:
    what ``reader_func`` receives."""

    def __init__(self, shards: tuple[SnapshotShardDataset, ...], element_spec: Any) -> None:
        super().__init__()
        self._shards = shards
        self._element_spec = DatasetSpec(element_spec)

    def _cardinality(self) -> int:
        return len(self._shards)

    def _make_iterator(self, ctx: IteratorContext) -> _SnapshotShardListIterator:
        return _SnapshotShardListIterator(self, ctx)


class _SnapshotShardListIterator(DatasetIterator):
    """Single-threaded, as every iterator's API; its place is the next shard's index."""

    def __init__(self, dataset: SnapshotShardListDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._shards = dataset._shards
        self._position = 0

    def _next(self) -> Any:
        if self._position >= len(self._shards):
            raise StopIteration
        self._position += 1
        return self._shards[self._position - 1]

    def _get_state(self) -> dict[str, Any]:
        return {"position": self._position}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._position = int(state["position"])


def default_reader(finished: Finished, options: Any) -> Callable[[Dataset], Dataset]:
    """TensorFlow's default ``reader_func``: the shards interleaved, one element of each in
    turn, read in parallel. Where the writer dealt the elements round-robin, every shard is in
    the cycle, so the elements come back in the order they were saved."""
    cycle = len(finished.shards) if finished.sharding == ROUND_ROBIN else cpu_budget(options)

    def reader_func(datasets: Dataset) -> Dataset:
        return datasets.interleave(
            lambda x: x, cycle_length=max(1, cycle), num_parallel_calls=AUTOTUNE
        )

    return reader_func


def _narrower(stored: tuple[int | None, ...] | None, given: tuple[int | None, ...]) -> bool:
    """Whether every shape ``stored`` allows fits ``given`` (unknown rank fits only unknown)."""
    return (
        stored is not None
        and len(stored) == len(given)
        and all(a is None or a == b for a, b in zip(given, stored, strict=True))
    )


def _check_spec(given: Any, stored: Any, path: str) -> Any:
    """``given`` where the stored elements fit it, else an error naming both."""
    fits = structure.same_structure(given, stored) and all(
        isinstance(g, structure.TensorSpec)
        and g.dtype == s.dtype
        and (g.shape is None or _narrower(s.shape, g.shape))
        for g, s in zip(structure.spec_leaves(given), structure.spec_leaves(stored), strict=True)
    )
    if not fits:
        raise InvalidArgumentError(
            f"load: the element_spec given, {given}, does not match the spec of the elements "
            f"saved in {path}, {stored}; leave element_spec=None to use the saved one"
        )
    return given


class LoadDataset(Dataset):
    """The elements saved in ``path`` by ``save`` or ``snapshot``, read by ``reader_func``.

    The element spec is the saved one (or ``element_spec``, which must fit it); the
    cardinality is the number saved where the default reader reads them, else whatever
    ``reader_func`` returns has. Its one input is the dataset ``reader_func`` built.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        element_spec: Any = None,
        compression: str | None = None,
        reader_func: Callable[[Dataset], Dataset] | None = None,
        wait: bool = False,
    ) -> None:
        path = os.fspath(path)
        saving = None
        try:
            finished: Finished | None = read_finished(path, "load")
        except NotFoundError as error:
            saving = read_saving(path) if wait else None
            if wait and saving is None and fs.exists(path):
                raise NotFoundError(
                    f"load(wait=True): {path} holds no finished snapshot and no distributed_save "
                    "is writing one (its SAVING file is missing); a Dataset.save still running "
                    "can be loaded once it finishes",
                    name=path,
                ) from error
            if saving is None:
                raise
            finished = None
        if finished is not None:
            codec, spec = finished.codec, finished.element_spec
        else:
            assert saving is not None
            meta = read_json(fs.join(path, saving["run"], METADATA))
            codec, spec = str(meta["codec"]), spec_from_json(meta["element_spec"])
        if compression is not None and resolve_codec(compression, "load") != codec:
            raise InvalidArgumentError(
                f"load: {path} was saved with compression {codec!r}, not "
                f"{compression!r}; pass compression={codec!r} or None"
            )
        if element_spec is not None:
            spec = _check_spec(element_spec, spec, path)
        if finished is not None and wait and finished.sharding == STREAMS and not reader_func:
            # A distributed save read with wait=True reads the same way whether it has finished
            # or not, so that a position saved while it was written restores after.
            inner: Dataset = LoadWhileWritingDataset(path, finished.run, len(finished.shards), spec)
        elif finished is None:
            assert saving is not None
            if reader_func is not None:
                raise InvalidArgumentError(
                    f"load(wait=True): {path} is still being written, and reading it while it "
                    "is takes no reader_func (the reader follows the streams as their chunks "
                    "are committed); pass reader_func=None, or load it once it is finished"
                )
            inner = LoadWhileWritingDataset(
                path, str(saving["run"]), int(saving["num_streams"]), spec
            )
        else:
            shards = tuple(
                SnapshotShardDataset(shard_dir(finished.run_dir, s.shard), s.chunks, spec)
                for s in finished.shards
            )
            datasets = SnapshotShardListDataset(shards, spec)
            reader = reader_func or default_reader(finished, datasets.options())
            inner = reader(datasets)
            if not isinstance(inner, Dataset):
                raise TypeError(
                    f"load: reader_func must return a Dataset, got {type(inner).__name__}"
                )
        super().__init__((inner,))
        self._path = path
        self._element_spec = spec
        self._saved_elements = (
            finished.elements if finished is not None and reader_func is None else None
        )
        self._own_reader = reader_func is not None

    def positions(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> SnapshotPositions | None:
        """The snapshot's elements by stream and offset (``snapshot_positions``), finished or
        still being written; None where a ``reader_func`` reads it (the order is its own)."""
        if self._own_reader:
            return None
        return SnapshotPositions.open(self._path, self._element_spec, timeout_s)

    def _cardinality(self) -> int:
        if self._saved_elements is not None:
            return self._saved_elements
        return self._inputs[0].cardinality()

    def _make_iterator(self, ctx: IteratorContext) -> _LoadIterator:
        return _LoadIterator(self, ctx)


class _LoadIterator(DatasetIterator):
    """Single-threaded, as every iterator's API; the reader's iterator and its state."""

    def __init__(self, dataset: LoadDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)

    def _next(self) -> Any:
        return self._input._next()

    def _get_state(self) -> dict[str, Any]:
        return {"reader": self._input.get_state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._input.set_state(state["reader"])
