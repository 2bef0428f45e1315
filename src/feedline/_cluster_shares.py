"""Positions that the workers of a cluster share: how one worker's share is marked in an
iterator's state, and how a restore hands a worker every worker's share.

Some inputs are read by every worker of a synchronous cluster together: the consumers of one
data service job shared by name take its elements first come, first served, so what one worker
returned is only its *share* of the job's position. An iterator marks such a part of its state
with ``SHARE`` (its value names the input, for messages). Alone, a share cannot be restored;
the cluster's checkpoint (``feedline.distribute``, which gathers every worker's state) replaces
each share, on every worker, by the ``gathered`` form: every worker's share of it, a ``group``
token that this restore of the cluster alone has, and whether this worker ``lead``\\ s (restores
first, the others after it). The iterator that owns the state merges the shares itself. This
module sits on the floor so that the packages that mark shares (``feedline.service``) and the
one that gathers them (``feedline.distribute``) need not import each other.

Example:
  >>> own = {"input": {"done": [[0, 4]], SHARE: "job 'a'"}, "batches": []}
  >>> other = {"input": {"done": [[4, 4]], SHARE: "job 'a'"}, "batches": []}
  >>> share_paths(own)
  [('input',)]
  >>> restored = gathered(own, [own, other], group="g1", lead=False)["input"]
  >>> [share["done"] for share in restored[SHARES]], restored[GROUP], restored[LEAD]
  ([[[0, 4]], [[4, 4]]], 'g1', False)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "GROUP",
    "LEAD",
    "SHARE",
    "SHARES",
    "gathered",
    "is_gathered",
    "share_paths",
    "without_shares",
]

#: The key of a state part that is one worker's share of a position the cluster shares.
SHARE = "feedline.cluster_share"
#: The keys of the gathered form: every worker's share, the restore's token, whether to lead.
SHARES = "feedline.cluster_shares"
GROUP = "feedline.cluster_group"
LEAD = "feedline.cluster_lead"

Path = tuple[Any, ...]


def share_paths(state: Any, path: Path = ()) -> list[Path]:
    """Where ``state`` (nested dicts, lists and tuples) holds shares, as key paths."""
    if isinstance(state, dict):
        if SHARE in state:
            return [path]
        return [p for key, value in state.items() for p in share_paths(value, (*path, key))]
    if isinstance(state, list | tuple):
        return [p for i, value in enumerate(state) for p in share_paths(value, (*path, i))]
    return []


def _at(state: Any, path: Path) -> Any:
    for key in path:
        state = state[key]
    return state


def _replaced(state: Any, path: Path, value: Any) -> Any:
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(state, dict):
        return {**state, key: _replaced(state[key], rest, value)}
    items = list(state)
    items[key] = _replaced(items[key], rest, value)
    return type(state)(items) if isinstance(state, tuple) else items


def gathered(own: Any, states: Sequence[Any], *, group: str, lead: bool) -> Any:
    """``own`` with each share replaced by the gathered form: that share of every state in
    ``states`` (every worker's state of the same pipeline, in worker order), ``group`` and
    ``lead``."""
    for path in share_paths(own):
        shares = [_at(state, path) for state in states]
        own = _replaced(own, path, {SHARES: shares, GROUP: group, LEAD: lead})
    return own


def without_shares(state: Any) -> Any:
    """``state`` with each share replaced by None: what is left is the workers' own."""
    for path in share_paths(state):
        state = _replaced(state, path, None)
    return state


def is_gathered(state: Any) -> bool:
    """Whether ``state`` is the gathered form of a share."""
    return isinstance(state, dict) and SHARES in state
