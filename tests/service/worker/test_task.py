"""Tests of feedline/service/worker/task.py and replies.py: a task run by a fake host (no
sockets, no dispatcher), its replies decoded as a consumer would."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from feedline._net.elements import unpack_elements
from feedline._net.wire import decode_frame
from feedline.data import Dataset
from feedline.errors import InvalidArgumentError
from feedline.service.config import ShardingPolicy
from feedline.service.protocol import GetElementsRequest, TaskDef
from feedline.service.shm import WorkerSegments
from feedline.service.worker import replies
from feedline.service.worker.buffer import TaskBuffer
from feedline.service.worker.host import TaskHost
from feedline.service.worker.task import Task

pytestmark = pytest.mark.timeout(60)


class FakeCounters:
    def __init__(self) -> None:
        self.served_elements = 0
        self.failed: list[tuple[int, str]] = []

    def served(self, elements: int, nbytes: int) -> None:
        self.served_elements += elements

    def task_failed(self, task_id: int, report: Mapping[str, Any]) -> None:
        self.failed.append((task_id, str(report.get("type"))))


class FakeHost:
    """A ``TaskHost`` serving ``dataset`` and, for DYNAMIC tasks, the ``splits`` given."""

    def __init__(self, dataset: Dataset, splits: list[list[int]] | None = None) -> None:
        self.worker_address = "fake-worker:1"
        self.draining = False
        self.shm = WorkerSegments(False)
        self.telemetry = FakeCounters()
        self.failures_reported = 0
        self.split_requests: list[dict[str, Any]] = []
        self._dataset = dataset
        self._splits = list(splits or [])

    def report_failure(self) -> None:
        self.failures_reported += 1

    def call_dispatcher(
        self, method: str, header: dict[str, Any], what: str
    ) -> tuple[dict[str, Any], list[memoryview]]:
        assert method == "GetSplit"
        self.split_requests.append(header)
        return {"split": self._splits.pop(0) if self._splits else None}, []

    def dataset(self, task: TaskDef) -> tuple[Dataset, str | None]:
        return self._dataset, None


def start_task(
    host: TaskHost, mode: ShardingPolicy = ShardingPolicy.OFF, num_consumers: int | None = None
) -> Task:
    definition = TaskDef(
        task_id=7, job_id=3, dataset_id="d", mode=mode, worker_index=0, num_workers=1,
        num_consumers=num_consumers,
    )  # fmt: skip
    task = Task(definition, host)
    task.start()
    return task


def ask(task: Task, **fields: Any) -> tuple[dict[str, Any], list[int]]:
    """One GetElements: the reply's header (without its elements) and its elements' values."""
    header, buffers = decode_frame(
        task.get_elements(GetElementsRequest.from_header({"task_id": 7, **fields}))
    )
    meta = header.pop("meta", None)
    values = [] if meta is None else [int(e[0]) for e in unpack_elements(meta, buffers)]
    return header, values


def read_all(task: Task, **fields: Any) -> tuple[list[int], dict[str, Any]]:
    """Asks until the reply says the task ends; the values and that last reply."""
    values: list[int] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        header, got = ask(task, wait_ms=200, **fields)
        values += got
        if header != {"eos": False}:
            return values, header
    raise TimeoutError(f"the task did not end; received {values}")


def test_a_task_runs_its_dataset_and_its_replies_carry_the_elements() -> None:
    host = FakeHost(Dataset.range(10))
    task = start_task(host)
    values, end = read_all(task, max_elements=4)
    assert values == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert end == {"eos": True}
    assert task.completed() and task.failure() is None
    assert (task.served_elements, task.served_bytes) == (10, 80)
    assert host.telemetry.served_elements == 10
    assert host.failures_reported == 0


def bad_at_3(x: np.ndarray) -> np.ndarray:
    if int(x) == 3:
        raise ValueError("element 3 is bad")
    return x


def test_a_failing_element_fails_the_task_and_is_reported_once() -> None:
    host = FakeHost(Dataset.range(10).map(bad_at_3))
    task = start_task(host)
    values, end = read_all(task, max_elements=1)
    assert values == [0, 1, 2]
    assert end["error"]["type"] == "ValueError"
    assert end["error"]["message"] == "element 3 is bad"
    assert (end["error"]["worker"], end["error"]["task_id"]) == ("fake-worker:1", 7)
    assert host.failures_reported == 1
    assert host.telemetry.failed == [(7, "ValueError")]
    assert not task.completed()
    assert ask(task)[0]["error"]["type"] == "ValueError"  # every consumer hears it


def test_round_robin_consumer_i_gets_element_i_of_each_round() -> None:
    task = start_task(FakeHost(Dataset.range(7)), num_consumers=2)
    got: dict[int, list[Any]] = {0: [], 1: []}
    for round_index in range(4):
        for consumer in (0, 1):
            header, values = ask(task, consumer_index=consumer, round=round_index, wait_ms=2000)
            got[consumer].append(values or header)
    assert got == {
        0: [[0], [2], [4], {"eos": True}],
        1: [[1], [3], [5], {"eos": True}],
    }  # element 6 is less than a round: nobody gets it


def test_a_round_robin_reply_carries_the_complete_rounds_after_the_one_asked_for() -> None:
    task = start_task(FakeHost(Dataset.range(11)), num_consumers=2)
    # Rounds 0-4 are [0, 1], [2, 3], ..., [8, 9]; element 10 is less than a round. Round 4
    # first: then every round is complete when the others are asked for.
    assert ask(task, consumer_index=0, round=4, wait_ms=2000)[1] == [8]
    assert ask(task, consumer_index=1, round=0, max_elements=3, wait_ms=2000)[1] == [1, 3, 5]
    # Every complete round, and not one past the input's end:
    assert ask(task, consumer_index=0, round=0, max_elements=64, wait_ms=2000)[1] == [0, 2, 4, 6, 8]
    assert ask(task, consumer_index=1, round=3, max_elements=64, wait_ms=2000)[1] == [7, 9]
    assert ask(task, consumer_index=0, round=5, max_elements=64, wait_ms=2000)[0]["eos"]


def test_a_round_robin_consumer_held_by_a_slower_one_is_named_in_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # With round_window rounds kept that consumer 1 has not taken, consumer 0 waits for it,
    # and the worker says so (once per _HELD_WARNING_S).
    buffer = TaskBuffer(7, round_window=2)
    for value in range(10):
        buffer.put([np.int64(value)], 8)
    task_replies = replies.TaskReplies(7, buffer, FakeHost(Dataset.range(1)), 2, False)

    def ask_round(consumer: int, round_index: int) -> list[int]:
        request = {"task_id": 7, "consumer_index": consumer, "round": round_index}
        request.update(wait_ms=50, max_elements=64)
        header, buffers = decode_frame(
            task_replies.get_elements(GetElementsRequest.from_header(request))
        )
        meta = header.get("meta")
        return [] if meta is None else [int(e[0]) for e in unpack_elements(meta, buffers)]

    with caplog.at_level("WARNING", logger="feedline.service.worker.server"):
        assert ask_round(0, 0) == [0, 2]  # rounds 0 and 1: the two the buffer keeps
        assert ask_round(0, 2) == []
        assert ask_round(0, 2) == []
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "consumer 0 waits for round 2: consumer(s) 1 have not taken round 0" in warning
    # Consumer 1 takes rounds 0 and 1, which makes room for 2 and 3: its reply has them too.
    assert ask_round(1, 0) == [1, 3, 5, 7]
    assert ask_round(0, 2) == [4, 6, 8]  # each round it takes makes room for the next


def test_a_round_robin_request_needs_its_consumer_index() -> None:
    task = start_task(FakeHost(Dataset.range(2)), num_consumers=2)
    with pytest.raises(InvalidArgumentError, match="'consumer_index' is missing"):
        ask(task, round=0)
    with pytest.raises(InvalidArgumentError, match=r"consumer_index 2 is out of range \[0, 2\)"):
        ask(task, consumer_index=2, round=0)


def test_a_dynamic_task_reads_the_splits_its_host_hands_out() -> None:
    host = FakeHost(Dataset.range(10).map(lambda x: x * 10), splits=[[4, 5], [0], [9]])
    task = start_task(host, mode=ShardingPolicy.DYNAMIC)
    values, end = read_all(task, max_elements=8)
    assert values == [40, 50, 0, 90]
    assert end == {"eos": True}
    assert host.split_requests == [
        {"job_id": 3, "task_id": 7, "request": n, "repetition": 0} for n in range(4)
    ]


def test_a_stopped_task_is_gone() -> None:
    task = start_task(FakeHost(Dataset.range(10**9)))
    assert ask(task, wait_ms=2000)[1] == [0]
    task.stop()
    assert ask(task)[0] == {"gone": True}
    assert not task.completed()


# -- fuller replies for a consumer that holds elements (replies.TaskReplies._linger) -----------


@pytest.fixture
def long_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request may wait 30 s, and linger as long: a reply that comes sooner did not linger
    to its end."""
    monkeypatch.setattr(replies, "_MAX_WAIT_S", 30.0)
    monkeypatch.setattr(replies, "_LINGER_S", 30.0)


