"""``Autoscaler`` with the local back-end: real ``feedline worker`` processes that it starts
under demand and drains when idle, every element read exactly once.

Each worker is given a known capacity by a rate-limited map (a sleep per element: 2 cores
stand for many workers); the consumer reads as fast as it can, so one worker is too few.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

from feedline import service
from feedline.data import Dataset
from feedline.errors import InvalidArgumentError
from feedline.service.autoscaler import Autoscaler, Policy
from feedline.service.dispatcher.demand import load_reply
from feedline.service.protocol import LoadReply, WorkerLoad
from feedline.service.scaling import LocalWorkers

pytestmark = pytest.mark.timeout(240)

WAIT_S = 90.0
# About 850 elements are read before the third worker is asked for on a loaded machine (fewer
# idle): the epoch lasts well past it, and the rest, read after the pause, stays short.
ELEMENTS = 2000


def rate_limited(x):
    time.sleep(0.01)  # 100 elements/s per worker
    return x


@pytest.fixture
def dispatcher(tmp_path) -> Iterator[service.DispatchServer]:
    server = service.DispatchServer(
        service.DispatcherConfig(work_dir=str(tmp_path), fault_tolerant_mode=True)
    )
    yield server
    server.stop()


def local_load(server: service.DispatchServer) -> Callable[[], LoadReply]:
    """What GetLoad answers, read in this process."""

    def load() -> LoadReply:
        with server._lock:
            return load_reply(server._state, server._core.load, server._workers.draining)

    return load


def until(condition: Callable[[], bool], what: str, step: Callable[[], object]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        step()
        time.sleep(0.2)


def test_scales_up_under_demand_and_down_when_idle_and_loses_nothing(dispatcher) -> None:
    address = dispatcher.target.split("://")[1]
    backend = LocalWorkers(address, drain_seconds=10.0)
    scaler = Autoscaler(
        local_load(dispatcher),
        backend,
        Policy(1, 3, stabilization_s=2.0, scale_down_s=2.0),
        interval_s=0.2,
    )
    dataset = (
        Dataset.range(ELEMENTS)
        .map(rate_limited)
        .apply(service.distribute("distributed_epoch", dispatcher.target, job_name="scaled"))
    )
    received: list[int] = []
    reading = threading.Event()
    reading.set()
    done = threading.Event()
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            for element in dataset:
                received.append(int(element))
                reading.wait()
        except BaseException as error:  # reported by the test
            errors.append(error)
        finally:
            done.set()

    try:
        scaler.step()  # the first worker (min_workers)
        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        until(lambda: backend.count() == 3, "three workers under demand", scaler.step)
        reading.clear()  # the trainer pauses: the workers idle
        until(lambda: backend.count() == 1, "one worker when idle", scaler.step)
        reading.set()
        until(done.is_set, "the job ends", scaler.step)
        consumer.join(10)
    finally:
        reading.set()
        backend.close()
    assert not errors, errors
    assert sorted(received) == list(range(ELEMENTS))  # each element exactly once
    # Up, then down (then up again once the trainer reads on): the drains that took it from
    # 3 to 1 lost nothing.
    changes = [d.changed for d in scaler.decisions if d.changed]
    assert changes[0] > 0 and any(c < 0 for c in changes), changes
    assert backend.drained >= 2, changes


def test_policy_scales_up_at_once_and_down_after_scale_down_s() -> None:
    policy = Policy(1, 10, stabilization_s=60, scale_down_s=5, scale_up_s=0, settle_s=0)
    assert policy.target(0, desired=4, current=1) == 4
    assert policy.target(2, desired=2, current=4) == 4  # asked for fewer for 2 s only
    assert policy.target(4, desired=3, current=4) == 4
    assert policy.target(5, desired=2, current=4) == 3  # the most asked for over 5 s
    assert policy.target(7, desired=1, current=3) == 3  # 2 s after that scale-down
    assert policy.target(8, desired=2, current=3) == 3
    assert policy.target(10, desired=1, current=3) == 2  # 2 was asked for at 8 s
    assert policy.target(15, desired=1, current=2) == 1
    assert policy.target(16, desired=20, current=1) == 10  # max_workers
    assert policy.target(17, desired=0, current=10) == 10


def test_policy_allows_one_reversal_per_stabilization_window() -> None:
    policy = Policy(1, 10, stabilization_s=60, scale_down_s=5, scale_up_s=0, settle_s=0)
    assert policy.target(0, desired=4, current=2) == 4
    assert policy.target(5, desired=2, current=4) == 2  # reversal 1
    assert policy.target(6, desired=4, current=2) == 4
    assert policy.target(30, desired=2, current=4) == 4  # a second one waits 60 s
    assert policy.target(65, desired=2, current=4) == 2  # 2 is the most since 5 s
    # A scale-down after a scale-down is no reversal: 5 s of lower demand suffice.
    assert policy.target(70, desired=1, current=2) == 1


def _directions(
    policy: Policy, demand: Callable[[int], int], seconds: int
) -> list[tuple[int, int]]:
    """The policy's changes (second, +1 or -1) under ``demand(second)``, one round a second."""
    current, directions = 1, []
    for second in range(seconds):
        target = policy.target(float(second), demand(second), current)
        if target != current:
            directions.append((second, 1 if target > current else -1))
            current = target
    return directions


