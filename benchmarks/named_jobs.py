"""What a job name costs a consumer: a shared or round-robin job against a job of its own.

Usage (from the repository root)::

    .venv/bin/python benchmarks/named_jobs.py [--rounds 4] [--elements 40000]

A ``feedline dispatcher`` and two ``feedline worker`` processes on loopback; this process reads
``distributed_epoch`` jobs of ``range(--elements).map(a float32[1024] of i)`` (4 KiB elements)
to their end, in rounds, each round starting one kind later:

* *anonymous*: a job of its own (no ``job_name``): the peer;
* *named*: the same job with a ``job_name`` (a shared job, first come, first served, read by
  this consumer alone): it holds few elements ahead, so that consumers that join later still
  find the rest of the job at the workers;
* *named, 2 consumers*: two consumers (threads of this process) share a named job; elements/s of
  the two together;
* *round robin, 2 consumers*: two consumers with ``consumer_index`` 0 and 1 of
  ``num_consumers=2`` (the dataset repeated, as round robin needs), each reading half
  the elements in step.

Prints elements/s per kind (median of rounds) and the ratio of each to *anonymous*, and the
consumer's CPU per element; writes ``benchmarks/results/named_jobs-*.json``.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import write_results  # noqa: E402
from tests.service.procs import ServiceProcesses  # noqa: E402

from feedline.data import Dataset  # noqa: E402
from feedline.service import distribute  # noqa: E402

KINDS = ("anonymous", "named", "named, 2 consumers", "round robin, 2 consumers")


def four_kib(i: Any) -> np.ndarray:
    return np.full(1024, i, dtype=np.float32)


def in_threads(consume: Callable[[int], None], count: int) -> None:
    """``consume(i)`` for ``i`` in ``range(count)``, each in a thread of its own, to the end."""
    threads = [threading.Thread(target=consume, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
        if thread.is_alive():
            raise RuntimeError("a consumer did not end within 600 s")


def read_job(target: str, elements: int, name: str | None, consumers: int) -> int:
    """Reads one epoch with ``consumers`` threads; the elements they read together. (Each
    consumer iterates a dataset of its own: the k-th ``iter()`` of one dataset joins its job's
    k-th iteration.)"""
    counts = [0] * consumers

    def consume(index: int) -> None:
        dataset = (
            Dataset.range(elements)
            .map(four_kib)
            .apply(distribute("distributed_epoch", target, job_name=name))
        )
        for _ in dataset:
            counts[index] += 1

    in_threads(consume, consumers)
    return sum(counts)


def read_rounds(target: str, elements: int, name: str) -> int:
    """Two round-robin consumers (threads) read ``elements`` in all; the elements read."""
    counts = [0, 0]

    def consume(index: int) -> None:
        dataset = (
            Dataset.range(10**6)
            .map(four_kib)
            .repeat()
            .apply(
                distribute(
                    "parallel_epochs", target, job_name=name, consumer_index=index, num_consumers=2
                )
            )
        )
        iterator = iter(dataset)
        for _ in range(elements // 2):
            next(iterator)
            counts[index] += 1
        iterator.close()

    in_threads(consume, 2)
    return sum(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--elements", type=int, default=40_000)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    cpu: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with ServiceProcesses(timeout=3600) as cluster:
        cluster.start_dispatcher()
        for _ in range(2):
            cluster.start_worker()
        read_job(cluster.target, 2000, None, 1)  # warm-up
        for round_ in range(args.rounds):
            for kind in KINDS[round_ % 4 :] + KINDS[: round_ % 4]:
                name = None if kind == "anonymous" else f"r{round_}-{kind}"
                consumers = 2 if kind.endswith("2 consumers") else 1
                started, process = time.perf_counter(), time.process_time()
                if kind.startswith("round robin"):
                    count = read_rounds(cluster.target, args.elements, f"r{round_}-rr")
                else:
                    count = read_job(cluster.target, args.elements, name, consumers)
                elapsed = time.perf_counter() - started
                if count != args.elements:
                    raise RuntimeError(f"{kind}: read {count} of {args.elements} elements")
                rates[kind].append(count / elapsed)
                cpu[kind].append((time.process_time() - process) / count * 1e6)
                print(f"round {round_ + 1}: {kind} {count / elapsed:,.0f} elements/s", flush=True)
    base = statistics.median(rates["anonymous"])
    print(
        f"\n| job | elements/s, median of {args.rounds} | / anonymous | consumer CPU µs / element |"
    )
    print("|---|---:|---:|---:|")
    summary = {}
    for kind in KINDS:
        rate = statistics.median(rates[kind])
        summary[kind] = {
            "rate": rate,
            "vs_anonymous": rate / base,
            "cpu_us": statistics.median(cpu[kind]),
        }
        print(f"| {kind} | {rate:,.0f} | {rate / base:.2f}x | {summary[kind]['cpu_us']:.1f} |")
    write_results(
        "named_jobs", {"args": vars(args), "rates": rates, "cpu_us": cpu, "median": summary}
    )


if __name__ == "__main__":
    main()
