"""Tests of feedline/service/dispatcher/jobs.py against a real dispatcher (gRPC on loopback):
a join retried with its request id is served once, by this dispatcher and by its next life
on the same journal."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from feedline import service
from feedline._net import rpc as _rpc
from feedline.data import Dataset
from feedline.service.client.dataset import register_dataset
from feedline.service.protocol import DISPATCHER_SERVICE as SERVICE_NAME
from feedline.service.protocol import GetOrCreateJobRequest

pytestmark = pytest.mark.timeout(60)


def _join(client: _rpc.RpcClient, dataset_id: str, request_id: str | None) -> dict[str, Any]:
    request = GetOrCreateJobRequest(
        dataset_id, int(service.ShardingPolicy.OFF), None, 0, None, "AUTO", request_id=request_id
    )
    return client.call("GetOrCreateJob", request.to_header(), timeout=10)[0]


def test_a_retried_join_is_the_same_consumer_across_a_restart(tmp_path: Path) -> None:
    config = service.DispatcherConfig(work_dir=str(tmp_path), fault_tolerant_mode=True)
    dispatcher = service.DispatchServer(config)
    port = int(dispatcher.target.rsplit(":", 1)[1])
    client = _rpc.RpcClient(f"127.0.0.1:{port}", SERVICE_NAME, None)
    try:
        client.call(  # the first call: a fresh port may be one another test's client last failed on
            "WorkerHeartbeat",
            {"address": "127.0.0.1:1", "wait_ms": 0},
            timeout=10,
            wait_for_ready=True,
        )
        dataset_id = register_dataset(dispatcher.target, Dataset.range(8))
        first = _join(client, dataset_id, "join-a")
        # The reply was lost, say: the same join again is the same consumer of the same
        # (anonymous) job, which has one consumer and one task.
        again = _join(client, dataset_id, "join-a")
        assert (again["job_id"], again["client_id"]) == (first["job_id"], first["client_id"])
        assert again["consumers"] == again["joined"] == 1 and len(again["tasks"]) == 1
        assert len(dispatcher._state.jobs) == 1
        # Another join (or one without an id) is another consumer, of another anonymous job.
        other = _join(client, dataset_id, "join-b")
        plain = _join(client, dataset_id, None)
        assert len({first["job_id"], other["job_id"], plain["job_id"]}) == 3
        dispatcher.stop()
        # Its next life on the same journal knows the join too.
        dispatcher = service.DispatchServer(dataclasses.replace(config, port=port))
        after = _join(client, dataset_id, "join-a")
        assert (after["job_id"], after["client_id"]) == (first["job_id"], first["client_id"])
        assert len(dispatcher._state.jobs) == 3
        # A consumer that was released is not handed out again: its join makes a new one.
        client.call("ReleaseClient", {"client_id": first["client_id"]}, timeout=10)
        fresh = _join(client, dataset_id, "join-a")
        assert fresh["client_id"] != first["client_id"]
    finally:
        client.close()
        dispatcher.stop()


def test_a_consumer_joins_with_a_request_id(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    dataset = Dataset.range(4).apply(service.distribute("parallel_epochs", cluster.target))
    iterator = iter(dataset)
    assert int(next(iterator)) == 0
    (client,) = cluster.dispatcher._state.clients.values()
    assert client.request_id is not None and len(client.request_id) == 32
    assert cluster.dispatcher._state.client_by_request == {client.request_id: client.client_id}
    assert sorted([0, *(int(x) for x in iterator)]) == [0, 1, 2, 3]
