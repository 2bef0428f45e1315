"""The coordinator's agent for one worker keeps ``IN_FLIGHT`` requests sent to it, against a
fake worker (a gRPC server of the worker's methods, in this process): the next request waits on
the worker while one runs, a lost call sends its functions again, and short functions travel
several to a request."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest

from feedline._net import rpc
from feedline.distribute.cluster_resolver import ClusterSpec
from feedline.distribute.coordinator import ClusterCoordinator
from feedline.distribute.parameter_server import closures
from feedline.distribute.parameter_server.agent import BATCH_S, IN_FLIGHT, MAX_BATCH
from feedline.distribute.parameter_server.protocol import SERVICE_NAME
from feedline.errors import UnavailableError
from tests.distribute.parameter_server._cluster import chief_strategy


class FakeWorker:
    """Answers Ping and CreateResource; each Run waits for ``release``, then runs its
    functions and reports that each took ``seconds`` (the first call that carries a function
    whose argument is in ``lose`` fails, as if the worker were gone)."""

    def __init__(self, lose: tuple[int, ...] = ()) -> None:
        self.release = threading.Event()
        self.arrived: list[int] = []
        self.requests: list[int] = []  # how many functions each Run carried
        self.seconds = 0.05  # what each function took, as reported
        self.at_most: int | None = None  # functions run per request; the others skipped
        self.ran: list[int] = []
        self._lose = set(lose)
        self._cond = threading.Condition()
        token = rpc.resolve_token(None)
        handlers = {"Ping": self._ping, "CreateResource": self._create, "Run": self._run}
        self.server, port = rpc.start_server(
            SERVICE_NAME, handlers, bind="127.0.0.1", port=0, token=token,
            upload_limits={"Run": 1 << 20, "CreateResource": 1 << 20},
        )  # fmt: skip
        self.address = f"127.0.0.1:{port}"

    def _ping(self, header: dict, buffers: list) -> tuple[dict, list]:
        return {"job": "worker", "task": 0, "incarnation": "fake"}, []

    def _create(self, header: dict, buffers: list) -> tuple[dict, list]:
        return {}, []

    def _run(self, header: dict, buffers: list) -> tuple[dict, list[Any]]:
        assert header["closures"] == [[]] * len(buffers)  # no PerWorkerValues here
        calls = [closures.ClosureUnpickler(bytes(b), {}, {}).load() for b in buffers]
        with self._cond:
            self.arrived += [args[0] for _, args, _ in calls]
            self.requests.append(len(calls))
            self._cond.notify_all()
            failing = any(args[0] in self._lose for _, args, _ in calls)
            self._lose -= {args[0] for _, args, _ in calls}
        if failing:
            raise UnavailableError("the fake worker lost this call")
        assert self.release.wait(30)
        count = len(calls) if self.at_most is None else self.at_most
        run, skipped = calls[:count], calls[count:]
        with self._cond:
            self.ran += [args[0] for _, args, _ in run]
        outcomes = [{"result": True, "seconds": self.seconds} for _ in run]
        outcomes += [{"skipped": True} for _ in skipped]
        return {"outcomes": outcomes}, [cloudpickle.dumps(fn(*a, **k)) for fn, a, k in run]

    def wait_for(self, count: int, timeout: float = 20.0) -> list[int]:
        with self._cond:
            self._cond.wait_for(lambda: len(self.arrived) >= count, timeout)
            return list(self.arrived)


@pytest.fixture
def coordinator_of(ps_spec: ClusterSpec) -> Iterator[Any]:
    made: list[tuple[ClusterCoordinator, FakeWorker]] = []

    def make(worker: FakeWorker) -> ClusterCoordinator:
        spec = ClusterSpec({**ps_spec.as_dict(), "worker": [worker.address]})
        coordinator = ClusterCoordinator(chief_strategy(spec), function_timeout=30)
        made.append((coordinator, worker))
        return coordinator

    yield make
    for coordinator, worker in made:
        worker.release.set()
        coordinator.close()
        worker.server.stop(0.0)


def _square(x: int) -> int:
    return x * x


def test_the_next_function_waits_on_the_worker_while_one_runs(coordinator_of) -> None:
    assert IN_FLIGHT == 2
    worker = FakeWorker()
    coordinator = coordinator_of(worker)
    values = [coordinator.schedule(_square, args=(i,)) for i in range(5)]
    # Two functions reach the worker before either has finished; the third waits its turn.
    assert sorted(worker.wait_for(2)) == [0, 1]
    time.sleep(0.3)
    assert len(worker.arrived) == 2 and not any(v.done for v in values)
    worker.release.set()
    coordinator.join(timeout=20)
    assert [v.fetch() for v in values] == [0, 1, 4, 9, 16]
    assert sorted(worker.arrived) == [0, 1, 2, 3, 4]


def test_functions_of_lost_calls_run_again(coordinator_of) -> None:
    worker = FakeWorker(lose=(0, 1))  # the first calls of the two functions in flight
    coordinator = coordinator_of(worker)
    values = [coordinator.schedule(_square, args=(i,)) for i in range(3)]
    worker.release.set()
    coordinator.join(timeout=20)
    assert [v.fetch() for v in values] == [0, 1, 4]
    # Functions 0 and 1 were sent, lost, and sent again: each ran at least once.
    assert sorted(worker.arrived) == [0, 0, 1, 1, 2]


def test_short_functions_travel_several_to_a_request(coordinator_of) -> None:
    worker = FakeWorker()
    worker.seconds = 1e-4  # each function reports 0.1 ms: BATCH_S holds many
    worker.release.set()
    coordinator = coordinator_of(worker)
    coordinator.schedule(_square, args=(-1,)).fetch(timeout=20)  # learns what they take
    values = [coordinator.schedule(_square, args=(i,)) for i in range(200)]
    coordinator.join(timeout=20)
    assert [v.fetch() for v in values] == [i * i for i in range(200)]
    assert sorted(worker.arrived) == [-1, *range(200)]  # each once
    assert worker.requests[0] == 1 and max(worker.requests) > 1
    assert max(worker.requests) <= min(MAX_BATCH, int(BATCH_S / 1e-4))


def test_long_functions_travel_one_to_a_request(coordinator_of) -> None:
    worker = FakeWorker()
    worker.seconds = BATCH_S  # each function takes a whole batch's time
    worker.release.set()
    coordinator = coordinator_of(worker)
    values = [coordinator.schedule(_square, args=(i,)) for i in range(30)]
    coordinator.join(timeout=20)
    assert [v.fetch() for v in values] == [i * i for i in range(30)]
    assert worker.requests == [1] * 30


def test_functions_a_request_had_no_time_for_go_back_to_the_queue(coordinator_of) -> None:
    worker = FakeWorker()
    worker.seconds = 1e-4
    worker.at_most = 1  # as if each request ran out of its budget after one function
    worker.release.set()
    coordinator = coordinator_of(worker)
    coordinator.schedule(_square, args=(-1,)).fetch(timeout=20)
    values = [coordinator.schedule(_square, args=(i,)) for i in range(50)]
    coordinator.join(timeout=20)
    assert [v.fetch() for v in values] == [i * i for i in range(50)]
    assert sorted(worker.ran) == [-1, *range(50)]  # each run once
    assert max(worker.requests) > 1  # sent several at a time, run one at a time
