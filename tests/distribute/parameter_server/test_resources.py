"""``ResourceRegistry``: ids from 1, shared by datasets and iterators; what a worker lacks."""

from __future__ import annotations

import doctest
import threading

from feedline.distribute.parameter_server import resources
from feedline.distribute.parameter_server.resources import Resource, ResourceRegistry


def test_resources_are_numbered_in_order_and_listed_as_missing_until_made() -> None:
    registry = ResourceRegistry()
    assert registry.missing(set()) == []
    dataset = registry.add("dataset", b"fn", 0)
    iterator = registry.add_iterator(dataset)
    other = registry.add("dataset", b"other fn", 0)
    assert (dataset, iterator, other) == (1, 2, 3)
    assert registry.missing(set()) == [
        Resource(1, "dataset", b"fn", 0),
        Resource(2, "iterator", b"", 1),
        Resource(3, "dataset", b"other fn", 0),
    ]
    assert [r.ident for r in registry.missing({1, 3})] == [2]
    assert registry.missing({1, 2, 3}) == []


def test_ids_stay_unique_when_threads_add_at_once() -> None:
    registry = ResourceRegistry()
    ids: list[int] = []

    def add() -> None:
        for _ in range(200):
            ids.append(registry.add_iterator(0))

    threads = [threading.Thread(target=add) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(ids) == list(range(1, 801))
    assert [r.ident for r in registry.missing(set())] == list(range(1, 801))


def test_the_docstring_example_runs() -> None:
    results = doctest.testmod(resources)
    assert results.attempted and not results.failed
