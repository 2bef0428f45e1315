"""Three trainers reading one epoch: one cross-trainer job (``CrossTrainerCache``) against three
separate jobs, with real processes.

Usage (from the repository root)::

    .venv/bin/python benchmarks/cross_trainer_cache.py [--elements 2000] [--step-ms 2]

A ``feedline dispatcher``, one ``feedline worker`` and trainer processes on this machine. The
dataset is ``Dataset.range(elements).map(f)`` under ``distributed_epoch``, where ``f`` costs the
worker CPU (NumPy work, 16 KiB elements); each trainer "trains" ``--step-ms`` per element (a
sleep) and reports its rate over the epoch. The trainers of a run start together (a wall-clock
barrier). Runs, in order:

=============  ==================================================================================
solo           one trainer, alone in a cross-trainer job: its solo rate
separate       three trainers, each its own job (three job names): the worker computes the epoch
               three times
separate,      three trainers, each alone in its own cross-trainer job: computed three times,
cached         read as the shared trainers read (a batch per request)
shared         three trainers, one job and a ``CrossTrainerCache`` each: computed once
shared, slow   as shared, one trainer at half speed (twice the step): what it costs the others
=============  ==================================================================================

Printed, per trial: the worker's CPU seconds per run (``/proc``) and each trainer's rate; then
the medians over the trials of the goals' ratios: worker CPU of shared / separate (goal <= 1/3 +
10%; also against "separate, cached", which reads the same way and so isolates what computing
once saves), the slowest shared trainer's rate / the solo rate (goal >= 0.95), and the fast
trainers' rates beside a slow one / their shared rates (goal >= 0.95). Every trainer checks
that it read every element exactly once.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.service.procs import ServiceProcesses  # noqa: E402

TRAINER = """
import os, time
import numpy as np
from feedline.data import Dataset
from feedline.service import CrossTrainerCache, distribute
from tests.launcher import report

elements = int(os.environ["ELEMENTS"])
rounds = int(os.environ["ROUNDS"])  # the function runs on the worker: it takes the value along

def work(x):
    values = np.sin(np.arange(4096, dtype=np.float32) + np.float32(x))
    for _ in range(rounds):
        values = np.sin(values)
    values[0] = x
    return values

cache = CrossTrainerCache(os.environ["TRAINER"]) if os.environ.get("SHARED") else None
dataset = Dataset.range(elements).map(work).apply(
    distribute("distributed_epoch", os.environ["FEEDLINE_TARGET"], job_name=os.environ["JOB"],
               cross_trainer_cache=cache)
)
step = float(os.environ["STEP_S"])
time.sleep(max(0.0, float(os.environ["START"]) - time.time()))
seen = []
first = None
for x in dataset:
    if first is None:
        first = time.monotonic()
    seen.append(int(x[0]))
    time.sleep(step)
