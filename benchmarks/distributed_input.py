"""feedline.distribute's distributed input against tf.distribute's, on two logical CPU replicas.

Usage (from the repository root)::

    .venv/bin/python benchmarks/distributed_input.py [--quick] [--no-tf] [--no-profile]

The pipeline is ``from_tensor_slices((x, y)).shuffle(60000).batch(128)`` (x: 60000x28x28x1 uint8,
y: 60000 uint8, ``_common.make_images``) distributed with ``MirroredStrategy`` over two replicas
on the CPU by ``experimental_distribute_dataset``; each step's per-replica tensors are touched
(``experimental_local_results`` and ``.shape``). Measured in one run, one after another:

  feedline  ``MirroredStrategy(["cpu:0", "cpu:1"])``, steps of ``PerReplica`` torch tensors,
            interleaved round by round with the same pipeline not distributed (NumPy batches),
            whose difference is the per-step overhead of the distributed iterator;
  TF        ``tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])`` over two virtual CPU
            devices (``_tf_distributed_peer.py`` under ``.venv-tf/bin/python``), and plain
            tf.data, iterated eagerly the same way.

Every rate is elements per second, the best of ``--repetitions`` runs of at least
``--min-seconds`` in whole epochs (making the iterator included) after a warm-up, timed by
``_common.measure``. Then the feedline side is taken apart (``--no-profile`` skips it): its
stages are timed one by one, with the process's context switches per step (thread hand-offs), and
cProfile is run on the consumer (main) thread and on the step source's prefetch thread. cProfile's
times are wall-clock: a call that waits on a lock, or releases the GIL and must take it back
(``np.take``), is charged the time the other thread runs meanwhile. Results are also written as
JSON to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import os
import pathlib
import pstats
import resource
import statistics
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

import _common
import feedline.distribute as fdist
from feedline.data import AUTOTUNE, Dataset

TF_PEER = pathlib.Path(__file__).resolve().parent / "_tf_distributed_peer.py"

GLOBAL_BATCH = 128
REPLICAS = ("cpu:0", "cpu:1")
STEPS_PER_EPOCH = -(-_common.NUM_IMAGES // GLOBAL_BATCH)
ELEMENTS_PER_STEP = _common.NUM_IMAGES / STEPS_PER_EPOCH
TARGET_RATIO = 3.0  # feedline / tf.distribute, elements/s
TARGET_OVERHEAD_US = 100.0  # distributed iterator beyond the plain pipeline, per step


def us_per_step(rate: float) -> float:
    """Microseconds per step of ``GLOBAL_BATCH`` elements (the epoch's mean step) at ``rate``."""
    return 1e6 * ELEMENTS_PER_STEP / rate


def overhead_us(distributed: float | None, plain: float | None) -> float | None:
    """Microseconds per step that distribution adds to the plain pipeline, from two rates."""
    if not distributed or not plain:
        return None
    return us_per_step(distributed) - us_per_step(plain)


# -- the pipelines ----------------------------------------------------------------------------


def plain_dataset(x: np.ndarray, y: np.ndarray) -> Dataset:
    return Dataset.from_tensor_slices((x, y)).shuffle(_common.NUM_IMAGES).batch(GLOBAL_BATCH)


def touch_step(strategy: fdist.Strategy) -> Callable[[Any], int]:
    """Reads the shape of every replica's tensors of a step; returns the step's rows."""
    local = strategy.experimental_local_results

    def touch(step: Any) -> int:
        images, labels = step
        for tensor in local(images):
            _ = tensor.shape
        return sum(t.shape[0] for t in local(labels))

    return touch


def touch_batch(batch: Any) -> int:
    _ = batch[0].shape
    return batch[1].shape[0]


def touch_host_step(step: Any) -> int:
    """A step of the step source: one NumPy ``(x, y)`` per replica."""
    return sum(part[1].shape[0] for part in step)


Case = tuple[Callable[[], Any], Callable[[Any], int]]


def interleaved(
    cases: dict[str, Case], min_seconds: float, repetitions: int
) -> dict[str, _common.Measurement]:
    """``_common.measure`` of each case, one run of each per round, so that the cases of a round
    see the same machine load; the best of ``repetitions`` rounds each. Rounds after the first
    warm up with one epoch."""
    runs: dict[str, list[_common.Measurement]] = {name: [] for name in cases}
    for round_index in range(repetitions):
        for name, (make, rows_of) in cases.items():
            runs[name].append(
                _common.measure(
                    make,
                    rows_of,
                    min_seconds=min_seconds,
                    repetitions=1,
                    whole_epochs=True,
                    warmup_seconds=None if round_index == 0 else 0.0,
                )
            )
    out = {}
    for name, measurements in runs.items():
        rates = [m.rate for m in measurements]
        out[name] = _common.Measurement(
            max(rates),
            rates,
            sum(m.rows for m in measurements),
            sum(m.seconds for m in measurements),
        )
    return out


def run_tf_peer(args: list[str]) -> dict[str, Any] | str:
    """The JSON that ``_tf_distributed_peer.py`` prints, or why it could not run."""
    return _common.run_tf_script(TF_PEER, args, "the TensorFlow peer")


# -- taking the feedline side apart -----------------------------------------------------------


def stage_cases(x: np.ndarray, y: np.ndarray, strategy: fdist.Strategy) -> dict[str, Case]:
    """The distributed pipeline built up stage by stage, from feedline's own pieces (private:
    the step source is ``SplitBatchesDataset`` plus ``prefetch(replicas)``, see
    ``feedline/distribute/distributed_dataset.py``)."""
    from feedline.distribute._steps import SplitBatchesDataset
    from feedline.distribute.distributed_dataset import DistributedDataset

    plain = plain_dataset(x, y)
    n = len(REPLICAS)
    split = SplitBatchesDataset(plain, n, n, range(n))
    distributed = strategy.experimental_distribute_dataset(plain)
    source = distributed._source
    unprefetched = DistributedDataset(
        dataclasses.replace(source, steps=split), distributed._devices, None, distributed._agree
    )
    user_prefetch = strategy.experimental_distribute_dataset(plain.prefetch(AUTOTUNE))
    touch = touch_step(strategy)
    return {
        "a. plain: shuffle(60000).batch(128)": (lambda: plain, touch_batch),
        "b. a + cut into 2 replica slices (SplitBatchesDataset)": (lambda: split, touch_host_step),
        "c. b + prefetch(2): the step source": (lambda: source.steps, touch_host_step),
        "d. b + DistributedIterator (torch, PerReplica), no prefetch": (
            lambda: unprefetched,
            touch,
        ),
        "e. c + DistributedIterator: experimental_distribute_dataset": (
            lambda: distributed,
            touch,
        ),
        "f. e of a.prefetch(AUTOTUNE) (two prefetch threads)": (lambda: user_prefetch, touch),
    }


def switches_per_step(make: Callable[[], Any], rows_of: Callable[[Any], int]) -> float:
    """The process's context switches (voluntary and not, all threads) per step over one epoch:
    each is a thread that blocked or was preempted, e.g. a hand-off between two threads."""

    def switches() -> int:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_nvcsw + usage.ru_nivcsw

    for step in make():  # warm-up: the first epoch of a dataset may pay one-off costs
        rows_of(step)
    before = switches()
    rows = sum(rows_of(step) for step in make())
    return (switches() - before) / (rows / ELEMENTS_PER_STEP)


def profile_threads(run: Callable[[], None]) -> tuple[pstats.Stats, pstats.Stats | None]:
    """cProfile of ``run`` on this thread, and of every thread it starts (merged).

    cProfile sees one thread only; each new thread's first profile event installs a profiler of
    its own (``threading.setprofile``), which is read after the thread has ended.
    """
    started: list[cProfile.Profile] = []
    lock = threading.Lock()

    def bootstrap(frame: Any, event: str, arg: Any) -> None:
        sys.setprofile(None)
        profile = cProfile.Profile()
        with lock:
            started.append(profile)
        profile.enable()

    main = cProfile.Profile()
    threading.setprofile(bootstrap)
    try:
        main.enable()
        try:
            run()
        finally:
            main.disable()
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    main_stats = pstats.Stats(main)
    threads = pstats.Stats(*started) if started else None
    return main_stats, threads


def _short(file: str) -> str:
    for marker in ("site-packages/", "/src/", "/lib/python3"):
        if marker in file:
            return file.split(marker, 1)[1]
    return os.path.basename(file)


def profile_rows(stats: pstats.Stats, steps: int, top: int) -> list[dict[str, Any]]:
    """The ``top`` functions by own time: µs per step, share of the thread's time, calls/step."""
    entries = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for _, _, tt, _, _ in entries.values()) or 1.0
    rows = []
    for (file, line, name), (_, calls, tt, ct, _) in sorted(
        entries.items(), key=lambda item: -item[1][2]
    )[:top]:
        where = name if file == "~" else f"{_short(file)}:{line}({name})"
        rows.append(
            {
                "function": where,
                "own_us_per_step": 1e6 * tt / steps,
                "own_share": tt / total,
                "cum_us_per_step": 1e6 * ct / steps,
                "calls_per_step": calls / steps,
            }
        )
    return rows


