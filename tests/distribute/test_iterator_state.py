"""Tests of feedline/distribute/_iterator_state.py: which saved positions fit which iterators,
how the global position is taken from every worker's, and how it is split again."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from feedline.distribute import _iterator_state
from feedline.distribute._iterator_state import InputLayout


def saved(sharding: str, workers: int, replicas: int = 1, policy: str | None = None) -> dict:
    """The saved form of ``workers`` workers' positions, each tagged with its worker."""
    layout = InputLayout(sharding, workers, 0, replicas, policy)
    steps = {"input": {"input": "g", "pending": [], "batches": []}, "buffer": []}
    states = [{"steps": steps, "ahead": [], "finished": False, "worker": i} for i in range(workers)]
    return _iterator_state.gather(states[0], layout, lambda local: states)


@pytest.mark.parametrize(
    ("before", "now", "fits"),
    [
        # (sharding, workers, replicas) saved -> (sharding, workers, replicas) restoring
        (("data", 2, 1), ("data", 3, 1), True),
        (("data", 2, 1), ("whole", 1, 2), True),
        (("whole", 1, 3), ("data", 2, 1), True),
        (("data", 2, 1), ("files", 2, 1), False),
        (("files", 2, 1), ("files", 2, 1), True),
        (("files", 2, 1), ("files", 3, 1), False),
        (("files", 2, 1), ("files", 2, 2), False),
        (("off", 2, 1), ("off", 1, 1), False),
        (("function", 2, 1), ("function", 2, 1), True),
        (("function", 1, 2), ("function", 1, 3), False),
        (("per_replica_function", 1, 2), ("whole", 1, 2), False),
    ],
)
def test_which_saved_positions_fit_which_iterators(
    before: tuple[str, int, int], now: tuple[str, int, int], fits: bool
) -> None:
    problem = _iterator_state.restorable(saved(*before), InputLayout(now[0], now[1], 0, now[2]))
    assert (problem is None) == fits


def test_a_position_that_does_not_fit_says_why_and_what_to_do() -> None:
    problem = _iterator_state.restorable(
        saved("files", 2, policy="AUTO"), InputLayout("files", 3, 2, 1, "AUTO")
    )
    assert problem == (
        "the position was saved on 2 workers x 1 replica (input sharded by FILE (each worker "
        "reads its own files), as AutoShardPolicy.AUTO chose), and this iterator runs on 3 "
        "workers x 1 replica (input sharded by FILE (each worker reads its own files), as "
        "AutoShardPolicy.AUTO chose): input sharded by FILE (each worker reads its own files) "
        "resumes only on the same 2 workers x 1 replica. To go on: resume on 2 workers x 1 "
        "replica; or feed experimental_distribute_dataset input sharded by DATA "
        "(options.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA), whose "
        "position resumes on any number of workers; or restore the other objects without the "
        "iterator (Checkpoint(model=..., optimizer=...).restore(path).expect_partial()) and "
        "start the epoch again"
    )


def test_one_workers_position_and_newer_formats_are_refused_in_a_cluster() -> None:
    one_worker = {"steps": {}, "ahead": [], "finished": False}
    assert _iterator_state.restorable(one_worker, InputLayout("whole")) is None
    problem = _iterator_state.restorable(one_worker, InputLayout("data", 2))
    assert problem is not None and problem.startswith(
        "the checkpoint holds one worker's position only (written by an older feedline, or by "
        "get_state()), which cannot position 2 workers"
    )
    newer = {**saved("data", 2), "version": _iterator_state.VERSION + 1}
    problem = _iterator_state.restorable(newer, InputLayout("data", 2))
    assert problem is not None and "upgrade feedline" in problem


def test_the_same_split_restores_each_workers_own_entry_and_another_the_global_one() -> None:
    form = saved("data", 2)
    assert _iterator_state.local_state(form, InputLayout("data", 2, 1))["worker"] == 1
    assert _iterator_state.local_state(form, InputLayout("data", 3, 2)) == {
        "steps": {"input": {"input": "g", "pending": [], "batches": []}, "buffer": []},
        "ahead": [],
        "finished": False,
    }


