"""Tests of feedline/service/dispatcher/server.py: security, bad requests, liveness, collection."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from feedline import errors, service
from feedline._net import rpc as _rpc
from feedline._net.wire import encode_frame
from feedline.data import Dataset
from feedline.service.protocol import DISPATCHER_SERVICE as SERVICE_NAME

TOKEN = "s3cret-token"


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("the condition did not hold in time")
        time.sleep(0.05)


def test_target_and_lifecycle() -> None:
    dispatcher = service.DispatchServer(start=False)
    with pytest.raises(errors.FailedPreconditionError, match="start"):
        _ = dispatcher.target
    dispatcher.start()
    dispatcher.start()  # idempotent
    assert dispatcher.target.startswith("grpc://127.0.0.1:")
    dispatcher.stop()
    dispatcher.stop()


def test_a_token_guards_every_rpc(make_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_rpc.TOKEN_ENV, TOKEN)
    cluster = make_cluster(1, token=TOKEN)  # the worker takes the token from the environment
    monkeypatch.delenv(_rpc.TOKEN_ENV)
    dataset = Dataset.range(4).apply(service.distribute("parallel_epochs", cluster.target))
    with pytest.raises(errors.PermissionDeniedError, match="token"):
        list(dataset)
    assert cluster.dispatcher._state.datasets == {}  # nothing was registered
    with pytest.raises(errors.PermissionDeniedError):
        cluster.add_worker(token="wrong")
    monkeypatch.setenv(_rpc.TOKEN_ENV, TOKEN)
    assert sorted(int(x) for x in dataset) == [0, 1, 2, 3]


def test_a_worker_needs_the_token_too(make_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = make_cluster(0, token=TOKEN)
    worker = cluster.add_worker(token=TOKEN)
    monkeypatch.setenv(_rpc.TOKEN_ENV, TOKEN)
    dataset = Dataset.range(3).apply(service.distribute("parallel_epochs", cluster.target))
    assert sorted(int(x) for x in dataset) == [0, 1, 2]
    monkeypatch.delenv(_rpc.TOKEN_ENV)
    reader = _rpc.RpcClient(worker.worker_address, "feedline.service.Worker")
    with pytest.raises(errors.PermissionDeniedError):
        reader.call("GetElements", {"task_id": 1}, timeout=5)
    reader.close()


@pytest.mark.parametrize(
    ("method", "frame"),
    [
        ("RegisterDataset", b"not a frame at all"),
        ("RegisterDataset", encode_frame({"compression": "AUTO"})),
        ("GetOrCreateJob", encode_frame({"dataset_id": 7, "mode": 0})),
        ("ClientHeartbeat", encode_frame({"client_id": "one"})),
        ("WorkerHeartbeat", encode_frame({"address": ["x"]})),
        ("GetSplit", encode_frame({"job_id": 1})),
    ],
)
def test_malformed_requests_are_refused_and_the_server_keeps_serving(
    make_cluster: Any, method: str, frame: bytes
) -> None:
    cluster = make_cluster(1)
    raw = _rpc.RpcClient(cluster.address, SERVICE_NAME)
    with pytest.raises(errors.InvalidArgumentError):
        raw.call_frame(method, frame, timeout=5)
    raw.close()
    dataset = Dataset.range(3).apply(service.distribute("parallel_epochs", cluster.target))
    assert sorted(int(x) for x in dataset) == [0, 1, 2]


def test_unknown_ids_are_not_found(make_cluster: Any) -> None:
    cluster = make_cluster(0)
    raw = _rpc.RpcClient(cluster.address, SERVICE_NAME)
    with pytest.raises(errors.NotFoundError):
        raw.call("GetDatasetDef", {"dataset_id": "missing"}, timeout=5)
    this_life = cluster.dispatcher.incarnation << 32
    with pytest.raises(errors.NotFoundError):
        raw.call("ClientHeartbeat", {"client_id": this_life | 12345}, timeout=5)
    # An id of another life of the dispatcher says so.
    with pytest.raises(errors.FailedPreconditionError, match="earlier life"):
        raw.call("ClientHeartbeat", {"client_id": 12345}, timeout=5)
    raw.close()


def test_a_worker_that_stops_heartbeating_is_dropped(make_cluster: Any) -> None:
    cluster = make_cluster(2, worker_timeout_ms=300, job_gc_check_interval_ms=50)
    state = cluster.dispatcher._state
    assert len(state.workers) == 2
    gone = cluster.workers[0]
    gone.stop()
    wait_until(lambda: gone.worker_address not in state.workers)
    assert cluster.workers[1].worker_address in state.workers
    dataset = Dataset.range(6).apply(service.distribute("parallel_epochs", cluster.target))
    assert sorted(int(x) for x in dataset) == list(range(6))  # only the live worker has a task


def test_a_consumer_of_an_ended_job_that_goes_silent_is_released_without_a_warning(
    make_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = make_cluster(1, client_timeout_ms=300, job_gc_check_interval_ms=50)
    iterator = iter(Dataset.range(3).apply(service.distribute("parallel_epochs", cluster.target)))
    assert sorted(int(next(iterator)) for _ in range(3)) == [0, 1, 2]
    state = cluster.dispatcher._state
    (job,) = state.jobs.values()
    wait_until(lambda: job.finished)  # the worker handed out everything: the job ended
    iterator._reader.queue.close()  # type: ignore[attr-defined]  # ... and its consumer died
    (client_id,) = job.client_ids
    wait_until(lambda: client_id not in state.clients or state.clients[client_id].released)
    assert "missed heartbeats" not in "".join(
        r.getMessage() for r in caplog.records if r.levelno >= 30
    )


def test_a_consumer_that_vanishes_is_released_and_its_job_ends(make_cluster: Any) -> None:
    cluster = make_cluster(1, client_timeout_ms=300, job_gc_check_interval_ms=50)
    dataset_id = service.register_dataset(cluster.target, Dataset.range(10).repeat())
    raw = _rpc.RpcClient(cluster.address, SERVICE_NAME)
    reply, _ = raw.call(
        "GetOrCreateJob",
        {
            "dataset_id": dataset_id,
            "mode": 0,
            "job_name": None,
            "iteration": 0,
            "num_consumers": None,
            "target_workers": "ANY",
        },
        timeout=5,
    )
    raw.close()  # ... and it never heartbeats
    state = cluster.dispatcher._state
    # Released; its job, anonymous, ended and was collected with it.
    wait_until(lambda: reply["client_id"] not in state.clients)
    assert reply["job_id"] not in state.jobs
    worker = cluster.workers[0]
    wait_until(lambda: not worker._tasks)  # the worker stopped the job's infinite task


def test_a_named_job_without_consumers_is_collected_after_the_timeout(make_cluster: Any) -> None:
    cluster = make_cluster(1, job_gc_timeout_ms=200, job_gc_check_interval_ms=50)
    dataset = (
        Dataset.range(10)
        .repeat()
        .apply(service.distribute("parallel_epochs", cluster.target, job_name="idle"))
    )
    iterator = iter(dataset)
    next(iterator)
    iterator.close()
    state = cluster.dispatcher._state
    (job,) = state.jobs.values()
    assert job.job_name == "idle"
    wait_until(lambda: job.finished)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"port": -1}, "port"),
        ({"protocol": "http"}, "protocol"),
        ({"fault_tolerant_mode": True}, "work_dir"),
        ({"worker_addresses": "a:1"}, "worker_addresses"),
        ({"worker_addresses": ["a:1", "a:1"]}, "duplicates"),
        ({"job_gc_timeout_ms": -2}, "job_gc_timeout_ms"),
        ({"worker_timeout_ms": 1.5}, "worker_timeout_ms"),
        ({"token": ""}, "token"),
    ],
)
def test_dispatcher_config_is_validated(config: dict[str, Any], match: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=match):
        service.DispatcherConfig(**config)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"dispatcher_address": ""}, "dispatcher_address"),
        ({"dispatcher_address": "h:1", "port": 70000}, "port"),
        ({"dispatcher_address": "h:1", "heartbeat_interval_ms": -5}, "heartbeat"),
        ({"dispatcher_address": "h:1", "worker_tags": "gpu"}, "worker_tags"),
        ({"dispatcher_address": "h:1", "data_transfer_protocol": "udp"}, "data_transfer"),
        ({"dispatcher_address": "h:1", "data_transfer_address": "h:2"}, "its own port"),
    ],
)
def test_worker_config_is_validated(config: dict[str, Any], match: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=match):
        service.WorkerConfig(**config)


def test_a_time_of_0_ms_is_1_ms_and_none_the_default_as_in_tensorflow() -> None:
    config = service.DispatcherConfig(job_gc_timeout_ms=0, worker_timeout_ms=0)
    assert config.gc_timeout_s == config.worker_timeout_s == 0.001
    assert service.DispatcherConfig(job_gc_timeout_ms=-1).gc_timeout_s == float("inf")
    assert service.DispatcherConfig().client_timeout_s == 10.0
    worker = service.WorkerConfig("h:1", heartbeat_interval_ms=0)
    assert worker.heartbeat_interval_s == 0.001 and worker.dispatcher_timeout_s == 60.0


def test_a_job_gc_timeout_of_0_collects_a_named_job_once_its_consumers_left(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(1, job_gc_timeout_ms=0, job_gc_check_interval_ms=50)
    dataset = Dataset.range(3).apply(
        service.distribute("parallel_epochs", cluster.target, job_name="j")
    )
    assert [int(x) for x in dataset] == [0, 1, 2]
    wait_until(lambda: not cluster.dispatcher._core.state.jobs)


def test_configs_keep_tensorflows_positions_and_take_the_rest_by_keyword() -> None:
    # DispatcherConfig(port, protocol, work_dir, fault_tolerant_mode, worker_addresses, ...)
    # and WorkerConfig(dispatcher_address, worker_address, port, protocol,
    # heartbeat_interval_ms, ...) as TensorFlow orders them.
    config = service.DispatcherConfig(0, "grpc", None, False, ("127.0.0.1:1",), 500, 600, 700)
    assert config.worker_addresses == ("127.0.0.1:1",) and config.worker_timeout_ms == 700
    worker = service.WorkerConfig("127.0.0.1:1", None, 0, "grpc", 250, 900)
    assert worker.heartbeat_interval_ms == 250 and worker.dispatcher_timeout_ms == 900
    worker = service.WorkerConfig(
        "127.0.0.1:1", "w:%port%", 0, "grpc", 250, 900, "grpc", "w:%port%"
    )
    assert worker.data_transfer_address == worker.worker_address
    with pytest.raises(TypeError):  # feedline's own fields are keyword-only
        service.WorkerConfig("h:1", None, 0, "grpc", 1, 1, None, None, ("tag",))  # type: ignore[misc]
    with pytest.raises(TypeError):
        service.DispatcherConfig(0, "grpc", None, False, None, 1, 1, 1, "normal")  # type: ignore[misc]


def test_sharding_policy_strings() -> None:
    parse = service.ShardingPolicy.parse
    assert parse("parallel_epochs") is service.ShardingPolicy.OFF
    assert parse("distributed_epoch") is service.ShardingPolicy.DYNAMIC
    assert parse(service.ShardingPolicy.HINT) is service.ShardingPolicy.HINT
    assert [p.is_static for p in service.ShardingPolicy] == [False, False, True, True, True, True]


# -- collection of finished jobs and unused datasets ------------------------------------------


def test_finished_anonymous_jobs_leave_nothing_behind(make_cluster: Any) -> None:
    cluster = make_cluster(2)
    dispatcher = cluster.dispatcher
    dataset = Dataset.range(3).apply(service.distribute("parallel_epochs", cluster.target))
    for _ in range(20):
        assert sorted(int(x) for x in dataset) == [0, 0, 1, 1, 2, 2]
    state = dispatcher._state
    # Each iteration's job was collected as its consumer finished: what the dispatcher keeps
    # does not grow with the number of jobs run.
    assert (state.jobs, state.tasks, state.clients, state.split_cursors) == ({}, {}, {}, {})
    assert not dispatcher._core.client_seen and not dispatcher._core.job_versions
    assert all(state.worker_tasks(w.worker_address) == [] for w in cluster.workers)
    assert len(state.datasets) == 1  # the dataset stays for the next iteration
    # The workers hear of it at their next heartbeat and drop the tasks.
    wait_until(lambda: not any(worker._tasks for worker in cluster.workers))


def test_a_named_job_is_collected_after_the_timeout_and_its_name_starts_afresh(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(1, job_gc_timeout_ms=1500, job_gc_check_interval_ms=50)
    state = cluster.dispatcher._state

    def named() -> Dataset:
        return Dataset.range(4).apply(
            service.distribute("distributed_epoch", cluster.target, job_name="epochs")
        )

    assert sorted(int(x) for x in named()) == [0, 1, 2, 3]
    (job_id,) = state.jobs
    # Within job_gc_timeout_ms a late consumer of the ended job gets its end at once.
    assert list(named()) == []
    assert list(state.jobs) == [job_id]
    wait_until(lambda: not state.jobs)
    assert state.job_by_key == {} and state.clients == {}
    # Once collected, the name starts a new job, which reads the data again.
    assert sorted(int(x) for x in named()) == [0, 1, 2, 3]


def test_a_dataset_no_job_reads_is_collected_after_the_timeout(make_cluster: Any) -> None:
    cluster = make_cluster(1, job_gc_timeout_ms=2000, job_gc_check_interval_ms=50)
    dispatcher = cluster.dispatcher
    # Registered now, read later (register_dataset, then from_dataset_id elsewhere): it is kept
    # while it was used within the timeout...
    dataset_id = service.register_dataset(cluster.target, Dataset.range(3))
    time.sleep(0.8)
    by_id = service.from_dataset_id("parallel_epochs", cluster.target, dataset_id)
    time.sleep(0.8)  # registered 1.6 s ago, asked about 0.8 s ago
    assert sorted(int(x) for x in by_id) == [0, 1, 2]
    assert dataset_id in dispatcher._state.datasets
    # ... and forgotten once nothing used it for that long.
    wait_until(lambda: dataset_id not in dispatcher._state.datasets)
    assert dispatcher._state.dataset_by_fingerprint == {}
    with pytest.raises(errors.NotFoundError, match="register it again"):
        list(by_id)
    # A dataset given to distribute registers itself again when its id was forgotten.
    distributed = Dataset.range(2).apply(service.distribute("parallel_epochs", cluster.target))
    assert sorted(int(x) for x in distributed) == [0, 1]
    first_id = distributed._dataset_id
    wait_until(lambda: first_id not in dispatcher._state.datasets)
    assert sorted(int(x) for x in distributed) == [0, 1]
    assert distributed._dataset_id in dispatcher._state.datasets


def test_a_dataset_a_running_job_reads_is_never_collected(make_cluster: Any) -> None:
    cluster = make_cluster(1, job_gc_timeout_ms=200, job_gc_check_interval_ms=50)
    state = cluster.dispatcher._state
    dataset = (
        Dataset.range(5)
        .repeat()
        .apply(service.distribute("parallel_epochs", cluster.target, job_name="long"))
    )
    iterator = iter(dataset)
    seen = [int(next(iterator)) for _ in range(3)]
    deadline = time.monotonic() + 1.0  # five times the timeout
    while time.monotonic() < deadline:
        seen.append(int(next(iterator)))
        time.sleep(0.01)
    assert len(state.datasets) == 1 and len(state.jobs) == 1
    assert seen[:10] == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    iterator.close()
    wait_until(lambda: not state.jobs and not state.datasets)


def test_job_gc_timeout_ms_takes_tensorflows_never() -> None:
    assert service.DispatcherConfig(job_gc_timeout_ms=-1).gc_timeout_s == float("inf")
    assert service.DispatcherConfig().gc_timeout_s == 300.0
    assert service.DispatcherConfig().gc_check_interval_s == 1.0
    with pytest.raises(errors.InvalidArgumentError, match="job_gc_timeout_ms"):
        service.DispatcherConfig(job_gc_timeout_ms=-2)
