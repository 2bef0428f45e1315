"""What acknowledging on commit costs: a consumer that commits every step against one that
acknowledges on receipt on the same fault-tolerant service, and against a plain (not
fault-tolerant) service, alternated in one run.

Usage (from the repository root)::

    PYTHONPATH=src .venv/bin/python benchmarks/step_commits.py [--trials 5] [--elements 20000]
        [--steps 32,256] [--step-ms 0] [--journal-sync full]

Two services on this machine, each a dispatcher and two ``feedline worker`` processes: one
``feedline dispatcher --fault-tolerant`` (its journal on this machine's disk, each commit
fsynced, or with ``--journal-sync normal`` not), and one plain dispatcher. This process reads
``distributed_epoch`` jobs of ``--elements`` elements of 4 KiB (1024 float32) each, a step being
``--steps`` elements taken with ``next`` (and ``--step-ms`` of simulated training, a sleep). Per
trial and step size, each first in turn: *plain* (the plain service's DYNAMIC job: the peer),
*receipt* (``acknowledge="on_receipt"``: the exactly-once DYNAMIC job), *commit*
(``acknowledge="on_commit"``, ``commit()`` after every step: one ClientHeartbeat that the
dispatcher journals before it answers) and *pipelined* (``commit(wait=False)``: the consumer's
next heartbeat carries the acknowledgements, several steps at a time). Prints elements/s of
each, the CPU seconds of the consumer and of its service's dispatcher and workers together, the
ratios to *receipt* and to *plain*, and per step size the median and range of the ratios over
the trials, the median time from each mode's last element to the end of its input and the
median CPU microseconds an element of the consumer, the dispatcher and the workers; writes
``benchmarks/results/step_commits.json``. On a loaded machine the CPU ratio is the steadier
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


MODES = ("plain", "receipt", "commit", "pipelined")
# The ratios reported: (mode, its peer).
RATIOS = (
    ("commit", "receipt"),
    ("pipelined", "receipt"),
    ("receipt", "plain"),
    ("pipelined", "plain"),
)


def read_epoch(
    target: str, name: str, elements: int, step: int, step_s: float, mode: str
) -> tuple[float, float]:
    """Reads one epoch in steps of ``step`` elements; elements per second, and the seconds
    from the last element to the end of the input."""
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
    started = last = ended = time.perf_counter()
    done = False
    while not done:
        for _ in range(step):
            try:
                next(iterator)
            except StopIteration:
                ended = time.perf_counter()
                done = True
                break
            last = time.perf_counter()
            count += 1
        if step_s:
            time.sleep(step_s)
        if mode != "receipt":
            iterator.commit(wait=mode == "commit")  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - started
    iterator.close()
    if count != elements:
        raise RuntimeError(f"read {count} of {elements} elements")
    return count / elapsed, ended - last


ROLES = ("consumer", "dispatcher", "workers")


def role_cpu(cluster: ServiceProcesses, servers: list[str]) -> dict[str, float]:
    """The CPU seconds used so far by this process (the consumer), the dispatcher
    (``servers[0]``) and the workers (the others)."""
    return {
        "consumer": time.process_time(),
        "dispatcher": cluster.cpu_seconds(servers[0]),
        "workers": sum(cluster.cpu_seconds(name) for name in servers[1:]),
    }


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
    with (
        tempfile.TemporaryDirectory() as work,
        ServiceProcesses(timeout=3600) as cluster,
        ServiceProcesses(timeout=3600) as plain,
    ):
        servers = [
            cluster.start_dispatcher(
                "--fault-tolerant", "--work-dir", work, "--journal-sync", args.journal_sync
            )
        ]
        servers += [cluster.start_worker() for _ in range(2)]
        plain_servers = [plain.start_dispatcher()] + [plain.start_worker() for _ in range(2)]
        read_epoch(cluster.target, "warm-up", 2000, 32, 0.0, "pipelined")
        read_epoch(plain.target, "warm-up", 2000, 32, 0.0, "receipt")
        for trial in range(args.trials):
            for step in steps:
                rates, tails, cpu, per_role = {}, {}, {}, {}
                # Each mode first in turn.
                for mode in MODES[trial % len(MODES) :] + MODES[: trial % len(MODES)]:
                    on, on_servers = (
                        (plain, plain_servers) if mode == "plain" else (cluster, servers)
                    )
                    before = role_cpu(on, on_servers)
                    rates[mode], tails[mode] = read_epoch(
                        on.target,
                        f"t{trial}-s{step}-{mode}",
                        args.elements,
                        step,
                        args.step_ms / 1000,
                        "receipt" if mode == "plain" else mode,
                    )
                    after = role_cpu(on, on_servers)
                    cpu[mode] = sum(after.values()) - sum(before.values())
                    per_role[mode] = {  # microseconds of CPU an element
                        role: (after[role] - before[role]) / args.elements * 1e6 for role in ROLES
                    }
                row: dict[str, Any] = {
                    "trial": trial,
                    "step": step,
                    **rates,
                    "cpu": cpu,
                    "cpu_us_per_element": per_role,
                    "end_ms": {mode: tail * 1000 for mode, tail in tails.items()},
                }
                for mode, peer in RATIOS:
                    row[f"{mode}/{peer}"] = rates[mode] / rates[peer]
                    row[f"{mode}/{peer} cpu"] = cpu[mode] / cpu[peer]
                row["load"] = os.getloadavg()[0]
                rows.append(row)
                print(
                    f"trial {trial} step {step}: "
                    + ", ".join(
                        f"{mode} {rates[mode]:.0f}/s ({cpu[mode]:.2f} CPU s, end "
                        f"{tails[mode] * 1000:.0f} ms after the last element)"
                        for mode in MODES
                    )
                    + f" (load {row['load']:.1f})",
                    flush=True,
                )
    print(
        "\n| elements per step | "
        + " | ".join(f"{mode} / {peer}: rate (CPU)" for mode, peer in RATIOS)
        + " |\n|---:|"
        + "---|" * len(RATIOS)
    )
    summary: dict[str, dict[str, float]] = {}
    for step in steps:
        cells = []
        for mode, peer in RATIOS:
            of_step = [row for row in rows if row["step"] == step]
            rate = [row[f"{mode}/{peer}"] for row in of_step]
            used = [row[f"{mode}/{peer} cpu"] for row in of_step]
            summary.setdefault(str(step), {})[f"{mode}/{peer}"] = statistics.median(rate)
            summary[str(step)][f"{mode}/{peer} cpu"] = statistics.median(used)
            cells.append(
                f"{statistics.median(rate):.3f} ({min(rate):.3f}-{max(rate):.3f}), "
                f"CPU {statistics.median(used):.3f}"
            )
        print(f"| {step} | {' | '.join(cells)} |")
    print("\n| elements per step | " + " | ".join(MODES) + " |\n|---:|" + "---:|" * len(MODES))
    for step in steps:
        ends = [
            statistics.median(row["end_ms"][mode] for row in rows if row["step"] == step)
            for mode in MODES
        ]
        print(f"| {step} | " + " | ".join(f"{end:.0f} ms" for end in ends) + " |")
    print(
        "\nCPU microseconds an element (medians): consumer + dispatcher + workers = all\n\n"
        "| elements per step | " + " | ".join(MODES) + " |\n|---:|" + "---|" * len(MODES)
    )
    for step in steps:
        cells = []
        for mode in MODES:
            by_role = {
                role: statistics.median(
                    row["cpu_us_per_element"][mode][role] for row in rows if row["step"] == step
                )
                for role in ROLES
            }
            cells.append(
                " + ".join(f"{by_role[role]:.2f}" for role in ROLES)
                + f" = {sum(by_role.values()):.1f}"
            )
        print(f"| {step} | " + " | ".join(cells) + " |")
    write_results("step_commits", {"args": vars(args), "rows": rows, "median_ratio": summary})


if __name__ == "__main__":
    main()
