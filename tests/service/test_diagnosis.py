"""``diagnose`` names the bottleneck of synthetic pipelines with a known slow stage.

The service is real processes (``feedline dispatcher`` and ``feedline worker``); the consumer,
in this process, reads each pipeline for a few seconds while ``feedline diagnose``'s ``watch``
asks the dispatcher for its load. Three clusters take their shares of the pipelines side by
side, each one pipeline at a time. The goal is the right bottleneck in at least 9 of the 10;
every miss is printed. The rules themselves are checked on hand-made loads first.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pytest

from feedline import service
from feedline.cli._autoscale import load_source, watch
from feedline.data import Dataset
from feedline.service.diagnosis import diagnose, diagnose_job, one_more_worker, render
from feedline.service.protocol import JobLoad, LoadReply
from tests.service.procs import ServiceProcesses

pytestmark = pytest.mark.timeout(400)


def job(**fields: object) -> JobLoad:
    base: dict[str, object] = dict(
        job_id=1, busy=2.0, wait=0.5, fill=0.0, elements_per_s=100.0, workers=("a", "b"),
        movable=True, stages={}, steps_per_s=100.0,
    )  # fmt: skip
    base.update(fields)
    return JobLoad(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "bottleneck"),
    [
        ({"wait": 0.02}, "trainer"),
        ({"busy": 0.4, "fill": 1.0}, "network"),
        ({"stages": {"map#1": 9.0, "range#2$": 1.0}}, "map"),
        ({"stages": {"map#1": 1.0, "fromgenerator#2$": 9.0}}, "reader"),
        ({"stages": {"map#1": 4.0, "map#2": 4.0, "range#3$": 2.0}}, "workers"),
        ({"stages": {"prefetch#0": 50.0, "map#1": 9.0, "range#2$": 1.0}}, "map"),
        ({"steps_per_s": 0.0, "wait": None}, "idle"),
    ],
)
def test_the_rules(fields: dict[str, object], bottleneck: str) -> None:
    assert diagnose_job(job(**fields)).bottleneck == bottleneck


def test_one_more_worker_gains_a_worker_s_share_at_most_what_the_trainer_takes() -> None:
    # 2 workers: a third makes 50% more, if the trainer takes it (it waits half its time:
    # it would take twice as much).
    assert one_more_worker(job(wait=0.5)) == pytest.approx(0.5)
    # It waits 20% of the time: it takes only 25% more.
    assert one_more_worker(job(wait=0.2)) == pytest.approx(0.25)
    assert diagnose_job(job(wait=0.02)).gain == 0.0


def test_an_idle_service_says_so() -> None:
    (verdict,) = diagnose(LoadReply(desired_workers=0))
    assert verdict.bottleneck == "idle"
    assert "the service is idle" in render([verdict], LoadReply(desired_workers=0))


def slow(seconds: float) -> Callable[[object], object]:
    def stage(x: object) -> object:
        time.sleep(seconds)
        return x

    return stage


def slow_source(seconds: float, nbytes: int = 8) -> Dataset:
    def generate():
        for i in range(10**9):
            time.sleep(seconds)
            yield np.full(nbytes // 8, i, dtype=np.int64)

    return Dataset.from_generator(generate, output_signature=service_spec(nbytes))


def service_spec(nbytes: int):
    from feedline.data import TensorSpec

    return TensorSpec((nbytes // 8,), np.int64)


class Measured(NamedTuple):
    """A pipeline's bottleneck: the one expected, the one named, and the verdict as printed."""

    name: str
    expected: str
    got: str
    rendered: str


def big(x: object) -> np.ndarray:
    return np.zeros(4 << 20, dtype=np.uint8)  # 4 MiB: the transfer is the slow part


