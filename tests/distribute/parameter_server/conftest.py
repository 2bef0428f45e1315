"""In-process parameter servers on free loopback ports, one cluster per test (variables are
named by creation order, so a cluster is never shared between tests)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from feedline.distribute import Server
from feedline.distribute.cluster_resolver import ClusterSpec
from tests.launcher import free_ports


@pytest.fixture
def ps_spec() -> Iterator[ClusterSpec]:
    """A cluster of two running ps tasks (and a chief address, unused)."""
    ports = free_ports(3)
    spec = ClusterSpec(
        {"chief": [f"127.0.0.1:{ports[0]}"], "ps": [f"127.0.0.1:{p}" for p in ports[1:]]}
    )
    servers = [Server(spec, "ps", i) for i in range(2)]
    yield spec
    for server in servers:
        server.stop()