wall = time.monotonic() - first
report({"rate": (len(seen) - 1) / wall, "exact": sorted(seen) == list(range(elements))})
"""


def run(
    cluster: ServiceProcesses,
    worker: str,
    trainers: dict[str, dict[str, str]],
    common: dict[str, str],
) -> tuple[float, dict[str, Any]]:
    """Runs the ``trainers`` (name: environment) together; the worker's CPU seconds meanwhile
    and each trainer's report.

    Raises:
      RuntimeError: a trainer failed, or did not read every element exactly once.
    """
    before = cluster.cpu_seconds(worker)
    start = {"START": str(time.time() + 3)}
    group = cluster.run(
        TRAINER, [(name, {**common, **start, **env}) for name, env in trainers.items()]
    )
    results = group.wait()
    cpu = cluster.cpu_seconds(worker) - before
    reports = {}
    for name, result in results.items():
        if not result.ok or not result.result["exact"]:
            raise RuntimeError(f"trainer {name}: {result.describe()}")
        reports[name] = result.result
    return cpu, reports


def measure(elements: int, step_s: float, rounds: int, flip: bool = False) -> dict[str, Any]:
    """The runs (module docstring): worker CPU seconds and trainer rates; ``flip`` runs
    "shared, slow" before "shared" (trials alternate, so that a load that grows or falls
    during a trial favours neither)."""
    common = {"ELEMENTS": str(elements), "STEP_S": str(step_s), "ROUNDS": str(rounds)}
    step = str(step_s)
    with ServiceProcesses(timeout=600) as cluster:
        cluster.start_dispatcher()
        worker = cluster.start_worker()
        out: dict[str, Any] = {}
        solo = {"t0": {"JOB": "solo", "SHARED": "1", "TRAINER": "t0", "STEP_S": step}}
        out["solo"] = run(cluster, worker, solo, common)
        separate = {f"t{i}": {"JOB": f"own{i}", "STEP_S": step} for i in range(3)}
        out["separate"] = run(cluster, worker, separate, common)
        alone = {
            f"t{i}": {"JOB": f"alone{i}", "SHARED": "1", "TRAINER": f"t{i}", "STEP_S": step}
            for i in range(3)
        }
        out["separate, cached"] = run(cluster, worker, alone, common)
        shared = {
            f"t{i}": {"JOB": "shared", "SHARED": "1", "TRAINER": f"t{i}", "STEP_S": step}
            for i in range(3)
        }
        slow = {name: dict(env, JOB="shared-slow") for name, env in shared.items()}
        slow["t2"]["STEP_S"] = str(2 * step_s)
        for name in ("shared, slow", "shared") if flip else ("shared", "shared, slow"):
            out[name] = run(cluster, worker, slow if name == "shared, slow" else shared, common)
    return out


def figures_of(out: dict[str, Any]) -> dict[str, float]:
    """The goals' ratios of one trial's runs."""
    solo_rate = out["solo"][1]["t0"]["rate"]
    shared_rates = {t: r["rate"] for t, r in out["shared"][1].items()}
    slow_rates = {t: r["rate"] for t, r in out["shared, slow"][1].items()}
    return {
        "cpu_shared_over_separate": out["shared"][0] / out["separate"][0],
        "cpu_shared_over_separate_cached": out["shared"][0] / out["separate, cached"][0],
        "shared_rate_over_solo_min": min(shared_rates.values()) / solo_rate,
        "fast_beside_slow_over_shared": statistics.mean(
            slow_rates[t] / shared_rates[t] for t in ("t0", "t1")
        ),
        "slow_trainer_over_shared": slow_rates["t2"] / shared_rates["t2"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=2000)
    parser.add_argument("--step-ms", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=30, help="np.sin passes per element")
    parser.add_argument("--trials", type=int, default=3, help="figures are their medians")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()
    trials = []
    for trial in range(args.trials):
        out = measure(args.elements, args.step_ms / 1000, args.rounds, flip=trial % 2 == 1)
        print(
            f"\ntrial {trial}\n| run | worker CPU s | trainer rates (elements/s) |\n|---|---:|---|"
        )
        for name, (cpu, reports) in out.items():
            rates = ", ".join(f"{t} {r['rate']:.0f}" for t, r in sorted(reports.items()))
            print(f"| {name} | {cpu:.2f} | {rates} |")
        trials.append(figures_of(out))
    figures = {key: statistics.median(t[key] for t in trials) for key in trials[0]}
    print(
        f"\nmedians of {args.trials} trials:\n"
        f"worker CPU, shared / separate: {figures['cpu_shared_over_separate']:.3f} "
        "(goal <= 0.433)\n"
        f"worker CPU, shared / separate cross-trainer jobs: "
        f"{figures['cpu_shared_over_separate_cached']:.3f} (goal <= 0.433)\n"
        f"slowest shared trainer / solo rate: {figures['shared_rate_over_solo_min']:.3f} "
        "(goal >= 0.95)\n"
        f"fast trainers beside a half-speed one / shared: "
        f"{figures['fast_beside_slow_over_shared']:.3f} (goal >= 0.95)\n"
        f"the half-speed trainer / shared: {figures['slow_trainer_over_shared']:.3f} (~0.5)"
    )
    if args.json:
        print(json.dumps({"trials": trials, "medians": figures}))


if __name__ == "__main__":
    main()
