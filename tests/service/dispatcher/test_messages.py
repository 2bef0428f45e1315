"""The requests the dispatcher reads (``protocol``): the headers senders write today read back
to the same request, and malformed ones are refused as before."""

from __future__ import annotations

from typing import Any

import pytest

from feedline import errors
from feedline.service.protocol import (
    ClientHeartbeatRequest,
    GetOrCreateJobRequest,
    GetSplitRequest,
    PinSplitVersionRequest,
    RegisterDatasetRequest,
    SplitVersionsRequest,
    WorkerHeartbeatRequest,
    split_versions_from_reply,
)

# Headers as the worker and client send them now.
WORKER_HEARTBEAT = {
    "address": "localhost:5051",
    "tags": ["gpu"],
    "current_tasks": [7, 9],
    "finished_tasks": [9],
    "failed_tasks": [{"task_id": 7, "type": "ValueError", "message": "m", "traceback": "t"}],
    "draining": False,
    "leaving": False,
    "wait_ms": 1000,
    "task_stats": [[7, 10, 80]],
    "instance": 123456789,
}
GET_OR_CREATE_JOB = {
    "dataset_id": "12",
    "mode": 1,
    "job_name": "train",
    "iteration": 3,
    "num_consumers": None,
    "target_workers": "AUTO",
    "resume": None,
}
REGISTER_DATASET = {
    "compression": "AUTO",
    "cardinality": -1,
    "split_plan": None,
    "dataset_id": None,
}
CLIENT_HEARTBEAT = {
    "client_id": 5,
    "version": 2,
    "wait_ms": 0,
    "received": [[0, [[0, 3]]]],
    "holding": [1],
    "closed": [],
}
GET_SPLIT = {"job_id": 4, "task_id": 6, "request": 2, "repetition": 0}
PIN = {"job_id": 3, "task_id": 7, "key": 1, "url": "s3://b/k", "version": '"e1"'}


@pytest.mark.parametrize(
    "kind, header",
    [
        (WorkerHeartbeatRequest, WORKER_HEARTBEAT),
        (GetOrCreateJobRequest, GET_OR_CREATE_JOB),
        (
            GetOrCreateJobRequest,
            {
                **GET_OR_CREATE_JOB,
                "cross_trainer": True,
                "trainer_id": "a",
                "trainer_splits": [[0, [[0, 4]]], [8, []]],
            },
        ),
        (RegisterDatasetRequest, REGISTER_DATASET),
        (ClientHeartbeatRequest, CLIENT_HEARTBEAT),
        (ClientHeartbeatRequest, {"client_id": 5, "version": -1, "wait_ms": 0}),
        (GetSplitRequest, GET_SPLIT),
        (GetSplitRequest, {**GET_SPLIT, "finished": [3, 40], "handed_out": [1, 2]}),
        (GetSplitRequest, {**GET_SPLIT, "wait_ms": 500}),
        (PinSplitVersionRequest, PIN),
        (PinSplitVersionRequest, {**PIN, "version": 12}),
        (SplitVersionsRequest, {"client_id": 5, "keys": [0, 8]}),
    ],
)
def test_a_header_reads_back_to_itself(kind: Any, header: dict[str, Any]) -> None:
    assert kind.from_header(header).to_header() == header


def test_fields_are_typed() -> None:
    request = WorkerHeartbeatRequest.from_header(WORKER_HEARTBEAT)
    assert request.current_tasks == (7, 9) and request.tags == ("gpu",)
    assert request.instance == 123456789
    assert GetSplitRequest.from_header({**GET_SPLIT, "finished": [3, 40]}).finished == (3, 40)
    # What a sender leaves out reads as its default.
    assert WorkerHeartbeatRequest.from_header({"address": "a"}) == WorkerHeartbeatRequest("a")


@pytest.mark.parametrize(
    "kind, header, message",
    [
        (WorkerHeartbeatRequest, {"wait_ms": 0}, "field 'address' is missing"),
        (WorkerHeartbeatRequest, {"address": "a", "failed_tasks": [3]}, "a failed task is 3"),
        (WorkerHeartbeatRequest, {"address": "a", "draining": 1}, "field 'draining' must be"),
        (WorkerHeartbeatRequest, {"address": "a", "instance": "x"}, "instance must be an int64"),
        (GetOrCreateJobRequest, {**GET_OR_CREATE_JOB, "target_workers": "X"}, "target_workers"),
        (GetOrCreateJobRequest, {**GET_OR_CREATE_JOB, "dataset_id": 12}, "must be a string"),
        (
            GetOrCreateJobRequest,
            {**GET_OR_CREATE_JOB, "trainer_splits": [[0, [[0, -1]]]]},
            "trainer_splits must be",
        ),
        (RegisterDatasetRequest, {**REGISTER_DATASET, "dataset_id": ""}, "non-empty string"),
        (GetSplitRequest, {**GET_SPLIT, "finished": ["a", 1]}, "finished must be"),
        (GetSplitRequest, {**GET_SPLIT, "handed_out": [True]}, "handed_out must be"),
        (GetSplitRequest, {**GET_SPLIT, "wait_ms": -1}, "wait_ms must be >= 0"),
        (ClientHeartbeatRequest, {"client_id": "5"}, "field 'client_id' must be"),
        (PinSplitVersionRequest, {**PIN, "version": None}, "object's version"),
        (PinSplitVersionRequest, {**PIN, "version": 1.5}, "object's version"),
        (PinSplitVersionRequest, {**PIN, "url": "a\nb"}, "url must be printable"),
        (SplitVersionsRequest, {"client_id": 5, "keys": ["0"]}, "keys"),
    ],
)
def test_a_malformed_header_is_refused(kind: Any, header: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=message):
        kind.from_header(header)


def test_a_split_versions_reply_reads_back_and_refuses_wrong_types() -> None:
    reply = {"versions": [[0, {"s3://b/a": '"e1"', "s3://b/b": 7}]]}
    assert split_versions_from_reply(reply) == {0: {"s3://b/a": '"e1"', "s3://b/b": 7}}
    assert split_versions_from_reply({}) == {}
    for bad in ([["0", {}]], [[0, ["s3://b/a"]]], [[0, {"s3://b/a": 1.5}]]):
        with pytest.raises(errors.InvalidArgumentError, match="malformed"):
            split_versions_from_reply({"versions": bad})
