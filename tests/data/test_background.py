"""Tests of feedline/data/ops/_background.py: the producer threads behind prefetch, parallel
interleave and the parallel file readers, at interpreter exit.

A script that exits while a producer thread still runs a map function used to abort in about
one run in eight with NumPy, and in every run with PyTorch: the daemon thread was inside the
library when the interpreter tore down ("terminate called without an active exception"). Each
test runs such a script in several fresh processes (``tests.launcher``) and checks that every
one exits with code 0 and prints nothing on stderr.
"""

from __future__ import annotations

import pytest

from tests.launcher import run

pytestmark = pytest.mark.timeout(60)

# Reads three elements of the pipeline named by $PIPELINE and exits with its producer threads
# busy in PyTorch; with $READER_THREAD, a non-daemon thread of the script reads on after the
# main thread returned.
EXITING_SCRIPT = """
import os, threading
import torch
from feedline.data import Dataset
from tests.launcher import report

def work(x):
    t = torch.randn(128, 128)
    for _ in range(4):
        t = t @ t
        t = t / t.norm()
    return t.numpy()

pipelines = {
    "prefetch": lambda: Dataset.range(10**6).map(work).prefetch(16),
    "interleave": lambda: Dataset.range(100).interleave(
        lambda i: Dataset.range(10**6).map(work).prefetch(4),
        cycle_length=3,
        num_parallel_calls=3,
        deterministic=False,
    ),
    "finite": lambda: Dataset.range(30).map(work).prefetch(8).map(lambda x: x.sum()).prefetch(4),
}
iterator = iter(pipelines[os.environ["PIPELINE"]]())
read = [next(iterator) for _ in range(3)]
if os.environ.get("READER_THREAD"):
    def read_on():
        read.extend(iterator)
        report(len(read))
    threading.Thread(target=read_on, name="reader").start()
else:
    report(len(read))
"""

RUNS = 2  # with PyTorch busy in the thread, every run aborted before the exit hook


def _exit_cleanly(pipeline: str, reader_thread: bool = False) -> list[object]:
    env = {"PIPELINE": pipeline, "READER_THREAD": "1" if reader_thread else ""}
    results = run(
        EXITING_SCRIPT,
        [(f"run{i}", env) for i in range(RUNS)],
        timeout=45,
        check=False,
    )
    for result in results.values():
        assert result.ok and not result.stderr.strip(), result.describe()
    return [result.result for result in results.values()]


@pytest.mark.parametrize("pipeline", ["prefetch", "interleave"])
def test_a_script_exiting_with_producer_threads_busy_exits_cleanly(pipeline: str) -> None:
    assert _exit_cleanly(pipeline) == [3] * RUNS


def test_a_thread_still_reading_at_exit_reads_to_the_end(pipeline: str = "finite") -> None:
    # The producers stop when the main thread returns; the script's own thread still gets
    # every element, pulled in that thread.
    assert _exit_cleanly(pipeline, reader_thread=True) == [30] * RUNS