def print_profile(title: str, stats: pstats.Stats, steps: int, top: int) -> list[dict[str, Any]]:
    total = sum(tt for _, _, tt, _, _ in stats.stats.values())  # type: ignore[attr-defined]
    rows = profile_rows(stats, steps, top)
    print(
        f"\n{title}: {1e6 * total / steps:.1f} µs/step under the profiler, top {top} by own time\n"
    )
    print("| own µs/step | share | cum µs/step | calls/step | function |")
    print("|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['own_us_per_step']:.2f} | {r['own_share']:.0%} | {r['cum_us_per_step']:.2f} "
            f"| {r['calls_per_step']:.2f} | `{r['function']}` |"
        )
    return rows


def profile_feedline(x: np.ndarray, y: np.ndarray, epochs: int, top: int) -> dict[str, Any]:
    """cProfile of ``epochs`` epochs of the distributed pipeline, consumer and producer threads."""
    strategy = fdist.MirroredStrategy(list(REPLICAS))
    distributed = strategy.experimental_distribute_dataset(plain_dataset(x, y))
    touch = touch_step(strategy)
    for step in distributed:  # warm-up, outside the profile
        touch(step)
    steps = 0

    def run() -> None:
        nonlocal steps
        for _ in range(epochs):
            for step in distributed:
                touch(step)
                steps += 1

    main_stats, thread_stats = profile_threads(run)
    print(
        "\ncProfile times are wall-clock: a lock's acquire, or a call that releases the GIL and "
        "takes it back (np.take), is charged the time the other thread runs meanwhile"
    )
    out = {
        "epochs": epochs,
        "steps": steps,
        "main": print_profile("cProfile, main thread (consumer)", main_stats, steps, top),
    }
    if thread_stats is not None:
        out["prefetch_thread"] = print_profile(
            "cProfile, the step source's prefetch thread (producer)", thread_stats, steps, top
        )
    return out


