"""The dispatcher's parts, driven directly: a core with no server, no sockets and no journal,
and a clock the test moves."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest

from feedline import errors
from feedline._net.wire import decode_frame
from feedline.service import DispatcherConfig
from feedline.service.dispatcher import split_handout
from feedline.service.dispatcher.core import DispatcherCore, Reply
from feedline.service.dispatcher.datasets import Datasets
from feedline.service.dispatcher.gc import Collector
from feedline.service.dispatcher.jobs import Jobs
from feedline.service.dispatcher.long_poll import LongPoll
from feedline.service.dispatcher.split_handout import SplitHandout
from feedline.service.dispatcher.workers import Workers
from feedline.service.protocol import (
    ClientHeartbeatRequest,
    GetOrCreateJobRequest,
    GetSplitRequest,
    PinSplitVersionRequest,
    RegisterDatasetRequest,
    ReleaseClientRequest,
    WorkerHeartbeatRequest,
)
from feedline.service.status.metrics import DispatcherTelemetry

INCARNATION = 1
FIRST_ID = (INCARNATION << 32) + 1  # the first id this dispatcher life makes
OFF, DYNAMIC = 0, 1


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class Parts:
    """A dispatcher without its server: the core and every part, wired as the server does."""

    core: DispatcherCore
    clock: FakeClock
    datasets: Datasets
    long_poll: LongPoll
    workers: Workers
    jobs: Jobs
    splits: SplitHandout
    collector: Collector
    telemetry: DispatcherTelemetry

    def call(self, handler: Any, request: Any, buffers: tuple[bytes, ...] = ()) -> dict[str, Any]:
        """``handler``'s reply header to ``request`` (a protocol dataclass)."""
        reply: Reply | bytes = handler(request.to_header(), [memoryview(b) for b in buffers])
        if isinstance(reply, bytes):  # a reply encoded by the handler (a kept job view's)
            return decode_frame(reply)[0]
        return reply[0]

    def register(self, payload: bytes = b"dataset", units: int | None = 4) -> str:
        plan = (
            None
            if units is None
            else {"num_units": units, "shuffle": False, "seed": None, "unit": "element"}
        )
        request = RegisterDatasetRequest(None, -1 if units is None else units, plan)
        reply = self.call(self.datasets.register_dataset, request, (payload, b"spec"))
        return str(reply["dataset_id"])

    def heartbeat(self, address: str, **fields: Any) -> dict[str, Any]:
        return self.call(self.workers.worker_heartbeat, WorkerHeartbeatRequest(address, **fields))

    def join(self, dataset_id: str, mode: int = OFF, job_name: str | None = None) -> dict[str, Any]:
        request = GetOrCreateJobRequest(dataset_id, mode, job_name, 0, None, "AUTO")
        return self.call(self.jobs.get_or_create_job, request)

    def dynamic_job(self) -> tuple[dict[str, Any], int]:
        """A DYNAMIC job of a dataset of 4 units on worker ``w1``: the join's reply and the id
        of its one task."""
        dataset_id = self.register(units=4)
        self.heartbeat("w1")
        job = self.join(dataset_id, mode=DYNAMIC)
        ((task_id, *_),) = job["tasks"]
        return job, task_id


def make_parts(**config: Any) -> Parts:
    clock = FakeClock()
    core = DispatcherCore(DispatcherConfig(**config), incarnation=INCARNATION, clock=clock)
    telemetry = DispatcherTelemetry(False, lambda: None)
    datasets = Datasets(core)
    long_poll = LongPoll(core)
    workers = Workers(core, telemetry)
    jobs = Jobs(core, datasets, workers, long_poll)
    collector = Collector(core, jobs, workers, telemetry)
    return Parts(
        core, clock, datasets, long_poll, workers, jobs, SplitHandout(core), collector, telemetry
    )