# (name, dataset, trainer's seconds per step, the bottleneck)
CASES: list[tuple[str, Callable[[], Dataset], float, str]] = [
    ("slow map", lambda: Dataset.range(10**9).map(slow(0.01)), 0.0, "map"),
    ("slow map, batched", lambda: Dataset.range(10**9).map(slow(0.002)).batch(8), 0.0, "map"),
    ("slow reader", lambda: slow_source(0.01), 0.0, "reader"),
    ("slow reader, then a map", lambda: slow_source(0.01).map(lambda x: x + 1), 0.0, "reader"),
    ("slow trainer", lambda: Dataset.range(10**9), 0.02, "trainer"),
    ("slow trainer, batched", lambda: Dataset.range(10**9).batch(16), 0.02, "trainer"),
    (
        "three equal stages",
        lambda: Dataset.range(10**9).map(slow(0.004)).map(slow(0.004)).map(slow(0.004)),
        0.0,
        "workers",
    ),
    (
        "reader and map alike",
        lambda: slow_source(0.005).map(slow(0.005)),
        0.0,
        "workers",
    ),
    ("large elements", lambda: Dataset.range(10**9).map(big), 0.0, "network"),
]


def read_while(dataset: Dataset, step_s: float, stop: threading.Event) -> None:
    iterator = iter(dataset)
    try:
        while not stop.is_set():
            next(iterator)
            if step_s:
                time.sleep(step_s)
    finally:
        iterator.close()


# Clusters measured side by side, each running its share of CASES one after the other: every
# pipeline still has its cluster to itself, and the slow part (the windows of reports) overlaps.
LANES = 3


def measure_lane(
    cases: list[tuple[str, Callable[[], Dataset], float, str]], idle_first: bool
) -> list[Measured]:
    """Each of ``cases`` read alone on a cluster of its own (a dispatcher and a worker
    process), ``diagnose``'s verdict taken as ``feedline diagnose`` does; with ``idle_first``,
    the verdict on the cluster before any job first."""
    measured: list[Measured] = []
    with ServiceProcesses() as cluster:
        cluster.start_dispatcher()
        cluster.start_worker()
        load, close = load_source(cluster.address)
        try:
            if idle_first:
                (idle,), _ = watch(load, 1.0)
                measured.append(Measured("idle service", "idle", idle.bottleneck, ""))
            for name, make, step_s, expected in cases:
                dataset = make().apply(service.distribute("parallel_epochs", cluster.target))
                stop = threading.Event()
                reader = threading.Thread(
                    target=read_while, args=(dataset, step_s, stop), daemon=True
                )
                reader.start()
                try:
                    deadline = time.monotonic() + 60
                    while True:  # its job's first reports
                        verdicts, _ = watch(load, 0.0)
                        if (
                            verdicts
                            and verdicts[0].job_id is not None
                            and (verdicts[0].bottleneck != "idle")
                        ):
                            break
                        assert time.monotonic() < deadline, f"{name}: no job's load"
                        time.sleep(0.5)
                    time.sleep(3.0)  # a window of reports of this pipeline alone
                    verdicts, reply = watch(load, 4.0)
                finally:
                    stop.set()
                    reader.join(30)
                got = verdicts[0].bottleneck if verdicts else "none"
                measured.append(Measured(name, expected, got, render(verdicts, reply)))
                # The job ends with its consumer: the next case's is the only one.
                deadline = time.monotonic() + 30
                while load().jobs and time.monotonic() < deadline:
                    time.sleep(0.2)
        finally:
            close()
    return measured


def test_the_bottleneck_of_synthetic_pipelines_is_named() -> None:
    results: list[Measured] = []
    shares = [CASES[i::LANES] for i in range(LANES)]
    with concurrent.futures.ThreadPoolExecutor(LANES) as lanes:
        for lane in list(lanes.map(measure_lane, shares, [i == 0 for i in range(LANES)])):
            results += lane
    for miss in (r for r in results if r.got != r.expected):
        print(f"{miss.name}: expected {miss.expected}, got\n{miss.rendered}")
    outcomes = [(r.name, r.expected, r.got) for r in results]
    print(outcomes)
    assert sorted(r.name for r in results) == sorted(["idle service", *(c[0] for c in CASES)])
    assert sum(r.expected == r.got for r in results) >= 9, outcomes
