"""Tests of the consumer's messages in feedline/service/protocol.py: what a consumer reads, as
the dispatcher and the workers send it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from feedline.errors import InvalidArgumentError
from feedline.service.protocol import (
    ElementSpecReply,
    ElementsReply,
    HeartbeatReply,
    JobView,
    JoinReply,
    RegisterDatasetReply,
    StreamView,
    TaskView,
)

# A join reply as the dispatcher builds it (dispatcher/jobs.py and long_poll.py).
_JOIN = {
    "job_id": 5 << 32 | 1,
    "client_id": 5 << 32 | 2,
    "incarnation": 5,
    "client_timeout_ms": 10000,
    "tasks": [[5 << 32 | 3, "127.0.0.1:7001", "running"], [5 << 32 | 4, "127.0.0.1:7002", "lost"]],
    "streams": [[5 << 32 | 3, 0, 2, 0], [5 << 32 | 4, 1, 2, 3]],
    "finished": False,
    "error": None,
    "consumers": 1,
    "joined": 2,
    "exactly_once": False,
    "split_cursor": None,
    "version": 7,
}


def test_a_join_reply_reads_and_writes_the_same_bytes() -> None:
    reply = JoinReply.from_header(_JOIN)
    assert (reply.job_id, reply.client_id, reply.client_timeout_ms) == (
        5 << 32 | 1,
        5 << 32 | 2,
        10000,
    )
    assert reply.view.tasks[1] == TaskView(5 << 32 | 4, "127.0.0.1:7002", "lost")
    assert reply.view.streams[1] == StreamView(5 << 32 | 4, 1, 2, 3)
    assert (reply.view.joined, reply.view.version) == (2, 7)
    assert json.dumps(reply.to_header()) == json.dumps(_JOIN)


def test_a_heartbeat_reply_carries_the_splits_done_of_exactly_once_jobs() -> None:
    view = {k: v for k, v in _JOIN.items() if k not in ("job_id", "client_id", "client_timeout_ms")}
    header = {**view, "exactly_once": True, "split_cursor": {"num_units": 8}}
    header["splits_done"] = [[0, 4], [4, 4]]
    reply = HeartbeatReply.from_header(header)
    assert reply.splits_done == ((0, 4), (4, 4))
    assert reply.view.split_cursor == {"num_units": 8}
    assert json.dumps(reply.to_header()) == json.dumps(header)
    plain = HeartbeatReply.from_header(view)
    assert plain.splits_done is None and "splits_done" not in plain.to_header()
    assert not plain.complete and "complete" not in plain.to_header()
    complete = HeartbeatReply.from_header({**header, "complete": True})
    assert complete.complete and complete.to_header()["complete"] is True


def test_a_view_fills_in_what_an_older_dispatcher_left_out() -> None:
    view = JobView.from_header({"tasks": [], "version": 0})
    assert (view.streams, view.consumers, view.joined, view.finished, view.error) == (
        (),
        1,
        1,
        False,
        None,
    )


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"tasks": None}, "field 'tasks'"),
        ({"tasks": [[1, "a:1"]]}, "field 'tasks'"),
        ({"tasks": [["1", "a:1", "running"]]}, "field 'tasks'"),
        ({"tasks": [[1, "a:1", "paused"]]}, "'paused'"),
        ({"streams": [[1, 0, True, 0]]}, "field 'streams'"),
        ({"version": "7"}, "field 'version'"),
        ({"finished": 1}, "field 'finished'"),
        ({"client_id": None}, "field 'client_id'"),
    ],
)
def test_a_malformed_join_reply_is_an_invalid_argument(change: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        JoinReply.from_header({**_JOIN, **change})


@pytest.mark.parametrize(
    "header",
    [
        {"eos": False, "meta": {"signatures": [], "count": 2}, "tags": [[0, 0, 2]]},
        {"eos": False, "meta": {"signatures": [], "count": 4}, "tags": [[3, 7, 2], [1, 0, 2]]},
        {"eos": False, "meta": {"signatures": [], "count": 1}},
        {"eos": False},
        {"eos": False, "retry_after_ms": 500},
        {"eos": True},
        {"gone": True},
        {"error": {"type": "ValueError", "message": "bad", "traceback": ""}},
    ],
)
def test_an_elements_reply_reads_and_writes_the_same_bytes(header: dict[str, Any]) -> None:
    assert json.dumps(ElementsReply.from_header(header).to_header()) == json.dumps(header)


def test_an_elements_replys_tags_travel_as_runs_of_offsets() -> None:
    tags = [[3, 7], [3, 8], [1, 0], [3, 9], [3, 11], [3, 12]]
    header = ElementsReply(meta={"signatures": [], "count": 6}, tags=tags).to_header()
    assert header["tags"] == [[3, 7, 2], [1, 0, 1], [3, 9, 1], [3, 11, 2]]
    assert ElementsReply.from_header(json.loads(json.dumps(header))).tags == tags


@pytest.mark.parametrize(
    "tags",
    [
        [[0, "1", 1]],
        [[0, 1]],  # a pair, not a run
        [[0, 1, 0]],  # no element
        [[0, -1, 2]],
        [[0, 0, True]],
        [[0, 0, 1 << 20], [1, 0, 1]],  # more elements than a reply carries
        [7],
    ],
)
def test_a_malformed_elements_reply_is_an_invalid_argument(tags: list[Any]) -> None:
    with pytest.raises(InvalidArgumentError, match="field 'tags'"):
        ElementsReply.from_header({"eos": False, "tags": tags})


def test_an_elements_reply_with_a_mistyped_field_is_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgumentError, match="field 'eos'"):
        ElementsReply.from_header({"eos": "yes"})


def test_the_dataset_replies_read_back_and_refuse_wrong_types() -> None:
    assert RegisterDatasetReply.from_header({"dataset_id": "7"}) == RegisterDatasetReply("7")
    assert RegisterDatasetReply("7").to_header() == {"dataset_id": "7"}
    assert ElementSpecReply.from_header({"cardinality": -1}).cardinality == -1
    assert ElementSpecReply(12).to_header() == {"cardinality": 12}
    with pytest.raises(InvalidArgumentError, match="field 'dataset_id'"):
        RegisterDatasetReply.from_header({"dataset_id": 7})
    with pytest.raises(InvalidArgumentError, match="field 'cardinality'"):
        ElementSpecReply.from_header({})