def test_the_same_dataset_registered_twice_gets_the_same_id() -> None:
    parts = make_parts()
    first = parts.register(b"range(4)")
    assert first == str(FIRST_ID)
    assert parts.register(b"range(4)") == first
    assert parts.register(b"range(5)") == str(FIRST_ID + 1)
    assert sorted(parts.core.state.datasets) == [str(FIRST_ID), str(FIRST_ID + 1)]
    header, buffers = parts.datasets.get_element_spec({"dataset_id": first}, [])
    assert (header, buffers) == ({"cardinality": 4}, (b"spec",))


def test_a_malformed_registration_is_refused_and_changes_nothing() -> None:
    parts = make_parts()
    header = RegisterDatasetRequest(None, 4, None).to_header()
    with pytest.raises(errors.InvalidArgumentError, match="compression must be 'AUTO' or None"):
        parts.datasets.register_dataset(
            {**header, "compression": "GZIP"}, [memoryview(b"d"), memoryview(b"s")]
        )
    with pytest.raises(errors.InvalidArgumentError, match="dataset and its element spec"):
        parts.datasets.register_dataset(header, [memoryview(b"d")])
    with pytest.raises(errors.NotFoundError, match="not registered"):
        parts.datasets.get_dataset_def({"dataset_id": "7"}, [])
    assert parts.core.state.datasets == {}


def test_a_registering_worker_gets_a_task_of_every_running_job() -> None:
    parts = make_parts()
    dataset_id = parts.register()
    assert parts.heartbeat("w1") == {"incarnation": INCARNATION, "new_tasks": []}
    job = parts.join(dataset_id)
    (first_task,) = job["tasks"]
    assert first_task == [job["job_id"] + 1, "w1", "running"]
    reply = parts.heartbeat("w2")
    (task,) = reply["new_tasks"]
    assert (task["job_id"], task["worker_index"], task["num_workers"]) == (job["job_id"], 1, 2)
    assert (task["dataset_id"], task["mode"], task["shared"]) == (dataset_id, OFF, False)
    # The task is started: the next heartbeat that lists it hears nothing new.
    assert parts.heartbeat("w2", current_tasks=(task["task_id"],)) == {
        "incarnation": INCARNATION,
        "new_tasks": [],
    }


def test_a_draining_worker_gets_no_task_of_a_new_job() -> None:
    parts = make_parts()
    dataset_id = parts.register()
    parts.heartbeat("w1")
    parts.heartbeat("w2", draining=True)
    assert parts.workers.available() == ("w1",)
    job = parts.join(dataset_id)
    assert [address for _, address, _ in job["tasks"]] == ["w1"]


def test_a_consumer_heartbeat_wakes_on_news_of_its_own_job_only() -> None:
    parts = make_parts()
    dataset_id = parts.register()
    parts.heartbeat("w1")
    mine, other = parts.join(dataset_id), parts.join(dataset_id)
    (my_task,), (other_task,) = mine["tasks"], other["tasks"]
    replies: list[dict[str, Any]] = []
    request = ClientHeartbeatRequest(mine["client_id"], mine["version"], wait_ms=2000)
    waiter = threading.Thread(
        target=lambda: replies.append(parts.call(parts.long_poll.client_heartbeat, request))
    )
    waiter.start()
    try:
        # The other job's task ends: its version moves, this consumer's heartbeat still waits.
        parts.heartbeat("w1", current_tasks=(other_task[0],), finished_tasks=(other_task[0],))
        assert parts.core.job_versions[other["job_id"]] > other["version"]
        assert parts.core.job_versions[mine["job_id"]] == mine["version"]
        waiter.join(0.3)
        assert waiter.is_alive() and replies == []
    finally:
        # Its own job's task ends: the heartbeat answers at once with the news.
        parts.heartbeat("w1", current_tasks=(my_task[0],), finished_tasks=(my_task[0],))
        waiter.join(1.5)
    assert not waiter.is_alive()
    (reply,) = replies
    assert reply["tasks"] == [[my_task[0], "w1", "done"]]
    assert reply["finished"] is True
    assert reply["version"] == parts.core.job_versions[mine["job_id"]] != mine["version"]


