"""A worker's side of exactly-once DYNAMIC jobs: the pipeline run once per split, so that a split
can be run again on another worker and give the same elements at the same offsets.

In an exactly-once job (``ledger``) the worker does not run one pipeline over all the splits it
is given, as other DYNAMIC jobs do: ``SplitRunner.run(key, units)`` runs the dataset with its
source reduced to that one split, from a fresh iterator whose seed is fixed by the split's key.
Element ``offset`` of split ``key`` is then the same element wherever and however often the split
runs, provided the pipeline above the source depends on nothing but the split:

==========================================  =================================================
allowed                                     ``map``, ``filter``, ``flat_map``, ``interleave``,
                                            ``batch`` / ``padded_batch`` (within a split, the
                                            last batch of each split may be short), seeded
                                            ``shuffle`` (within a split), ``prefetch``,
                                            ``unbatch``, ``ignore_errors``
refused (``check_replayable``)              ``repeat``, ``take``, ``skip``, ``shard``,
                                            ``enumerate``, ``cache`` (they count across the
                                            whole stream), ``batch(drop_remainder=True)``
                                            (it would drop a remainder per split), ``shuffle``
                                            without a seed, ``deterministic=False``
cannot be checked: keep them deterministic  the functions given to ``map`` & co. (no
                                            unseeded randomness, no state kept across calls)
==========================================  =================================================

Apply those refused operations after ``distribute``, on the consumer, instead.

The objects a split reads from a store are held to one version across its runs: a run tells
the dispatcher the version of each object it opens before any element of it leaves (``pin``),
and a run again reads those versions (before those of a listing in the pipeline, made since),
or raises ``DataLossError`` where an object was replaced in between. The objects of a split
that the dataset's source listed with their versions (``list_files``) are known before the split
runs (``SplitRunner.listed``): the first of them a run opens pins all of the split's in one call,
and a run opening an object as the version the dispatcher holds pins nothing more.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from feedline.data.dataset import Dataset, IteratorContext, mix_seed, raw_elements, walk
from feedline.data.readers.list_files import ListFilesDataset
from feedline.errors import InvalidArgumentError
from feedline.service.splits import _source_of
from feedline.service.worker.split_source import with_split_source

__all__ = ["SplitRunner", "check_replayable"]

# Operations that count elements across the whole stream: per split they would mean another thing.
_STREAM_WIDE = {
    "RepeatDataset": "repeat",
    "TakeDataset": "take",
    "SkipDataset": "skip",
    "ShardDataset": "shard",
    "EnumerateDataset": "enumerate",
    "CacheDataset": "cache",
}


def check_replayable(dataset: Dataset) -> None:
    """Checks that ``dataset`` gives the same elements each time a split of it runs again.

    Raises:
      InvalidArgumentError: an operation the module's table refuses; the message names it.
    """
    problems = []
    for node in walk(dataset):
        name = type(node).__name__
        if name in _STREAM_WIDE:
            problems.append(f"{_STREAM_WIDE[name]} (it counts across the whole stream)")
        elif name in ("BatchDataset", "PaddedBatchDataset", "RebatchDataset") and getattr(
            node, "_drop_remainder", False
        ):
            problems.append("batch(drop_remainder=True) (it would drop a remainder per split)")
        elif name == "ShuffleDataset" and getattr(node, "_seed", 0) is None:
            problems.append("shuffle without a seed (a replayed split would come in another order)")
        elif getattr(node, "_deterministic", None) is False:
            problems.append(f"{name} with deterministic=False")
    if dataset.options().deterministic is False:
        problems.append("options.deterministic = False")
    if problems:
        raise InvalidArgumentError(
            "a fault-tolerant dispatcher hands out a DYNAMIC job's splits exactly once, "
            "running the pipeline above the source once per split so that the split of a lost "
            "worker can run again elsewhere; this dataset cannot: "
            + "; ".join(dict.fromkeys(problems))
            + ". Apply these after distribute(), on the consumer"
        )


class _OneSplit:
    """A ``SplitProvider`` that gives the split it was loaded with, once."""

    def __init__(self) -> None:
        self.units: list[int] | None = None

    def next_split(self, repetition: int) -> list[int] | None:
        units, self.units = self.units, None
        return units


class SplitRunner:
    """Runs ``dataset`` over one split at a time (one runner per task, used by one thread).

    Raises:
      InvalidArgumentError: ``dataset`` cannot be replayed (``check_replayable``) or has no
        splittable source.
    """

    def __init__(self, dataset: Dataset, wrap: Callable[[Dataset], Dataset] | None = None) -> None:
        check_replayable(dataset)
        self._provider = _OneSplit()
        self._dataset = with_split_source(dataset, self._provider)
        if wrap is not None:  # what the task measures of it (``stages.timed``)
            self._dataset = wrap(self._dataset)
        self._options = self._dataset.options()
        source = _source_of(dataset)
        self._source = source if isinstance(source, ListFilesDataset) else None

    def listed(self, units: Sequence[int]) -> dict[str, Any]:
        """The objects of the split of ``units`` that the dataset's source listed with a
        version, URL -> version: the versions its runs open them as."""
        source = self._source
        if source is None or not source._versions:
            return {}
        names = source._filenames
        return source._versions.only(names[u] for u in units)

    def run(
        self,
        key: int,
        units: Sequence[int],
        versions: Mapping[str, Any] | None = None,
        pin: Callable[[str, Any], Any] | None = None,
        pin_all: Callable[[dict[str, Any]], Mapping[str, Any]] | None = None,
    ) -> Iterator[Any]:
        """The elements of split ``key`` (its source units ``units``), in order and as
        operations see them (``raw_elements``, as a task's other pipelines give them): reading
        the objects of a store as ``versions`` (by URL, the versions the dispatcher holds
        for the split), and telling ``pin`` (``IteratorContext.pin_version``) the version of
        each other object it opens, before any element of it; with ``pin_all`` (URL ->
        version, several at once: the versions held), the first of the objects the source
        listed that it opens pins all of the split's (``_SplitPins``)."""
        self._provider.units = list(units)
        held = dict(versions or {})
        if pin is not None:
            pin = _SplitPins(held, pin, pin_all, lambda: self.listed(units))
        ctx = IteratorContext(
            self._options, mix_seed(key), collections.ChainMap(held), pin_version=pin
        )
        iterator = self._dataset._iterator(ctx)
        try:
            yield from raw_elements(iterator)
        finally:
            iterator.close()


class _SplitPins:
    """The ``pin_version`` of one run of a split: a version the dispatcher holds for the split
    (``held``, the run's versions) needs no call; the first of the objects the source listed
    (``listed()``, asked for at the first pin) that the run opens pins all of those the
    dispatcher does not hold yet with one ``pin_all``; any other object is pinned alone. A
    pipeline that opens no object (one that hands out the listed names) pins nothing and never
    asks for ``listed()``. Thread-safe (readers may open objects from several threads)."""

    def __init__(
        self,
        held: dict[str, Any],
        pin: Callable[[str, Any], Any],
        pin_all: Callable[[dict[str, Any]], Mapping[str, Any]] | None,
        listed: Callable[[], dict[str, Any]],
    ) -> None:
        self._held, self._pin, self._pin_all = held, pin, pin_all
        self._ask_listed: Callable[[], dict[str, Any]] | None = listed if pin_all else None
        self._listed: dict[str, Any] = {}  # listed, not held, not pinned yet
        self._lock = threading.Lock()

    def __call__(self, url: str, version: Any) -> Any:
        with self._lock:
            if self._ask_listed is not None:  # the first pin of the run
                listed, self._ask_listed = self._ask_listed(), None
                self._listed = {u: v for u, v in listed.items() if u not in self._held}
            if url in self._listed and self._pin_all is not None:
                listed, self._listed = self._listed, {}
                self._held.update(self._pin_all(listed))
            if self._held.get(url) == version:
                return version
        return self._pin(url, version)
