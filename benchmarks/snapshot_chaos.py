"""Chaos for ``distributed_save``: workers and the dispatcher killed (kill -9) mid-save, a
worker added mid-save, with real processes, counted over rounds.

Usage (from the repository root)::

    .venv/bin/python benchmarks/snapshot_chaos.py [--rounds 3] [--seed 0] [--elements 640]
        [--only worker-kill-9,dispatcher-kill-9,both-kill-9,worker-added,worker-kill-9+reader]
        [--worker-timeout-ms 10000]

Each round starts a fresh cluster (``tests/service/procs.py``): a fault-tolerant ``feedline
dispatcher`` (``--work-dir D --fault-tolerant``, a fresh ``D`` per round, and
``--worker-timeout-ms`` where given: how soon a killed worker's stream moves) and two ``feedline
worker`` processes, and starts ``distributed_save`` of ``Dataset.range(N).map(f)`` to a fresh
local directory, where ``f`` sleeps ``--delay`` seconds and tags the element (``x + TAG``).
Once a random fraction of the save's streams is complete (drawn in [0, 0.7] per round: 0 is
at once), the round injects its fault:

=================  ==========================================================================
worker-kill-9      a worker is killed (SIGKILL) and a replacement worker started
dispatcher-kill-9  the dispatcher is killed (SIGKILL) and started again on its port and work dir
both-kill-9        a worker and the dispatcher are killed together; the dispatcher is started
                   again as above, then a replacement worker
worker-added       a third worker joins
=================  ==========================================================================

A scenario ``FAULT+reader`` also reads the snapshot with ``Dataset.load(path, wait=True)`` on a
thread of this process from the start of the save, through the fault, to its end. The round
then waits (at most ``--hang-seconds``) for the save to finish and reads it back with
``Dataset.load(path)``. It counts the elements lost (never saved), duplicated (saved twice),
wrong (not of the dataset), whether the save hung (no ``DONE`` in time), and for the reader
what it lost and got twice. The promise: 0 lost, 0 duplicated, 0 wrong, 0 hung, in the
snapshot and for the reader. ``tests/service/test_snapshot_chaos.py`` runs two rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib
import random
import signal
import sys
import threading
import time
from collections import Counter
from typing import Any

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import chaos  # noqa: E402
from benchmarks.chaos import TAG  # noqa: E402
from tests.service.procs import ServiceProcesses, read_in_thread  # noqa: E402

from feedline.data import Dataset  # noqa: E402
from feedline.data.experimental import distributed_save  # noqa: E402
from feedline.data.ops import _snapshot_fs as fs  # noqa: E402
from feedline.data.ops._snapshot_format import is_finished  # noqa: E402
from feedline.data.ops._snapshot_streams import read_saving  # noqa: E402

FAULTS = ("worker-kill-9", "dispatcher-kill-9", "both-kill-9", "worker-added")
SCENARIOS = (*FAULTS, "worker-kill-9+reader", "both-kill-9+reader")
#: The processes each fault kills with SIGKILL.
KILLS = {"worker-kill-9": 1, "dispatcher-kill-9": 1, "both-kill-9": 2, "worker-added": 0}


def tagged(delay: float, x: Any) -> Any:
    """``x + TAG``, after ``delay`` seconds (the cost that makes the save last)."""
    time.sleep(delay)
    return np.int64(x) + TAG


@dataclasses.dataclass
class Round:
    """One round: when the fault came, and what the snapshot and the reader got."""

    scenario: str
    fault_fraction: float
    streams_done_at_fault: str
    lost: int
    duplicated: int
    wrong: int
    hung: bool
    save_seconds: float
    reader_lost: int | None = None
    reader_duplicated: int | None = None
    reader_error: str | None = None

    @property
    def broken(self) -> bool:
        """Whether the round broke the promise (module docstring)."""
        return bool(
            self.lost
            or self.duplicated
            or self.wrong
            or self.hung
            or self.reader_lost
            or self.reader_duplicated
            or self.reader_error
        )

    def cells(self) -> list[str]:
        reader = (
            "—"
            if self.reader_lost is None
            else f"{self.reader_lost} lost, {self.reader_duplicated} dup."
            + (f", {self.reader_error}" if self.reader_error else "")
        )
        return [
            self.scenario,
            f"{self.fault_fraction:.2f}",
            self.streams_done_at_fault,
            str(self.lost),
            str(self.duplicated),
            str(self.wrong),
            "yes" if self.hung else "no",
            f"{self.save_seconds:.1f} s",
            reader,
            "broken" if self.broken else "ok",
        ]


HEADER = [
    "scenario",
    "fault at",
    "streams done at fault",
    "lost",
    "duplicated",
    "wrong",
    "hung",
    "save took",
    "reader (wait=True)",
    "verdict",
]


def _streams_done(path: str) -> tuple[int, int]:
    """Streams of the save at ``path`` with a ``DONE`` file, and the number of streams."""
    saving = read_saving(path)
    if saving is None:
        return 0, 1
    run = fs.join(path, saving["run"])
    total = saving["num_streams"]
    done = sum(fs.exists(fs.join(run, f"shard_{s:05d}", "DONE")) for s in range(total))
    return done, total


def _wait_for(condition: Any, seconds: float) -> bool:
    """Whether ``condition()`` came true within ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _count(values: list[int], elements: int) -> tuple[int, int, int]:
    """Lost, duplicated and wrong among ``values`` (tagged elements of ``range(elements)``)."""
    counts = Counter(values)
    mine = {x for x in counts if TAG <= x < TAG + elements}
    wrong = sum(n for x, n in counts.items() if x not in mine)
    duplicated = sum(n - 1 for x, n in counts.items() if x in mine)
    return elements - len(mine), duplicated, wrong


