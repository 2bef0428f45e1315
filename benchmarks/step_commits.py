"""What acknowledging on commit costs: a consumer that commits every step against one that
acknowledges on receipt, on the same fault-tolerant service, alternated in one run.

Usage (from the repository root)::

    PYTHONPATH=src .venv/bin/python benchmarks/step_commits.py [--trials 5] [--elements 20000]
        [--steps 32,256] [--step-ms 0] [--journal-sync full]

A ``feedline dispatcher --fault-tolerant`` (its journal on this machine's disk, each commit
fsynced, or with ``--journal-sync normal`` not) and two
``feedline worker`` processes; this process reads ``distributed_epoch`` jobs of ``--elements``
elements of 4 KiB (1024 float32) each, a step being ``--steps`` elements taken with ``next``
(and ``--step-ms`` of simulated training, a sleep). Per trial and step size, each first in
turn: *receipt* (``acknowledge="on_receipt"``: the plain exactly-once DYNAMIC job),
*commit* (``acknowledge="on_commit"``, ``commit()`` after every step: one ClientHeartbeat that
the dispatcher journals before it answers) and *pipelined* (``commit(wait=False)``: the
consumer's next heartbeat carries the acknowledgements, several steps at a time). Prints
elements/s of each, the CPU seconds of the consumer, dispatcher and workers together, the
ratios to *receipt*, and per step size the median and range of the ratios over the trials;
writes ``benchmarks/results/step_commits.json``. On a loaded machine the CPU ratio is the steadier
measure of what the protocol costs.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import write_results  # noqa: E402
from tests.service.procs import ServiceProcesses  # noqa: E402

from feedline.data import Dataset  # noqa: E402
from feedline.service import distribute  # noqa: E402

ELEMENT_FLOATS = 1024  # 4 KiB of float32


def four_kib(i: Any) -> np.ndarray:
    return np.full(ELEMENT_FLOATS, i, dtype=np.float32)


MODES = ("receipt", "commit", "pipelined")


def read_epoch(target: str, name: str, elements: int, step: int, step_s: float, mode: str) -> float:
    """Reads one epoch in steps of ``step`` elements; elements per second."""
    dataset = (
        Dataset.range(elements)
        .map(four_kib)
        .apply(
            distribute(
                "distributed_epoch",
                target,
                job_name=name,
                acknowledge="on_receipt" if mode == "receipt" else "on_commit",
            )
        )
    )
    iterator = iter(dataset)
    count = 0
    started = time.perf_counter()
    done = False
    while not done:
        for _ in range(step):
            try:
                next(iterator)
            except StopIteration:
                done = True
                break
            count += 1
        if step_s:
            time.sleep(step_s)
        if mode != "receipt":
            iterator.commit(wait=mode == "commit")  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - started
    iterator.close()
    if count != elements:
        raise RuntimeError(f"read {count} of {elements} elements")
    return count / elapsed


def cluster_cpu(cluster: ServiceProcesses, servers: list[str]) -> float:
    """The CPU seconds used so far by this process (the consumer) and the servers."""
    return time.process_time() + sum(cluster.cpu_seconds(name) for name in servers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--elements", type=int, default=20000)
    parser.add_argument("--steps", default="32,256")
    parser.add_argument("--step-ms", type=float, default=0.0)
    parser.add_argument("--journal-sync", choices=("full", "normal"), default="full")
    args = parser.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as work, ServiceProcesses(timeout=3600) as cluster:
        servers = [
            cluster.start_dispatcher(
                "--fault-tolerant", "--work-dir", work, "--journal-sync", args.journal_sync
            )
        ]
        servers += [cluster.start_worker() for _ in range(2)]
        read_epoch(cluster.target, "warm-up", 2000, 32, 0.0, "pipelined")
        for trial in range(args.trials):
            for step in steps:
                rates, cpu = {}, {}
                for mode in MODES[trial % 3 :] + MODES[: trial % 3]:  # each first in turn
                    before = cluster_cpu(cluster, servers)
                    rates[mode] = read_epoch(
                        cluster.target,
                        f"t{trial}-s{step}-{mode}",
                        args.elements,
                        step,
                        args.step_ms / 1000,
                        mode,
                    )
                    cpu[mode] = cluster_cpu(cluster, servers) - before
                row = {
                    "trial": trial,
                    "step": step,
                    **rates,
                    "cpu": cpu,
                    "commit_ratio": rates["commit"] / rates["receipt"],
                    "pipelined_ratio": rates["pipelined"] / rates["receipt"],
                    "commit_cpu_ratio": cpu["commit"] / cpu["receipt"],
                    "pipelined_cpu_ratio": cpu["pipelined"] / cpu["receipt"],
                    "load": os.getloadavg()[0],
                }
                rows.append(row)
                print(
                    f"trial {trial} step {step}: receipt {rates['receipt']:.0f}/s, commit "
                    f"{rates['commit']:.0f}/s ({row['commit_ratio']:.3f}), pipelined "
                    f"{rates['pipelined']:.0f}/s ({row['pipelined_ratio']:.3f}); CPU s "
                    f"{cpu['receipt']:.2f} / {cpu['commit']:.2f} / {cpu['pipelined']:.2f} "
                    f"(load {row['load']:.1f})",
                    flush=True,
                )
    print(
        "\n| elements per step | rate, commit() / receipt | rate, commit(wait=False) / "
        "receipt | CPU, commit() / receipt | CPU, commit(wait=False) / receipt |\n"
        "|---:|---|---|---|---|"
    )
    summary: dict[str, dict[str, float]] = {}
    for step in steps:
        cells = []
        for key in ("commit_ratio", "pipelined_ratio", "commit_cpu_ratio", "pipelined_cpu_ratio"):
            ratios = [row[key] for row in rows if row["step"] == step]
            summary.setdefault(str(step), {})[key] = statistics.median(ratios)
            cells.append(f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
        print(f"| {step} | {' | '.join(cells)} |")
    write_results("step_commits", {"args": vars(args), "rows": rows, "median_ratio": summary})


if __name__ == "__main__":
    main()
