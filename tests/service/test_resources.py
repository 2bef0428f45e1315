"""The data service's threads, CPU and exit: bounded, quiet and fast.

Servers are real processes (``tests/service/procs.py``); the consumers whose threads are
counted run in this process. Every wait has a timeout.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from feedline.data import Dataset
from feedline.service import distribute
from tests.launcher import run
from tests.service.procs import ServiceProcesses

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cluster() -> Iterator[ServiceProcesses]:
    with ServiceProcesses() as processes:
        processes.start_dispatcher()
        processes.start_worker()
        yield processes


def fail_at_once(x: Any) -> Any:
    if int(x) >= 5:
        raise ValueError("this job fails")
    return x


def consumer_threads() -> int:
    return sum(t.name.startswith("feedline-consumer") for t in threading.enumerate())


def wait_for_no_consumer_threads(timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while consumer_threads():
        if time.monotonic() > deadline:
            pytest.fail(f"{consumer_threads()} consumer threads are still running")
        time.sleep(0.1)


def test_iterators_of_failed_jobs_leave_no_threads_behind(cluster: ServiceProcesses) -> None:
    dataset = (
        Dataset.range(100).map(fail_at_once).apply(distribute("parallel_epochs", cluster.target))
    )
    kept = []
    for _ in range(20):  # the error is raised; the iterators are kept, never closed
        iterator = iter(dataset)
        with pytest.raises(ValueError, match="this job fails"):
            for _ in iterator:
                pass
        kept.append(iterator)
    wait_for_no_consumer_threads()
    endless = Dataset.range(10).repeat().apply(distribute("parallel_epochs", cluster.target))
    for _ in range(20):  # never read past the first element, then dropped unclosed
        iterator = iter(endless)
        next(iterator)
    del iterator
    gc.collect()
    wait_for_no_consumer_threads()


def test_a_consumer_holding_an_ended_job_does_not_keep_the_dispatcher_busy(
    cluster: ServiceProcesses,
) -> None:
    (dispatcher,) = [name for name in cluster._groups if name.startswith("dispatcher")]
    iterator = iter(
        Dataset.range(500).apply(
            distribute("parallel_epochs", cluster.target, max_outstanding_requests=1000)
        )
    )
    next(iterator)
    time.sleep(1.0)  # the job ends at the worker: everything is in this consumer's buffer
    before, started = cluster.cpu_seconds(dispatcher), time.monotonic()
    time.sleep(3.0)  # the consumer drains nothing meanwhile, and heartbeats on its schedule
    busy = (cluster.cpu_seconds(dispatcher) - before) / (time.monotonic() - started)
    assert busy < 0.15, f"the dispatcher used {busy:.0%} of a core"
    assert sorted(int(x) for x in iterator) == list(range(1, 500))


# The seed's snippet, which never stops its servers, and an iterator left open mid-job.
NEVER_STOPPED = """
import time
from feedline import service
from feedline.data import Dataset
from tests.launcher import report

dispatcher = service.DispatchServer()
address = dispatcher.target.split("://")[1]
workers = [
    service.WorkerServer(service.WorkerConfig(dispatcher_address=address)) for _ in range(2)
]
dataset = Dataset.range(10).apply(service.distribute("parallel_epochs", dispatcher.target))
print(sorted(int(x) for x in dataset))
endless = Dataset.range(10**6).apply(service.distribute("parallel_epochs", dispatcher.target))
left_open = iter(endless)
next(left_open)
time.sleep(1.5)  # heartbeats and fetches in flight when the interpreter exits
report(time.time())
"""


def test_a_script_that_never_stops_its_servers_exits_quietly_and_at_once() -> None:
    for _ in range(3):
        (result,) = run(NEVER_STOPPED, [("script", {})], timeout=60).values()
        exit_took = time.time() - result.result
        assert result.stdout.strip() == str(sorted(list(range(10)) * 2))
        assert result.stderr == "", result.stderr  # no traceback, no warning
        assert exit_took < 1.0, f"the process took {exit_took:.2f} s to exit"
