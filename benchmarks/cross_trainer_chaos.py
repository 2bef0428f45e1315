"""Chaos for cross-trainer jobs: a trainer killed (kill -9) mid-epoch and restarted from its
checkpoint, or a worker killed (kill -9) mid-epoch and replaced, with real processes, counted
over rounds.

Usage (from the repository root)::

    .venv/bin/python benchmarks/cross_trainer_chaos.py [--rounds 10] [--fault-at random]
        [--fault-tolerant] [--elements 400] [--kill trainer|worker|worker+trainer]
        [--late-trainer] [--back-before-drop] [--no-hold]

Each round starts a fresh cluster (``tests/service/procs.py``): a ``feedline dispatcher`` (with
``--fault-tolerant``: on a fresh work dir, ``--fault-tolerant``), two ``feedline worker``
processes and three trainer processes that read one ``distributed_epoch`` job of ``--elements``
elements, each with a ``CrossTrainerCache`` of its own id. A trainer writes every element
``next()`` returns as a line, and every 7 elements saves a checkpoint (its iterator's
``get_state()`` and the lines written by then). Once the victim has read ``--fault-at`` of the
epoch (a fraction, or ``random``: drawn in [0.05, 0.9] per round), it is killed with SIGKILL and
started again: it drops the lines after its checkpoint (those steps are done again), restores
the state and reads on. Per trainer, the round counts the elements lost (never written),
duplicated (written twice) and whether a trainer hung (no end within ``--hang-seconds``). The
promise: 0 lost, 0 duplicated, 0 hung, for every trainer.

With ``--kill worker`` no trainer is killed: once the victim has read ``--fault-at`` of the
epoch and the others at least one element each, the first worker is killed with SIGKILL and
a new worker started in its place; the trainers fetch 8 elements ahead
(``max_outstanding_requests``), so the dead worker's cache held elements some trainers had
not fetched. The promise holds with ``--fault-tolerant`` (the
dead worker's splits run again, and each trainer takes what it had not received); without it,
what the dead worker held is lost to the trainers that had not fetched it. In ``--kill worker``
rounds the dispatcher drops a dead worker after 1 s (``--worker-timeout-ms 1000``).

``--late-trainer`` (with ``--kill worker``) adds a fourth trainer, ``late``, that first joins
the job once the dispatcher has dropped the dead worker: it reads what the live workers cached
from the job's start, and under ``--fault-tolerant`` gets the dead worker's splits, which the
other trainers had received in full, run again. So that the epoch still runs when ``late``
joins, the three others wait before their last 10 elements until ``late`` has its first.
``--kill worker+trainer``: the victim saves checkpoints only up to ``--fault-at`` of the epoch;
once every trainer has read 100 elements past that (the victim, reading slowest, last), the
first worker is killed and replaced, then the victim is killed and, once the dispatcher has
dropped the dead worker (with ``--back-before-drop``: at once, before that), restarted from
that checkpoint, older than the worker's death: under ``--fault-tolerant`` the dead worker's
splits that every trainer had received in full since run again for the restored victim. The
two others wait before their last 10 elements until the restarted victim has its first (with
``--no-hold`` they read on to the end of the epoch without it: where the job's tasks ended
their splits by then, a live worker gets a new task of the job that runs them).
``tests/service/client/test_cross_trainer.py`` runs five rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import random
import signal
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.service.procs import ServiceProcesses  # noqa: E402

TRAINERS = ("a", "b", "victim")
#: The trainer that first joins after the worker died (``--late-trainer``).
LATE = "late"
#: Steps between a trainer's checkpoints.
EVERY = 7

# A trainer process: reads the epoch as trainer $TRAINER, writes every element it returns as a
# line of $OUT, and every $EVERY elements saves its checkpoint (the state and the lines written
# by then). Restarted with $RESUME, it takes up its checkpoint and reads on from there.
TRAINER = """
import json, os, time
from pathlib import Path
from feedline.data import Dataset
from feedline.service import CrossTrainerCache, distribute
from tests.launcher import report

dataset = Dataset.range(int(os.environ["ELEMENTS"])).apply(
    distribute(
        "distributed_epoch",
        os.environ["FEEDLINE_TARGET"],
        job_name="epoch",
        cross_trainer_cache=CrossTrainerCache(os.environ["TRAINER"]),
        max_outstanding_requests=int(os.environ["OUTSTANDING"]) or None,
    )
)
out, checkpoint = Path(os.environ["OUT"]), Path(os.environ["OUT"] + ".ckpt")
iterator = iter(dataset)
lines = []
if os.environ.get("RESUME"):
    saved = json.loads(checkpoint.read_text())
    lines = out.read_text().split()[: saved["lines"]]
    iterator.set_state(saved["state"])