def first_come(buffer: TaskBuffer) -> replies.TaskReplies:
    return replies.TaskReplies(7, buffer, FakeHost(Dataset.range(1)), None, False)


def put_later(buffer: TaskBuffer, values: list[int], finish: bool = False) -> threading.Thread:
    """Puts ``values`` (8 bytes each) 50 ms from now on a thread, then finishes if asked."""

    def run() -> None:
        time.sleep(0.05)
        for value in values:
            buffer.put([np.int64(value)], 8)
        if finish:
            buffer.finish(drained=False)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def timed_ask(task_replies: replies.TaskReplies, **fields: Any) -> tuple[list[int], float]:
    """One first-come GetElements of up to 30 s; the values and the seconds it took."""
    request = {"task_id": 7, "wait_ms": 30_000, "consumer": 1, **fields}
    started = time.monotonic()
    frame = task_replies.get_elements(GetElementsRequest.from_header(request))
    header, buffers = decode_frame(frame)
    meta = header.get("meta")
    values = [] if meta is None else [int(e[0]) for e in unpack_elements(meta, buffers)]
    return values, time.monotonic() - started


def test_a_consumer_that_holds_elements_gets_its_reply_filled(long_linger: None) -> None:
    buffer = TaskBuffer(7)
    buffer.put([np.int64(0)], 8)
    producer = put_later(buffer, [1, 2, 3, 4])
    values, took = timed_ask(first_come(buffer), held=2, max_elements=4)
    assert values == [0, 1, 2, 3]  # waited for the reply to fill, and not longer
    assert took < 15
    producer.join(10)
    values, _ = timed_ask(first_come(buffer), held=0, max_elements=4)
    assert values == [4]


