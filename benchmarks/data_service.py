"""feedline's data service against tf.data service on the same workloads.

Usage (from the repository root)::

    .venv/bin/python benchmarks/data_service.py [--quick] [--only S1,S3] [--no-tf]
        [--transfer shm,grpc]

Each row runs on feedline (dispatcher, workers and consumer in this process), then on tf.data
service (``benchmarks/_tf_service_peer.py`` under ``.venv-tf/bin/python``, the same layout in its
own process), one after the other, so that the two peers of a row see the same machine load. The
table gives the best of ``--repetitions`` runs; the JSON written to ``benchmarks/results/`` has
every run.

Workloads, all ``range(10**9).map(f).apply(distribute("distributed_epoch", ...))`` over loopback
gRPC, ``max_outstanding_requests=None``, each with 1 and 2 workers:

  S1  f(i) = a 1 MB float32 element (262,144 values); MB/s (10**6 bytes/s)
  S2  the same with 200 KB elements (51,200 values); MB/s
  S3  the same with 4 KB elements (1,024 values); elements/s
  S4  f(i) = a pure-Python loop of ~1 ms holding the GIL (``_common.BusyLoop``, calibrated at
      start-up, the same count for both peers); the workers are separate processes
      (``feedline worker`` / a process running ``tf.data.experimental.service.WorkerServer``);
      elements/s and 2 workers / 1 worker

S1-S3 elements are ``np.full(size, i, np.float32)`` (tf.data: ``tf.fill([size], float(i))``) by
default: the same bytes in both, and very compressible; ``--data ramp`` makes
``np.arange(size, dtype=np.float32) + i`` (``tf.range(size, dtype=tf.float32) + float(i)``)
instead, which general-purpose compressors barely shrink. S1-S3 run with ``compression="AUTO"``
and with ``compression=None`` in both systems.

feedline runs each row twice (``--transfer``): with its default transfer, where a consumer on the
worker's host reads replies through shared memory (``feedline/service/shm.py``; "shm"), and
with ``data_transfer_protocol="grpc"``, every byte over loopback gRPC ("grpc"); tf.data service
runs once. For S1-S3 the table also gives a plain ``memcpy`` of the same bytes (``np.copyto`` of
element-sized arrays through 64 MB of sources and destinations, more than the caches hold), the
physical limit of any transfer on this machine.

Timing: for every run, fresh servers are started, the dataset is built and iterated; the first
element and a warm-up of ``--warmup-seconds`` are not timed; then elements are consumed for at
least ``--min-seconds``. The iterator is then closed and the servers (and worker processes) are
stopped. This module imports feedline only inside functions, because the TF peer imports it for
the shared workload definitions and timing loop.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

import numpy as np

import _common

BENCHMARKS = pathlib.Path(__file__).resolve().parent
TF_PEER = BENCHMARKS / "_tf_service_peer.py"

SCENARIOS = ("S1", "S2", "S3", "S4")
# float32 values per element of S1-S3.
ELEMENT_SIZES = {"S1": 262_144, "S2": 51_200, "S3": 1_024}
RANGE = 10**9
BUSY_SECONDS = 1e-3
DATA_KINDS = ("full", "ramp")
COMPRESSIONS = ("AUTO", "none")
# feedline / tf.data service, per row of the scenario (the targets).
TARGETS = {"S1": 2.0, "S3": 10.0}
TRANSFERS = ("shm", "grpc")
# memcpy: bytes cycled through (sources and destinations each), and the timing.
MEMCPY_BYTES = 64 << 20
MEMCPY_SECONDS = 0.5
S4_SCALING_TARGET = 1.6
# How long to wait for servers, worker processes and their registration.
START_TIMEOUT = 120.0
STOP_TIMEOUT = 15.0


# -- the workloads (shared with the TF peer) ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table: a scenario with a number of workers and a compression; the
    workers run in the benchmark's process unless ``processes`` (always for S4)."""

    scenario: str
    workers: int
    compression: str  # "AUTO" or "none"
    processes: bool = False
    # feedline: "shm" (its default: shared memory with a worker on the same host) or "grpc"
    # (data_transfer_protocol="grpc"); the TF peer's rows keep the default.
    transfer: str = "shm"

    @property
    def process_workers(self) -> bool:
        return self.processes or self.scenario == "S4"

    @property
    def element_bytes(self) -> int:
        return 4 * ELEMENT_SIZES[self.scenario] if self.scenario in ELEMENT_SIZES else 8

    @property
    def unit(self) -> str:
        return "MB/s" if self.scenario in ("S1", "S2") else "elements/s"

    @property
    def label(self) -> str:
        where = " processes" if self.process_workers else ""
        grpc = " grpc-only" if self.transfer == "grpc" else ""
        return f"{self.scenario} {self.workers}w{where} {self.compression}{grpc}"