def test_a_jobs_view_is_built_once_per_change_and_shared_by_its_consumers() -> None:
    parts = make_parts()
    dataset_id = parts.register()
    for address in ("w1", "w2"):
        parts.heartbeat(address)
    first = parts.join(dataset_id, job_name="shared")
    second = parts.join(dataset_id, job_name="shared")
    version = parts.core.job_versions[first["job_id"]]

    def heartbeat(consumer: dict[str, Any], known: int = -1) -> bytes:
        request = ClientHeartbeatRequest(consumer["client_id"], known, wait_ms=0)
        reply = parts.long_poll.client_heartbeat(request.to_header(), [])
        assert isinstance(reply, bytes)
        return reply

    # Both consumers, with an older view, get the very same encoded reply, built once.
    kept = heartbeat(first)
    assert heartbeat(second) is kept and heartbeat(first) is kept
    assert decode_frame(kept)[0]["consumers"] == 2
    assert decode_frame(kept)[0]["version"] == version
    # A consumer whose view is current is told so, without the view (a few bytes, shared).
    unchanged = heartbeat(first, version)
    assert decode_frame(unchanged)[0] == {"incarnation": INCARNATION, "unchanged": True}
    assert heartbeat(second, version) is unchanged
    assert len(unchanged) < 100 < len(kept)
    # A task ends: the next heartbeat of a consumer with the old version carries the change.
    (task, _) = first["tasks"]
    parts.heartbeat(task[1], current_tasks=(task[0],), finished_tasks=(task[0],))
    news = heartbeat(second, version)
    assert news is not kept
    reply = decode_frame(news)[0]
    assert reply["version"] == parts.core.job_versions[first["job_id"]] > version
    assert [t for t in reply["tasks"] if t[0] == task[0]] == [[task[0], task[1], "done"]]
    assert decode_frame(heartbeat(second, reply["version"]))[0].get("unchanged") is True
    # A consumer leaves: so does its count.
    parts.call(parts.jobs.release_client, ReleaseClientRequest(first["client_id"]))
    assert decode_frame(heartbeat(second))[0]["consumers"] == 1


def test_an_exactly_once_jobs_view_follows_its_split_cursor(tmp_path: Any) -> None:
    # A split handed out moves no version, but the view's split cursor: the view kept is not
    # reused past it.
    parts = make_parts(fault_tolerant_mode=True, work_dir=str(tmp_path))
    job, task_id = parts.dynamic_job()
    request = ClientHeartbeatRequest(job["client_id"], job["version"], wait_ms=0)
    before = parts.call(parts.long_poll.client_heartbeat, request)
    assert before["exactly_once"] is True
    split = GetSplitRequest(job["job_id"], 0, task_id=task_id, request=0)
    parts.call(parts.splits.get_split, split)
    after = parts.call(parts.long_poll.client_heartbeat, request)
    assert after["version"] == before["version"]
    assert after["split_cursor"] == parts.core.state.split_cursors[(job["job_id"], 0)]
    assert after["split_cursor"] != before["split_cursor"]


def test_splits_go_out_once_and_a_repeated_request_gets_the_same_split() -> None:
    parts = make_parts()
    job, task_id = parts.dynamic_job()

    def split(request: int) -> Any:
        asked = GetSplitRequest(job["job_id"], 0, task_id=task_id, request=request)
        return parts.call(parts.splits.get_split, asked)["split"]

    assert split(0) == [0]
    assert split(0) == [0]  # the reply was lost: the same split again
    assert [split(1), split(2), split(3)] == [[1], [2], [3]]
    assert split(3) == [3]
    assert split(4) is None
    # A caller without a task number gets the next split of another repetition.
    assert parts.call(parts.splits.get_split, GetSplitRequest(job["job_id"], 1))["split"] == [0]


