"""Tests of feedline/service/client/fetch.py: how a consumer's fetch threads ask a worker, against
an in-process dispatcher and worker (what each thread reads is in tests of the dataset)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from feedline.data import Dataset
from feedline.service import distribute
from feedline.service.client import fetch
from feedline.service.protocol import GetElementsRequest
from feedline.service.worker import replies
from tests.service.conftest import Cluster

pytestmark = pytest.mark.timeout(120)

# 1 MB elements: a reply of 8 MB carries 8, past fetch.TOGETHER_BYTES.
_VALUES = 1 << 18


def megabyte(i: np.ndarray) -> np.ndarray:
    return np.full(_VALUES, i, np.float32)


class Requests:
    """What a worker's tasks saw of the GetElements requests: how many were there at once at
    most, and their numbers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.most = 0
        self.seqs: list[int | None] = []


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[Requests]:
    """Counts the requests at the worker's tasks; each reply waits 20 ms before it goes (a
    slow send), so a request sent without waiting for it is at the worker meanwhile."""
    seen = Requests()
    original = replies.TaskReplies.get_elements

    def get_elements(self: replies.TaskReplies, request: GetElementsRequest) -> bytes:
        with seen.lock:
            seen.inside += 1
            seen.most = max(seen.most, seen.inside)
            seen.seqs.append(request.seq)
        try:
            frame = original(self, request)
            time.sleep(0.02)
            return frame
        finally:
            with seen.lock:
                seen.inside -= 1

    monkeypatch.setattr(replies.TaskReplies, "get_elements", get_elements)
    yield seen


def read(cluster: Cluster, dataset: Dataset, **kw: Any) -> list[int]:
    return [
        int(np.asarray(e).reshape(-1)[0])
        for e in dataset.apply(distribute("distributed_epoch", cluster.target, **kw))
    ]


def test_large_replies_come_two_requests_at_a_time_in_order(
    make_cluster: Callable[..., Cluster], requests: Requests
) -> None:
    cluster = make_cluster(1)
    assert read(cluster, Dataset.range(64).map(megabyte)) == list(range(64))
    assert requests.most == fetch.IN_FLIGHT == 2
    numbers = [s for s in requests.seqs if s is not None]
    assert numbers and sorted(numbers) == list(range(len(numbers)))  # every request numbered


def test_small_replies_come_one_request_at_a_time(
    make_cluster: Callable[..., Cluster], requests: Requests
) -> None:
    cluster = make_cluster(1)
    assert read(cluster, Dataset.range(2000)) == list(range(2000))
    assert requests.most == 1