def make_groups(
    scenarios: list[str],
    workers: list[int],
    compressions: list[str],
    processes: bool = False,
    transfers: tuple[str, ...] = ("shm",),
) -> list[list[Row]]:
    """The rows of ``scenarios`` x ``compressions`` x ``transfers`` x ``workers``, grouped by
    scenario and compression: the rows of a group (its transfers and worker counts) are timed
    in alternation. S4 (scalar elements, where neither compression nor shared memory comes
    into play) runs with ``AUTO`` and the first transfer only."""
    return [
        [
            Row(scenario, count, compression, processes, transfer)
            for transfer in (transfers[:1] if scenario == "S4" else transfers)
            for count in workers
        ]
        for scenario in scenarios
        for compression in (["AUTO"] if scenario == "S4" else compressions)
    ]


class MakeElement:
    """Element ``i`` of S1-S3: ``np.full(size, i, float32)`` ("full") or
    ``np.arange(size, dtype=float32) + i`` ("ramp")."""

    def __init__(self, size: int, kind: str) -> None:
        self.size = int(size)
        self.kind = kind

    def __call__(self, i: Any) -> np.ndarray:
        if self.kind == "full":
            return np.full(self.size, np.float32(i), dtype=np.float32)
        return np.arange(self.size, dtype=np.float32) + np.float32(i)


def check_element(row: Row, kind: str, element: np.ndarray) -> None:
    """Raises if the first element received (as NumPy) is not what the workload makes."""
    if row.scenario == "S4":
        if np.asarray(element).dtype.kind not in "iu":
            raise AssertionError(f"{row.label}: expected an integer, got {element!r}")
        return
    size = ELEMENT_SIZES[row.scenario]
    array = np.asarray(element)
    if array.shape != (size,) or array.dtype != np.float32:
        raise AssertionError(f"{row.label}: got {array.dtype}{array.shape}, want float32[{size}]")
    first = float(array[0])
    expected = MakeElement(size, kind)(first)
    if not np.array_equal(array, expected):
        raise AssertionError(f"{row.label}: element {first} differs from {kind}")


# -- timing (shared with the TF peer) ------------------------------------------------------------


@dataclasses.dataclass
class Run:
    """One run: ``elements`` consumed in ``seconds`` after the warm-up."""

    elements: int
    seconds: float
    start_seconds: float  # servers up, dataset built, first element received
    warmup_elements: int
    # CPU time of this process (all its threads) over the timed part: with in-process
    # workers, everything the transfer cost, whatever share of the CPUs the machine's load
    # left it.
    cpu_seconds: float = 0.0


def consume(
    iterator: Iterator[Any],
    *,
    warmup_seconds: float,
    min_seconds: float,
    check: Callable[[Any], None],
    started: float,
) -> Run:
    """Checks the first element, skips ``warmup_seconds`` of elements, then counts the elements
    received in at least ``min_seconds``."""
    warm = count = 0
    try:
        check(next(iterator))
        first = time.perf_counter()
        warm = 1
        while time.perf_counter() - first < warmup_seconds:
            next(iterator)
            warm += 1
        begin = now = time.perf_counter()
        cpu = time.process_time()
        while now - begin < min_seconds:
            next(iterator)
            count += 1
            now = time.perf_counter()
        cpu = time.process_time() - cpu
    except StopIteration:
        raise RuntimeError(
            f"the dataset of {RANGE:,} elements ended after {warm} warm-up and {count} timed "
            f"elements, {time.perf_counter() - started:.1f} s after the run started"
        ) from None
    return Run(count, now - begin, first - started, warm, cpu)