def test_an_exactly_once_get_split_waits_for_its_jobs_splits_to_be_done(tmp_path: Any) -> None:
    # Every split is out and none is done: a GetSplit that may wait does so at the dispatcher,
    # and answers the end of the repetition as soon as the consumer's receipts settle the last
    # split, not at the task's next ask; with nothing new it answers ``wait`` after its
    # ``wait_ms``; one that may not wait answers at once.
    parts = make_parts(fault_tolerant_mode=True, work_dir=str(tmp_path))
    job, task_id = parts.dynamic_job()
    job_id = job["job_id"]

    def get_split(request: int, finished: Any = None, wait_ms: int = 0) -> dict[str, Any]:
        asked = GetSplitRequest(job_id, 0, task_id, request, finished, wait_ms=wait_ms)
        return parts.call(parts.splits.get_split, asked)

    keys = [get_split(n, None if n == 0 else (n - 1, 1))["key"] for n in range(4)]
    assert keys == [0, 1, 2, 3]

    def report(key: int) -> None:
        request = ClientHeartbeatRequest(job["client_id"], received=[[key, [[0, 1]]]])
        parts.call(parts.long_poll.client_heartbeat, request)

    for key in (0, 1, 2):
        report(key)
    started = time.monotonic()
    assert get_split(4, (3, 1)) == {"split": None, "wait": True}
    assert time.monotonic() - started < 1.0  # it may not wait: answered at once
    started = time.monotonic()
    assert get_split(5, wait_ms=300) == {"split": None, "wait": True}
    assert 0.3 <= time.monotonic() - started < 2.0
    replies: list[dict[str, Any]] = []
    waiter = threading.Thread(target=lambda: replies.append(get_split(6, wait_ms=30_000)))
    waiter.start()
    try:
        waiter.join(0.1)
        assert waiter.is_alive() and replies == []  # split 3 is not done yet
        started = time.monotonic()
        report(3)
        waiter.join(5.0)
        assert time.monotonic() - started < 4.0  # answered at once, not after its 30 s
    finally:
        waiter.join(5.0)
    assert replies == [{"split": None}]


