"""In-process data service clusters for the service tests, always stopped at teardown."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from feedline import service
from tests.launcher import free_port


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