Session = Callable[[], contextlib.AbstractContextManager[Iterator[Any]]]


def repeat_group(
    sessions: list[tuple[Row, Session]],
    *,
    repetitions: int,
    warmup_seconds: float,
    min_seconds: float,
    check: Callable[[Row, Any], None],
) -> dict[Row, dict[str, Any]]:
    """Runs ``repetitions`` rounds; in each, one fresh session (servers, dataset, iterator) of
    every row, in turn, so that the rows of a group see the same load. Elements/s and bytes/s of
    every run and the best, per row. A run that fails is recorded in ``failures`` and the others
    go on; if every run of a row fails, its last error is raised."""
    runs: dict[Row, list[dict[str, Any]]] = {row: [] for row, _ in sessions}
    failures: dict[Row, list[str]] = {row: [] for row, _ in sessions}
    for index in range(repetitions):
        for row, session in sessions:
            started = time.perf_counter()
            try:
                with session() as iterator:
                    run = consume(
                        iterator,
                        warmup_seconds=warmup_seconds,
                        min_seconds=min_seconds,
                        check=lambda element, row=row: check(row, element),
                        started=started,
                    )
                runs[row].append({"repetition": index, **dataclasses.asdict(run)})
            except Exception as error:
                failures[row].append(f"run {index + 1}: {type(error).__name__}: {error}")
                print(f"{row.label}: {failures[row][-1]}", file=sys.stderr, flush=True)
                if len(failures[row]) == repetitions:
                    raise
    return {row: summarize(row, runs[row], failures[row]) for row, _ in sessions}


def summarize(row: Row, runs: list[dict[str, Any]], failures: list[str]) -> dict[str, Any]:
    rates = [r["elements"] / r["seconds"] for r in runs]
    cpu = [r["cpu_seconds"] / r["elements"] for r in runs if r.get("elements")]
    return {
        "cpu_per_element": min(cpu) if cpu else None,
        "elements_per_s": max(rates),
        "elements_per_s_median": statistics.median(rates),
        "elements_per_s_all": rates,
        "mb_per_s": max(rates) * row.element_bytes / 1e6,
        "mb_per_s_median": statistics.median(rates) * row.element_bytes / 1e6,
        "runs": runs,
        "failures": failures,
    }


def paired_ratio(more: dict[str, Any] | None, fewer: dict[str, Any] | None) -> float | None:
    """The median over rounds of ``more``'s rate / ``fewer``'s rate in the same round."""
    if not more or not fewer:
        return None
    by_round = {r["repetition"]: r["elements"] / r["seconds"] for r in fewer["runs"]}
    ratios = [
        r["elements"] / r["seconds"] / by_round[r["repetition"]]
        for r in more["runs"]
        if r["repetition"] in by_round
    ]
    return statistics.median(ratios) if ratios else None


def headline(row: Row, result: dict[str, Any] | None) -> float | None:
    """The number the table shows for ``row``: MB/s for S1 and S2, elements/s otherwise."""
    if not result:
        return None
    return result["mb_per_s"] if row.unit == "MB/s" else result["elements_per_s"]


# -- processes (shared with the TF peer) ---------------------------------------------------------


def start_process(command: list[str], log: IO[bytes], env: dict[str, str]) -> subprocess.Popen:
    """A worker process writing its output to ``log`` (never to a pipe that could fill up)."""
    return subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
    )


def stop_process(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it has not ended within ``STOP_TIMEOUT`` seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT)