def test_the_global_position_takes_the_worker_that_read_least_and_rebuilds_its_batches() -> None:
    """Worker 0's prefetch read two batches ahead, worker 1's one: the position is worker 1's
    pipeline with the batches both had read rebuilt from their slices, in worker order."""

    def state(pipeline: str, ahead: list[list[int]], buffered: list[list[int]]) -> dict:
        items: list[tuple[str, Any]] = [("element", (np.array(b),)) for b in buffered]
        return {
            "steps": {"input": {"input": pipeline, "pending": [], "batches": []}, "buffer": items},
            "ahead": [(np.array(b),) for b in ahead],
            "finished": False,
        }

    states = [
        state("after batch 4", ahead=[[0, 1, 2]], buffered=[[6, 7, 8], [12, 13, 14]]),
        state("after batch 3", ahead=[[3, 4, 5]], buffered=[[9, 10, 11]]),
    ]
    position = _iterator_state.global_position(states)
    assert position["input"] == "after batch 3"
    assert [b.tolist() for b in position["batches"]] == [list(range(6)), list(range(6, 12))]
    # An end of input buffered after the elements ends what was read ahead.
    states[1]["steps"]["buffer"].append(("end", None))
    assert len(_iterator_state.global_position(states)["batches"]) == 2


def _shared(worker: int, buffered: list[list[int]], ahead: tuple[list[int], ...] = ()) -> dict:
    """A worker's position in a shared job (its share tagged with ``worker``) with the steps
    it had read ahead of the job."""
    from feedline._cluster_shares import SHARE

    share = {"done": [[worker, 1]], SHARE: "job 'shared'"}
    return {
        "steps": {
            "input": {"input": share, "pending": [], "batches": []},
            "buffer": [("element", (np.array(b),)) for b in buffered] + [("end", None)],
        },
        "ahead": [(np.array(b),) for b in ahead],
        "finished": False,
    }


def test_a_shared_job_resumes_anywhere_with_the_steps_read_ahead_dealt_out_once() -> None:
    """Two workers of a shared job had read steps ahead (worker 0 two, worker 1 one, one of
    them in its device feed); on three workers each step is returned by one worker, first."""
    states = [_shared(0, [[2, 3]], ahead=([0, 1],)), _shared(1, [[6, 7]])]
    form = _iterator_state.gather(states[0], InputLayout("off", 2), lambda local: states)
    for layout in (InputLayout("off", 3, 0), InputLayout("whole", 1, 0)):
        assert _iterator_state.restorable(form, layout) is None
    dealt = [
        _iterator_state.local_state(form, InputLayout("off", 3, worker)) for worker in range(3)
    ]
    firsts = [
        [b.tolist() for kind, step in d["steps"]["buffer"] if kind == "element" for b in step]
        for d in dealt
    ]
    assert firsts == [[[0, 1]], [[2, 3]], [[6, 7]]]
    assert all(d["ahead"] == [] and d["steps"]["buffer"][-1] == ("end", None) for d in dealt)
    assert all(d["steps"]["input"]["input"]["done"] == [[0, 1]] for d in dealt)  # worker 0's
    one = _iterator_state.local_state(form, InputLayout("whole", 1, 0))
    assert len([e for e in one["steps"]["buffer"] if e[0] == "element"]) == 3
    problem = _iterator_state.restorable(form, InputLayout("off", 3, 0, 2))
    assert problem is not None and "resume only on as many" in problem


def test_a_shared_job_with_batches_cut_ahead_resumes_only_on_the_same_split() -> None:
    state = _shared(0, [])
    state["steps"]["input"]["batches"] = [np.arange(4)]  # one pipeline's global batch, cut
    form = _iterator_state.gather(state, InputLayout("whole", 1), lambda local: [state])
    assert _iterator_state.restorable(form, InputLayout("off", 2, 0)) is not None
    assert _iterator_state.restorable(form, InputLayout("whole", 1, 0)) is None


def test_a_shared_jobs_positions_that_differ_in_more_than_their_shares_say_where() -> None:
    states = [_shared(0, [[2, 3]]), _shared(1, [[6, 7]])]
    states[1]["steps"]["buffer"][-1] = ("error", "boom")  # worker 1's input had failed
    form = _iterator_state.gather(states[0], InputLayout("off", 2), lambda local: states)
    problem = _iterator_state.restorable(form, InputLayout("off", 3, 0))
    assert problem is not None and (
        "(the workers read a shared job, but workers 0 and 1 differ at steps/buffer/0/0)" in problem
    ), problem
    cut = _shared(0, [])
    cut["steps"]["input"]["batches"] = [np.arange(4)]
    form = _iterator_state.gather(cut, InputLayout("off", 2), lambda local: [cut, _shared(1, [])])
    problem = _iterator_state.restorable(form, InputLayout("off", 3, 0))
    assert problem is not None and "worker 0 holds global batches cut ahead" in problem, problem
    plain = _iterator_state.restorable(saved("files", 2), InputLayout("files", 3, 2))
    assert plain is not None and "shared job" not in plain
