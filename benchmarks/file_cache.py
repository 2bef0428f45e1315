"""Later passes over ``cache(filename)``: feedline's complete cache read by index, the same files
read in order, and tf.data's file cache, on the same rows.

Usage (from the repository root)::

    PYTHONPATH=src .venv/bin/python benchmarks/file_cache.py [--rows 200000] [--repetitions 3]

The rows: ``--rows`` elements of ``(float32[--width], int64)`` (``_common.SEED``; 16 values by
default), from ``from_tensor_slices`` through ``cache(filename)``, the first pass (which writes
the files) not timed. Then each workload is timed over whole passes of a fresh pipeline over
the complete cache, best of ``--repetitions``:

  C1  cache.shuffle(rows, seed=1).batch(256)   a shuffle of the whole cache
  C2  cache.batch(256)                         in order
  C3  cache.shard(4, 1).batch(256)             one worker's quarter

Ways: *by index* (feedline's complete local cache: memory-mapped, rows gathered), *in order*
(the same files with the index's chunk table removed, as an earlier version wrote them: read
chunk after chunk, ``shuffle`` through its buffer) and *tf.data* (``tf.data.Dataset.cache``
with a filename, the same workloads, under ``.venv-tf/bin/python``; skipped where missing).
Ratios are the other way's seconds over feedline by index's.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import _common

WORKLOADS = ("C1", "C2", "C3")
BATCH = 256


def make_rows(n: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(_common.SEED)
    return rng.random((n, width), dtype=np.float32), np.arange(n, dtype=np.int64)


def workload(name: str, cached: Any, n: int) -> Any:
    if name == "C1":
        return cached.shuffle(n, seed=1).batch(BATCH)
    if name == "C2":
        return cached.batch(BATCH)
    return cached.shard(4, 1).batch(BATCH)


def time_passes(make: Callable[[], Any], repetitions: int) -> tuple[float, int]:
    """The best seconds of a whole pass over a fresh ``make()``, and its rows."""
    best, rows = float("inf"), 0
    for _ in range(repetitions):
        start = time.perf_counter()
        rows = 0
        for _x, y in make():
            rows += len(y)
        best = min(best, time.perf_counter() - start)
    return best, rows


def run_feedline(
    directory: str, n: int, width: int, repetitions: int
) -> dict[str, dict[str, float]]:
    from feedline.data import Dataset

    x, y = make_rows(n, width)
    source = Dataset.from_tensor_slices((x, y))
    by_index = os.path.join(directory, "feedline")
    for _ in source.cache(by_index).batch(4096):  # the first pass writes the files
        pass
    in_order = os.path.join(directory, "feedline-in-order")
    shutil.copyfile(by_index + ".data", in_order + ".data")
    with open(by_index + ".index") as f:
        meta = json.load(f)
    del meta["chunks"]
    with open(in_order + ".index", "w") as f:
        json.dump(meta, f)
    assert source.cache(by_index)._random_access() is not None
    assert source.cache(in_order)._random_access() is None
    results: dict[str, dict[str, float]] = {}
    for name in WORKLOADS:
        for way, prefix in (("by index", by_index), ("in order", in_order)):
            seconds, rows = time_passes(
                lambda name=name, prefix=prefix: workload(name, source.cache(prefix), n),
                repetitions,
            )
            results.setdefault(name, {})[way] = seconds
            results[name]["rows"] = rows
    return results


def run_tf(directory: str, n: int, width: int, repetitions: int) -> dict[str, dict[str, float]]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    x, y = make_rows(n, width)
    source = tf.data.Dataset.from_tensor_slices((x, y))
    path = os.path.join(directory, "tf-cache")
    for _ in source.cache(path).batch(4096):
        pass
    results: dict[str, dict[str, float]] = {}
    for name in WORKLOADS:

        def make(name: str = name) -> Any:
            return workload(name, source.cache(path), n)

        seconds, rows = time_passes(make, repetitions)
        results[name] = {"tf.data": seconds, "rows": rows}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--width", type=int, default=16, help="float32 values per row")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--no-tf", action="store_true")
    parser.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.peer:
        print(json.dumps(run_tf(args.dir, args.rows, args.width, args.repetitions)))
        return
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(
        f"load average at start: {load}; {os.cpu_count()} CPUs; {args.rows:,} rows of "
        f"{args.width} float32"
    )
    with tempfile.TemporaryDirectory(prefix="feedline-file-cache-") as directory:
        results = run_feedline(directory, args.rows, args.width, args.repetitions)
        peer: dict[str, Any] | str = "skipped (--no-tf)"
        if not args.no_tf:
            peer = _common.run_tf_script(
                pathlib.Path(__file__).resolve(),
                ["--peer", "--dir", directory, "--rows", str(args.rows),
                 "--width", str(args.width), "--repetitions", str(args.repetitions)],
                "the tf.data file cache",
            )  # fmt: skip
    print("\n| workload | by index (s) | in order (s) | tf.data (s) | in order / by index "
          "| tf.data / by index |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for name in WORKLOADS:
        row = results[name]
        tf_s = peer[name]["tf.data"] if isinstance(peer, dict) else float("nan")
        print(
            f"| {name} | {row['by index']:.3f} | {row['in order']:.3f} | {tf_s:.3f} "
            f"| {row['in order'] / row['by index']:.2f}x | {tf_s / row['by index']:.2f}x |"
        )
    if isinstance(peer, str):
        print(f"\ntf.data: {peer}")
    _common.write_results(
        "file_cache",
        {"rows": args.rows, "width": args.width, "load": load, "feedline": results, "tf": peer},
    )


if __name__ == "__main__":
    sys.exit(main())
