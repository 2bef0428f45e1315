"""Tests of feedline/_cluster_shares.py: finding the shares in a nested state, handing a worker
every worker's share, and what ``_iterator_state`` makes of positions that differ in shares."""

from __future__ import annotations

import doctest
from typing import Any

import feedline._cluster_shares as cluster_shares
from feedline._cluster_shares import GROUP, LEAD, SHARE, SHARES
from feedline.distribute import _iterator_state
from feedline.distribute._iterator_state import InputLayout


def _worker_state(done: list[list[int]], buffered: list[tuple[str, Any]]) -> dict:
    share = {"version": 1, "mode": "DYNAMIC", "done": done, SHARE: "data service job 'a'"}
    return {
        "steps": {"input": {"input": share}, "buffer": buffered},
        "ahead": [],
        "finished": False,
    }


def test_shares_are_found_in_dicts_lists_and_tuples_and_gathered_in_worker_order() -> None:
    own = {"a": [{"b": ({SHARE: "x", "n": 0},)}], "c": {SHARE: "y", "n": 0}}
    other = {"a": [{"b": ({SHARE: "x", "n": 1},)}], "c": {SHARE: "y", "n": 1}}
    assert cluster_shares.share_paths(own) == [("a", 0, "b", 0), ("c",)]
    restored = cluster_shares.gathered(own, [own, other], group="g", lead=True)
    assert [s["n"] for s in restored["a"][0]["b"][0][SHARES]] == [0, 1]
    assert (restored["c"][GROUP], restored["c"][LEAD]) == ("g", True)
    assert cluster_shares.is_gathered(restored["c"]) and not cluster_shares.is_gathered(own)
    assert cluster_shares.without_shares(own) == {"a": [{"b": (None,)}], "c": None}
    assert own["c"][SHARE] == "y"  # the states given are not changed


def test_positions_that_differ_only_in_shares_resume_on_any_number_of_workers() -> None:
    states = [_worker_state([[0, 4]], []), _worker_state([[4, 4]], [])]
    saved = _iterator_state.gather(states[0], InputLayout("off", 2, 0), lambda _: states)
    three = InputLayout("off", 3, 2)
    assert _iterator_state.restorable(saved, three) is None
    assert _iterator_state.local_state(saved, three) == states[0]
    # A worker that had read a step ahead of the job (counted in its share): one worker of the
    # new ones returns it first.
    states[1] = _worker_state([[4, 4]], [("element", (7,))])
    saved = _iterator_state.gather(states[0], InputLayout("off", 2, 0), lambda _: states)
    assert _iterator_state.restorable(saved, three) is None
    buffers = [
        _iterator_state.local_state(saved, InputLayout("off", 3, i))["steps"]["buffer"]
        for i in range(3)
    ]
    assert buffers == [[("element", (7,))], [], []]
    # One that had found the end of its input and one that had not: the same shape only.
    states[1] = _worker_state([[4, 4]], [("end", None)])
    saved = _iterator_state.gather(states[0], InputLayout("off", 2, 0), lambda _: states)
    assert "resumes only on the same 2 workers" in str(_iterator_state.restorable(saved, three))


def test_doctests() -> None:
    assert doctest.testmod(cluster_shares).failed == 0
