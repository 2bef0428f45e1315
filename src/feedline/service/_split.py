"""Dynamic sharding (``processing_mode="distributed_epoch"``): a dataset's source, cut in splits.

The dispatcher never loads a dataset. It learns from the client the dataset's ``SplitPlan`` (how
many *units* its source has, whether to hand them out shuffled), and for every repetition (epoch
of the source) it keeps a ``SplitCursor`` that gives the next split, a list of unit indices, to
whichever worker asks. A worker runs the dataset with its source replaced by a
``SplitSourceDataset`` (``with_split_source``): that source asks its ``SplitProvider`` for splits
and yields the source's elements of each, and everything above it (map, shuffle, batch, ...)
runs on the worker as usual. Together the workers see every unit once per repetition.

=================================================  =======  ===================================
the dataset's source                               unit     a worker yields for each unit
=================================================  =======  ===================================
``range``, ``from_tensor_slices``, another finite  element  that element
random-access source (``NpyDataset`` given names)
``list_files``, shuffled or not                    file     the file name, as list_files does
a file reader given names (``TFRecordDataset``,    file     every record of that file
``TextLineDataset``, ``CsvDataset`` ...)
=================================================  =======  ===================================

A reader over a Dataset of names (``TFRecordDataset(Dataset.list_files(pattern))``) is split
through that Dataset, its source. Only the graph's leaves count: datasets made inside an
``interleave`` or ``flat_map`` function are not in the graph. Two workers that ask in turn for
splits of ``range(8)``, two units each::

    dispatcher hands out:  [0, 1]  [2, 3]  [4, 5]  [6, 7]  None
    worker 0 (asks first): [0, 1], [4, 5]  -> 0, 1, 4, 5
    worker 1:              [2, 3], [6, 7]  -> 2, 3, 6, 7

Example:
  >>> from feedline.data import Dataset
  >>> dataset = Dataset.range(6).map(lambda x: x * 10)
  >>> plan = split_plan(dataset)
  >>> plan
  SplitPlan(num_units=6, shuffle=False, seed=None, unit='element')
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

import dataclasses
import secrets
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import numpy as np

from feedline.data.auto_shard import rebuild_graph
from feedline.data.dataset import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    DatasetIterator,
    IteratorContext,
    RandomAccess,
    mix_seed,
    walk,
)
from feedline.data.readers.list_files import ListFilesDataset, _NamesAccess
from feedline.errors import FailedPreconditionError, InvalidArgumentError

__all__ = [
    "SplitCursor",
    "SplitPlan",
    "SplitProvider",
    "SplitSourceDataset",
    "split_plan",
    "with_split_source",
]

Unit = Literal["element", "file"]
_UNITS = ("element", "file")
#: Splits of element sources hold about 1/16 of a worker's share, within these bounds.
_SPLITS_PER_WORKER = 16
_MAX_SPLIT = 1024

_NEEDS = (
    "DYNAMIC sharding (processing_mode='distributed_epoch') needs a splittable source: range, "
    "from_tensor_slices, list_files or a file reader over a list of files"
)
_ADVICE = (
    "Use ShardingPolicy.OFF ('parallel_epochs') to have every worker run the whole dataset, or a "
    "static policy (FILE, DATA) to shard it by worker index"
)


# -- what the dispatcher knows ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    """What the dispatcher needs to hand out a dataset's source: its units and their order.

    Attributes:
      num_units: how many units the source has (elements, or files; see ``unit``).
      shuffle: whether each repetition hands the units out in a new random order (``list_files``
        with ``shuffle=True``).
      seed: the seed of those orders (``list_files``'s), None for fresh randomness in each
        repetition; unused without ``shuffle`` (``split_plan`` then gives None).
      unit: ``"element"`` (one element of a random-access source) or ``"file"`` (one file).

    Raises:
      InvalidArgumentError: a field of the wrong type or out of range.
    """

    num_units: int
    shuffle: bool
    seed: int | None
    unit: Unit = "element"

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_units", _check_int("SplitPlan", "num_units", self.num_units))
        if not isinstance(self.shuffle, bool | np.bool_):
            raise InvalidArgumentError(f"SplitPlan: shuffle must be a bool, got {self.shuffle!r}")
        object.__setattr__(self, "shuffle", bool(self.shuffle))
        if self.seed is not None:
            object.__setattr__(self, "seed", _check_int("SplitPlan", "seed", self.seed, None))
        if self.unit not in _UNITS:
            raise InvalidArgumentError(
                f"SplitPlan: unit must be one of {_UNITS}, got {self.unit!r}"
            )

    def to_json(self) -> dict[str, Any]:
        """The plan as a dict of JSON values; ``from_json`` reads it back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SplitPlan:
        """The plan that ``to_json`` gave.

        Raises:
          InvalidArgumentError: not a dict with exactly the plan's fields, or a bad field.
        """
        return cls(**_fields(cls, data))


@dataclasses.dataclass
class SplitCursor:
    """The dispatcher's position in one repetition of a source: a plain, JSON-serialisable record.

    ``next()`` hands out units ``position .. position + split_size - 1`` of the repetition's
    order: ``0 .. num_units - 1``, or, with a ``seed``, the permutation of them that the seed
    fixes (recomputed from the seed, never stored). ``range(10)`` and 2 workers (splits of 1
    unit), and a shuffled ``list_files`` of 4 files::

        in order:  [0] [1] [2] ... [9] None
        shuffled:  [2] [0] [3] [1] None     (the order depends on seed; a new one per repetition)

    Attributes:
      num_units: the units of the source (``SplitPlan.num_units``).
      split_size: how many units each split holds (the last may hold fewer).
      position: how many units have been handed out.
      seed: the seed of the permutation, None to hand units out in order.

    Example:
      >>> cursor = SplitCursor(num_units=5, split_size=2)
      >>> cursor.next(), cursor.to_json()
      ([0, 1], {'num_units': 5, 'split_size': 2, 'position': 2, 'seed': None})
      >>> restored = SplitCursor.from_json(cursor.to_json())
      >>> restored.next(), restored.next(), restored.next()
      ([2, 3], [4], None)
    """

    num_units: int
    split_size: int
    position: int = 0
    seed: int | None = None
    _order: np.ndarray | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self.num_units = _check_int("SplitCursor", "num_units", self.num_units)
        self.split_size = _check_int("SplitCursor", "split_size", self.split_size, 1)
        self.position = _check_int("SplitCursor", "position", self.position)
        if self.position > self.num_units:
            raise InvalidArgumentError(
                f"SplitCursor: position {self.position} is past num_units {self.num_units}"
            )
        if self.seed is not None:
            self.seed = _check_int("SplitCursor", "seed", self.seed)

    @classmethod
    def start(cls, plan: SplitPlan, repetition: int, num_workers: int) -> SplitCursor:
        """The cursor of repetition ``repetition`` of ``plan``'s source, nothing handed out yet.

        Files go one per split. Elements go in splits of ``num_units // (16 * num_workers)``,
        at least 1 and at most 1024, so each worker gets about 16 splits per repetition. With
        ``plan.shuffle`` the permutation seed is ``plan.seed`` mixed with ``repetition``, or fresh
        randomness where ``plan.seed`` is None.

        Raises:
          InvalidArgumentError: ``repetition`` or ``num_workers`` is not an int >= 0.
        """
        repetition = _check_int("SplitCursor.start", "repetition", repetition)
        num_workers = _check_int("SplitCursor.start", "num_workers", num_workers)
        if plan.unit == "file":
            size = 1
        else:
            share = plan.num_units // (_SPLITS_PER_WORKER * max(1, num_workers))
            size = min(max(share, 1), _MAX_SPLIT)
        seed = None
        if plan.shuffle:
            seed = secrets.randbits(63) if plan.seed is None else mix_seed(plan.seed, repetition)
        return cls(plan.num_units, size, 0, seed)

    @property
    def done(self) -> bool:
        """Whether every unit has been handed out."""
        return self.position >= self.num_units

    def next(self) -> list[int] | None:
        """The unit indices of the next split, or None when the repetition has no more."""
        start = self.position
        if start >= self.num_units:
            return None
        stop = min(start + self.split_size, self.num_units)
        self.position = stop
        if self.seed is None:
            return list(range(start, stop))
        if self._order is None:
            self._order = np.random.default_rng(self.seed).permutation(self.num_units)
        return self._order[start:stop].tolist()

    def to_json(self) -> dict[str, Any]:
        """The record as a dict of JSON values; ``from_json`` reads it back."""
        return {
            "num_units": self.num_units,
            "split_size": self.split_size,
            "position": self.position,
            "seed": self.seed,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SplitCursor:
        """The cursor that ``to_json`` gave, at the same position.

        Raises:
          InvalidArgumentError: not a dict with exactly the cursor's fields, or a bad field.
        """
        return cls(**_fields(cls, data))


def _check_int(owner: str, name: str, value: Any, minimum: int | None = 0) -> int:
    if isinstance(value, bool | np.bool_) or not hasattr(value, "__index__"):
        raise InvalidArgumentError(f"{owner}: {name} must be an int, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise InvalidArgumentError(f"{owner}: {name} must be >= {minimum}, got {value}")
    return value


def _fields(cls: type, data: Any) -> dict[str, Any]:
    """The fields of ``cls`` in ``data``, a JSON object that must hold exactly those."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    if not isinstance(data, Mapping):
        raise InvalidArgumentError(
            f"{cls.__name__}.from_json expects a dict, got {type(data).__name__}"
        )
    missing, unknown = names - set(data), set(data) - names
    if missing or unknown:
        raise InvalidArgumentError(
            f"{cls.__name__}.from_json expects the keys {sorted(names)}; missing "
            f"{sorted(missing)}, unknown {sorted(map(str, unknown))}"
        )
    return dict(data)


# -- finding and checking the source ------------------------------------------------------------


def split_plan(dataset: Dataset) -> SplitPlan:
    """The ``SplitPlan`` of ``dataset``'s source, which must be splittable (see the module).

    Example:
      >>> from feedline.data import Dataset
      >>> split_plan(Dataset.range(10).repeat().shuffle(4).batch(2))
      SplitPlan(num_units=10, shuffle=False, seed=None, unit='element')

    Raises:
      InvalidArgumentError: the dataset has several sources (zip, concatenate,
        sample_from_datasets), reads its source more than once, or its source is not splittable
        (``from_generator``, a source of infinite or unknown size); the message names them.
    """
    return _plan_of(_source_of(dataset))


def _source_of(dataset: Dataset) -> Dataset:
    """The single leaf of ``dataset``'s graph, read by one operation at most."""
    if not isinstance(dataset, Dataset):
        raise InvalidArgumentError(f"expected a Dataset, got {type(dataset).__name__}")
    nodes = list(walk(dataset))
    sources = [node for node in nodes if not node.inputs]
    if len(sources) > 1:
        combined = sorted({type(node).__name__ for node in nodes if len(node.inputs) > 1})
        raise InvalidArgumentError(
            f"{_NEEDS}, and only one; the dataset has {len(sources)} sources "
            f"({', '.join(type(s).__name__ for s in sources)}) combined by "
            f"{', '.join(combined)}. Make the other datasets inside an interleave or flat_map "
            f"function, or: {_ADVICE}."
        )
    (source,) = sources
    readers = [type(node).__name__ for node in nodes for item in node.inputs if item is source]
    if len(readers) > 1:
        raise InvalidArgumentError(
            f"{_NEEDS}, read once per repetition; the dataset's source {type(source).__name__} "
            f"is read by {len(readers)} operations ({', '.join(readers)}), as when a dataset is "
            f"zipped or concatenated with itself. {_ADVICE}."
        )
    return source


def _plan_of(source: Dataset) -> SplitPlan:
    name = type(source).__name__
    if isinstance(source, ListFilesDataset):
        seed = source._seed if source._shuffle else None
        return SplitPlan(len(source._filenames), source._shuffle, seed, "file")
    if source._random_access() is not None:
        count = source.cardinality()
        if count in (INFINITE_CARDINALITY, UNKNOWN_CARDINALITY):
            size = "infinite" if count == INFINITE_CARDINALITY else "unknown"
            raise InvalidArgumentError(
                f"{_NEEDS}, of finite, known size; the dataset's source {name} has {size} "
                f"cardinality, so the dispatcher cannot count its elements. {_ADVICE}."
            )
        return SplitPlan(count, False, None, "element")
    names = getattr(source, "_filenames", None)
    if source._is_file_reader and names is not None:
        return SplitPlan(len(names), False, None, "file")
    raise InvalidArgumentError(f"{_NEEDS}; the dataset's source is {name}. {_ADVICE}.")


# -- the worker's side --------------------------------------------------------------------------


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
        else:
            access = source._random_access()
        if access is None:  # split_plan accepted the source, so it has random access
            raise FailedPreconditionError(f"{type(source).__name__} lost its random access")
        self._access = access
        self._split = np.empty(0, np.int64)
        self._position = 0
        self._next_batch = self._gather  # type: ignore[assignment]

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
        self._source: Any = dataset._source
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