def test_a_get_split_waits_no_longer_than_the_bound_nor_past_the_waiting_calls_bound(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(split_handout, "MAX_SPLIT_WAIT_S", 0.2)
    parts = make_parts(fault_tolerant_mode=True, work_dir=str(tmp_path))
    job, task_id = parts.dynamic_job()
    for n in range(4):
        request = GetSplitRequest(job["job_id"], 0, task_id, n, None if n == 0 else (n - 1, 1))
        parts.call(parts.splits.get_split, request)

    def waited(request: int) -> float:
        started = time.monotonic()
        asked = GetSplitRequest(job["job_id"], 0, task_id, request, wait_ms=60_000)
        assert parts.call(parts.splits.get_split, asked) == {"split": None, "wait": True}
        return time.monotonic() - started

    assert 0.2 <= waited(4) < 2.0
    monkeypatch.setattr(split_handout, "_MAX_WAITING_TASKS", 0)
    assert waited(5) < 0.2


def test_a_split_is_held_to_the_first_version_pinned_for_each_object(tmp_path: Any) -> None:
    parts = make_parts(fault_tolerant_mode=True, work_dir=str(tmp_path))
    job, task = parts.dynamic_job()
    parts.call(parts.splits.get_split, GetSplitRequest(job["job_id"], 0, task, 0))

    def pin(url: str, version: Any, key: int = 0, task_id: int = task) -> Any:
        request = PinSplitVersionRequest(job["job_id"], task_id, key, url, version)
        return parts.call(parts.splits.pin_split_version, request)["version"]

    assert pin("s3://b/a", '"e1"') == '"e1"'
    assert pin("s3://b/a", '"e2"') == '"e1"'  # a run again that opened another version
    assert pin("s3://b/b", 7) == 7
    assert pin("s3://b/c", "x", key=3) == "x"  # a split not handed out holds none
    with pytest.raises(errors.InvalidArgumentError, match="is not a task of job"):
        pin("s3://b/a", '"e1"', task_id=task + 99)
    plain = make_parts()
    plain_job, plain_task = plain.dynamic_job()
    request = PinSplitVersionRequest(plain_job["job_id"], plain_task, 0, "s3://b/a", "e")
    with pytest.raises(errors.FailedPreconditionError, match="not hand out its splits exactly"):
        plain.call(plain.splits.pin_split_version, request)


def test_an_anonymous_job_is_collected_when_its_consumer_is_done() -> None:
    parts = make_parts()
    dataset_id = parts.register()
    parts.heartbeat("w1")
    job = parts.join(dataset_id)
    (task,) = job["tasks"]
    assert parts.call(parts.jobs.release_client, ReleaseClientRequest(job["client_id"])) == {}
    state = parts.core.state
    assert (state.jobs, state.tasks, state.clients) == ({}, {}, {})
    assert parts.core.client_seen == {} and job["job_id"] not in parts.core.job_versions
    # The worker still runs the task: it is told to delete it.
    reply = parts.heartbeat("w1", current_tasks=(task[0],))
    assert reply == {"incarnation": INCARNATION, "new_tasks": [], "delete_tasks": [task[0]]}


def test_gc_drops_the_silent_and_collects_a_named_job_then_its_dataset() -> None:
    parts = make_parts(job_gc_timeout_ms=5000, worker_timeout_ms=1000, client_timeout_ms=2000)
    state = parts.core.state
    dataset_id = parts.register()
    parts.heartbeat("w1")
    job = parts.join(dataset_id, job_name="shared")
    parts.clock.now += 1.5  # past worker_timeout_ms only
    parts.collector.collect()
    assert list(state.workers) == [] and state.tasks[job["job_id"] + 1].lost
    assert state.clients[job["client_id"]].released is False
    parts.clock.now += 1.0  # past client_timeout_ms: the consumer is released
    parts.collector.collect()
    assert state.clients[job["client_id"]].released is True
    assert list(state.jobs) == [job["job_id"]]  # a named job waits for another consumer
    parts.clock.now += 4.0
    parts.collector.collect()
    assert list(state.jobs) == [job["job_id"]]
    parts.clock.now += 2.0  # job_gc_timeout_ms after its last consumer left
    parts.collector.collect()
    assert state.jobs == {} and list(state.datasets) == [dataset_id]
    parts.clock.now += 5.5  # and the dataset, that long after the job last read it
    parts.collector.collect()
    assert state.datasets == {} and state.dataset_by_fingerprint == {}


def test_a_released_consumer_is_told_so() -> None:
    parts = make_parts()
    dataset_id = parts.register()
    parts.heartbeat("w1")
    parts.join(dataset_id, job_name="shared")
    job = parts.join(dataset_id, job_name="shared")
    assert job["consumers"] == 2 and job["joined"] == 2
    parts.call(parts.jobs.release_client, ReleaseClientRequest(job["client_id"]))
    with pytest.raises(errors.ConsumerReleasedError, match="was released"):
        parts.call(parts.long_poll.client_heartbeat, ClientHeartbeatRequest(job["client_id"]))
    unknown = FIRST_ID + 99
    with pytest.raises(errors.NotFoundError, match=f"no consumer {unknown} is known"):
        parts.call(parts.long_poll.client_heartbeat, ClientHeartbeatRequest(unknown))
    # A consumer id of another incarnation: an earlier life of the dispatcher made it.
    with pytest.raises(errors.FailedPreconditionError, match="earlier life of the dispatcher"):
        parts.call(parts.jobs.release_client, ReleaseClientRequest(99))


def test_a_heartbeat_s_unissued_task_ids_are_forgotten() -> None:
    # A worker's heartbeat names tasks the dispatcher never issued (made up, or of another
    # worker): the dispatcher keeps nothing of them, however many there are.
    parts = make_parts()
    telemetry = parts.telemetry
    dataset_id = parts.register()
    parts.heartbeat("w1")
    parts.heartbeat("w2")
    job = parts.join(dataset_id)
    mine, theirs = (task[0] for task in job["tasks"])
    made_up = [FIRST_ID + 1000 + i for i in range(5000)]
    stats = [[task_id, 3, 24] for task_id in [mine, theirs, *made_up, 77, -5]]
    reply = parts.heartbeat("w1", current_tasks=(mine,), task_stats=stats)
    assert reply == {"incarnation": INCARNATION, "new_tasks": []}
    assert telemetry.rates.known() == [mine]
    assert telemetry.rates.get(mine)[:2] == (3, 24)
    # Ids it never issued, named as the worker's current tasks, are deleted and forgotten too.
    reply = parts.heartbeat("w1", current_tasks=(mine, *made_up[:3]))
    assert reply["delete_tasks"] == made_up[:3]
    assert set(parts.core.state.tasks) == {mine, theirs}


def test_a_hostile_split_plan_is_refused_at_registration() -> None:
    parts = make_parts()
    plan = {"num_units": 3 * 10**7, "shuffle": True, "seed": 1, "unit": "file"}
    request = RegisterDatasetRequest(None, 3 * 10**7, plan)
    with pytest.raises(errors.InvalidArgumentError, match="at most"):
        parts.call(parts.datasets.register_dataset, request, (b"dataset", b"spec"))
    assert parts.core.state.datasets == {}


def test_worker_heartbeats_past_the_bound_are_answered_at_once_with_a_retry_time() -> None:
    # Waiting heartbeats hold a server thread each: at most _MAX_WAITING_WORKERS wait, the
    # others are told to wait on their side, so that the server's threads stay free.
    from feedline.service.dispatcher import workers as workers_module

    parts = make_parts()
    bound = workers_module._MAX_WAITING_WORKERS
    for index in range(bound + 1):
        parts.heartbeat(f"w{index}")
    waiters = [
        threading.Thread(target=parts.heartbeat, args=(f"w{i}",), kwargs={"wait_ms": 1500})
        for i in range(bound)
    ]
    for waiter in waiters:
        waiter.start()
    try:
        deadline = time.monotonic() + 10
        while len(parts.core.waiting) < bound and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(parts.core.waiting) == bound
        started = time.monotonic()
        reply = parts.heartbeat(f"w{bound}", wait_ms=5000)
        assert time.monotonic() - started < 2.5  # answered at once, not after its 5 s
        assert 0 < reply["retry_after_ms"] <= 5000
    finally:
        for waiter in waiters:
            waiter.join(5)


def test_a_worker_that_leaves_while_its_heartbeat_waits_is_forgotten() -> None:
    """A draining worker's heartbeat waits for news when its last one says it leaves: the
    waiting one, woken, does not mark it alive again (it would be dropped later for missed
    heartbeats, counted as a fault)."""
    parts = make_parts()
    parts.heartbeat("w1")
    waiting = threading.Thread(
        target=parts.heartbeat, args=("w1",), kwargs={"draining": True, "wait_ms": 2000}
    )
    waiting.start()
    deadline = time.monotonic() + 10
    while "w1" not in parts.core.waiting:
        assert time.monotonic() < deadline, "the heartbeat does not wait"
        time.sleep(0.01)
    parts.heartbeat("w1", draining=True, leaving=True)
    waiting.join(10)
    assert not waiting.is_alive()
    assert "w1" not in parts.core.state.workers
    assert "w1" not in parts.core.worker_seen
