"""Many concurrent consumers of one data service: does the time grow linearly with them?

Usage (from the repository root)::

    .venv/bin/python benchmarks/service_consumers.py [--consumers 100,300] [--elements 200]

A ``feedline dispatcher`` and ``--workers`` ``feedline worker`` processes (the one launcher,
``tests/launcher.py``) serve ``--processes`` consumer processes; each runs its share of the
consumers as threads, every consumer reading its own job of
``range(elements).apply(distribute("distributed_epoch", ...))`` once, all released together.
The table gives, for each number of consumers, the wall time from the release to the last
consumer's end, the time per consumer, and the dispatcher's CPU time; every consumer must have
read every element once. Results go to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.service.procs import ServiceProcesses  # noqa: E402

CONSUMERS = """
import os, threading, time
from feedline.data import Dataset
from feedline.service import distribute
from tests.launcher import report

target = os.environ["FEEDLINE_TARGET"]
count, elements = int(os.environ["COUNT"]), int(os.environ["ELEMENTS"])
start = float(os.environ["START"])
ok, ended, failures = [], [], []

def consume():
    dataset = Dataset.range(elements).apply(distribute("distributed_epoch", target))
    try:
        got = sorted(int(x) for x in dataset)
    except Exception as error:
        failures.append(repr(error)[:500])
        got = None
    ok.append(got == list(range(elements)))
    if got is not None and got != list(range(elements)):
        failures.append(f"read {len(got)} elements, {len(set(got))} distinct")
    ended.append(time.time())

threads = [threading.Thread(target=consume) for _ in range(count)]
time.sleep(max(0.0, start - time.time()))
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
report({"ok": sum(ok), "count": count, "last": max(ended), "failures": failures})
"""


def measure(consumers: int, processes: int, workers: int, elements: int) -> dict[str, float]:
    with ServiceProcesses(timeout=900) as cluster:
        dispatcher = cluster.start_dispatcher()
        for _ in range(workers):
            cluster.start_worker()
        start = time.time() + 10.0
        shares = [consumers // processes + (i < consumers % processes) for i in range(processes)]
        group = cluster.run(
            CONSUMERS,
            [
                (f"consumers{i}", {"COUNT": str(n), "ELEMENTS": str(elements), "START": str(start)})
                for i, n in enumerate(shares)
            ],
            timeout=900,
        )
        cpu_before = cluster.cpu_seconds(dispatcher)
        results = group.wait()
        cpu = cluster.cpu_seconds(dispatcher) - cpu_before
    for result in results.values():
        if not result.ok:
            raise SystemExit(result.describe())
    reports = [r.result for r in results.values()]
    read = sum(r["ok"] for r in reports)
    if read != consumers:
        failures = [f for r in reports for f in r["failures"]]
        raise SystemExit(
            f"only {read} of {consumers} consumers read every element once: {failures}"
        )
    wall = max(r["last"] for r in reports) - start
    return {
        "consumers": consumers,
        "seconds": wall,
        "per_consumer_ms": 1000 * wall / consumers,
        "dispatcher_cpu_s": cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--consumers", default="100,300", help="comma-separated counts")
    parser.add_argument("--processes", type=int, default=2, help="consumer processes")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--elements", type=int, default=200)
    args = parser.parse_args()
    rows = [
        measure(int(n), args.processes, args.workers, args.elements)
        for n in args.consumers.split(",")
    ]
    print("| consumers | wall time (s) | per consumer (ms) | dispatcher CPU (s) |")
    print("|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['consumers']} | {row['seconds']:.1f} | {row['per_consumer_ms']:.1f} "
            f"| {row['dispatcher_cpu_s']:.1f} |"
        )
    out = (
        ROOT / "benchmarks" / "results" / f"service_consumers-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
