"""What the benchmark's two interpreters share: the data, the GIL-bound function and the timer.

``data_pipeline.py`` (feedline and DataLoader, in ``.venv``) and ``_tf_peer.py`` (tf.data, in
``.venv-tf``) both import this module, so that every framework sees the same arrays, generated
from the same seed, the same per-element work, and the same way of timing it. It needs NumPy only.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

SEED = 20240601
NUM_IMAGES = 60_000
IMAGE_SHAPE = (28, 28, 1)
BATCH = 64
B4_RANGE = 10_000_000
B4_BATCH = 1024
# B6 times a prefix of this many elements at most.
B6_RANGE = 10_000_000

# W1: sliding windows of a long range, the time-series idiom; a prefix of it is timed.
W1_RANGE = 10_000_000
W1_WINDOW = 64
W1_BATCH = 32
# K1: variable-length int sequences bucketed by length; whole epochs are timed.
K1_COUNT = 50_000
K1_MAX_LENGTH = 100
K1_BOUNDARIES = [20, 40, 60, 80]
K1_BATCH_SIZES = [64, 64, 64, 64, 64]

WORKLOADS = ("B1", "B2", "B3", "B4", "B5", "B6", "W1", "K1")


def make_sequences(seed: int = SEED, n: int = K1_COUNT) -> tuple[np.ndarray, np.ndarray]:
    """``n`` int64 sequences of lengths 1..K1_MAX_LENGTH as rows of a padded matrix, and the
    lengths (the sequence of row ``i`` is ``rows[i, :lengths[i]]``), the same for a seed."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, K1_MAX_LENGTH + 1, size=n, dtype=np.int64)
    rows = rng.integers(1, 1000, size=(n, K1_MAX_LENGTH), dtype=np.int64)
    return rows, lengths


def make_images(seed: int = SEED, n: int = NUM_IMAGES) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random 28x28x1 uint8 images and uint8 labels in [0, 10), the same for a seed."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, *IMAGE_SHAPE), dtype=np.uint8)
    y = rng.integers(0, 10, size=(n,), dtype=np.uint8)
    return x, y


class BusyLoop:
    """A pure-Python loop that holds the GIL for about ``iterations`` x 50 ns per call.

    A class rather than a closure so that it pickles by reference to this module plus one int:
    feedline's worker processes and DataLoader's workers load the same code.
    """

    def __init__(self, iterations: int) -> None:
        self.iterations = int(iterations)

    def __call__(self, i: Any) -> int:
        total = int(i)
        for k in range(self.iterations):
            total ^= k
        return total


def calibrate_busy(target_seconds: float = 50e-6) -> int:
    """The ``BusyLoop`` iterations that take ``target_seconds`` per call on this machine, from
    the fastest of several timings (the machine's speed when nothing else runs)."""
    probe = 1000
    fn = BusyLoop(probe)
    per_call = float("inf")
    for _ in range(7):
        start = time.perf_counter()
        for i in range(500):
            fn(i)
        per_call = min(per_call, (time.perf_counter() - start) / 500)
    return max(1, round(probe * target_seconds / per_call))


def _spin(iterations: int, seconds: float) -> int:
    """Calls ``BusyLoop(iterations)`` for ``seconds``; the number of calls."""
    fn = BusyLoop(iterations)
    calls = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn(calls)
        calls += 1
    return calls


def process_scaling(iterations: int, seconds: float, repetitions: int) -> float:
    """How much more ``BusyLoop`` work two processes do than one on this machine (best of
    ``repetitions``): the ceiling of any 2-process speed-up, measured, not assumed."""
    import multiprocessing

    best = 0.0
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.starmap(_spin, [(iterations, 0.05)] * 2)
        for _ in range(repetitions):
            one = pool.starmap(_spin, [(iterations, seconds)])[0]
            two = sum(pool.starmap(_spin, [(iterations, seconds)] * 2))
            best = max(best, two / one)
    return best


