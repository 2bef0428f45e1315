"""Elastic training under chaos: every element trains in exactly one committed step while
trainers and service workers are killed (``kill -9``) and started at random moments.

Usage (from the repository root)::

    .venv/bin/python benchmarks/elastic_chaos.py [--rounds R] [--elements N] [--seed S]

Each round runs on 127.0.0.1: a fault-tolerant dispatcher (in this process; consumers released
after 1 s of silence, service workers dropped after 2 s), 2 service workers (processes), a
membership store (in this process) and elastic trainers (processes: gloo, one CPU thread each,
an 8 -> 32 -> 1 MLP under ``MultiWorkerMirroredStrategy`` with an ``ElasticClusterResolver``).
The trainers read one shared ``distributed_epoch`` job of ``Dataset.range(N).batch(8)`` with
``acknowledge="on_commit"`` in the hand-written loop of ``docs/fault_tolerance.md``: a step
takes a batch, runs (``strategy.run``: the all-reduce of the gradients), and on return the
trainer calls ``iterator.commit()``. Before ``commit`` the trainer appends ``P <ids>`` to its
log, after it returned ``C <ids>`` (each line flushed and fsynced); a commit refused with
``ConsumerReleasedError`` (the dispatcher released the trainer's consumer: on a loaded machine
its heartbeats stopped for the 1 s timeout) logs ``R <ids>``: the batch went back to the job,
and the consumer joined it again. A step that a membership change aborts keeps its batch and
runs it again after ``strategy.reform``.

A trainer's input is read by a thread, so that a trainer with nothing to read yet (another
holds the last batches, or a killed service worker's split waits for the worker timeout) still
takes part in every collective with an empty batch: a blocked ``next`` never stalls the group.
All trainers stop together once every one's input ended (a ``SUM`` of flags each step).

The driver makes, at seeded random moments of the round's progress, the membership changes
trainers 2 -> 3 -> 1 -> 2 (start, kill, kill, start) and service workers 2 -> 3 -> 1 (start,
kill, kill); a trainer change waits for the group to re-form after the last one (a joiner in
the group; every other trainer in a group without the victim, not only the first to re-form),
so that each is a change of its own.
At the end it counts, over the union of the ``C`` lines:

* **lost**: elements of ``range(N)`` in no ``C`` line, less those in the ``P`` line a killed
  trainer left last (the kill came between ``commit`` and its ``C`` line: committed, unlogged);
* **duplicated**: elements in more than one ``C`` line;
* **redone**: elements of a killed trainer's last ``P`` line that another trainer committed
  (the kill came before ``commit`` returned: the batch went back to the job, the documented
  one-step window where a batch trains twice);
* **released**: batches of ``R`` lines (a live trainer whose consumer the dispatcher released:
  the commit was refused and the batch went back to the job; others commit it);
* **hung**: rounds that did not end within ``--hang-seconds``;
* **steps lost per change**: on each trainer that lived to the end and saw changes, step
  attempts that did not advance its step count, per change it saw (goal: at most 1); the last
  round of the loop, which only finds that every trainer's input ended, is no attempt.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.launcher import Processes
from tests.service.procs import ServiceProcesses

BATCH = 8
FEATURES = 8

TRAINER = """
from benchmarks.elastic_chaos import trainer_main
from tests.launcher import report
report(trainer_main())
"""


class _Fetcher:
    """Reads the next batch in a thread when asked; ``take`` waits for it at most ``wait``
    seconds. Only one ``next`` is in flight, and none while the caller commits: the caller asks
    again only after it committed the batch ``take`` gave."""

    def __init__(self, iterator: Any) -> None:
        self._iterator = iterator
        self._asks: queue.Queue[None] = queue.Queue()
        self._out: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._asked = False
        self.ended = False
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            self._asks.get()
            try:
                self._out.put(("batch", next(self._iterator)))
            except StopIteration:
                self._out.put(("end", None))
                return
            except BaseException as error:  # the trainer raises it
                self._out.put(("error", error))
                return

    def take(self, wait: float) -> Any:
        if self.ended:
            return None
        if not self._asked:
            self._asks.put(None)
            self._asked = True
        try:
            kind, value = self._out.get(timeout=wait)
        except queue.Empty:
            return None
        self._asked = False
        if kind == "error":
            raise value
        if kind == "end":
            self.ended = True
            return None
        return value


def _log(log: Any, kind: str, ids: list[int]) -> None:
    log.write(f"{kind} {json.dumps(ids)}\n")
    log.flush()
    os.fsync(log.fileno())


def _commit(iterator: Any, log: Any, ids: list[int]) -> None:
    """Commits the step that trained on ``ids``, logging ``P`` before and ``C`` once it
    committed; a step whose batch went back to the job (the dispatcher released this
    trainer's consumer: its process was paused past ``client_timeout_ms``) logs ``R``."""
    from feedline.errors import ConsumerReleasedError

    _log(log, "P", ids)
    try:
        iterator.commit()
    except ConsumerReleasedError:
        _log(log, "R", ids)
        return
    _log(log, "C", ids)


def trainer_main() -> dict[str, Any]:
    """One elastic trainer (run in a process by ``run_round``): the environment gives the
    membership store (``FEEDLINE_ELASTIC_STORE``), the service (``TARGET``, ``JOB``), ``N``
    and the log (``LOG``)."""
    import torch

    import feedline.distribute as fdist
    from feedline import service
    from feedline.data import Dataset
    from feedline.distribute.elastic import ElasticClusterResolver
    from feedline.errors import MembershipChangedError

    torch.set_num_threads(1)
    resolver = ElasticClusterResolver(min_workers=1, settle_seconds=0.3, timeout_seconds=60)
    strategy = fdist.MultiWorkerMirroredStrategy(resolver)
    elastic = strategy.elastic
    assert elastic is not None
    torch.manual_seed(0)
    with strategy.scope():
        model = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
        )
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    def replica(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        loss = ((model(x) - y) ** 2).sum() / BATCH
        loss.backward()
        optimizer.step()
        return loss

    dataset = (
        Dataset.range(int(os.environ["N"]))
        .batch(BATCH)
        .apply(
            service.distribute(
                "distributed_epoch",
                os.environ["TARGET"],
                job_name=os.environ["JOB"],
                acknowledge="on_commit",
            )
        )
    )
    pause = float(os.environ.get("STEP_SECONDS", "0"))
    iterator = iter(dataset)
    fetcher = _Fetcher(iterator)
    frequencies = torch.arange(1, FEATURES + 1, dtype=torch.float32) / 100
    step = elastic.step
    # Step attempts made, and those that advanced here (a trainer's own count also jumps to
    # rank 0's when it adopts it at a reform: that is no step of its own).
    attempts = advanced = changes = rolled_back = 0
    held: list[int] | None = None  # the batch of the current step, not committed yet
    with open(os.environ["LOG"], "a") as log:
        _log(log, "G", [elastic.generation.number, elastic.world_size])  # in the group
        while True:
            if held is None:
                batch = fetcher.take(0.2)
                held = None if batch is None else [int(i) for i in batch]
            ids = torch.tensor(held or [], dtype=torch.float32)
            x = torch.sin(ids[:, None] * frequencies)
            y = x.sum(dim=1, keepdim=True).cos()
            before = elastic.committed
            attempts += 1
            try:
                flags = torch.tensor([float(held is not None), float(not fetcher.ended)])
                total = strategy.reduce("SUM", flags, axis=None)
                if total[0].item() == 0 and total[1].item() == 0:
                    attempts -= 1  # this round only found every trainer's input ended
                    break
                strategy.run(replica, (x, y))
            except MembershipChangedError:
                changes += 1
                applied = elastic.committed > before
                advanced += int(applied)
                mine = step + (1 if applied else 0)
                if applied and held is not None:  # the step's all-reduce succeeded here
                    _commit(iterator, log, held)
                    held = None
                step = strategy.reform(mine)
                _log(log, "G", [elastic.generation.number, elastic.world_size])
                rolled_back += max(0, mine - step)
                continue
            step += 1
            advanced += 1
            if held is not None:
                _commit(iterator, log, held)
                held = None
            time.sleep(pause)
    return {
        "attempts": attempts,
        "advanced": advanced,
        "changes": changes,
        "rolled_back": rolled_back,
        "world_size": elastic.world_size,
    }


@dataclass
class Round:
    """What one round found."""

    seed: int
    elements: int
    lost: int = 0
    duplicated: int = 0
    unlogged: int = 0
    released: int = 0
    redone: int = 0
    hung: bool = False
    seconds: float = 0.0
    trainer_changes: int = 0
    worker_changes: int = 0
    steps_lost_per_change: list[float] = field(default_factory=list)
    rolled_back: int = 0
    failed_trainers: list[str] = field(default_factory=list)
    trainers: dict[str, Any] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)


