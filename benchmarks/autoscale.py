"""Autoscaling: how fast and how well ``feedline autoscale`` follows a change in demand.

Usage (from the repository root)::

    .venv/bin/python benchmarks/autoscale.py [--capacity 20] [--demand 50] [--phase-seconds 40]
        [--stabilization 300] [--scale-down 5] [--scale-downs 20] [--elements 4000]
        [--only follow|lost|gain]

A dispatcher (fault tolerant, in this process) and ``feedline worker`` processes that the
autoscaler's local back-end starts and drains (``service.scaling.LocalWorkers``, driven by
``service.autoscaler.Autoscaler`` every 0.5 s). Each worker is given a known capacity: the
pipeline is a rate-limited map (``1 / --capacity`` seconds of sleep per element), so the best
worker count for a trainer that takes ``D`` elements a second is ``ceil(D / capacity)``, and two
cores stand for many workers. The trainer (this process) takes one element per step, and each
step works (sleeps) ``1 / --demand`` seconds: with its input always ready it takes ``--demand``
elements a second.

Part 1, following demand: ``--demand``, then twice as much, then ``--demand`` again, for
``--phase-seconds`` each. Reported per change: the worker heartbeats (1 s each) until the count
is within 1 of the best count and stays there; the reversals (a change of direction) over the
run; the worker-seconds against the best fixed setting (the best count of the busiest phase, all
the run), and the elements per second the trainer got against its demand.

Part 2, nothing lost: a finite epoch (``--elements``) of an exactly-once job, read to its end
while workers are started and drained ``--scale-downs`` times (never the last worker of the
job); reported: lost and duplicated elements.

Part 3, the predicted gain: two workers and a trainer that wants four workers' worth;
``feedline diagnose``'s predicted gain of one more worker against the gain measured once a third
one serves.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import math
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from feedline import service
from feedline.cli._autoscale import load_source
from feedline.data import Dataset
from feedline.service.autoscaler import Autoscaler, Policy
from feedline.service.diagnosis import diagnose as diagnose_load
from feedline.service.scaling import LocalWorkers

HEARTBEAT_S = 1.0


def rate_limited(seconds: float):
    def stage(x):
        time.sleep(seconds)
        return x

    return stage


def follow_demand(args: argparse.Namespace, target: str, address: str) -> None:
    load, close = load_source(address)
    backend = LocalWorkers(address, drain_seconds=5.0)
    scaler = Autoscaler(
        load,
        backend,
        Policy(1, args.max_workers, args.stabilization, scale_down_s=args.scale_down),
        interval_s=0.5,
    )
    demand = [args.demand, 2 * args.demand, args.demand]
    best = [math.ceil(d / args.capacity) for d in demand]
    dataset = Dataset.range(10**9).map(rate_limited(1.0 / args.capacity))
    dataset = dataset.apply(service.distribute("distributed_epoch", target))
    phase = [0]
    stop = threading.Event()
    taken: collections.Counter[int] = collections.Counter()

    def train() -> None:
        iterator = iter(dataset)
        try:
            while not stop.is_set():
                next(iterator)
                taken[phase[0]] += 1
                time.sleep(1.0 / demand[phase[0]])  # the step's own work
        finally:
            iterator.close()

    counts: list[tuple[float, int]] = []
    changes: list[float] = []
    trainer = threading.Thread(target=train, daemon=True)
    start = time.monotonic()
    try:
        scaler.step()
        trainer.start()
        for index in range(3):
            phase[0] = index
            changes.append(time.monotonic())
            phase_end = time.monotonic() + args.phase_seconds
            while time.monotonic() < phase_end:
                scaler.step()
                counts.append((time.monotonic(), backend.count()))
                time.sleep(0.5)
    finally:
        stop.set()
        trainer.join(30)
        backend.close()
        close()
    end = time.monotonic()
    # Worker-seconds: the integral of the count.
    worker_s = sum(c * (t1 - t0) for (t0, c), (t1, _) in itertools.pairwise(counts))
    fixed_s = max(best) * (counts[-1][0] - counts[0][0])
    directions = [d.changed > 0 for d in scaler.decisions if d.changed]
    reversals = sum(a != b for a, b in itertools.pairwise(directions))
    print(f"capacity {args.capacity}/s per worker; demand {demand} elements/s; best {best}")
    for index, changed in enumerate(changes):
        phase_end = changes[index + 1] if index + 1 < len(changes) else end
        in_phase = [(t, c) for t, c in counts if changed <= t < phase_end]
        settled = None
        for i, (t, _) in enumerate(in_phase):
            if all(abs(c - best[index]) <= 1 for _, c in in_phase[i:]):
                settled = t - changed
                break
        got = taken[index] / max(1e-9, phase_end - changed)
        print(
            f"phase {index} (demand {demand[index]}/s, best {best[index]} workers): workers "
            f"{sorted(set(c for _, c in in_phase))}, within 1 of best after "
            + ("never" if settled is None else f"{settled / HEARTBEAT_S:.1f} heartbeats")
            + f"; trainer got {got:.1f} elements/s"
        )
    print(
        f"reversals: {reversals} in {(end - start) / 60:.1f} min; changes "
        f"{[d.changed for d in scaler.decisions if d.changed]}"
    )
    print(
        f"worker-seconds: {worker_s:.0f} autoscaled vs {fixed_s:.0f} for the best fixed "
        f"setting ({max(best)} workers): {worker_s / fixed_s:.2f}x"
    )


def nothing_lost(args: argparse.Namespace, target: str, address: str) -> None:
    load, close = load_source(address)
    backend = LocalWorkers(address, drain_seconds=5.0)
    dataset = Dataset.range(args.elements).map(rate_limited(1.0 / args.capacity))
    dataset = dataset.apply(
        service.distribute("distributed_epoch", target, job_name="twenty-scale-downs")
    )
    received: list[int] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            received.extend(int(x) for x in dataset)
        except BaseException as error:  # reported below
            errors.append(error)

    reader = threading.Thread(target=read, daemon=True)
    drained = 0
    try:
        backend.scale_up(2)
        reader.start()
        deadline = time.monotonic() + 600
        while reader.is_alive() and drained < args.scale_downs and time.monotonic() < deadline:
            reply = load()
            live = [w for w in reply.workers if not w.draining and backend.owns(w.address)]
            candidates = [w.address for w in live if not w.pinned and w.tasks]
            if len(live) >= 2 and candidates:
                drained += backend.scale_down(1, candidates[:1])
                backend.scale_up(1)
            time.sleep(1.5)
        reader.join(600)
    finally:
        backend.close()
        close()
    counts = collections.Counter(received)
    lost = args.elements - len(counts)
    duplicated = sum(n - 1 for n in counts.values() if n > 1)
    print(
        f"{drained} scale-downs during an epoch of {args.elements} elements: {lost} lost, "
        f"{duplicated} duplicated, errors {errors or 'none'}"
    )


def predicted_gain(args: argparse.Namespace, target: str, address: str) -> None:
    """With 2 workers and a trainer that wants more, ``diagnose``'s predicted gain of one more
    worker against the gain measured once it runs."""
    load, close = load_source(address)
    backend = LocalWorkers(address, drain_seconds=2.0)
    dataset = Dataset.range(10**9).map(rate_limited(1.0 / args.capacity))
    dataset = dataset.apply(service.distribute("distributed_epoch", target))
    taken = [0]
    stop = threading.Event()

    def train() -> None:
        iterator = iter(dataset)
        try:
            while not stop.is_set():
                next(iterator)
                taken[0] += 1
                time.sleep(1.0 / (4 * args.capacity))  # wants 4 workers' worth
        finally:
            iterator.close()

    def rate(seconds: float) -> float:
        before, started = taken[0], time.monotonic()
        time.sleep(seconds)
        return (taken[0] - before) / (time.monotonic() - started)

    trainer = threading.Thread(target=train, daemon=True)
    try:
        backend.scale_up(2)
        trainer.start()
        time.sleep(10.0)  # two workers serve, their reports fill the window
        verdict = diagnose_load(load())[0]
        two = rate(10.0)
        backend.scale_up(1)
        time.sleep(8.0)  # the third registers and serves
        three = rate(10.0)
    finally:
        stop.set()
        trainer.join(30)
        backend.close()
        close()
    measured = three / two - 1
    print(
        f"one more worker: predicted +{100 * verdict.gain:.0f}% ({verdict.bottleneck}), "
        f"measured +{100 * measured:.0f}% ({two:.1f} -> {three:.1f} elements/s): "
        f"the prediction is off by {100 * abs(verdict.gain - measured) / max(measured, 1e-9):.0f}%"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--capacity", type=float, default=20.0, help="elements/s per worker")
    parser.add_argument("--demand", type=float, default=50.0, help="elements/s, first phase")
    parser.add_argument("--phase-seconds", type=float, default=40.0)
    parser.add_argument("--stabilization", type=float, default=300.0)
    parser.add_argument("--scale-down", type=float, default=5.0)
    parser.add_argument("--max-workers", type=int, default=8)
    parser.add_argument("--scale-downs", type=int, default=20)
    parser.add_argument("--elements", type=int, default=4000)
    parser.add_argument("--only", choices=("follow", "lost", "gain"), default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work_dir:
        dispatcher = service.DispatchServer(
            service.DispatcherConfig(work_dir=work_dir, fault_tolerant_mode=True)
        )
        address = dispatcher.target.split("://")[1]
        try:
            if args.only in (None, "follow"):
                follow_demand(args, dispatcher.target, address)
            if args.only in (None, "lost"):
                nothing_lost(args, dispatcher.target, address)
            if args.only in (None, "gain"):
                predicted_gain(args, dispatcher.target, address)
        finally:
            dispatcher.stop()


if __name__ == "__main__":
    main()