# -- the run ----------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _step_us(rate: float | None) -> float | None:
    return None if not rate else us_per_step(rate)


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if not a or not b else f"{a / b:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="short runs, one repetition")
    parser.add_argument("--min-seconds", type=float, default=None)
    parser.add_argument("--repetitions", type=int, default=None)
    parser.add_argument("--no-tf", action="store_true", help="skip the TensorFlow peer")
    parser.add_argument("--no-profile", action="store_true", help="skip stages and cProfile")
    parser.add_argument("--profile-epochs", type=int, default=None)
    parser.add_argument("--top", type=int, default=12, help="functions listed per profile")
    args = parser.parse_args()

    min_seconds = args.min_seconds or (0.4 if args.quick else 1.5)
    repetitions = args.repetitions or (1 if args.quick else 3)
    profile_epochs = args.profile_epochs or (2 if args.quick else 6)
    timing = {"min_seconds": min_seconds, "repetitions": repetitions}

    x, y = _common.make_images()
    strategy = fdist.MirroredStrategy(list(REPLICAS))
    plain = plain_dataset(x, y)
    distributed = strategy.experimental_distribute_dataset(plain)

    print("feedline: distributed and plain, interleaved ...", file=sys.stderr, flush=True)
    feedline = interleaved(
        {
            "distributed": (lambda: distributed, touch_step(strategy)),
            "plain": (lambda: plain, touch_batch),
        },
        min_seconds,
        repetitions,
    )
    paired = [
        us_per_step(d) - us_per_step(p)
        for d, p in zip(feedline["distributed"].rates, feedline["plain"].rates, strict=True)
    ]
    tf: dict[str, Any] | str | None = None
    if not args.no_tf:
        print("TensorFlow: tf.distribute and plain tf.data ...", file=sys.stderr, flush=True)
        tf = run_tf_peer(
            [
                "--min-seconds",
                str(min_seconds),
                "--repetitions",
                str(repetitions),
                "--global-batch",
                str(GLOBAL_BATCH),
            ]
        )
        if isinstance(tf, str):
            print(tf, file=sys.stderr)
    peer = tf if isinstance(tf, dict) else {}
    rates: dict[str, float | None] = {
        "feedline distributed": feedline["distributed"].rate,
        "feedline plain": feedline["plain"].rate,
        "tf distributed": peer.get("distributed", {}).get("rate"),
        "tf plain": peer.get("plain", {}).get("rate"),
    }
    overhead = us_per_step(feedline["distributed"].rate) - us_per_step(feedline["plain"].rate)
    tf_overhead = overhead_us(rates["tf distributed"], rates["tf plain"])
    tf_rate = rates["tf distributed"]
    ratio = feedline["distributed"].rate / tf_rate if tf_rate else None

    print(
        f"\nelements/s, best of {repetitions} runs of >= {min_seconds} s in whole epochs of "
        f"{_common.NUM_IMAGES:,} elements; global batch {GLOBAL_BATCH} over {len(REPLICAS)} "
        f"replicas ({STEPS_PER_EPOCH} steps/epoch); {os.cpu_count()} CPUs\n"
    )
    print("| pipeline | elements/s | µs/step | / tf.distribute |")
    print("|---|---:|---:|---:|")
    labels = {
        "feedline distributed": 'feedline `MirroredStrategy(["cpu:0", "cpu:1"])`, '
        "`experimental_distribute_dataset`",
        "feedline plain": "feedline, the same pipeline not distributed",
        "tf distributed": 'TF `MirroredStrategy(["/cpu:0", "/cpu:1"])` (2 virtual CPUs), '
        "`experimental_distribute_dataset`",
        "tf plain": "tf.data, the same pipeline not distributed",
    }
    for key, label in labels.items():
        print(
            f"| {label} | {_fmt(rates[key])} | {_fmt(_step_us(rates[key]), 1)} | "
            f"{_ratio(rates[key], rates['tf distributed'])} |"
        )
    verdict_ratio = "—" if ratio is None else ("met" if ratio >= TARGET_RATIO else "NOT met")
    print(
        f"\nfeedline / tf.distribute: {'—' if ratio is None else f'{ratio:.2f}x'} "
        f"(target >= {TARGET_RATIO:.0f}x: {verdict_ratio})"
    )
    print(
        f"feedline's distributed iterator beyond the plain pipeline: {overhead:.1f} µs/step, best "
        f"against best (round by round: {', '.join(f'{p:.1f}' for p in paired)}; median "
        f"{statistics.median(paired):.1f}) (target <= ~{TARGET_OVERHEAD_US:.0f} µs: "
        f"{'met' if overhead <= TARGET_OVERHEAD_US else 'NOT met'})"
    )
    if tf_overhead is not None:
        print(f"tf.distribute beyond plain tf.data: {tf_overhead:,.1f} µs/step")

    stages: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None
    if not args.no_profile:
        print("\nfeedline stages ...", file=sys.stderr, flush=True)
        try:
            cases = stage_cases(x, y, strategy)
        except (ImportError, AttributeError, TypeError) as error:  # private pieces moved
            print(f"\nstage breakdown unavailable: {error!r}")
        else:
            measured = interleaved(cases, min_seconds, repetitions)
            switches = {name: switches_per_step(*case) for name, case in cases.items()}
            stages = {
                name: {**m.as_dict(), "switches_per_step": switches[name]}
                for name, m in measured.items()
            }
            base = us_per_step(next(iter(measured.values())).rate)
            print("\nthe feedline side stage by stage (interleaved, best of each)\n")
            print("| stage | elements/s | µs/step | beyond a | context switches/step |")
            print("|---|---:|---:|---:|---:|")
            for name, m in measured.items():
                step_us = us_per_step(m.rate)
                print(
                    f"| {name} | {_fmt(m.rate)} | {_fmt(step_us, 1)} | "
                    f"{_fmt(step_us - base, 1)} | {switches[name]:.2f} |"
                )
        print(f"\nprofiling {profile_epochs} epochs ...", file=sys.stderr, flush=True)
        profile = profile_feedline(x, y, profile_epochs, args.top)

    _common.write_results(
        "distributed_input",
        {
            "timing": timing,
            "global_batch": GLOBAL_BATCH,
            "feedline": {name: m.as_dict() for name, m in feedline.items()},
            "overhead_us_per_step": overhead,
            "overhead_us_per_step_by_round": paired,
            "tf": tf,
            "ratio": ratio,
            "stages": stages,
            "profile": profile,
        },
    )


if __name__ == "__main__":
    main()
