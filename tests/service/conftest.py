"""In-process data service clusters for the service tests, always stopped at teardown."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from feedline import service
from feedline._net.rpc import RpcClient
from feedline.service.protocol import INCARNATION_SHIFT, WORKER_SERVICE, GetElementsRequest
from feedline.service.worker import server as worker_module
from tests.launcher import free_port

#: A GetElements request for a task of a dispatcher life no worker has heard of yet: it waits
#: at the worker for its task (up to a second), holding one of the worker's waiting reads.
WAITING_READ = GetElementsRequest((7 << INCARNATION_SHIFT) + 1, wait_ms=1000).to_header()


class Cluster:
    """A dispatcher and its workers in this process."""

    def __init__(self, dispatcher: service.DispatchServer) -> None:
        self.dispatcher = dispatcher
        self.workers: list[service.WorkerServer] = []

    @property
    def target(self) -> str:
        return self.dispatcher.target

    @property
    def address(self) -> str:
        return self.dispatcher.target.split("://")[1]

    def add_worker(self, **config: object) -> service.WorkerServer:
        worker = service.WorkerServer(
            service.WorkerConfig(dispatcher_address=self.address, **config)  # type: ignore[arg-type]
        )
        self.workers.append(worker)
        return worker

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.dispatcher.stop()


@pytest.fixture
def make_cluster() -> Iterator[Callable[..., Cluster]]:
    """``make_cluster(num_workers=2, **dispatcher_config)``."""
    clusters: list[Cluster] = []

    def make(num_workers: int = 2, **config: object) -> Cluster:
        cluster = Cluster(service.DispatchServer(service.DispatcherConfig(**config)))  # type: ignore[arg-type]
        clusters.append(cluster)
        for _ in range(num_workers):
            cluster.add_worker()
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()


def static_cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    """A cluster of two workers at fixed addresses, which the dispatcher lists (static
    sharding)."""
    ports = [free_port(), free_port()]
    addresses = [f"127.0.0.1:{port}" for port in ports]
    cluster = make_cluster(0, worker_addresses=addresses)
    for port, address in zip(ports, addresses, strict=True):
        cluster.add_worker(port=port, worker_address=address)
    return cluster


@contextlib.contextmanager
def waiting_reads_taken(worker: service.WorkerServer) -> Iterator[RpcClient]:
    """Within the block, every read that may wait at ``worker`` is taken: as many threads as
    ``_MAX_WAITING_READS`` send ``WAITING_READ`` again and again. Yields a client of the
    worker."""
    client = RpcClient(worker.worker_address, WORKER_SERVICE)
    stop = threading.Event()

    def hold() -> None:
        while not stop.is_set():
            client.call("GetElements", WAITING_READ, timeout=30)

    bound = worker_module._MAX_WAITING_READS
    holders = [threading.Thread(target=hold, daemon=True) for _ in range(bound)]
    for holder in holders:
        holder.start()
    try:
        deadline = time.monotonic() + 10
        while worker._waiting_reads < bound:
            if time.monotonic() > deadline:
                pytest.fail(f"{bound} reads did not all wait at the worker within 10 s")
            time.sleep(0.02)
        yield client
    finally:
        stop.set()
        for holder in holders:
            holder.join(10)
        client.close()
