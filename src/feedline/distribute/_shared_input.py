"""Input that the workers of a cluster read together: one data service job shared by name.

The workers of a ``MultiWorkerMirroredStrategy`` cluster that read one exactly-once data service
job (``distributed_epoch`` from a fault-tolerant dispatcher, with a ``job_name``) take its
elements first come, first served: each worker's position is a *share* of the job's
(``feedline._cluster_shares``). The cluster's checkpoint holds every worker's share; a restore
hands each worker all of them, with a token that only this restore of the cluster has:

1. every worker gets the token of worker 0 (one all-gather);
2. worker 0 (the *lead*) resumes a new job, named after the job and the token, at the union of
   the shares: every element that some worker had returned when the checkpoint was taken;
3. then (one more all-gather) the other workers join that job.

So a restarted cluster never joins the job its previous incarnation read (whose elements may be
held by consumers that died, or drained), and no restored worker reads an element the
checkpoint counts, nor misses one it does not. A cluster that starts afresh goes through the
same steps with the positions its workers have at the start, so that it too reads a job of its
own: a cluster restarted before its first checkpoint reads the whole epoch again, as its
parameters start again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from feedline import _cluster_shares as cluster_shares
from feedline.data.dataset import Dataset, walk
from feedline.errors import FailedPreconditionError

Gather = Callable[[Any], list[Any]]


def reads_shared_input(steps: Dataset, num_workers: int) -> bool:
    """Whether the workers' step pipelines read a job that they share (several workers)."""
    return num_workers > 1 and any(node._is_sharded_elsewhere() for node in walk(steps))


def restore(
    own: dict[str, Any],
    workers: list[dict[str, Any]],
    num_workers: int,
    worker_index: int,
    gather: Gather,
    set_state: Callable[[dict[str, Any]], None],
    *,
    fresh: bool = False,
) -> None:
    """Restores this worker's state ``own`` with the shares of ``workers`` (every worker's
    state when it was saved, in worker order) gathered: worker 0 of the ``num_workers`` now
    first, the others once it is done (a collective: every worker calls it). ``fresh``: the
    iterator is new, and stays as it is where no worker's state holds a share."""
    paths = cluster_shares.share_paths(own)
    found = gather(bool(paths))
    if len(found) != num_workers:
        set_state(own)  # no collective (workers made apart): a share alone is refused
        return
    if not any(found):
        if not fresh:
            set_state(own)
        return
    if not paths:
        raise FailedPreconditionError(
            f"worker {worker_index}'s input holds no share of the data service job that other "
            "workers share: every worker of a cluster must read the same pipeline"
        )
    group = gather(uuid.uuid4().hex)[0]
    lead = worker_index == 0
    state = cluster_shares.gathered(own, workers, group=group, lead=lead)
    if lead:
        set_state(state)
    gather("the lead worker resumed the shared job")
    if not lead:
        set_state(state)


def start(
    get_state: Callable[[], dict[str, Any]],
    num_workers: int,
    worker_index: int,
    gather: Gather,
    set_state: Callable[[dict[str, Any]], None],
) -> None:
    """Moves a new iterator's shared job to a job of this start of the cluster alone (see the
    module docstring): a collective, after every worker joined the job (so that each sees the
    others in it). Nothing moves where the workers have no collective (each made its input
    apart) or the input cannot be checkpointed (a job that is not exactly-once)."""
    if len(gather("every worker joined the shared job")) != num_workers:
        return
    try:
        own: dict[str, Any] | None = get_state()
    except FailedPreconditionError:
        own = None
    states = gather(own)
    if own is None or any(state is None for state in states):
        return
    restore(own, states, num_workers, worker_index, gather, set_state, fresh=True)