every, pause = int(os.environ["EVERY"]), float(os.environ["PAUSE"])
# CKPT_UNTIL: no checkpoint is saved past that many elements.
until = int(os.environ.get("CKPT_UNTIL") or 1 << 62)
# HOLD: this trainer waits (at most 60 s) before its last 10 elements until that file exists;
# JOINED: this trainer creates that file once it has its first element (since it started).
hold, joined = os.environ.get("HOLD"), os.environ.get("JOINED")
with out.open("w", buffering=1) as log:
    log.write("".join(f"{x}\\n" for x in lines))
    for x in iterator:
        lines.append(str(int(x)))
        log.write(f"{int(x)}\\n")
        if joined:  # its first element since it (re)started
            Path(joined).touch()
            joined = None
        deadline = time.monotonic() + 60
        while hold and len(lines) == int(os.environ["ELEMENTS"]) - 10 and not Path(hold).exists():
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        if len(lines) % every == 0 and len(lines) <= until:
            tmp = checkpoint.with_suffix(".tmp")
            tmp.write_text(json.dumps({"state": iterator.get_state(), "lines": len(lines)}))
            tmp.replace(checkpoint)
        time.sleep(pause)
report(len(lines))
"""


@dataclasses.dataclass
class Round:
    """One round: where the victim was killed, and per trainer what it lost and got twice."""

    fault_fraction: float
    killed_at: int
    lost: dict[str, int]
    duplicated: dict[str, int]
    hung: list[str]
    failed: dict[str, str]

    @property
    def broken(self) -> bool:
        """Whether the round broke the promise (0 lost, 0 duplicated, 0 hung, no failure)."""
        return bool(
            any(self.lost.values()) or any(self.duplicated.values()) or self.hung or self.failed
        )


def _lines(path: pathlib.Path) -> int:
    """The elements a trainer wrote to ``path`` so far."""
    return len(path.read_text().split()) if path.exists() else 0


def run_round(
    workdir: pathlib.Path,
    *,
    elements: int = 400,
    fault_fraction: float = 0.3,
    fault_tolerant: bool = False,
    hang_seconds: float = 90.0,
    kill: str = "trainer",
    late: bool = False,
    back_before_drop: bool = False,
    hold: bool = True,
) -> Round:
    """Runs one round on a fresh cluster (module docstring); ``kill``: ``trainer`` (the
    victim), ``worker`` (the first worker, replaced by a new one) or ``worker+trainer`` (the
    worker, then the victim, restored from a checkpoint older than the worker's death);
    ``late``: a trainer first joins after the worker died (``kill="worker"`` only). With
    ``kill="worker+trainer"``: ``back_before_drop``, the victim is restarted at once, not once
    the dispatcher dropped the dead worker; ``hold=False``, the others read to the epoch's end
    without waiting for the victim to be back."""
    if late and kill != "worker":
        raise ValueError("a late trainer joins after a worker died: use kill='worker'")
    workdir.mkdir(parents=True, exist_ok=True)
    names = (*TRAINERS, LATE) if late else TRAINERS
    files = {name: workdir / f"{name}.txt" for name in names}
    # A worker killed mid-epoch must hold elements the trainers have not fetched yet: they
    # fetch a few at a time.
    worker_dies = kill in ("worker", "worker+trainer")
    outstanding = 8 if worker_dies else 0
    common = {"ELEMENTS": str(elements), "EVERY": str(EVERY), "OUTSTANDING": str(outstanding)}

    def env(name: str, pause: float, **extra: str) -> dict[str, str]:
        return {**common, "TRAINER": name, "OUT": str(files[name]), "PAUSE": str(pause), **extra}

    kill_at = max(1, round(elements * fault_fraction))
    past = 0  # what every trainer reads past the victim's last checkpoint before the kills
    if kill == "worker+trainer":
        kill_at = max(EVERY, round((elements - 150) * fault_fraction))
        past = 100
        if hold:  # the epoch runs until it is back
            common["HOLD"] = str(workdir / "victim-back")
    if late:  # the epoch runs on until the late trainer joins
        common["HOLD"] = str(workdir / "late-joined")
    with ServiceProcesses(timeout=hang_seconds + 120) as cluster:
        args: tuple[str, ...] = ("--worker-timeout-ms", "1000") if worker_dies else ()
        if fault_tolerant:
            args += ("--work-dir", str(workdir / "journal"), "--fault-tolerant")
        dispatcher = cluster.start_dispatcher(*args)
        workers = [cluster.start_worker() for _ in range(2)]
        trainers = cluster.run(
            TRAINER,
            [
                ("a", env("a", 0.004)),
                ("b", env("b", 0.006)),
                # With ``past`` the victim is the slowest: the epoch runs on until it is killed.
                (
                    "victim",
                    env(
                        "victim",
                        0.02 if past else 0.004,
                        CKPT_UNTIL=str(kill_at) if past else "",
                        HOLD="",
                    ),
                ),
            ],
            timeout=hang_seconds + 60,
        )
        # A worker is killed once every trainer reads the job (with ``past``: once every
        # trainer has read that far past the victim's last checkpoint).
        if past:
            waited = dict.fromkeys(TRAINERS, kill_at + past)
        else:
            waited = {name: kill_at if name == "victim" else int(worker_dies) for name in TRAINERS}
        deadline = time.monotonic() + 60
        while any(_lines(files[name]) < count for name, count in waited.items()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the trainers did not read {waited} elements in 60 s")
            time.sleep(0.01)
        if worker_dies:
            cluster.send(workers[0], signal.SIGKILL)
            if cluster.wait_exit(workers[0], 30) is None:
                raise RuntimeError("the worker outlived its kill -9 for 30 s")
            killed_at = len(files["victim"].read_text().split())
            if past:  # the victim too, before it reads much further
                trainers.send("victim", signal.SIGKILL)
            cluster.start_worker()  # its replacement
            groups: list[tuple[Any, tuple[str, ...]]] = [(trainers, TRAINERS)]
            if late:
                _wait_for_drop(cluster, dispatcher)
                extra = {"HOLD": "", "JOINED": common["HOLD"]}
                joined = cluster.run(
                    TRAINER, [(LATE, env(LATE, 0.0, **extra))], timeout=hang_seconds + 60
                )
                groups.append((joined, (LATE,)))
        if kill != "worker":
            if not past:
                trainers.send("victim", signal.SIGKILL)
            if trainers.wait_exit("victim", 30) is None:
                raise RuntimeError("the victim outlived its kill -9 for 30 s")
            killed_at = len(files["victim"].read_text().split())
            if past and not back_before_drop:  # back once the dead worker is dropped
                _wait_for_drop(cluster, dispatcher)
            back = {"HOLD": "", "JOINED": common.get("HOLD", "")}
            restarted = cluster.run(
                TRAINER,
                [("victim", env("victim", 0.001, RESUME="1", **back))],
                timeout=hang_seconds + 60,
            )
            groups = [(trainers, ("a", "b")), (restarted, ("victim",))]
        hung = []
        deadline = time.monotonic() + hang_seconds
        for group, members in groups:
            for name in members:
                while group.poll(name) is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                if group.poll(name) is None:
                    hung.append(name)
        results = {name: result for group, _ in groups for name, result in group.wait().items()}
    failed = {name: results[name].describe()[-2000:] for name in names if not results[name].ok}
    lost, duplicated = {}, {}
    for name, path in files.items():
        values = [int(x) for x in path.read_text().split()] if path.exists() else []
        lost[name] = len(set(range(elements)) - set(values))
        duplicated[name] = len(values) - len(set(values))
    return Round(fault_fraction, killed_at, lost, duplicated, hung, failed)


def _wait_for_drop(cluster: ServiceProcesses, dispatcher: Any) -> None:
    """Waits (at most 30 s) until the dispatcher has dropped the killed worker."""
    deadline = time.monotonic() + 30
    while "missed heartbeats" not in cluster.output(dispatcher):
        if time.monotonic() > deadline:
            raise RuntimeError("the dispatcher did not drop the dead worker in 30 s")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--elements", type=int, default=400)
    parser.add_argument("--fault-at", default="random", help="a fraction of the epoch, or random")
    parser.add_argument("--fault-tolerant", action="store_true")
    parser.add_argument(
        "--kill", choices=("trainer", "worker", "worker+trainer"), default="trainer"
    )
    parser.add_argument(
        "--late-trainer",
        action="store_true",
        help="with --kill worker: a fourth trainer first joins after the worker died",
    )
    parser.add_argument(
        "--back-before-drop",
        action="store_true",
        help="with --kill worker+trainer: the victim is restarted at once, not once the "
        "dispatcher dropped the dead worker",
    )
    parser.add_argument(
        "--no-hold",
        action="store_true",
        help="with --kill worker+trainer: the others read to the epoch's end without waiting "
        "for the victim to be back",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    scratch = ROOT / "benchmarks" / "results" / f"cross-trainer-chaos-{stamp}"
    rounds = []
    print(
        f"| round | fault at | {args.kill} killed when the victim had read "
        "| lost | duplicated | hung | verdict |"
    )
    print("|---:|---:|---:|---|---|---|---|")
    for index in range(args.rounds):
        fraction = rng.uniform(0.05, 0.9) if args.fault_at == "random" else float(args.fault_at)
        row = run_round(
            scratch / str(index),
            elements=args.elements,
            fault_fraction=fraction,
            fault_tolerant=args.fault_tolerant,
            kill=args.kill,
            late=args.late_trainer,
            back_before_drop=args.back_before_drop,
            hold=not args.no_hold,
        )
        rounds.append(row)
        print(
            f"| {index} | {fraction:.2f} | {row.killed_at} | {sum(row.lost.values())} "
            f"| {sum(row.duplicated.values())} | {len(row.hung)} "
            f"| {'broken: ' + json.dumps(row.failed)[:200] if row.broken else 'ok'} |",
            flush=True,
        )
    print(
        f"\n{len(rounds)} rounds, {len(rounds)} kills -9 of a {args.kill}"
        f"{' (and a trainer joining after it)' if args.late_trainer else ''} "
        f"({'fault-tolerant' if args.fault_tolerant else 'plain'} dispatcher): "
        f"lost {sum(sum(r.lost.values()) for r in rounds)}, "
        f"duplicated {sum(sum(r.duplicated.values()) for r in rounds)}, "
        f"hung {sum(len(r.hung) for r in rounds)}, "
        f"broken rounds {sum(r.broken for r in rounds)}"
    )
    if any(r.broken for r in rounds):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
