"""Malformed requests to a real dispatcher and worker: each is refused with INVALID_ARGUMENT and
a short message naming the field, never with the server's traceback, and the servers keep
serving."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from feedline import service
from feedline._net.wire import encode_frame
from feedline.data import Dataset
from feedline.service.protocol import DISPATCHER_SERVICE, WORKER_SERVICE
from tests.launcher import local_auth

_CALL_TIMEOUT_S = 10.0
_HUGE = 10**20  # past 64 bits


class _Cluster:
    def __init__(self) -> None:
        self.dispatcher = service.DispatchServer()
        self.worker = service.WorkerServer(
            service.WorkerConfig(
                dispatcher_address=self.dispatcher.target, heartbeat_interval_ms=100
            )
        )
        dataset = Dataset.range(1_000_000).apply(
            service.distribute("parallel_epochs", self.dispatcher.target)
        )
        self.reader = iter(dataset)
        next(self.reader)  # a job, a task and a consumer exist
        with self.dispatcher._lock:
            state = self.dispatcher._state
            self.dataset_id = next(iter(state.datasets))
            self.job_id = next(iter(state.jobs))
            self.task_id = next(iter(state.tasks))
            self.client_id = next(iter(state.clients))
        self.channels = {
            DISPATCHER_SERVICE: grpc.insecure_channel(self.dispatcher.target.split("://")[1]),
            WORKER_SERVICE: grpc.insecure_channel(self.worker.worker_address),
        }

    def call(self, service_name: str, method: str, frame: bytes) -> grpc.StatusCode:
        """The status of one raw call (OK or the error's), after checking that its details
        carry no traceback."""
        stub = self.channels[service_name].unary_unary(f"/{service_name}/{method}")
        try:
            stub(frame, timeout=_CALL_TIMEOUT_S, metadata=local_auth())
        except grpc.RpcError as error:
            assert isinstance(error, grpc.Call)
            details = error.details() or ""
            assert "Traceback" not in details and ".py" not in details, details
            self.details = details
            return error.code()
        self.details = ""
        return grpc.StatusCode.OK

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        self.reader = None  # type: ignore[assignment]
        self.worker.stop()
        self.dispatcher.stop()


@pytest.fixture(scope="module")
def cluster() -> Iterator[_Cluster]:
    made = _Cluster()
    yield made
    made.close()


def _job_request(c: _Cluster, **change: Any) -> dict[str, Any]:
    header = {
        "dataset_id": c.dataset_id,
        "mode": 0,
        "job_name": "malformed",
        "iteration": 0,
        "num_consumers": None,
        "target_workers": "AUTO",
    }
    return {**header, **change}


def _pin(cluster: Any, **change: Any) -> dict[str, Any]:
    """A PinSplitVersion request of the cluster's task, with ``change``."""
    header = {"job_id": cluster.job_id, "task_id": cluster.task_id, "key": 0, "url": "s3://b/k"}
    return {**header, "version": "e", **change}


def _pins(cluster: Any, **change: Any) -> dict[str, Any]:
    """A PinSplitVersions request of the cluster's task, with ``change``."""
    header = {"job_id": cluster.job_id, "task_id": cluster.task_id, "key": 0}
    return {**header, "versions": {"s3://b/k": "e"}, **change}


_D, _W = DISPATCHER_SERVICE, WORKER_SERVICE
_WORKER = {"address": "x:1"}

# (service, method, the header (made for the cluster), the field the message names)
CASES: list[tuple[str, str, Any, str]] = [
    (_D, "GetOrCreateJob", lambda c: _job_request(c, mode=-1), "mode"),
    (_D, "GetOrCreateJob", lambda c: _job_request(c, mode=_HUGE), "mode"),
    (_D, "GetOrCreateJob", lambda c: _job_request(c, mode="0"), "mode"),
    (_D, "GetOrCreateJob", lambda c: _job_request(c, request_id="x" * 65), "request_id"),
    (_D, "GetOrCreateJob", lambda c: _job_request(c, request_id=7), "request_id"),
    (_D, "ClientHeartbeat", lambda c: {"client_id": c.client_id, "wait_ms": _HUGE}, "wait_ms"),
    (_D, "ClientHeartbeat", lambda c: {"client_id": _HUGE}, "client_id"),
    (_D, "WorkerHeartbeat", lambda c: {**_WORKER, "wait_ms": _HUGE}, "wait_ms"),
    (_D, "WorkerHeartbeat", lambda c: {**_WORKER, "current_tasks": [_HUGE]}, "current_tasks"),
    (_D, "WorkerHeartbeat", lambda c: {"address": "", "tags": []}, "address"),
    (_D, "WorkerHeartbeat", lambda c: {"address": "x:1\n"}, "address"),
    (_D, "WorkerHeartbeat", lambda c: {**_WORKER, "failed_tasks": [{"task_id": True}]}, "failed"),
    (_D, "GetSplit", lambda c: {"job_id": c.job_id, "repetition": _HUGE}, "repetition"),
    (_D, "PinSplitVersion", lambda c: _pin(c, version=1.5), "version"),
    (_D, "PinSplitVersion", lambda c: _pin(c, url="s3://b/\x00"), "url"),
    (_D, "PinSplitVersion", lambda c: _pin(c, key="0"), "key"),
    (_D, "PinSplitVersions", lambda c: _pins(c, versions={"s3://b/k": 1.5}), "version"),
    (_D, "PinSplitVersions", lambda c: _pins(c, versions=["s3://b/k", "e"]), "versions"),
    (_D, "PinSplitVersions", lambda c: _pins(c, versions={"s3://b/\x00": "e"}), "url"),
    (
        _D,
        "PinSplitVersions",
        lambda c: _pins(c, versions={f"s3://b/{i}": "e" for i in range(1025)}),
        "1024",
    ),
    (_D, "SplitVersions", lambda c: {"client_id": c.client_id, "keys": ["0"]}, "keys"),
    (_D, "ReleaseClient", lambda c: {"client_id": [c.client_id]}, "client_id"),
    (_W, "GetElements", lambda c: {"task_id": c.task_id, "wait_ms": _HUGE}, "wait_ms"),
    (_W, "GetElements", lambda c: {"task_id": _HUGE}, "task_id"),
]


@pytest.mark.parametrize(
    ("service_name", "method", "header", "name"),
    CASES,
    ids=[f"{method}-{name}-{i}" for i, (_, method, _, name) in enumerate(CASES)],
)
def test_a_malformed_request_is_invalid_and_names_its_field(
    cluster: _Cluster, service_name: str, method: str, header: Any, name: str
) -> None:
    code = cluster.call(service_name, method, encode_frame(header(cluster)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, cluster.details
    assert repr(name) in cluster.details or name in cluster.details.split(), cluster.details
    assert len(cluster.details) < 500, cluster.details
    assert next(cluster.reader) is not None  # the cluster serves on


@pytest.mark.parametrize("service_name", [DISPATCHER_SERVICE, WORKER_SERVICE])
@pytest.mark.parametrize(
    "frame",
    [b"", b"garbage", b'FLW\x01\x05\x00\x00\x00{"a":', b"FLW\x01\x02\x00\x00\x00[]"],
)
def test_garbage_bytes_are_invalid(cluster: _Cluster, service_name: str, frame: bytes) -> None:
    method = "GetSplit" if service_name == DISPATCHER_SERVICE else "GetElements"
    assert cluster.call(service_name, method, frame) == grpc.StatusCode.INVALID_ARGUMENT
