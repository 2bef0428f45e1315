"""Tests of the messages a worker reads (feedline/service/protocol.py, "messages to a worker"):
each header as its sender writes it comes back the same, key order included, from
``to_header(from_header(header))``; a malformed one is an InvalidArgumentError."""

from __future__ import annotations

from typing import Any

import pytest

from feedline.errors import InvalidArgumentError
from feedline.service.config import ShardingPolicy
from feedline.service.protocol import (
    DatasetDefReply,
    GetElementsRequest,
    GetSplitReply,
    TaskDef,
    WorkerHeartbeatReply,
)

TASK = {
    "task_id": 7,
    "job_id": 3,
    "dataset_id": "abc",
    "fingerprint": "f00d",
    "mode": 1,
    "worker_index": 0,
    "num_workers": 2,
    "num_consumers": None,
    "skip": 5,
    "exactly_once": False,
    "shared": True,
}


@pytest.mark.parametrize(
    ("kind", "header"),
    [
        (
            GetElementsRequest,
            {"task_id": 7, "consumer": 9, "consumers": 2, "held": 1, "max_elements": 4,
             "max_bytes": 1024, "wait_ms": 50},
        ),
        (
            GetElementsRequest,
            {"task_id": 7, "consumer": 9, "consumers": 1, "held": 0, "max_elements": 4,
             "max_bytes": 1024, "seq": 3, "wait_ms": 50},
        ),
        (GetElementsRequest, {"task_id": 7, "consumer_index": 1, "round": 3, "wait_ms": 50,
                              "shm": {"name": "x"}}),
        (GetElementsRequest, {"task_id": 7, "consumer_index": 1, "round": 3, "max_elements": 8,
                              "wait_ms": 50}),
        (TaskDef, TASK),
        (WorkerHeartbeatReply, {"incarnation": 5, "new_tasks": [TASK]}),
        (
            WorkerHeartbeatReply,
            {"incarnation": 5, "new_tasks": [], "delete_tasks": [1, 2],
             "task_errors": {"2": {"type": "ValueError"}}, "lost_tasks": [4],
             "dropped_tasks": [6]},
        ),
        (GetSplitReply, {"split": [4, 5]}),
        (GetSplitReply, {"split": None}),
        (GetSplitReply, {"split": None, "wait": True}),
        (GetSplitReply, {"split": [1], "key": 1, "skip": [[0, 3]]}),
        (GetSplitReply, {"split": [1], "key": 1, "skip": [], "versions": {"s3://b/k": '"e1"'}}),
    ],
)  # fmt: skip
def test_a_header_comes_back_as_it_was_sent(kind: Any, header: dict[str, Any]) -> None:
    assert list(kind.from_header(header).to_header().items()) == list(header.items())


def test_what_a_worker_reads_of_them() -> None:
    reply = WorkerHeartbeatReply.from_header(
        {"incarnation": 5, "new_tasks": [TASK], "delete_tasks": [2],
         "task_errors": {"2": {"type": "ValueError"}}}
    )  # fmt: skip
    assert reply.task_errors == {2: {"type": "ValueError"}}
    assert reply.new_tasks[0].mode is ShardingPolicy.DYNAMIC
    assert (reply.delete_tasks, reply.lost_tasks) == ((2,), ())
    request = GetElementsRequest.from_header({"task_id": 7})
    assert (request.wait_ms, request.consumer, request.max_elements) == (500, 0, 1)


@pytest.mark.parametrize(
    ("kind", "header", "match"),
    [
        (GetElementsRequest, {}, "field 'task_id' is missing"),
        (GetElementsRequest, {"task_id": 7, "wait_ms": "5"}, "field 'wait_ms' must be"),
        (GetElementsRequest, {"task_id": 7, "held": True}, "field 'held' must be"),
        (GetElementsRequest, {"task_id": 7, "seq": "1"}, "field 'seq' must be"),
        (TaskDef, {**TASK, "mode": 99}, "task mode 99 is none of"),
        (TaskDef, {**TASK, "num_workers": None}, "field 'num_workers' must be"),
        (WorkerHeartbeatReply, {"incarnation": 5}, "field 'new_tasks' is missing"),
        (WorkerHeartbeatReply, {"new_tasks": [], "delete_tasks": ["1"]}, "list of ints"),
        (WorkerHeartbeatReply, {"new_tasks": [], "task_errors": {"x": {}}}, "task_errors"),
        (GetSplitReply, {"split": [1.5]}, "list of unit indices"),
        (GetSplitReply, {"split": [1], "key": 1, "skip": [[0]]}, "ranges"),
        (GetSplitReply, {"split": [1], "versions": {"s3://b/k": 1.5}}, "object's version"),
        (GetSplitReply, {"split": [1], "versions": ["s3://b/k"]}, "field 'versions' must be"),
    ],
)
def test_a_malformed_header_is_an_invalid_argument(
    kind: Any, header: dict[str, Any], match: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        kind.from_header(header)


def test_round_position_of_a_first_come_request_is_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgumentError, match="'consumer_index' is missing"):
        GetElementsRequest.from_header({"task_id": 7}).round_position()
    assert GetElementsRequest.from_header(
        {"task_id": 7, "consumer_index": 0, "round": 2}
    ).round_position() == (0, 2)


def test_the_dataset_def_reply_reads_back_and_refuses_wrong_types() -> None:
    header = {"compression": "AUTO", "split_plan": {"kind": "range"}}
    assert DatasetDefReply.from_header(header).to_header() == header
    assert (
        DatasetDefReply.from_header({"compression": None, "split_plan": None}).compression is None
    )
    with pytest.raises(InvalidArgumentError, match="field 'compression'"):
        DatasetDefReply.from_header({"compression": 1, "split_plan": None})
