"""The same global batches through kills and joins: rounds of an elastic job reading a
``GlobalBatches``, checked step by step against one reader's global batches.

Usage (from the repository root)::

    PYTHONPATH=src .venv/bin/python benchmarks/global_batches_chaos.py [--rounds 10]
        [--input rows|stream|saved] [--seed 1]

Each round, on 127.0.0.1: a membership store (in this process) and 3 worker processes (gloo,
the small MLP of ``tests/distribute/elastic_job.py``, ``BackupAndRestore.run`` over
``elastic_job.global_input``: 240 ids, global batch 24, by index or as a shuffled stream). At
seeded points of the progress the driver kills a random worker with kill -9, lets the others
train a few steps, starts a new worker, and does so twice (3 -> 2 -> 3 -> 2 -> 3 workers), then
stops the job. With ``--input saved`` the workers read a snapshot that ``distributed_save``
writes meanwhile on 2 service workers (a dispatcher in this process, ``feedline worker``
processes; each id takes ``--save-pause-ms`` to make): 2-8 s (seeded) after the trainers
started, while the save runs, the driver kills a random service worker with kill -9 and starts
another, so the trainers read global batches whose streams a worker died writing. Each
committed step's global batch is read from what the group trained on (the all-reduced gradient
of the ``seen`` parameter, logged by every worker whose step committed).

Per round: the steps committed; **wrong**, steps whose logged global batch is not the
reference's (one reader's ``local_batch(step, 0, 1)``) or differs between two logs of it;
**skipped**, step numbers missing below the last; **redone**, steps a worker logged twice (it
committed the step, then the group, which had not, ran it again after a change: the same
global batch both times); and **hung**, a round that did not end within ``--round-seconds``.
The goal: 0 wrong, 0 skipped, 0 hung.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write_results
from tests.distribute import elastic_job
from tests.launcher import Processes
from tests.service.procs import ServiceProcesses

from feedline import service
from feedline.data.ops._snapshot_format import is_finished
from feedline.distribute.elastic import serve_membership_store

WORKER = """
import os
from tests.launcher import report
from tests.distribute.elastic_job import main
report(main(os.environ["FEEDLINE_TEST_NAME"]))
"""


def _wait(what: str, ready: Any, groups: list[Processes], deadline: float) -> None:
    while not ready():
        for group in groups:
            failed = [n for n in group.names if group.poll(n) not in (None, 0, -9)]
            if failed:
                raise RuntimeError(f"{failed} failed while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def _check(directory: Path, reference: list[list[int]]) -> dict[str, Any]:
    logged: dict[int, list[list[int]]] = {}
    redone = 0
    for steps in elastic_job.logged_steps(directory).values():
        for step, ids in steps:
            logged.setdefault(step, []).append(ids)
        redone += len(steps) - len({step for step, _ in steps})
    last = max(logged, default=-1)
    wrong = [
        s
        for s, batches in logged.items()
        if s >= len(reference) or any(ids != reference[s] for ids in batches)
    ]
    return {
        "steps": last + 1,
        "wrong": len(wrong),
        "skipped": len(set(range(last + 1)) - set(logged)),
        "redone": redone,
    }


def run_round(
    seed: int, kind: str, round_seconds: float, work: Path, save_pause_s: float
) -> dict[str, Any]:
    rng = random.Random(seed)
    store = serve_membership_store("127.0.0.1", 0)
    snapshot = str(work / "snapshot")
    env = elastic_job.job_env(work, store.port, INPUT=kind, SNAPSHOT=snapshot)
    deadline = time.monotonic() + round_seconds
    with contextlib.ExitStack() as stack:
        savers: list[str] = []
        cluster = None
        if kind == "saved":
            cluster = stack.enter_context(ServiceProcesses(timeout=round_seconds + 60))
            config = service.DispatcherConfig(
                port=cluster.port, worker_timeout_ms=1000, job_gc_check_interval_ms=100
            )
            stack.enter_context(service.DispatchServer(config))
            savers += [cluster.start_worker() for _ in range(2)]
            service.distributed_save(elastic_job.saved_ids(save_pause_s), snapshot, cluster.address)
        row = _trainers(rng, env, work, round_seconds, deadline, cluster, savers)
    reference = elastic_job.reference_batches(kind, 3000, snapshot)
    del store
    return {"seed": seed, **row, **_check(work, reference)}


def _trainers(
    rng: random.Random,
    env: dict[str, str],
    work: Path,
    round_seconds: float,
    deadline: float,
    cluster: ServiceProcesses | None,
    savers: list[str],
) -> dict[str, Any]:
    live = ["w0", "w1", "w2"]
    groups = [Processes(WORKER, [(n, env) for n in live], timeout=round_seconds + 60)]
    events: list[str] = []
    started = time.monotonic()
    hung = False
    saving = cluster is not None
    try:

        def group_of(name: str) -> Processes:
            return next(g for g in groups if name in g.names)

        def steps(name: str) -> int:
            return elastic_job.read_progress(work, name)["step"]

        if cluster is not None:
            time.sleep(rng.uniform(2, 8))
            saver = rng.choice(savers)
            cluster.send(saver, signal.SIGKILL)
            savers.remove(saver)
            savers.append(cluster.start_worker())
            finished = is_finished(str(work / "snapshot"))
            events.append(
                f"{time.monotonic() - started:.1f}s kill service worker {saver} "
                f"({'after' if finished else 'during'} the save, trainers at step "
                f"{max(steps(n) for n in live)})"
            )
        _wait("3 workers", lambda: all(steps(n) >= 2 for n in live), groups, deadline)
        for change in range(2):
            # a first kill while the save is written, in its first pass (10 steps)
            at = max(steps(n) for n in live) + rng.randint(*(1, 5) if saving else (2, 25))
            _wait(f"step {at}", lambda at=at: max(steps(n) for n in live) >= at, groups, deadline)
            victim = rng.choice(live)
            group_of(victim).send(victim, signal.SIGKILL)
            saving = saving and not is_finished(str(work / "snapshot"))
            live.remove(victim)
            killed_at = max(steps(n) for n in live)
            during = " during the save" if saving else ""
            events.append(f"{time.monotonic() - started:.1f}s kill {victim} at {killed_at}{during}")
            until = killed_at + rng.randint(1, 10)
            _wait("survivors", lambda u=until: all(steps(n) >= u for n in live), groups, deadline)
            joiner = f"j{change}"
            groups.append(Processes(WORKER, [(joiner, env)], timeout=round_seconds + 60))
            live.append(joiner)
            _wait(
                f"{joiner} joined",
                lambda j=joiner, u=until: (
                    elastic_job.read_progress(work, j)["world"] == 3 and steps(j) >= u
                ),
                groups,
                deadline,
            )
            events.append(f"{time.monotonic() - started:.1f}s {joiner} in at {steps(joiner)}")
        (work / "stop").write_text("")
        for group in groups:
            group.wait()
    except (TimeoutError, RuntimeError) as error:
        hung = True
        events.append(f"ended early: {error}")
    finally:
        for group in reversed(groups):
            group.__exit__(None, None, None)
    return {"hung": hung, "seconds": round(time.monotonic() - started, 1), "events": events}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--input", choices=["rows", "stream", "saved"], default="rows")
    parser.add_argument("--save-pause-ms", type=float, default=250.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--round-seconds", type=float, default=240.0)
    args = parser.parse_args()
    rows = []
    for index in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="global-batches-chaos-") as work:
            row = run_round(
                args.seed + index,
                args.input,
                args.round_seconds,
                Path(work),
                args.save_pause_ms / 1000,
            )
        print(json.dumps(row), flush=True)
        rows.append(row)
    summary = {
        "rounds": len(rows),
        "input": args.input,
        "steps": sum(r["steps"] for r in rows),
        "wrong": sum(r["wrong"] for r in rows),
        "skipped": sum(r["skipped"] for r in rows),
        "hung": sum(r["hung"] for r in rows),
        "redone": sum(r["redone"] for r in rows),
        "load_average": os.getloadavg(),
    }
    print(json.dumps(summary, indent=2))
    write_results("global_batches_chaos", {"summary": summary, "rounds": rows})


if __name__ == "__main__":
    main()