def wait_until(
    ready: Callable[[], bool],
    what: str,
    processes: list[subprocess.Popen],
    log: IO[bytes] | None = None,
    timeout: float = START_TIMEOUT,
) -> None:
    """Polls ``ready`` until it holds; raises if a process ends first or on timeout."""
    deadline = time.monotonic() + timeout
    while not ready():
        for process in processes:
            if process.poll() is not None:
                tail = ""
                if log is not None:
                    log.flush()
                    tail = pathlib.Path(log.name).read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{what}: process exited with {process.returncode}\n{tail}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not ready after {timeout:.0f} s")
        time.sleep(0.05)


def worker_env() -> dict[str, str]:
    """The environment of worker processes: ``benchmarks/`` importable (for ``_common``)."""
    paths = [str(BENCHMARKS), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))


# -- feedline --------------------------------------------------------------------------------


def _feedline_cli() -> list[str]:
    script = pathlib.Path(sys.executable).parent / "feedline"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "feedline.cli"]


def feedline_session_factory(
    row: Row, kind: str, busy_iterations: int, log_dir: str
) -> Callable[[], contextlib.AbstractContextManager[Iterator[Any]]]:
    """Fresh feedline servers and a fresh distributed dataset of ``row`` for each run."""
    from feedline import service
    from feedline.data import Dataset

    if row.scenario == "S4":
        fn: Callable[[Any], Any] = _common.BusyLoop(busy_iterations)
    else:
        fn = MakeElement(ELEMENT_SIZES[row.scenario], kind)
    compression = None if row.compression == "none" else row.compression

    @contextlib.contextmanager
    def session() -> Iterator[Iterator[Any]]:
        dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
        workers: list[Any] = []
        processes: list[subprocess.Popen] = []
        log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed below)
            prefix="feedline-worker-", suffix=".log", dir=log_dir, delete=False
        )
        try:
            address = dispatcher.target.split("://", 1)[1]
            if row.process_workers:
                command = [*_feedline_cli(), "worker", "--dispatcher", address, "--port", "0"]
                env = worker_env()
                processes.extend(start_process(command, log, env) for _ in range(row.workers))
                # The dispatcher's (private) state knows its workers; read only, to wait.
                registered = lambda: len(dispatcher._state.workers)  # noqa: E731
                wait_until(lambda: registered() >= row.workers, "feedline workers", processes, log)
            else:
                for _ in range(row.workers):
                    workers.append(
                        service.WorkerServer(service.WorkerConfig(dispatcher_address=address))
                    )
            dataset = (
                Dataset.range(RANGE)
                .map(fn)
                .apply(
                    service.distribute(
                        processing_mode="distributed_epoch",
                        service=dispatcher.target,
                        compression=compression,
                        max_outstanding_requests=None,
                        data_transfer_protocol="grpc" if row.transfer == "grpc" else None,
                    )
                )
            )
            iterator = iter(dataset)
            try:
                yield iterator
            finally:
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()
                del iterator, dataset
        finally:
            for worker in workers:
                worker.stop()
            for process in processes:
                stop_process(process)
            dispatcher.stop()
            log.close()
            os.unlink(log.name)

    return session


def run_feedline(
    group: list[Row], kind: str, busy_iterations: int, timing: dict[str, Any], log_dir: str
) -> dict[Row, dict[str, Any]]:
    """feedline's results for the rows of ``group``, timed in alternation."""
    return repeat_group(
        [(row, feedline_session_factory(row, kind, busy_iterations, log_dir)) for row in group],
        repetitions=timing["repetitions"],
        warmup_seconds=timing["warmup_seconds"],
        min_seconds=timing["min_seconds"],
        check=lambda row, element: check_element(row, kind, element),
    )


# -- the TF peer ------------------------------------------------------------------------------