def _read_log(path: Path) -> list[tuple[str, list[int]]]:
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().split("\n"):
        kind, _, ids = line.partition(" ")
        if kind in ("P", "C", "R") and ids:
            with contextlib.suppress(json.JSONDecodeError):  # a line the kill cut
                lines.append((kind, json.loads(ids)))
    return lines


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _committed(logs: list[Path]) -> int:
    return sum(len(ids) for path in logs for kind, ids in _read_log(path) if kind == "C")


def _generation(logs: list[Path]) -> int:
    """The newest generation of the group that a trainer logged joining (its ``G`` lines)."""
    return max((_generation_of(path) for path in logs), default=-1)


def _generation_of(log: Path) -> int:
    """The newest generation of the group that the trainer of ``log`` logged joining."""
    newest = -1
    for line in _text(log).split("\n"):
        if line.startswith("G "):
            with contextlib.suppress(json.JSONDecodeError, IndexError):  # a cut line
                newest = max(newest, int(json.loads(line[2:])[0]))
    return newest


def _wait(what: str, ready: Any, limit: float) -> None:
    end = time.monotonic() + limit
    while not ready():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def run_round(
    seed: int,
    elements: int,
    workdir: Path,
    *,
    hang_seconds: float = 180.0,
    worker_changes: bool = True,
    step_seconds: float = 0.05,
) -> Round:
    """One round: trainers 2 -> 3 -> 1 -> 2 and (``worker_changes``) service workers
    2 -> 3 -> 1, each change at a seeded random point of the committed progress."""
    from feedline import service
    from feedline.distribute.elastic import serve_membership_store

    rng = random.Random(seed)
    row = Round(seed=seed, elements=elements)
    started = time.monotonic()
    store = serve_membership_store("127.0.0.1", 0)
    config = service.DispatcherConfig(
        work_dir=str(workdir / "dispatcher"),
        fault_tolerant_mode=True,
        client_timeout_ms=1000,
        worker_timeout_ms=2000,
    )
    dispatcher = service.DispatchServer(config)
    env = {
        "FEEDLINE_ELASTIC_STORE": f"127.0.0.1:{store.port}",
        "TARGET": dispatcher.target,
        "JOB": f"chaos-{seed}",
        "N": str(elements),
        "STEP_SECONDS": str(step_seconds),
    }
    trainers: dict[str, Processes] = {}
    logs: list[Path] = []
    plan: list[tuple[str, str]] = [
        ("trainer", "start"),
        ("trainer", "kill"),
        ("trainer", "kill"),
        ("trainer", "start"),
    ]
    if worker_changes:
        plan += [("worker", "start"), ("worker", "kill"), ("worker", "kill")]
    # Each change at a random point of the progress; trainer changes keep their order (so
    # does the worker sequence), the two sequences interleave at random.
    points = sorted(rng.uniform(0.05, 0.5) for _ in plan)
    trainer_plan = [p for p in plan if p[0] == "trainer"]
    worker_plan = [p for p in plan if p[0] == "worker"]
    order = trainer_plan + worker_plan
    rng.shuffle(order)
    trainer_iter, worker_iter = iter(trainer_plan), iter(worker_plan)
    schedule = [
        (point, next(trainer_iter) if kind == "trainer" else next(worker_iter))
        for point, (kind, _) in zip(points, order, strict=True)
    ]

    def start_trainer() -> str:
        name = f"t{len(trainers)}"
        log = workdir / f"{name}.log"
        logs.append(log)
        trainers[name] = Processes(TRAINER, [(name, {"LOG": str(log)})], env=env, timeout=600)
        return name

    def alive_trainers() -> list[str]:
        """The trainers running that have been in the group."""
        return [
            n
            for n, p in trainers.items()
            if p.poll(n) is None and "G " in _text(workdir / f"{n}.log")
        ]

    try:
        with ServiceProcesses(timeout=600) as cluster:
            cluster.port = int(dispatcher.target.rsplit(":", 1)[1])
            workers = [cluster.start_worker(), cluster.start_worker()]
            start_trainer()
            start_trainer()
            deadline = started + hang_seconds
            for point, (kind, action) in schedule:
                target = int(point * elements)
                try:
                    _wait(
                        "progress",
                        lambda target=target: _committed(logs) >= target,  # type: ignore[misc]
                        deadline - time.monotonic(),
                    )
                except TimeoutError:
                    row.hung = True
                    break
                time.sleep(rng.uniform(0, 0.3))
                row.events.append(
                    f"{time.monotonic() - started:.1f}s {kind} {action} at {_committed(logs)}"
                )
                if kind == "trainer":
                    if action == "start":
                        joiner = start_trainer()
                        try:  # a change once it is in the group (or the input ended)
                            _wait(
                                "the joiner",
                                lambda joiner=joiner: (
                                    joiner in alive_trainers()  # type: ignore[misc]
                                    or trainers[joiner].poll(joiner) is not None
                                ),
                                deadline - time.monotonic(),
                            )
                        except TimeoutError:
                            row.hung = True
                            break
                    elif alive_trainers():
                        victim = rng.choice(alive_trainers())
                        generation = _generation(logs)
                        trainers[victim].send(victim, signal.SIGKILL)
                        trainers[victim].wait_exit(victim, timeout=30)
                        try:  # the next change once every other one re-formed (or ended),
                            # so that no survivor sees two kills as one change
                            _wait(
                                "the group without the victim",
                                lambda generation=generation: all(
                                    _generation_of(workdir / f"{n}.log") > generation
                                    for n in alive_trainers()
                                ),
                                deadline - time.monotonic(),
                            )
                        except TimeoutError:
                            row.hung = True
                            break
                    row.trainer_changes += 1
                else:
                    if action == "start":
                        workers.append(cluster.start_worker())
                    else:
                        victim = workers.pop(rng.randrange(len(workers)))
                        cluster.send(victim, signal.SIGKILL)
                        cluster.wait_exit(victim, timeout=30)
                    row.worker_changes += 1
            if not row.hung:
                try:
                    _wait(
                        "the trainers to end",
                        lambda: not alive_trainers(),
                        deadline - time.monotonic(),
                    )
                except TimeoutError:
                    row.hung = True
            for name, procs in trainers.items():
                code = procs.poll(name)
                if code not in (None, 0, -signal.SIGKILL):
                    row.failed_trainers.append(f"{name}: {procs.output(name, 'stderr')[-400:]}")
                result = procs.reports().get(name)
                row.trainers[name] = result if result is not None else {"exit": code}
                if result is not None:
                    row.rolled_back += result["rolled_back"]
                    if result["changes"]:
                        lost = (result["attempts"] - result["advanced"]) / result["changes"]
                        row.steps_lost_per_change.append(round(lost, 2))
    finally:
        for procs in trainers.values():
            procs.kill_all()
        dispatcher.stop()
    _count(row, logs, killed=[n for n, p in trainers.items() if p.poll(n) == -signal.SIGKILL])
    row.seconds = round(time.monotonic() - started, 1)
    return row


