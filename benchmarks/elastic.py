"""Elastic ``MultiWorkerMirroredStrategy``: steps lost per membership change, and how soon a
joiner trains.

Usage (from the repository root)::

    .venv/bin/python benchmarks/elastic.py [--changes N] [--step-seconds S]

A membership store (in this process) and 3 worker processes on 127.0.0.1 (gloo, one CPU
replica and one compute thread each) train the small MLP of ``tests/distribute/elastic_job.py``
(8 -> 32 -> 1, Adam, global batch 24) with the hand-written loop of ``docs/fault_tolerance.md``,
sleeping ``--step-seconds`` between steps. The driver then makes ``--changes`` pairs of
membership changes: it kills a worker with ``kill -9`` (a loss) and, once the others trained 10
steps without it, starts a new worker (a join), and so on. At the end every worker reports:

* **steps lost per change**: on each worker that saw changes, the step attempts that did not
  advance its step count (``attempts - (last step - first step)``), divided by the changes it
  saw (goal: at most 1). A loss costs the step in flight; a join costs one attempt that is
  refused at the start of ``strategy.run``, before the step computes anything;
* **survivor pause**: from the ``MembershipChangedError`` to the survivor's next committed step
  (the round with its settle window, the state broadcast, the step redone; for a join, also
  the joiner's way from its admission to its first step); the time gloo or the heartbeat
  (3 s without a beat, for a peer that died between collectives) took to notice a loss comes
  before it and is not counted;
* **joiner, admitted to first committed step**: from the end of the strategy's construction
  (the round that admitted it closed and the group formed) to its first committed step, which
  includes making its model and optimizer and receiving parameters and optimizer state from
  rank 0 (goal: <= 1 s);
* **joiner, start to admission**: from the start of the joiner's ``main`` (interpreter and
  ``import torch`` aside) to its admission: the warm-up of torch's lazily loaded parts, the
  wait for the group to reach a step boundary, the round.

The machine's load average is printed with the figures: on a loaded machine every figure
grows, the ratio of survivor pause to restart less.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.distribute.elastic_job import job_env
from tests.distribute.elastic_job import read_progress as _progress
from tests.launcher import Processes

from feedline.distribute.elastic import serve_membership_store

WORKER = """
import os
from tests.launcher import report
from tests.distribute.elastic_job import main
report(main(os.environ["FEEDLINE_TEST_NAME"]))
"""


def _wait(what: str, ready: Any, limit: float = 180.0) -> None:
    end = time.monotonic() + limit
    while not ready():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def run(changes: int, step_seconds: float) -> dict[str, Any]:
    store = serve_membership_store("127.0.0.1", 0)
    directory = Path(tempfile.mkdtemp(prefix="feedline-elastic-bench-"))
    env = job_env(directory, store.port, MIN_WORKERS="2", STEP_SECONDS=str(step_seconds))
    groups: list[tuple[Processes, str]] = []
    alive = ["w0", "w1", "w2"]
    first = Processes(WORKER, [(n, {}) for n in alive], env=env, timeout=1800)
    groups += [(first, n) for n in alive]
    try:
        _wait("3 workers", lambda: all(_progress(directory, n)["world"] == 3 for n in alive))
        for change in range(changes):
            victim = alive.pop(change % len(alive))
            owner = next(g for g, n in groups if n == victim)
            at = max(_progress(directory, n)["step"] for n in alive)
            owner.send(victim, signal.SIGKILL)
            _wait(
                "the survivors",
                lambda at=at: all(  # type: ignore[misc]
                    _progress(directory, n)["world"] == 2
                    and _progress(directory, n)["step"] > at + 10
                    for n in alive
                ),
            )
            joiner = f"j{change}"
            procs = Processes(WORKER, [(joiner, {})], env=env, timeout=1800)
            groups.append((procs, joiner))
            alive.append(joiner)
            _wait(
                "the joiner",
                lambda joiner=joiner: (
                    all(  # type: ignore[misc]
                        _progress(directory, n)["world"] == 3 for n in alive
                    )
                    and _progress(directory, joiner)["step"] > 0
                ),
            )
        (directory / "stop").write_text("")
        results: dict[str, Any] = {}
        for procs in {id(g): g for g, _ in groups}.values():
            for name, result in procs.wait().items():
                if result.result is not None:
                    results[name] = result.result
    finally:
        for procs in {id(g): g for g, _ in groups}.values():
            procs.kill_all()
    return results


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    lost, pauses_loss, pauses_join = [], [], []
    for result in results.values():
        for change in result["changes"]:
            if change.get("resumed_s") is None:
                continue  # another change came before a step committed
            (pauses_loss if change["reason"] == "peer_lost" else pauses_join).append(
                change["resumed_s"]
            )
        if result["changes"]:
            advanced = int(result["step"]) - int(result["first_step"])
            lost.append((int(result["attempts"]) - advanced) / len(result["changes"]))
    joiners = [r for n, r in results.items() if n.startswith("j")]
    return {
        "steps_lost_per_change_max": max(lost, default=0.0),
        "steps_lost_per_change_mean": statistics.fmean(lost) if lost else 0.0,
        "survivor_pause_loss_s": statistics.median(pauses_loss) if pauses_loss else None,
        "survivor_pause_join_s": statistics.median(pauses_join) if pauses_join else None,
        "joiner_first_commit_s": [round(r["first_commit_s"], 3) for r in joiners],
        "joiner_start_to_admission_s": [round(r["startup_s"], 3) for r in joiners],
        "final_steps": sorted({r["step"] for r in results.values()}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=3, help="kill-then-join pairs")
    parser.add_argument("--step-seconds", type=float, default=0.02)
    args = parser.parse_args()
    results = run(args.changes, args.step_seconds)
    summary = summarise(results)
    summary["load_average"] = os.getloadavg()
    print(json.dumps(summary, indent=2))
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    path = out / f"elastic-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"summary": summary, "workers": results}, indent=2))
    print(f"raw results: {path}")


if __name__ == "__main__":
    main()