def test_policy_with_a_flapping_demand_reverses_at_most_once_per_window() -> None:
    """Demand that swings between 3 and 6 workers every 10 s, for an hour: a scale-down right
    after a scale-up (a reversal) happens at most once per 5 minutes, so the count changes
    direction at most twice in any 5 minutes (that scale-down and the scale-up after it)."""
    policy = Policy(min_workers=1, max_workers=10, stabilization_s=300)
    directions = _directions(policy, lambda s: 6 if (s // 10) % 2 else 3, 3600)
    changes = [t for (_, before), (t, d) in itertools.pairwise(directions) if d != before]
    reversals = [
        t for (_, before), (t, d) in itertools.pairwise(directions) if (before, d) == (1, -1)
    ]
    assert all(b - a >= 300 for a, b in itertools.pairwise(reversals)), directions
    assert all(c - a >= 300 for a, _, c in zip(changes, changes[1:], changes[2:], strict=False)), (
        directions
    )
    assert len(reversals) <= 3600 // 300 + 1
    assert directions[-1][1] == 1  # it ends with what the peaks need


def test_policy_never_scales_down_for_dips_shorter_than_scale_down_s() -> None:
    policy = Policy(min_workers=1, max_workers=10, stabilization_s=300, scale_down_s=5)
    directions = _directions(policy, lambda s: 6 if (s // 4) % 2 else 3, 3600)
    assert [d for _, d in directions] == [1, 1], directions


def test_policy_checks_its_bounds() -> None:
    with pytest.raises(InvalidArgumentError, match="--min-workers"):
        Policy(min_workers=3, max_workers=2)


class FakeBackend:
    """Counts what the autoscaler asks of it."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = list(addresses)
        self.drained: list[str] = []

    def count(self) -> int:
        return len(self.addresses)

    def owns(self, address: str) -> bool:
        return address in self.addresses

    def scale_up(self, count: int) -> None:
        self.addresses += [f"new:{i}" for i in range(count)]

    def scale_down(self, count: int, candidates: Sequence[str]) -> int:
        chosen = list(candidates)[:count]
        self.drained += chosen
        self.addresses = [a for a in self.addresses if a not in chosen]
        return len(chosen)

    def close(self) -> None:
        return


def test_the_last_worker_of_a_running_job_is_never_drained() -> None:
    """The dispatcher asks for 1 worker; of 3, one runs the last task of a job (pinned) and
    one is busier: the least busy unpinned one drains first, the pinned one never."""
    reply = LoadReply(
        desired_workers=1,
        workers=(
            WorkerLoad("a:1", False, 1, 0.9, True),
            WorkerLoad("b:1", False, 1, 0.5, False),
            WorkerLoad("c:1", False, 1, 0.1, False),
        ),
    )
    backend = FakeBackend(["a:1", "b:1", "c:1"])
    scaler = Autoscaler(
        lambda: reply, backend, Policy(0, 5, stabilization_s=0, scale_down_s=0, scale_up_s=0)
    )
    decision = scaler.step()
    assert decision.target == 1 and decision.changed == -2
    assert backend.drained == ["c:1", "b:1"]
    # Asked for none, it still keeps the pinned one.
    reply = LoadReply(desired_workers=0, workers=(WorkerLoad("a:1", False, 1, 0.9, True),))
    scaler = Autoscaler(
        lambda: reply, backend, Policy(0, 5, stabilization_s=0, scale_down_s=0, scale_up_s=0)
    )
    assert scaler.step().changed == 0 and backend.addresses == ["a:1"]