@dataclasses.dataclass
class Measurement:
    """Rows per second: the best of ``rates`` (one per repetition)."""

    rate: float
    rates: list[float]
    rows: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def measure(
    make_iterable: Callable[[], Iterable[Any]],
    rows_of: Callable[[Any], int],
    *,
    min_seconds: float,
    repetitions: int,
    whole_epochs: bool,
    warmup_seconds: float | None = None,
) -> Measurement:
    """Times iteration of fresh iterables; the best of ``repetitions`` runs of ``min_seconds``.

    Each run makes new iterables (an epoch each) until ``min_seconds`` have passed; with
    ``whole_epochs`` every epoch is run to its end (so per-epoch costs such as filling a shuffle
    buffer are counted), otherwise the run stops mid-epoch as soon as the time is up (a prefix
    of a long dataset). Making the iterator is inside the timed region. A warm-up run of
    ``warmup_seconds`` (default: half of ``min_seconds``, at least one epoch when
    ``whole_epochs``) comes first and is not counted.
    """

    def run(seconds: float) -> tuple[int, float]:
        rows = 0
        start = time.perf_counter()
        while True:
            iterable = make_iterable()
            iterator = iter(iterable)
            for element in iterator:
                rows += rows_of(element)
                if not whole_epochs and time.perf_counter() - start >= seconds:
                    break
            close = getattr(iterator, "close", None)
            elapsed = time.perf_counter() - start
            if close is not None:
                close()
            if elapsed >= seconds:
                return rows, elapsed

    run(min_seconds / 2 if warmup_seconds is None else warmup_seconds)
    rates, total_rows, total_seconds = [], 0, 0.0
    for _ in range(repetitions):
        rows, seconds = run(min_seconds)
        rates.append(rows / seconds)
        total_rows += rows
        total_seconds += seconds
    return Measurement(max(rates), rates, total_rows, total_seconds)


def rss_bytes() -> int:
    """The resident set size of this process now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> bool:
    """Resets the kernel's peak-RSS counter of this process (Linux); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """The peak resident set size since the last ``reset_peak_rss`` (or since the start)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# glibc's largest allowed mmap threshold (32 MiB: a buffer below it comes from the heap, not from
# pages mapped afresh and faulted in at every allocation), and a trim threshold that keeps freed
# heap memory mapped. glibc adjusts both to what a process happens to free unless they are set.
FIXED_MALLOC = {
    "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
}


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) process ``pid`` has used (Linux; ticks of 10 ms)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_memory_of(run: Callable[[], None]) -> dict[str, int]:
    """RSS before ``run`` and the peak RSS during it (after resetting the peak counter)."""
    before = rss_bytes()
    exact = reset_peak_rss()
    run()
    peak = peak_rss_bytes()
    return {
        "rss_before": before,
        "peak_rss": peak,
        "peak_delta": max(0, peak - before),
        "exact_peak": int(exact),
    }


TF_PYTHON = pathlib.Path(__file__).resolve().parents[1] / ".venv-tf" / "bin" / "python"


def run_tf_script(script: pathlib.Path, args: list[str], what: str) -> dict[str, Any] | str:
    """The JSON that ``script`` prints as its last line under the TensorFlow virtualenv, or why
    it could not run (``what`` names the peer in that message)."""
    if not TF_PYTHON.exists():
        return f"{TF_PYTHON} is missing (see benchmarks/README.md)"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH="")
    done = subprocess.run(
        [str(TF_PYTHON), str(script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        return f"{what} failed (exit code {done.returncode}): {tail}"
    return json.loads(lines[-1])


RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def write_results(name: str, payload: dict[str, Any]) -> pathlib.Path:
    """Writes ``payload`` to ``results/<name>-<stamp>.json``, after the date, the command and
    the machine, and returns the file's path."""
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = RESULTS / f"{name}-{stamp}.json"
    header = {
        "date": stamp,
        "command": " ".join(sys.argv),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
    }
    out.write_text(json.dumps({**header, **payload}, indent=2))
    print(f"\nresults written to {out.relative_to(RESULTS.parents[1])}")
    return out


def print_profile_tables(key: str, profile: dict) -> None:
    """A cProfile summary as Markdown tables: by own time, then feedline's functions by
    cumulative time (the ``own`` and ``feedline_cumulative`` rows of a profile result)."""
    print("| own µs/step | cum µs/step | calls/step | function |")
    print("|---:|---:|---:|---|")
    for row in profile["own"]:
        print(
            f"| {row['own_us_per_step']:,.1f} | {row['cum_us_per_step']:,.1f} "
            f"| {row['calls_per_step']:.1f} | `{row['function']}` |"
        )
    if profile["feedline_cumulative"]:
        print(f"\n{key}: feedline's functions by cumulative time\n")
        print("| cum µs/step | calls/step | function |")
        print("|---:|---:|---|")
        for row in profile["feedline_cumulative"]:
            print(
                f"| {row['cum_us_per_step']:,.1f} | {row['calls_per_step']:.1f} "
                f"| `{row['function']}` |"
            )
