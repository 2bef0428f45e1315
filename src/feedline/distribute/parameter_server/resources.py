"""``ResourceRegistry``: the per-worker datasets and iterators every worker is to hold.

The coordinator adds one entry per ``create_per_worker_dataset`` and per ``iter()`` of a
per-worker dataset; each worker agent makes on its worker the entries it has not made there yet
(again, all of them, after the worker restarted). Entries are never removed.

>>> registry = ResourceRegistry()
>>> dataset = registry.add("dataset", b"pickled dataset_fn", 0)
>>> iterator = registry.add_iterator(dataset)
>>> [(r.ident, r.kind, r.source) for r in registry.missing({dataset})]
[(2, 'iterator', 1)]
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Container

__all__ = ["Resource", "ResourceRegistry"]


@dataclasses.dataclass(frozen=True)
class Resource:
    """A per-worker dataset (its pickled function) or iterator (of resource ``source``)."""

    ident: int
    kind: str  # "dataset" or "iterator"
    payload: bytes
    source: int


class ResourceRegistry:
    """The resources in the order they were added, numbered from 1; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._resources: list[Resource] = []

    def add(self, kind: str, payload: bytes, source: int) -> int:
        """Adds a resource; returns its id."""
        with self._lock:
            ident = len(self._resources) + 1
            self._resources.append(Resource(ident, kind, payload, source))
        return ident

    def add_iterator(self, dataset: int) -> int:
        """Adds an iterator over the dataset of id ``dataset``; returns its id."""
        return self.add("iterator", b"", dataset)

    def missing(self, created: Container[int]) -> list[Resource]:
        """The resources whose ids are not in ``created``, in the order they were added."""
        with self._lock:
            return [r for r in self._resources if r.ident not in created]
