"""Tests of feedline/service/client/job_reader.py: a consumer that no worker serves says so
while it waits, once per wait, and reads once a worker comes."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from feedline import service
from feedline.data import Dataset, Options
from feedline.service.client import job_reader
from tests.service.procs import read_in_thread

pytestmark = pytest.mark.timeout(60)


def _told(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "no worker has served" in r.getMessage()]


def test_a_consumer_that_no_worker_serves_says_so_once_then_reads_when_one_starts(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_reader, "SLOW_CALL_S", 0.3)
    options = Options()
    options.experimental_distribute.service_timeout_ms = 40_000
    with (
        caplog.at_level(logging.WARNING, logger=job_reader.__name__),
        service.DispatchServer(service.DispatcherConfig()) as dispatcher,
    ):
        dataset = Dataset.range(20).apply(
            service.distribute("distributed_epoch", dispatcher.target)
        )
        iterator = iter(dataset.with_options(options))
        read: list[tuple[list[int], BaseException | None]] = []
        reader = threading.Thread(target=lambda: read.append(read_in_thread(iterator, 30)))
        reader.start()
        deadline = time.monotonic() + 20
        while not _told(caplog) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.2)  # two more turns of the reader's wait: no second warning
        told = _told(caplog)
        assert len(told) == 1, caplog.text
        assert "no worker runs a task of it" in told[0], told
        assert "waits up to 40 s in all" in told[0] and "service_timeout_ms" in told[0], told
        address = dispatcher.target.split("://")[-1]
        with service.WorkerServer(service.WorkerConfig(dispatcher_address=address)):
            reader.join(30)
    assert not reader.is_alive()
    got, raised = read[0]
    assert raised is None and sorted(got) == list(range(20))
    assert len(_told(caplog)) == 1, caplog.text


def test_a_consumer_served_at_once_says_nothing(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_reader, "SLOW_CALL_S", 0.3)
    with (
        caplog.at_level(logging.WARNING, logger=job_reader.__name__),
        service.DispatchServer(service.DispatcherConfig()) as dispatcher,
        service.WorkerServer(
            service.WorkerConfig(dispatcher_address=dispatcher.target.split("://")[-1])
        ),
    ):
        dataset = Dataset.range(5).map(lambda x: (time.sleep(0.1), x)[1])
        got = sorted(
            int(x) for x in dataset.apply(service.distribute("parallel_epochs", dispatcher.target))
        )
    assert got == list(range(5))  # read over 0.5 s, past SLOW_CALL_S: a worker served it
    assert not _told(caplog), caplog.text
