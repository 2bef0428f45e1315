"""Tests of feedline/service/dispatcher/state.py: explicit records, updates that replay exactly."""

from __future__ import annotations

import dataclasses
import json

import pytest

from feedline import errors
from feedline.service.dispatcher import state as st


def _history() -> list[st.Update]:
    record = st.DatasetRecord("1000", "f" * 64, b"\x00payload\xff", b"spec", "AUTO", 10, None)
    return [
        st.RegisterDataset(record),
        st.RegisterWorker("127.0.0.1:1", ("gpu",), instance=77),
        st.RegisterWorker("127.0.0.1:2"),
        st.CreateJob(1, "1000", 1, "job", 0, None, "ANY"),
        st.CreateTask(2, 1, "127.0.0.1:1", 0, 2),
        st.CreateTask(3, 1, "127.0.0.1:2", 1, 2),
        st.AcquireClient(4, 1),
        st.MoveSplitCursor(1, 0, {"num_units": 10, "split_size": 1, "position": 3, "seed": None}),
        st.EndTaskSplits(3),
        st.FinishTask(2),
        st.RemoveWorker("127.0.0.1:2"),
        st.ReleaseClient(4),
        st.CreateJob(5, "1000", 0, None, 0, None, "ANY"),
        st.FinishJob(1),
    ]


def _snapshot(state: st.DispatcherState) -> dict[str, object]:
    return {
        "datasets": {k: dataclasses.asdict(v) for k, v in state.datasets.items()},
        "workers": {k: dataclasses.asdict(v) for k, v in state.workers.items()},
        "jobs": {k: dataclasses.asdict(v) for k, v in state.jobs.items()},
        "tasks": {k: dataclasses.asdict(v) for k, v in state.tasks.items()},
        "clients": {k: dataclasses.asdict(v) for k, v in state.clients.items()},
        "cursors": dict(state.split_cursors),
        "by_key": dict(state.job_by_key),
        "next_id": state.next_id,
    }


def test_updates_replayed_from_json_rebuild_the_same_state() -> None:
    live, replayed = st.DispatcherState(), st.DispatcherState()
    journal = []
    for update in _history():
        journal.append(json.dumps(st.update_to_json(update)))
        live.apply(update)
    for line in journal:
        replayed.apply(st.update_from_json(json.loads(line)))
    assert _snapshot(replayed) == _snapshot(live)


def test_what_the_updates_did() -> None:
    state = st.DispatcherState()
    for update in _history():
        state.apply(update)
    assert state.jobs[1].finished and not state.jobs[5].finished
    assert state.job_by_key == {("job", 0): 1}
    assert all(state.tasks[t].finished for t in (2, 3))  # finished, and on a removed worker
    assert state.tasks[3].splits_ended and not state.tasks[2].splits_ended
    assert set(state.workers) == {"127.0.0.1:1"}
    assert state.workers["127.0.0.1:1"].instance == 77
    assert state.active_clients(1) == []
    assert state.split_cursors == {}  # a finished job's cursors go with it
    assert state.new_id() == 1001  # ids are never reused (the dataset id "1000" counts too)


def test_ids_carry_the_incarnation_of_the_dispatcher_life_that_made_them() -> None:
    earlier, later = st.DispatcherState(incarnation=7), st.DispatcherState(incarnation=8)
    first = earlier.new_id()
    earlier.apply(st.CreateJob(first, "1000", 0, None, 0, None, "ANY"))
    assert st.incarnation_of(first) == 7 and st.incarnation_of(earlier.new_id()) == 7
    assert st.incarnation_of(later.new_id()) == 8
    assert later.new_id() != first  # a restarted dispatcher never hands out an old id
    # A journal of the earlier life replayed into the later one keeps the later one's ids.
    later.apply(st.CreateJob(first, "1000", 0, None, 0, None, "ANY"))
    assert st.incarnation_of(later.new_id()) == 8


@pytest.mark.parametrize(
    "data",
    [
        {"type": "Nope"},
        {"type": "FinishTask"},
        {"type": "CreateJob", "job_id": 1},
        {"type": "RegisterDataset", "record": {"dataset_id": "x"}},
    ],
)
def test_malformed_updates_are_refused(data: dict[str, object]) -> None:
    with pytest.raises(errors.InvalidArgumentError):
        st.update_from_json(data)


def test_removed_jobs_and_datasets_are_forgotten_everywhere() -> None:
    removals: list[st.Update] = [st.RemoveJob(1), st.RemoveJob(5), st.RemoveDataset("1000")]
    live, replayed = st.DispatcherState(), st.DispatcherState()
    for update in [*_history(), *removals]:
        live.apply(update)
        replayed.apply(st.update_from_json(json.loads(json.dumps(st.update_to_json(update)))))
    assert _snapshot(replayed) == _snapshot(live)
    assert (live.datasets, live.dataset_by_fingerprint, live.jobs, live.job_by_key) == (
        {},
        {},
        {},
        {},
    )
    assert (live.tasks, live.clients, live.split_cursors) == ({}, {}, {})
    assert live.worker_tasks("127.0.0.1:1") == []
    assert set(live.workers) == {"127.0.0.1:1"}  # workers are not a job's to remove
    before = st.DispatcherState()
    for update in _history():
        before.apply(update)
    assert live.new_id() == before.new_id()  # removing frees no id for reuse


def test_worker_tasks_come_from_the_workers_own_tasks() -> None:
    state = st.DispatcherState()
    for update in _history()[:6]:
        state.apply(update)
    state.apply(st.CreateJob(6, "1000", 0, None, 0, None, "ANY"))
    state.apply(st.CreateTask(7, 6, "127.0.0.1:1", 0, 1))
    assert [t.task_id for t in state.worker_tasks("127.0.0.1:1")] == [2, 7]
    assert [t.task_id for t in state.worker_tasks("127.0.0.1:2")] == [3]
    state.apply(st.RemoveJob(1))
    assert [t.task_id for t in state.worker_tasks("127.0.0.1:1")] == [7]
    assert state.worker_tasks("127.0.0.1:2") == []
