"""A distributed iterator's position in a checkpoint: every worker's, and the global pipeline's.

``DistributedIterator.get_state()`` is this worker's position. A checkpoint holds more: every
worker's position (gathered to every worker, so that the chief writes them all), so that a
restored cluster continues each worker's input exactly, and, where every worker reads the whole
pipeline, the position of that global pipeline, so that the epoch can go on over another number
of workers. ``gather`` builds the saved form (a collective under several workers: every worker
calls it, as every worker calls ``Checkpoint.save``); ``restorable`` says whether a saved form
fits an iterator; ``local_state`` picks this worker's entry or re-splits the global position::

    {"format": "feedline.distribute.DistributedIterator", "version": 1,
     "sharding": "data", "policy": "DATA", "num_workers": 2, "replicas_per_worker": 1,
     "workers": [<worker 0's get_state()>, <worker 1's get_state()>],
     "global": {"input": <the global pipeline's state>, "batches": [<global batches read ahead
                but not consumed>], "finished": False}}        # None where it does not apply

=========================================  ===========  =====================================
input                                      sharding     restores on
=========================================  ===========  =====================================
one worker, any policy                     whole        any number of workers and replicas
                                                        whose input is ``whole`` or ``data``
several workers, DATA (AUTO without files)  data         the same
several workers, FILE (AUTO over files)     files        the same workers and replicas only
several workers, OFF / HINT                off / hint   the same workers and replicas only
``distribute_datasets_from_function``      function     the same workers and replicas only
a data service job the workers share       off /        any number of workers (below)
                                           function
=========================================  ===========  =====================================

The workers that read one exactly-once data service job by name save their shares of its
position (``feedline._cluster_shares``); a restore hands every worker all the shares
(``_shared_input``). Where the workers' positions differ only in those shares and in the whole
steps they had read ahead of the job (as with ``.batch()`` after ``distribute``, whether the
steps were prefetched or not), any number of workers resumes, each with worker 0's position,
every share, and its turn of the steps read ahead (whose elements the shares count as read:
they are returned first, each by one worker; they are cut for the saved number of replicas a
worker, which must stay the same where there are any).

Under DATA every worker runs the same global pipeline and keeps its own slices of each global
batch, so the workers' pipelines are at one position: the global batch that the next step cuts.
Each worker's prefetch thread may have read a few batches further than another's, so the global
position is taken from the worker that read least, with the batches it read ahead rebuilt from
every worker's slices of them (the slices of a batch, in worker order, are the batch). Restored
on M workers, the global pipeline goes back to that position, the rebuilt batches are cut first,
over M workers: no element is lost or read twice, and the epoch goes on at the same global batch.
Two workers saved after 2 steps of ``range(36).batch(6)`` (worker 0 had ``[0 1 2]``, ``[6 7 8]``;
worker 1 ``[3 4 5]``, ``[9 10 11]``); on three workers the epoch goes on::

    worker 0: [12 13], [18 19], [24 25], [30 31]
    worker 1: [14 15], [20 21], [26 27], [32 33]
    worker 2: [16 17], [22 23], [28 29], [34 35]
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from feedline import _cluster_shares as cluster_shares
from feedline import structure
from feedline.data.ops._background import ELEMENT

FORMAT = "feedline.distribute.DistributedIterator"
VERSION = 1

_RESPLITTABLE = frozenset({"whole", "data"})
_DESCRIPTIONS = {
    "whole": "read whole by one worker",
    "data": "sharded by DATA (every worker reads the whole pipeline and keeps its slices)",
    "files": "sharded by FILE (each worker reads its own files)",
    "off": "not sharded (AutoShardPolicy.OFF: every worker reads everything)",
    "hint": "sharded by its SHARD_HINT shard() calls",
    "function": "made per worker by distribute_datasets_from_function",
    "per_replica_function": "made per replica by distribute_datasets_from_function",
}


@dataclasses.dataclass(frozen=True)
class InputLayout:
    """How a distributed iterator's input is shared among workers and replicas.

    Attributes:
      sharding: one of ``whole``, ``data``, ``files``, ``off``, ``hint``, ``function``,
        ``per_replica_function`` (see the module docstring).
      num_workers, worker_index, replicas_per_worker: where this iterator's worker sits.
      policy: the dataset's ``AutoShardPolicy`` name where one applied (for messages).
    """

    sharding: str
    num_workers: int = 1
    worker_index: int = 0
    replicas_per_worker: int = 1
    policy: str | None = None

    def describe(self) -> str:
        how = _DESCRIPTIONS.get(self.sharding, self.sharding)
        if self.policy == "AUTO" and self.sharding in ("data", "files"):
            how += ", as AutoShardPolicy.AUTO chose"
        return f"{self.shape()} (input {how})"

    def shape(self) -> str:
        return (
            f"{_count(self.num_workers, 'worker')} x {_count(self.replicas_per_worker, 'replica')}"
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def is_saved_form(state: Any) -> bool:
    """Whether ``state`` is the form ``gather`` makes (not one worker's ``get_state()``)."""
    return isinstance(state, Mapping) and state.get("format") == FORMAT


def gather(
    local: dict[str, Any], layout: InputLayout, all_gather: Callable[[Any], list[Any]]
) -> dict[str, Any]:
    """Every worker's position and, where it applies, the global pipeline's (a collective under
    several workers)."""
    states = all_gather(local)
    return {
        "format": FORMAT,
        "version": VERSION,
        "sharding": layout.sharding,
        "policy": layout.policy,
        "num_workers": layout.num_workers,
        "replicas_per_worker": layout.replicas_per_worker,
        "workers": states,
        "global": global_position(states) if layout.sharding in _RESPLITTABLE else None,
    }


def global_position(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The global pipeline's position from every worker's state (see the module docstring).

    Each state is ``{"steps": <prefetch>, "ahead": [steps], "finished": bool}`` whose prefetch
    state is ``{"input": <split>, "buffer": [(kind, step)]}`` and whose split state is
    ``{"input": <global pipeline>, "pending": [], "batches": [global batches]}``: the layout that
    ``StepSource.from_global_batches`` builds.
    """
    read_ahead = [list(s["ahead"]) + _leading_elements(s["steps"]["buffer"]) for s in states]
    least = min(range(len(states)), key=lambda i: len(read_ahead[i]))
    depth = len(read_ahead[least])
    batches = [_join([steps[t] for steps in read_ahead]) for t in range(depth)]
    split = states[least]["steps"]["input"]
    batches.extend(split.get("batches", ()))
    return {"input": split["input"], "batches": batches, "finished": states[least]["finished"]}


def _leading_elements(buffer: list[tuple[str, Any]]) -> list[Any]:
    """The steps buffered before the end of input (or a buffered error), in order."""
    steps = []
    for kind, value in buffer:
        if kind != ELEMENT:
            break
        steps.append(value)
    return steps


def _join(steps: list[tuple[Any, ...]]) -> Any:
    """One global batch from every worker's step of it (each a tuple of replica slices)."""
    parts = [part for step in steps for part in step]
    if len(parts) == 1:
        return parts[0]
    return structure.map_structure(lambda *leaves: np.concatenate(leaves), *parts)


def restorable(saved: Any, layout: InputLayout) -> str | None:
    """Why ``saved`` cannot position an iterator of ``layout``, or None if it can."""
    if not is_saved_form(saved):
        if layout.num_workers > 1 and isinstance(saved, Mapping) and "steps" in saved:
            return (
                "the checkpoint holds one worker's position only (written by an older feedline, "
                f"or by get_state()), which cannot position {layout.num_workers} workers; restore "
                "it on one worker, or restore without the iterator and start the epoch again"
            )
        return None
    if int(saved.get("version", 0)) > VERSION:
        return (
            f"its position has format version {saved['version']}; this feedline reads up to "
            f"{VERSION}: upgrade feedline"
        )
    before = InputLayout(
        saved["sharding"],
        int(saved["num_workers"]),
        replicas_per_worker=int(saved["replicas_per_worker"]),
        policy=saved.get("policy"),
    )
    if _same_split(before, layout):
        return None
    if before.sharding in _RESPLITTABLE and layout.sharding in _RESPLITTABLE:
        return None
    read_whole = {before.sharding, layout.sharding} <= {"whole", "off"}  # OFF on one worker
    if (before.sharding == layout.sharding or read_whole) and _shares_only(saved["workers"]):
        if before.replicas_per_worker == layout.replicas_per_worker or not any(
            _read_ahead(state) for state in saved["workers"]
        ):
            return None
        return (
            f"the position was saved on {before.describe()}, and this iterator runs on "
            f"{layout.describe()}: the steps its workers had read ahead of the shared job are "
            f"cut for {before.replicas_per_worker} replicas a worker, and resume only on as "
            f"many (on any number of workers). To go on: resume with "
            f"{before.replicas_per_worker} replicas a worker; or restore the other objects "
            "without the iterator (Checkpoint(model=..., optimizer=...).restore(path)"
            ".expect_partial()) and start the epoch again"
        )
    if before.sharding not in _RESPLITTABLE:
        rule = (
            f"input {_DESCRIPTIONS.get(before.sharding, before.sharding)} resumes only on the "
            f"same {before.shape()}"
        )
        unshared = _unshared(saved["workers"])
        if unshared is not None:
            rule += f" (the workers read a shared job, but {unshared})"
    else:
        rule = (
            "a global position is re-split only over input read whole or sharded by DATA, and "
            f"this input is {_DESCRIPTIONS.get(layout.sharding, layout.sharding)}"
        )
    return (
        f"the position was saved on {before.describe()}, and this iterator runs on "
        f"{layout.describe()}: {rule}. To go on: resume on {before.shape()}; or feed "
        "experimental_distribute_dataset input sharded by DATA "
        "(options.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA), whose "
        "position resumes on any number of workers; or restore the other objects without the "
        "iterator (Checkpoint(model=..., optimizer=...).restore(path).expect_partial()) and "
        "start the epoch again"
    )


def _shares_only(states: list[Any]) -> bool:
    """Whether the workers' positions differ only in their shares of a job they read together
    (``feedline._cluster_shares``) and the steps they read ahead of it: then any number of
    workers resumes it, each with every share, and the steps read ahead dealt out among them
    (a data service job shared by name, with nothing but whole steps buffered after it)."""
    paths = cluster_shares.share_paths(states[0])
    if not paths or any(_cut_ahead(state) for state in states):
        return False
    blanked = [
        pickle.dumps(cluster_shares.without_shares(_without_read_ahead(state))) for state in states
    ]
    return all(b == blanked[0] for b in blanked)


def _unshared(states: list[Any]) -> str | None:
    """Where the workers' positions hold shares of a job but differ in more than those and
    the steps they read ahead of it (what keeps ``_shares_only`` from holding), in words."""
    if not cluster_shares.share_paths(states[0]):
        return None
    for index, state in enumerate(states):
        if _cut_ahead(state):
            return f"worker {index} holds global batches cut ahead of its steps"
    blanked = [cluster_shares.without_shares(_without_read_ahead(state)) for state in states]
    for index, state in enumerate(blanked[1:], start=1):
        path = _first_difference(blanked[0], state)
        if path is not None:
            where = "/".join(str(key) for key in path) or "the top"
            return f"workers 0 and {index} differ at {where}"
    return None


def _first_difference(a: Any, b: Any, path: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
    """The first key path where ``a`` and ``b`` (nested dicts and lists) differ, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                return (*path, key)
            found = _first_difference(a[key], b[key], (*path, key))
            if found is not None:
                return found
        return None
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = _first_difference(x, y, (*path, i))
            if found is not None:
                return found
        return None if len(a) == len(b) else (*path, min(len(a), len(b)))
    return None if pickle.dumps(a) == pickle.dumps(b) else path


def _cut_ahead(state: dict[str, Any]) -> bool:
    """Whether a worker's input holds global batches cut ahead of its steps (one worker's
    whole pipeline), which only one worker may take."""
    steps = state["steps"]
    split = steps.get("input") if isinstance(steps, dict) else None
    return isinstance(split, dict) and bool(split.get("batches") or split.get("pending"))


def _read_ahead(state: dict[str, Any]) -> list[Any]:
    """The steps a worker had read and not returned: its device feed's, then its prefetch
    buffer's (where its steps are prefetched)."""
    steps = state["steps"]
    buffer = steps.get("buffer", []) if isinstance(steps, dict) else []
    return list(state["ahead"]) + _leading_elements(buffer)


def _without_read_ahead(state: dict[str, Any]) -> dict[str, Any]:
    steps = state["steps"]
    if isinstance(steps, dict) and "buffer" in steps:
        buffer = steps["buffer"]
        steps = {**steps, "buffer": buffer[len(_leading_elements(buffer)) :]}
    return {**state, "ahead": [], "steps": steps}


def _same_split(before: InputLayout, now: InputLayout) -> bool:
    return (before.sharding, before.num_workers, before.replicas_per_worker) == (
        now.sharding,
        now.num_workers,
        now.replicas_per_worker,
    )


def local_state(saved: dict[str, Any], layout: InputLayout) -> dict[str, Any]:
    """This worker's ``get_state()``-form position from a saved form that ``restorable``
    accepted: its own entry, or the global position re-split for ``layout``."""
    before = InputLayout(
        saved["sharding"], int(saved["num_workers"]), 0, int(saved["replicas_per_worker"])
    )
    if _same_split(before, layout):
        return saved["workers"][layout.worker_index]
    if saved["global"] is None or layout.sharding not in _RESPLITTABLE:
        # _shares_only: every worker resumes the shared job and takes its turn of the steps
        # the workers had read ahead of it (the shares count their elements as read), so that
        # each step is returned once
        read_ahead = [step for state in saved["workers"] for step in _read_ahead(state)]
        own = _without_read_ahead(saved["workers"][0])
        mine = read_ahead[layout.worker_index :: layout.num_workers]
        if not mine:
            return own
        if "buffer" not in own["steps"]:  # read ahead only by a device feed
            return {**own, "ahead": mine}
        buffer = [(ELEMENT, step) for step in mine] + own["steps"]["buffer"]
        return {**own, "steps": {**own["steps"], "buffer": buffer}}
    position = saved["global"]
    return {
        "steps": {
            "input": {"input": position["input"], "pending": [], "batches": position["batches"]},
            "buffer": [],
        },
        "ahead": [],
        "finished": bool(position["finished"]),
    }