def run_round(
    scenario: str,
    workdir: pathlib.Path,
    *,
    elements: int = 640,
    delay: float = 0.01,
    fault_fraction: float = 0.3,
    hang_seconds: float = 120.0,
    worker_timeout_ms: int | None = None,
) -> Round:
    """Runs one round on a fresh cluster (module docstring)."""
    fault, _, reader = scenario.partition("+")
    if fault not in FAULTS or reader not in ("", "reader"):
        raise ValueError(f"unknown scenario {scenario!r}; choose from {SCENARIOS}")
    workdir.mkdir(parents=True, exist_ok=True)
    path = str(workdir / "snapshot")
    args: tuple[str, ...] = ("--work-dir", str(workdir / "dispatcher"), "--fault-tolerant")
    if worker_timeout_ms is not None:
        args += ("--worker-timeout-ms", str(worker_timeout_ms))
    read: dict[str, Any] = {}
    with ServiceProcesses(timeout=hang_seconds + 120) as cluster:
        dispatcher = cluster.start_dispatcher(*args)
        workers = [cluster.start_worker() for _ in range(2)]
        started = time.monotonic()
        distributed_save(
            Dataset.range(elements).map(functools.partial(tagged, delay)), path, cluster.address
        )
        thread = None
        if reader:

            def read_all() -> None:
                try:
                    got, error = read_in_thread(
                        iter(Dataset.load(path, wait=True)), hang_seconds + 60
                    )
                    read.update(got=got, error=None if error is None else repr(error)[:200])
                except AssertionError as hang:
                    read.update(got=[], error=str(hang)[:200])

            thread = threading.Thread(target=read_all, name="snapshot-reader", daemon=True)
            thread.start()
        _wait_for(
            lambda: (
                is_finished(path)
                or _streams_done(path)[0] >= fault_fraction * _streams_done(path)[1]
            ),
            hang_seconds,
        )
        done, total = _streams_done(path)
        at_fault = f"{done}/{total}" + (" (finished)" if is_finished(path) else "")
        if fault in ("worker-kill-9", "both-kill-9"):
            victim = random.Random(fault_fraction).choice(workers)
            cluster.send(victim, signal.SIGKILL)
        if fault in ("dispatcher-kill-9", "both-kill-9"):
            cluster.send(dispatcher, signal.SIGKILL)
            if cluster.wait_exit(dispatcher, 30) is None:
                raise RuntimeError("the dispatcher outlived its kill -9 for 30 s")
            cluster.start_dispatcher(*args)
        if fault != "dispatcher-kill-9":
            cluster.start_worker()  # the replacement, or the worker added
        hung = not _wait_for(lambda: is_finished(path), hang_seconds)
        save_seconds = time.monotonic() - started
        if thread is not None:
            thread.join(hang_seconds + 90)
    saved = [] if hung else [int(x) for x in Dataset.load(path)]
    lost, duplicated, wrong = _count(saved, elements)
    row = Round(scenario, fault_fraction, at_fault, lost, duplicated, wrong, hung, save_seconds)
    if reader:
        got = read.get("got", [])
        row.reader_lost, row.reader_duplicated, reader_wrong = _count(got, elements)
        row.wrong += reader_wrong
        row.reader_error = read.get("error", "the reader did not end")
    return row


def summary(rows: list[Round]) -> str:
    """Per scenario over its rounds: rounds, kills, lost, duplicated, wrong, hangs, broken."""
    lines = [
        "| scenario | rounds | kills -9 | lost | duplicated | wrong | hung | reader lost "
        "| reader duplicated | broken rounds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario in dict.fromkeys(row.scenario for row in rows):
        mine = [row for row in rows if row.scenario == scenario]
        readers = [row for row in mine if row.reader_lost is not None]
        lines.append(
            f"| {scenario} | {len(mine)} | {KILLS[scenario.split('+')[0]] * len(mine)} "
            f"| {sum(r.lost for r in mine)} | {sum(r.duplicated for r in mine)} "
            f"| {sum(r.wrong for r in mine)} | {sum(r.hung for r in mine)} "
            f"| {sum(r.reader_lost or 0 for r in readers) if readers else '—'} "
            f"| {sum(r.reader_duplicated or 0 for r in readers) if readers else '—'} "
            f"| {sum(r.broken for r in mine)} |"
        )
    return "\n".join(lines)


def table(rows: list[Round]) -> str:
    return chaos.table(rows, HEADER)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each scenario")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the fault moments")
    parser.add_argument("--elements", type=int, default=640)
    parser.add_argument("--delay", type=float, default=0.01, help="seconds the map sleeps")
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    parser.add_argument("--hang-seconds", type=float, default=120.0)
    parser.add_argument(
        "--worker-timeout-ms",
        type=int,
        default=None,
        help="the dispatcher's --worker-timeout-ms (its default, 10000, when not given)",
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    scratch = ROOT / "benchmarks" / "results" / f"snapshot-chaos-{stamp}"
    rows = []
    print(table([]), flush=True)
    for index in range(args.rounds):
        for scenario in args.only.split(","):
            row = run_round(
                scenario,
                scratch / f"{scenario}-{index}",
                elements=args.elements,
                delay=args.delay,
                fault_fraction=rng.uniform(0.0, 0.7),
                hang_seconds=args.hang_seconds,
                worker_timeout_ms=args.worker_timeout_ms,
            )
            rows.append(row)
            print(table([row]).splitlines()[-1], flush=True)
    print(f"\n{args.elements} elements a save, seed {args.seed}\n")
    print(summary(rows))
    out = scratch.with_suffix(".json")
    out.write_text(json.dumps([dataclasses.asdict(row) for row in rows], indent=2))
    if any(row.broken for row in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