def run_tf(
    group: list[Row], kind: str, busy_iterations: int, timing: dict[str, Any]
) -> tuple[str, dict[Row, dict[str, Any]]] | str:
    """TensorFlow's version and the TF peer's results for the worker counts of ``group``
    (timed in alternation there too), keyed by the row with the default ``transfer``, or why
    there are none."""
    counts = sorted({row.workers for row in group})
    args = [
        "--only",
        group[0].scenario,
        "--workers",
        ",".join(str(count) for count in counts),
        "--compression",
        group[0].compression,
        "--data",
        kind,
        "--busy-iterations",
        str(busy_iterations),
        "--min-seconds",
        str(timing["min_seconds"]),
        "--warmup-seconds",
        str(timing["warmup_seconds"]),
        "--repetitions",
        str(timing["repetitions"]),
    ]
    if group[0].processes:
        args.append("--process-workers")
    out = _common.run_tf_script(TF_PEER, args, "the tf.data service peer")
    if isinstance(out, str):
        return out
    return out["tensorflow"], {Row(**entry["row"]): entry["result"] for entry in out["rows"]}


# -- memcpy ---------------------------------------------------------------------------------------


def memcpy_rate(row: Row, repetitions: int) -> dict[str, Any] | None:
    """The best rate of ``np.copyto`` of ``row``'s elements (S1-S3), each from one of
    ``MEMCPY_BYTES`` of sources into one of as many destinations, in turn, so that the copies
    come from memory as the service's do, not from the caches; None for S4."""
    if row.scenario not in ELEMENT_SIZES:
        return None
    size = ELEMENT_SIZES[row.scenario]
    count = max(2, MEMCPY_BYTES // (4 * size))
    sources = np.arange(count * size, dtype=np.float32).reshape(count, size)
    targets = np.zeros_like(sources)
    rates = []
    cpu = []
    for _ in range(repetitions):
        copies = 0
        begin = now = time.perf_counter()
        started = time.thread_time()
        while now - begin < MEMCPY_SECONDS:
            for i in range(count):
                np.copyto(targets[i], sources[i])
            copies += count
            now = time.perf_counter()
        rates.append(copies / (now - begin))
        cpu.append((time.thread_time() - started) / copies)
    return {
        "cpu_per_element": min(cpu),
        "elements_per_s": max(rates),
        "mb_per_s": max(rates) * row.element_bytes / 1e6,
        "elements_per_s_all": rates,
    }


# -- the run ------------------------------------------------------------------------------------


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if unit == "elements/s" or value >= 100 else f"{value:,.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def _us(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e6:,.1f}"


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def _key(row: Row) -> Row:
    """The row with the default transfer: what the TF peer and memcpy results are keyed by."""
    return dataclasses.replace(row, transfer="shm")


def print_report(results: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """The table of rates and ratios and the worker scaling, as Markdown."""
    timing = meta["timing"]
    print(
        f"\nbest of {timing['repetitions']} runs of >= {timing['min_seconds']} s after a "
        f"{timing['warmup_seconds']} s warm-up; data: {meta['data']}; {os.cpu_count()} CPUs\n"
    )
    lines: dict[Row, dict[str, Any]] = {}
    for entry in results:
        line = lines.setdefault(_key(entry["row"]), {"tf": entry.get("tf")})
        line[entry["row"].transfer] = entry.get("feedline")
        line["memcpy"] = entry.get("memcpy")
    print(
        "| row | workers | compression | unit | feedline shm | feedline gRPC | tf.data service "
        "| shm / TF | gRPC / TF | memcpy | shm / memcpy | target |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row, line in lines.items():
        shm, grpc = headline(row, line.get("shm")), headline(row, line.get("grpc"))
        tf, copy = headline(row, line["tf"]), headline(row, line["memcpy"])
        target = TARGETS.get(row.scenario)
        target_text = f"≥ {target:g}x" if target else "—"
        where = " (processes)" if row.process_workers else ""
        print(
            f"| {row.scenario} | {row.workers}{where} | {row.compression} | {row.unit} | "
            f"{_fmt(shm, row.unit)} | {_fmt(grpc, row.unit)} | {_fmt(tf, row.unit)} | "
            f"{_ratio(shm, tf)} | {_ratio(grpc, tf)} | {_fmt(copy, row.unit)} | "
            f"{_ratio(shm, copy)} | {target_text} |"
        )
    cpu_rows = [(row, line) for row, line in lines.items() if not row.process_workers]
    if any((line.get("shm") or {}).get("cpu_per_element") for _, line in cpu_rows):
        print(
            "\nCPU time per element (this process, all threads: in-process workers) against "
            "a memcpy's, whatever share of the CPUs the load left each\n"
        )
        print("| row | workers | compression | feedline shm µs | feedline gRPC µs | memcpy µs "
              "| memcpy / shm |")  # fmt: skip
        print("|---|---|---|---:|---:|---:|---:|")
        for row, line in cpu_rows:
            shm = (line.get("shm") or {}).get("cpu_per_element")
            grpc = (line.get("grpc") or {}).get("cpu_per_element")
            copy = (line.get("memcpy") or {}).get("cpu_per_element")
            print(
                f"| {row.scenario} | {row.workers} | {row.compression} | {_us(shm)} | "
                f"{_us(grpc)} | {_us(copy)} | {_ratio(copy, shm)} |"
            )
    notes = [f"{e['row'].label}: {e['note']}" for e in results if e.get("note")]
    for entry in results:
        sides = [("feedline", "feedline")]
        if entry["row"].transfer == "shm":
            sides.append(("tf", "tf.data service"))
        for side, name in sides:
            for failure in (entry.get(side) or {}).get("failures", []):
                notes.append(f"{entry['row'].label}: {name} {failure} (left out)")
    for note in dict.fromkeys(notes):
        print(f"\n* {note}")

    scaling = [e for e in results if e.get("scaling")]
    if scaling:
        print(
            "\n2 workers / 1 worker, the median over rounds of the ratio within a round "
            "(the two are timed in alternation)\n"
        )
        print(
            "| scenario | compression | workers | feedline transfer | feedline 2/1 "
            "| tf.data service 2/1 | target |"
        )
        print("|---|---|---|---|---:|---:|---:|")
        for entry in scaling:
            row = entry["row"]
            target = f"≥ {S4_SCALING_TARGET}x" if row.scenario == "S4" else "—"
            where = "processes" if row.process_workers else "in-process"
            print(
                f"| {row.scenario} | {row.compression} | {where} | {row.transfer} | "
                f"{_x(entry['scaling'].get('feedline'))} | {_x(entry['scaling'].get('tf'))} | "
                f"{target} |"
            )
    if meta.get("machine_2_over_1"):
        print(
            f"\nS4: BusyLoop of {meta['busy_iterations']} iterations (~{BUSY_SECONDS * 1e3:g} ms "
            f"per element when calibrated); the machine itself: 2 processes of the same loop do "
            f"{meta['machine_2_over_1']:.2f}x the work of 1"
        )


def _jsonable(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**e, "row": dataclasses.asdict(e["row"])} for e in results]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="short runs, one repetition")
    parser.add_argument("--only", default=",".join(SCENARIOS), help="e.g. S1,S3")
    parser.add_argument("--workers", default="1,2", help="worker counts, e.g. 1,2")
    parser.add_argument("--compression", default=",".join(COMPRESSIONS), help="AUTO,none")
    parser.add_argument("--data", choices=DATA_KINDS, default="full")
    parser.add_argument(
        "--transfer",
        default=",".join(TRANSFERS),
        help="feedline's transfers: shm (its default, shared memory on one host), grpc",
    )
    parser.add_argument(
        "--process-workers",
        action="store_true",
        help="S1-S3 with worker processes too (S4 always has them)",
    )
    parser.add_argument("--min-seconds", type=float, default=None)
    parser.add_argument("--warmup-seconds", type=float, default=None)
    parser.add_argument("--repetitions", type=int, default=None)
    parser.add_argument("--busy-iterations", type=int, default=None, help="S4 (default: ~1 ms)")
    parser.add_argument("--no-tf", action="store_true", help="skip the tf.data service peer")
    parser.add_argument("--no-feedline", action="store_true", help="the TF peer only")
    args = parser.parse_args()

    scenarios = [s.strip().upper() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {', '.join(SCENARIOS)}")
    compressions = [c.strip() for c in args.compression.split(",") if c.strip()]
    if set(compressions) - set(COMPRESSIONS):
        parser.error(f"--compression: choose from {', '.join(COMPRESSIONS)}")
    workers = [int(w) for w in args.workers.split(",")]
    transfers = tuple(t.strip() for t in args.transfer.split(",") if t.strip())
    if not transfers or set(transfers) - set(TRANSFERS):
        parser.error(f"--transfer: choose from {', '.join(TRANSFERS)}")
    timing = {
        "min_seconds": args.min_seconds or (0.5 if args.quick else 2.0),
        "warmup_seconds": args.warmup_seconds or (0.2 if args.quick else 0.5),
        "repetitions": args.repetitions or (1 if args.quick else 3),
    }
    meta: dict[str, Any] = {"timing": timing, "data": args.data, "busy_iterations": None}
    if "S4" in scenarios:
        meta["busy_iterations"] = args.busy_iterations or _common.calibrate_busy(BUSY_SECONDS)
        print(f"S4: BusyLoop({meta['busy_iterations']}) ~ 1 ms", file=sys.stderr, flush=True)
    busy = meta["busy_iterations"] or 0

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="feedline-service-bench-") as log_dir:
        for group in make_groups(scenarios, workers, compressions, args.process_workers, transfers):
            what = f"{group[0].scenario} {group[0].compression} ({len(group)} rows)"
            # The 1-minute load average as the group starts (this benchmark's threads count too).
            entries = {
                row: {"row": row, "feedline": None, "tf": None, "loadavg_1min": os.getloadavg()[0]}
                for row in group
            }
            copy = memcpy_rate(group[0], timing["repetitions"])
            for entry in entries.values():
                entry["memcpy"] = copy
            if not args.no_feedline:
                print(f"{what}: feedline ...", file=sys.stderr, flush=True)
                try:
                    for row, result in run_feedline(
                        group, args.data, busy, timing, log_dir
                    ).items():
                        entries[row]["feedline"] = result
                except Exception as error:  # report the rows and go on
                    for entry in entries.values():
                        entry["note"] = f"feedline failed: {type(error).__name__}: {error}"
                    print(f"{what}: feedline failed: {error!r}", file=sys.stderr, flush=True)
            if not args.no_tf:
                print(f"{what}: tf.data service ...", file=sys.stderr, flush=True)
                tf = run_tf(group, args.data, busy, timing)
                if isinstance(tf, str):
                    for entry in entries.values():
                        entry["note"] = (entry.get("note", "") + " " + tf).strip()
                    print(f"{what}: {tf}", file=sys.stderr, flush=True)
                else:
                    meta["tensorflow"], by_row = tf
                    for row in group:
                        entries[row]["tf"] = by_row.get(_key(row))
            for transfer in transfers:
                by_workers = {r.workers: entries[r] for r in group if r.transfer == transfer}
                if 1 in by_workers and 2 in by_workers:
                    by_workers[2]["scaling"] = {
                        side: paired_ratio(by_workers[2][side], by_workers[1][side])
                        for side in ("feedline", "tf")
                    }
            for row in group:
                entry = entries[row]
                print(
                    f"{row.label}: feedline {_fmt(headline(row, entry['feedline']), row.unit)}  "
                    f"tf.data service {_fmt(headline(row, entry['tf']), row.unit)} {row.unit}",
                    file=sys.stderr,
                    flush=True,
                )
                results.append(entry)

    if "S4" in scenarios:
        meta["machine_2_over_1"] = _common.process_scaling(busy, 1.0, timing["repetitions"])
    print_report(results, meta)
    _common.write_results(
        "data_service",
        {
            **meta,
            "rows": _jsonable(results),
        },
    )


if __name__ == "__main__":
    main()