def test_a_consumer_that_holds_nothing_gets_what_is_there_at_once(long_linger: None) -> None:
    buffer = TaskBuffer(7)
    buffer.put([np.int64(0)], 8)
    producer = put_later(buffer, [1])
    values, took = timed_ask(first_come(buffer), held=0, max_elements=4)
    assert values == [0] and took < 15
    producer.join(10)


def test_a_reply_that_reached_its_bytes_or_the_end_of_the_input_waits_no_more(
    long_linger: None,
) -> None:
    buffer = TaskBuffer(7)
    for value in range(2):
        buffer.put([np.int64(value)], 8)
    values, took = timed_ask(first_come(buffer), held=5, max_elements=4, max_bytes=16)
    assert values == [0, 1] and took < 15  # 16 bytes: full
    buffer.put([np.int64(2)], 8)
    producer = put_later(buffer, [], finish=True)
    values, took = timed_ask(first_come(buffer), held=5, max_elements=4)
    assert values == [2] and took < 15  # the input ended: nothing more comes
    producer.join(10)


# -- a consumer's requests in flight together (replies.TaskReplies._wait_turn) ------------------


def served_request_0(
    monkeypatch: pytest.MonkeyPatch, turn_wait_s: float, values: int
) -> replies.TaskReplies:
    """A task's replies with ``values`` elements buffered, whose request 0 of consumer 1 took
    the first; a request waits ``turn_wait_s`` at most for its turn."""
    monkeypatch.setattr(replies, "_TURN_WAIT_S", turn_wait_s)
    buffer = TaskBuffer(7)
    for value in range(values):
        buffer.put([np.int64(value)], 8)
    task_replies = first_come(buffer)
    assert timed_ask(task_replies, seq=0, max_elements=1)[0] == [0]
    return task_replies


def test_numbered_requests_take_their_elements_in_their_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    task_replies = served_request_0(monkeypatch, 30.0, 3)
    later: list[list[int]] = []
    thread = threading.Thread(
        target=lambda: later.append(timed_ask(task_replies, seq=2, max_elements=1)[0]),
        daemon=True,
    )
    thread.start()  # request 2 arrives first, and waits for request 1
    time.sleep(0.2)
    assert later == []
    assert timed_ask(task_replies, seq=1, max_elements=1)[0] == [1]
    thread.join(10)
    assert later == [[2]]


def test_a_request_whose_predecessor_never_comes_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    task_replies = served_request_0(monkeypatch, 0.3, 2)
    values, took = timed_ask(task_replies, seq=2, max_elements=1)  # request 1 was lost
    assert values == [1] and 0.25 < took < 10


def test_only_a_consumers_own_requests_wait_for_each_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    task_replies = served_request_0(monkeypatch, 30.0, 3)  # a reply sooner waited for no turn
    # Another consumer's first numbered request (whatever its number) takes at once, and so
    # does an unnumbered one.
    values, took = timed_ask(task_replies, consumer=2, seq=5, max_elements=1)
    assert values == [1] and took < 15
    values, took = timed_ask(task_replies, consumer=3, max_elements=1)
    assert values == [2] and took < 15
