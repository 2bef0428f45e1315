"""The seed's shared-job example with two real processes: how are the elements split?

Usage (from the repository root)::

    .venv/bin/python benchmarks/shared_jobs.py [--trials 20]

The seed's example: with one worker, two training processes iterate
``Dataset.range(5).apply(distribute("parallel_epochs", ..., job_name=...))`` three times and
print ``list(dataset)``; each job's elements are shared first come, first served. Here a
``feedline dispatcher``, a ``feedline worker`` and two consumer processes run it ``--trials``
times (a new job name each time), both processes released by a wall-clock barrier at each trial,
so that they start within a few milliseconds of each other. The output gives, for every round
(trial and iteration), how many of the five elements each process printed, and a count of each
split. ``tests/service/test_shared_jobs.py`` runs a short version.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.service.procs import ServiceProcesses  # noqa: E402

SEED_CONSUMER = """
import json, os, pathlib, time
from feedline.data import Dataset
from feedline.service import distribute
from tests.launcher import report

target = os.environ["FEEDLINE_TARGET"]
# The barrier: both processes start their first trial a second after the later of them
# was ready (both read the same two file times), then one each PERIOD seconds.
ready = pathlib.Path(os.environ["READY"])
(ready / os.environ["NAME"]).touch()
deadline = time.time() + 60
while len(list(ready.iterdir())) < 2:
    if time.time() > deadline:
        raise SystemExit("the other consumer did not start within 60 s")
    time.sleep(0.01)
start = max(path.stat().st_mtime for path in ready.iterdir()) + 1.0
period = float(os.environ["PERIOD"])
trials = []
for trial in range(int(os.environ["TRIALS"])):
    dataset = Dataset.range(5).apply(
        distribute("parallel_epochs", target, job_name=f"trial{trial}")
    )
    time.sleep(max(0.0, start + trial * period - time.time()))
    trials.append([[int(x) for x in dataset] for _ in range(3)])   # print(list(dataset)) x 3
report(trials)
"""


def run_trials(trials: int, period: float = 1.5) -> list[tuple[list[int], list[int]]]:
    """The seed's example ``trials`` times: for every round, what each process printed.

    Raises:
      RuntimeError: a consumer process failed (its output in the message).
    """
    with (
        ServiceProcesses(timeout=60 + trials * period * 2) as cluster,
        tempfile.TemporaryDirectory(prefix="feedline-ready-") as ready,
    ):
        cluster.start_dispatcher()
        cluster.start_worker()
        env = {"READY": ready, "PERIOD": str(period), "TRIALS": str(trials)}
        consumers = cluster.run(
            SEED_CONSUMER, [(name, {**env, "NAME": name}) for name in ("first", "second")]
        )
        results = consumers.wait()
    for result in results.values():
        if not result.ok:
            raise RuntimeError(result.describe())
    first, second = results["first"].result, results["second"].result
    return [(first[t][i], second[t][i]) for t in range(trials) for i in range(3)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    rounds = run_trials(args.trials)
    splits = collections.Counter((len(a), len(b)) for a, b in rounds)
    for index, (a, b) in enumerate(rounds):
        print(f"trial {index // 3} iteration {index % 3}: first {a}, second {b}")
    both = sum(bool(a) and bool(b) for a, b in rounds)
    complete = sum(sorted(a + b) == [0, 1, 2, 3, 4] for a, b in rounds)
    print(f"\n{len(rounds)} rounds; each element once in {complete}; both got elements in {both}")
    print("| first, second | rounds |\n|---|---:|")
    for split, count in sorted(splits.items(), key=lambda item: -item[1]):
        print(f"| {split[0]}, {split[1]} | {count} |")


if __name__ == "__main__":
    main()
