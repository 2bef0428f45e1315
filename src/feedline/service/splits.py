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

The worker's side, the split source, is ``worker.split_source``.

Example:
  >>> from feedline.data import Dataset
  >>> plan = split_plan(Dataset.range(6).map(lambda x: x * 10))
  >>> plan
  SplitPlan(num_units=6, shuffle=False, seed=None, unit='element', unit_bytes=None)
  >>> cursor = SplitCursor.start(plan, repetition=0, num_workers=1)
  >>> cursor.next(), cursor.next()
  ([0], [1])
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from feedline.data.dataset import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    mix_seed,
    walk,
)
from feedline.data.readers.list_files import ListFilesDataset
from feedline.errors import InvalidArgumentError
from feedline.service.permutation import IndexPermutation

__all__ = [
    "MAX_LISTED_UNITS",
    "MAX_UNITS",
    "SplitCursor",
    "SplitPlan",
    "split_plan",
]

Unit = Literal["element", "file"]
_UNITS = ("element", "file")
#: Splits hold about 1/16 of a worker's share, within these bounds: at most 1024 elements, or
#: 64 files, or, where a listing gave the files' sizes (``SplitPlan.unit_bytes``), as many as
#: hold about 64 MiB (at most 1024). Splits of several files keep a long list of files from
#: costing one GetSplit per file (10,000 objects of 1 MB are 157 splits, not 10,000; of 10 kB,
#: 10 per worker); a list of at most ``16 * workers`` files still goes one file per split. A
#: split's size in bytes is what a split run again costs (an exactly-once job's split of a
#: lost worker) and how unevenly the last splits end a repetition.
_SPLITS_PER_WORKER = 16
_MAX_SPLIT = 1024
_MAX_FILE_SPLIT = 64
_FILE_SPLIT_BYTES = 64 << 20
#: The most units of a plan of files, or of a shuffled plan. A file plan's dataset lists its
#: files, and the dispatcher takes a dataset of at most ``protocol.MAX_DATASET_BYTES`` (256
#: MiB): at 16 bytes a name at least, no dataset lists more files than this.
MAX_LISTED_UNITS = 1 << 24
#: The most units of any plan (an element plan: a range, of which nothing is kept per unit).
MAX_UNITS = 1 << 62

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
      unit_bytes: the mean size of a file in bytes, where the listing that found the files gave
        their sizes (``list_files`` on an object store); None where not known.

    Raises:
      InvalidArgumentError: a field of the wrong type or out of range.
    """

    num_units: int
    shuffle: bool
    seed: int | None
    unit: Unit = "element"
    unit_bytes: int | None = None

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
        if self.unit_bytes is not None:
            object.__setattr__(
                self, "unit_bytes", _check_int("SplitPlan", "unit_bytes", self.unit_bytes)
            )
        listed = self.unit == "file" or self.shuffle
        limit = MAX_LISTED_UNITS if listed else MAX_UNITS
        if self.num_units > limit:
            what = "files" if self.unit == "file" else "shuffled units"
            raise InvalidArgumentError(
                f"SplitPlan: a plan of {what if listed else 'elements'} has at most {limit:,} "
                f"units, got {self.num_units:,}. Split the list of files into several datasets "
                "(several jobs), or shard the dataset statically (FILE or DATA) instead of "
                "with DYNAMIC sharding"
            )

    def to_json(self) -> dict[str, Any]:
        """The plan as a dict of JSON values (``unit_bytes`` where known); ``from_json``
        reads it back."""
        fields = dataclasses.asdict(self)
        if self.unit_bytes is None:
            del fields["unit_bytes"]
        return fields

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SplitPlan:
        """The plan that ``to_json`` gave (a plan journaled before ``unit_bytes`` existed
        reads back with None).

        Raises:
          InvalidArgumentError: not a dict with the plan's fields, or a bad field.
        """
        return cls(**_fields(cls, data, optional=("unit_bytes",)))


@dataclasses.dataclass
class SplitCursor:
    """The dispatcher's position in one repetition of a source: a plain, JSON-serialisable record.

    ``next()`` hands out units ``position .. position + split_size - 1`` of the repetition's
    order: ``0 .. num_units - 1``, or, with a ``seed``, the permutation of them that the seed
    fixes (``permutation.IndexPermutation``: computed per unit handed out, in O(1) each, never
    stored). The dispatcher moves a cursor under its lock with ``take`` (O(1)) and computes
    the split's units after, with ``units``. ``range(10)`` and 2 workers (splits of 1
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
    _order: IndexPermutation | None = dataclasses.field(
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

        Units go in splits of ``num_units // (16 * num_workers)``, at least 1 and at most 1024
        elements or 64 files (or as many files of ``plan.unit_bytes`` as hold 64 MiB, up to
        1024), so each worker gets about 16 splits per repetition (more where the bound
        applies): 100 files over 2 workers go 3 to a split, 20 files one to a split, 10,000
        files 64 to a split, or 312 where they are known to be 10 kB each. With
        ``plan.shuffle`` the permutation seed is ``plan.seed`` mixed with ``repetition``, or fresh
        randomness where ``plan.seed`` is None.

        Raises:
          InvalidArgumentError: ``repetition`` or ``num_workers`` is not an int >= 0.
        """
        repetition = _check_int("SplitCursor.start", "repetition", repetition)
        num_workers = _check_int("SplitCursor.start", "num_workers", num_workers)
        share = plan.num_units // (_SPLITS_PER_WORKER * max(1, num_workers))
        size = min(max(share, 1), _max_split(plan))
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
        taken = self.take()
        return None if taken is None else self.units(*taken)

    def take(self) -> tuple[int, int] | None:
        """Moves past the next split: its positions ``(start, stop)`` in the repetition's
        order (``units`` gives its units), or None when the repetition has no more. O(1)."""
        start = self.position
        if start >= self.num_units:
            return None
        stop = min(start + self.split_size, self.num_units)
        self.position = stop
        return start, stop

    def units(self, start: int, stop: int) -> list[int]:
        """The units at positions ``start .. stop - 1`` of the repetition's order."""
        if self.seed is None:
            return list(range(start, stop))
        if self._order is None:
            self._order = IndexPermutation(self.num_units, self.seed)
        return self._order[np.arange(start, stop, dtype=np.int64)].tolist()

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


def _max_split(plan: SplitPlan) -> int:
    """The most units a split of ``plan`` holds (the module's bounds)."""
    if plan.unit != "file":
        return _MAX_SPLIT
    if plan.unit_bytes is None:
        return _MAX_FILE_SPLIT
    return min(_MAX_SPLIT, max(_MAX_FILE_SPLIT, _FILE_SPLIT_BYTES // max(1, plan.unit_bytes)))


def _check_int(owner: str, name: str, value: Any, minimum: int | None = 0) -> int:
    if isinstance(value, bool | np.bool_) or not hasattr(value, "__index__"):
        raise InvalidArgumentError(f"{owner}: {name} must be an int, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise InvalidArgumentError(f"{owner}: {name} must be >= {minimum}, got {value}")
    return value


def _fields(cls: type, data: Any, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of ``cls`` in ``data``, a JSON object that must hold those (but the
    ``optional`` ones, which keep their defaults) and no others."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    required = names - set(optional)
    if not isinstance(data, Mapping):
        raise InvalidArgumentError(
            f"{cls.__name__}.from_json expects a dict, got {type(data).__name__}"
        )
    missing, unknown = required - set(data), set(data) - names
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
      SplitPlan(num_units=10, shuffle=False, seed=None, unit='element', unit_bytes=None)

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
        mean = source.mean_bytes
        return SplitPlan(len(source._filenames), source._shuffle, seed, "file", mean)
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
