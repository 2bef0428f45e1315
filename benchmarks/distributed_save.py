"""``distributed_save``: how fast the workers save a costly pipeline, and how much faster
reading the snapshot back is than computing the pipeline again, on the same workers.

Usage (from the repository root)::

    .venv/bin/python benchmarks/distributed_save.py [--elements 3000] [--workers 2]

A ``feedline dispatcher`` and ``--workers`` ``feedline worker`` processes on loopback. The
pipeline is ``Dataset.range(N).map(f)`` where ``f`` costs 2 ms of CPU per element (a busy loop)
and returns ``(x, 4 KiB of float32)``. Measured, each a full pass read by this process:

* ``recompute``: the pipeline through the service (``distributed_epoch``): every pass runs the
  2 ms map again on the workers;
* ``save``: ``distributed_save`` to a local directory, from the call to the snapshot's ``DONE``;
* ``read back (service)``: ``Dataset.load(path)`` through the same workers, each worker
  reading its share of the streams (``ShardingPolicy.HINT``: the reader shards the list of
  streams with ``SHARD_HINT``; the dispatcher lists its workers, as HINT needs);
* ``read back (local)``: ``Dataset.load(path)`` in this process, no service.

The ratio ``recompute / read back (service)`` is the speed-up of reading a finished snapshot
over recomputing the pipeline on the same workers. Results go to stdout and
``benchmarks/results/distributed_save.json``.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time
from typing import Any

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import write_results  # noqa: E402
from tests.launcher import free_port  # noqa: E402
from tests.service.procs import ServiceProcesses  # noqa: E402

from feedline import service  # noqa: E402
from feedline.data import Dataset  # noqa: E402
from feedline.data.experimental import SHARD_HINT  # noqa: E402
from feedline.data.ops._snapshot_format import is_finished  # noqa: E402

COST_S = 0.002
WIDTH = 1024


def costly(x: Any) -> Any:
    """2 ms of this thread's CPU, then ``(x, a 4 KiB row)``."""
    end = time.thread_time() + COST_S
    while time.thread_time() < end:
        pass
    return x, np.full(WIDTH, x, np.float32)


def pipeline(elements: int) -> Dataset:
    return Dataset.range(elements).map(costly)


def timed_pass(dataset: Dataset, elements: int) -> float:
    start = time.perf_counter()
    count = sum(1 for _ in dataset)
    seconds = time.perf_counter() - start
    if count != elements:
        raise RuntimeError(f"a pass read {count} elements, not {elements}")
    return seconds


def by_stream(datasets: Dataset) -> Dataset:
    """Each worker reads its share of the streams (``SHARD_HINT``), interleaved."""
    return datasets.shard(SHARD_HINT, SHARD_HINT).interleave(
        lambda d: d, cycle_length=4, num_parallel_calls=4
    )


def run(elements: int, workers: int, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="feedline-bench-save-") as scratch:
        path = f"{scratch}/snapshot"
        with ServiceProcesses(timeout=1800) as cluster:
            # HINT sharding needs the dispatcher's fixed list of workers.
            ports = [free_port() for _ in range(workers)]
            cluster.start_dispatcher(
                "--worker-addresses", ",".join(f"127.0.0.1:{port}" for port in ports)
            )
            for port in ports:
                cluster.start_worker("--worker-address", f"127.0.0.1:{port}", port=port)
            target = cluster.target
            recompute = [
                timed_pass(
                    pipeline(elements).apply(service.distribute("distributed_epoch", target)),
                    elements,
                )
                for _ in range(repeats)
            ]
            start = time.perf_counter()
            service.distributed_save(pipeline(elements), path, cluster.address)
            while not is_finished(path):
                time.sleep(0.01)
            save = time.perf_counter() - start
            loaded = Dataset.load(path, reader_func=by_stream)
            read_service = [
                timed_pass(
                    loaded.apply(service.distribute(service.ShardingPolicy.HINT, target)),
                    elements,
                )
                for _ in range(repeats)
            ]
        read_local = [timed_pass(Dataset.load(path), elements) for _ in range(repeats)]
    best = {
        "recompute_s": min(recompute),
        "save_s": save,
        "read_service_s": min(read_service),
        "read_local_s": min(read_local),
    }
    return {
        "elements": elements,
        "workers": workers,
        "map_cost_s": COST_S,
        "element_bytes": WIDTH * 4 + 8,
        "runs": {
            "recompute_s": recompute,
            "read_service_s": read_service,
            "read_local_s": read_local,
        },
        **best,
        "speedup_service": best["recompute_s"] / best["read_service_s"],
        "speedup_local": best["recompute_s"] / best["read_local_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    result = run(args.elements, args.workers, args.repeats)
    n = result["elements"]
    print(f"{n} elements, {result['workers']} workers, map {COST_S * 1000:.0f} ms/element CPU")
    print("| pass | seconds (best) | elements/s |\n|---|---:|---:|")
    for key, name in [
        ("recompute_s", "recompute (service)"),
        ("save_s", "distributed_save"),
        ("read_service_s", "read back (service, same workers)"),
        ("read_local_s", "read back (local Dataset.load)"),
    ]:
        print(f"| {name} | {result[key]:.3f} | {n / result[key]:,.0f} |")
    print(f"\nread back vs recompute, same workers: {result['speedup_service']:.1f}x")
    print(f"read back locally vs recompute: {result['speedup_local']:.1f}x")
    print(write_results("distributed_save", result))


if __name__ == "__main__":
    main()
