"""What the same global batches on any number of workers cost one worker: ``GlobalBatches``
against the plain DATA-sharded read, whose batches change with the number of workers.

Usage (from the repository root)::

    PYTHONPATH=src .venv/bin/python benchmarks/global_batches.py [--steps 150] [--trials 3]

One worker's reads (rank 0 of ``n``, ``n`` = 1 to 4), in this process: ``--steps`` steps of a
global batch of 48 elements, each element a 4 KiB array made from its id by a *decode* of
~50 µs of Python work (``BusyLoop``). Per ``n``, alternated in each trial:

- *shard*: ``ids.shard(n, 0).map(decode).batch(48 // n)``, the baseline: a worker decodes its
  own elements only, but which elements make a step depends on ``n``;
- *index*: ``GlobalBatches(ids, 48, shuffle_seed=..., epochs=..., map_func=decode)``: its own
  rows, read by index;
- *stream*: ``GlobalBatches(ids.shuffle(...).repeat(), 48, map_func=decode)``: every id of the
  global batch read, its own decoded;
- *stream, decode in the dataset*: ``GlobalBatches(ids.shuffle(...).repeat().map(decode), 48)``:
  every element decoded on every worker, the case the docs warn of;
- *saved*: ``GlobalBatches(Dataset.load(path), 48, shuffle_seed=..., epochs=...)`` of a
  snapshot of the decoded elements in 40 streams (what ``distributed_save`` on the service's
  workers leaves), read by place; its peer *saved, shard*: ``Dataset.load(path).shard(n,
  0).batch(48 // n)``, the DATA-sharded read of the same snapshot.

Prints ms per step (median of the trials) and the ratio to *shard*; writes
``benchmarks/results/global_batches-*.json``.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import BusyLoop, calibrate_busy, write_results  # noqa: E402

from feedline.data import Dataset  # noqa: E402
from feedline.distribute.global_batches import GlobalBatches  # noqa: E402

GLOBAL = 48
ELEMENTS = 48 * 400


def _decoder(iterations: int) -> Callable[[Any], np.ndarray]:
    busy = BusyLoop(iterations)

    def decode(element_id: Any) -> np.ndarray:
        busy(int(element_id))
        return np.full(1024, int(element_id), dtype=np.float32)

    return decode


def _time(read: Callable[[int], Any], steps: int) -> float:
    read(0)  # the first step builds iterators and permutations
    start = time.perf_counter()
    for step in range(1, steps + 1):
        read(step)
    return (time.perf_counter() - start) / steps * 1000


def _setups(
    world: int, decode: Callable[[Any], np.ndarray], saved: str
) -> dict[str, Callable[[int], Any]]:
    ids = Dataset.range(ELEMENTS)
    shard = iter(ids.shard(world, 0).map(decode).batch(GLOBAL // world))
    index = GlobalBatches(ids, GLOBAL, shuffle_seed=1, epochs=10, map_func=decode)
    stream = GlobalBatches(ids.shuffle(4096, seed=1).repeat(), GLOBAL, map_func=decode)
    decoded = GlobalBatches(ids.shuffle(4096, seed=1).repeat().map(decode), GLOBAL)
    by_place = GlobalBatches(Dataset.load(saved), GLOBAL, shuffle_seed=1, epochs=10)
    loaded = iter(Dataset.load(saved).shard(world, 0).batch(GLOBAL // world))
    return {
        "shard": lambda step: next(shard),
        "index": lambda step: index.local_batch(step, 0, world),
        "stream": lambda step: stream.local_batch(step, 0, world),
        "stream, decode in the dataset": lambda step: decoded.local_batch(step, 0, world),
        "saved": lambda step: by_place.local_batch(step, 0, world),
        "saved, shard": lambda step: next(loaded),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    decode = _decoder(calibrate_busy(50e-6))
    saved = tempfile.mkdtemp(prefix="global-batches-saved-")
    Dataset.range(ELEMENTS).map(_decoder(0)).save(saved, shard_func=lambda e: np.int64(e[0]) // 480)
    results: dict[str, dict[str, list[float]]] = {}
    for trial in range(args.trials):
        for world in (1, 2, 3, 4):
            setups = _setups(world, decode, saved)
            names = list(setups)
            order = names[trial % len(names) :] + names[: trial % len(names)]
            for name in order:
                ms = _time(setups[name], args.steps)
                results.setdefault(str(world), {}).setdefault(name, []).append(ms)
    print(f"{'workers':>7}  {'setup':<30} {'ms/step':>8} {'vs shard':>9}")
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for world, by_name in results.items():
        base = statistics.median(by_name["shard"])
        for name, times in by_name.items():
            ms = statistics.median(times)
            summary.setdefault(world, {})[name] = {"ms_per_step": ms, "ratio": ms / base}
            print(f"{world:>7}  {name:<30} {ms:8.2f} {ms / base:8.2f}x")
    shutil.rmtree(saved)
    write_results(
        "global_batches",
        {"steps": args.steps, "trials": args.trials, "raw_ms": results, "summary": summary},
    )


if __name__ == "__main__":
    main()
