"""Shared jobs (``job_name``) with consumers in separate processes: the job's elements are
shared between them, and a consumer that dies takes with it only what it held.

The servers and the consumers are real processes (``tests/service/procs.py`` on the one
launcher); the consumers report what they read as JSON. Every wait has a timeout.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from benchmarks.shared_jobs import run_trials

from tests.service.procs import ServiceProcesses

pytestmark = pytest.mark.timeout(180)


def test_two_processes_share_the_seeds_job() -> None:
    rounds = run_trials(trials=8)  # the seed's example, 8 times: 24 rounds
    for first, second in rounds:
        assert sorted(first + second) == [0, 1, 2, 3, 4], (first, second)
    # The seed's outcome: both processes get elements in most rounds.
    both = sum(bool(first) and bool(second) for first, second in rounds)
    assert both >= 0.6 * len(rounds), [(len(a), len(b)) for a, b in rounds]


# Two consumers of one shared job; each writes every element it returns as a line, so that
# what a killed consumer had returned is known.
KILLED_CONSUMER = """
import os, sys, time
from feedline.data import Dataset
from feedline.service import distribute
from tests.launcher import report

dataset = Dataset.range(int(os.environ["ELEMENTS"])).apply(
    distribute(
        "distributed_epoch",
        os.environ["FEEDLINE_TARGET"],
        job_name="shared",
        max_outstanding_requests=int(os.environ["OUTSTANDING"]),
    )
)
pause = float(os.environ["PAUSE"])
with open(os.environ["OUT"], "w", buffering=1) as out:
    for x in dataset:
        out.write(f"{int(x)}\\n")
        time.sleep(pause)
report("done")
"""


def test_a_killed_consumer_of_a_shared_job_loses_only_what_it_held(tmp_path: Path) -> None:
    elements, outstanding = 4000, 32
    with ServiceProcesses() as cluster:
        cluster.start_dispatcher()
        for _ in range(2):
            cluster.start_worker()
        common = {"ELEMENTS": str(elements), "OUTSTANDING": str(outstanding)}
        files = {name: tmp_path / f"{name}.txt" for name in ("doomed", "survivor")}
        consumers = cluster.run(
            KILLED_CONSUMER,
            [
                ("doomed", {**common, "OUT": str(files["doomed"]), "PAUSE": "0.0005"}),
                ("survivor", {**common, "OUT": str(files["survivor"]), "PAUSE": "0.001"}),
            ],
            timeout=120,
        )
        deadline = time.monotonic() + 60
        while not files["doomed"].exists() or len(files["doomed"].read_text()) < 2000:
            assert time.monotonic() < deadline, "the consumers did not start reading"
            time.sleep(0.05)
        consumers.send("doomed", signal.SIGKILL)
        results = consumers.wait()
    assert results["survivor"].ok, results["survivor"].describe()
    read = {name: [int(x) for x in path.read_text().split()] for name, path in files.items()}
    seen = read["doomed"] + read["survivor"]
    assert len(seen) == len(set(seen))  # never twice
    lost = elements - len(seen)
    # What the killed consumer held (received, not yet returned) is lost: at most its
    # max_outstanding_requests. The kill may also land between next() returning an element
    # and the line that records it (the loop measures what was written, not what was
    # returned): one element more.
    assert 0 <= lost <= outstanding + 1, json.dumps({"lost": lost})