def _count(row: Round, logs: list[Path], killed: list[str]) -> None:
    committed: list[int] = []
    unfinished: list[int] = []  # a killed trainer's last P line without its C line
    for path in logs:
        lines = _read_log(path)
        committed += [i for kind, ids in lines if kind == "C" for i in ids]
        row.released += sum(kind == "R" for kind, _ in lines)
        if path.stem in killed and lines and lines[-1][0] == "P":
            unfinished += lines[-1][1]
    seen = set(committed)
    row.duplicated = len(committed) - len(seen)
    missing = set(range(row.elements)) - seen
    row.unlogged = len(missing & set(unfinished))
    row.lost = len(missing) - row.unlogged
    row.redone = len(set(unfinished) & seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--elements", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-seconds", type=float, default=240.0)
    parser.add_argument("--no-worker-changes", action="store_true")
    args = parser.parse_args()
    rows = []
    for index in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="feedline-elastic-chaos-") as workdir:
            row = run_round(
                args.seed + index,
                args.elements,
                Path(workdir),
                hang_seconds=args.hang_seconds,
                worker_changes=not args.no_worker_changes,
            )
        rows.append(row)
        print(json.dumps(asdict(row)), flush=True)
    steps = [s for row in rows for s in row.steps_lost_per_change]
    summary = {
        "rounds": len(rows),
        "elements_per_round": args.elements,
        "lost": sum(r.lost for r in rows),
        "duplicated": sum(r.duplicated for r in rows),
        "unlogged": sum(r.unlogged for r in rows),
        "redone": sum(r.redone for r in rows),
        "released": sum(r.released for r in rows),
        "hung": sum(r.hung for r in rows),
        "failed_trainers": sum(len(r.failed_trainers) for r in rows),
        "trainer_changes": sum(r.trainer_changes for r in rows),
        "worker_changes": sum(r.worker_changes for r in rows),
        "steps_lost_per_change_max": max(steps, default=0.0),
        "steps_lost_per_change_mean": round(sum(steps) / len(steps), 2) if steps else 0.0,
        "rolled_back_steps": sum(r.rolled_back for r in rows),
        "load_average": os.getloadavg(),
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
