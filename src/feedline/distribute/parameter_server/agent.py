"""``WorkerAgent``: the coordinator's thread for one ``worker`` task.

It takes scheduled functions from the coordinator's queue, one at a time, makes the worker's
per-worker datasets and iterators first (again after the worker restarted: every request names
the incarnation it was meant for), sends the function, and resolves its ``RemoteValue``. A call
that fails means the worker is gone: the function goes back to the front of the queue, and the
agent tries the worker every ``RETRY_S`` on a fresh channel until it answers again.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any

import cloudpickle

from feedline._net import rpc as _rpc
from feedline._net.remote_errors import error_from_report
from feedline.distribute.parameter_server import closures
from feedline.distribute.parameter_server.protocol import SERVICE_NAME
from feedline.distribute.parameter_server.values import PerWorkerValues, RemoteValue
from feedline.errors import UnavailableError

if TYPE_CHECKING:
    from feedline.distribute.parameter_server.coordinator import ClusterCoordinator

__all__ = ["RETRY_S", "Closure", "Resource", "WorkerAgent"]

#: How often an unreachable worker is tried.
RETRY_S = 0.2


@dataclasses.dataclass
class Closure:
    """A scheduled function: its pickle, the PerWorkerValues it refers to, its result."""

    name: str
    data: bytes
    values: dict[int, PerWorkerValues]
    result: RemoteValue


@dataclasses.dataclass(frozen=True)
class Resource:
    """A per-worker dataset (its pickled function) or iterator (of resource ``source``)."""

    ident: int
    kind: str  # "dataset" or "iterator"
    payload: bytes
    source: int


class WorkerAgent(threading.Thread):
    """Sends one worker its functions, one at a time, and follows it through restarts."""

    def __init__(self, coordinator: ClusterCoordinator, index: int, address: str) -> None:
        super().__init__(name=f"feedline-coordinator-worker-{index}", daemon=True)
        self._coordinator = coordinator
        self.index = index
        self.address = address
        self._token = _rpc.resolve_token(None)
        self._client = _rpc.RpcClient(address, SERVICE_NAME, self._token)
        self._incarnation: str | None = None
        self._created: set[int] = set()
        #: Since when (``time.monotonic()``) the worker has not answered; None while it does.
        self.down_since: float | None = None

    def close(self) -> None:
        self._client.close()

    def run(self) -> None:
        coordinator = self._coordinator
        while not coordinator._stopping.is_set():
            closure = coordinator._take()
            try:
                if closure is None:
                    if self._incarnation is not None:
                        self._make_resources()
                    continue
                outcome = self._execute(closure)
            except UnavailableError:
                if closure is not None:
                    coordinator._requeue(closure)
                self._wait_until_back()
                continue
            except Exception as error:  # a per-worker dataset that cannot be made
                if coordinator._stopping.is_set():  # stopped: its channel was closed
                    if closure is not None:
                        coordinator._requeue(closure)
                    return
                if closure is None:
                    with coordinator._cond:
                        coordinator._error = coordinator._error or error
                    continue
                outcome = (False, error, None)
            coordinator._finish(closure, outcome)

    def _connect(self, client: _rpc.RpcClient, timeout: float, wait: bool) -> None:
        header, _ = client.call("Ping", {}, timeout=timeout, wait_for_ready=wait)
        if header.get("incarnation") != self._incarnation:
            self._incarnation = header.get("incarnation")
            self._created.clear()

    def _make_resources(self) -> None:
        with self._coordinator._cond:
            missing = [r for r in self._coordinator._resources if r.ident not in self._created]
        for resource in missing:
            header, _ = self._client.upload(
                "CreateResource",
                {
                    "incarnation": self._incarnation,
                    "id": resource.ident,
                    "kind": resource.kind,
                    "source": resource.source,
                },
                [resource.payload] if resource.payload else [],
                timeout=self._coordinator._function_timeout,
            )
            if header.get("restarted"):
                raise UnavailableError(f"worker {self.index} restarted")
            self._created.add(resource.ident)  # made, or failed: reported once, not retried
            if "error" in header:
                raise self._error_of(header["error"])

    def _execute(self, closure: Closure) -> tuple[bool, Any, int | None]:
        if self._incarnation is None:  # not up yet: the function goes back to the queue
            self._connect(self._client, timeout=1.0, wait=False)
        self._make_resources()
        ids = list(closure.values)
        values = [closures.dumps_value(closure.values[i].values[self.index]) for i in ids]
        header, buffers = self._client.upload(
            "Run",
            {"incarnation": self._incarnation, "values": ids},
            [closure.data, *values],
            timeout=self._coordinator._function_timeout,
        )
        if header.get("restarted"):
            raise UnavailableError(f"worker {self.index} restarted")
        if "error" in header:
            return False, self._error_of(header["error"]), header.get("ps_task")
        return True, cloudpickle.loads(bytes(buffers[0])), None

    def _error_of(self, report: dict[str, Any]) -> BaseException:
        """The error a function raised on this worker, with the worker's traceback as a note."""
        error = error_from_report({k: v for k, v in report.items() if k != "traceback"})
        error.__notes__ = [
            f"raised on worker {self.index} ({self.address}); the remote traceback:\n"
            f"{str(report.get('traceback', '')).rstrip()}"
        ]
        return error

    def _wait_until_back(self) -> None:
        """Tries the worker every ``RETRY_S`` (on a fresh channel, free of gRPC's reconnect
        backoff) until it answers; then its resources are made again."""
        self._incarnation = None
        self.down_since = time.monotonic()
        while not self._coordinator._stopping.is_set():
            if self._coordinator._cluster_error is not None:
                self._coordinator._stopping.wait(RETRY_S)
                continue
            client = _rpc.RpcClient(self.address, SERVICE_NAME, self._token)
            try:
                self._connect(client, timeout=1.0, wait=False)
            except UnavailableError:
                client.close()
                self._coordinator._stopping.wait(RETRY_S)
                continue
            self._client.close()
            self._client = client
            self.down_since = None
            return
