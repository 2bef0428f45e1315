"""Seed 001 (``tf.data.experimental.service.distribute``, the Chinese page): every code block.

Blocks (5): 1 is ``distribute``'s signature, checked against feedline's; 2-4 run as they are
(with ``import feedline as tf``) and their printed outputs are compared through ``normalise``
(rules in ``_support``); 5, two training processes sharing a job by ``job_name``, runs in two
processes started by ``tests/launcher.py`` against one dispatcher and one worker. The page says
its block 5 output is "one possible outcome", so what is compared is what every outcome shares:
at each of the three iterations, the two processes' lists together hold 0..4 once each.
"""

from __future__ import annotations

import ast
import inspect
import re

import pytest

from tests import launcher
from tests.seeds._support import PAGE_ENV, check_snippet, expected, normalise, run_page

# The page's usage block, verbatim.
SIGNATURE = """
tf.data.experimental.service.distribute(
    processing_mode, service, job_name=None, consumer_index=None,
    num_consumers=None, max_outstanding_requests=None, data_transfer_protocol=None,
    compression='AUTO', target_workers='AUTO'
)
"""

SNIPPETS = [
    ("001_00", "import feedline as tf  # the page's blocks assume it\n"),
    (
        "001_02",
        """
dispatcher = tf.data.experimental.service.DispatchServer()
dispatcher_address = dispatcher.target.split("://")[1]
# Start two workers
workers = [
    tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(
            dispatcher_address=dispatcher_address)) for _ in range(2)
]
dataset = tf.data.Dataset.range(10)
dataset = dataset.apply(tf.data.experimental.service.distribute(
    processing_mode="parallel_epochs", service=dispatcher.target))
print(sorted(list(dataset.as_numpy_iterator())))
""",
    ),
    (
        "001_03",
        """
dispatcher = tf.data.experimental.service.DispatchServer()
dispatcher_address = dispatcher.target.split("://")[1]
workers = [
    tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(
            dispatcher_address=dispatcher_address)) for _ in range(2)
]
dataset = tf.data.Dataset.range(10)
dataset = dataset.apply(tf.data.experimental.service.distribute(
    processing_mode="distributed_epoch", service=dispatcher.target))
print(sorted(list(dataset.as_numpy_iterator())))
""",
    ),
    (
        "001_04",
        """
dispatcher = tf.data.experimental.service.DispatchServer()
dispatcher_address = dispatcher.target.split("://")[1]
workers = [
    tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(
            dispatcher_address=dispatcher_address)) for _ in range(2)
]
dataset = tf.data.Dataset.range(5)
dataset = dataset.map(lambda x:x*x)
dataset = dataset.apply(
   tf.data.experimental.service.distribute("parallel_epochs",
                                           dispatcher.target))
dataset = dataset.map(lambda x:x+1)
print(sorted(list(dataset.as_numpy_iterator())))
""",
    ),
]

# Block 5, run by each of two training processes; the dispatcher the test started stands for
# the page's "localhost:5000".
SHARED_JOB = """
import os
import feedline as tf
from tests.launcher import report

DISPATCHER = os.environ["SEED_DISPATCHER"]

range5_dataset = tf.data.Dataset.range(5)
dataset = range5_dataset.apply(tf.data.experimental.service.distribute(
    "parallel_epochs", DISPATCHER, job_name="my_job_name"))  # seed: "localhost:5000"
for iteration in range(3):
  print(list(dataset))

report("done")
"""


@pytest.fixture(scope="module")
def page() -> dict:
    return run_page(SNIPPETS)


@pytest.mark.parametrize("name", [name for name, _ in SNIPPETS])
def test_snippet(page: dict, name: str) -> None:
    check_snippet(page, name)


def test_distribute_signature() -> None:  # block 1
    import feedline as tf

    call = ast.parse(SIGNATURE.strip()).body[0].value  # type: ignore[attr-defined]
    seed = [(arg.id, inspect.Parameter.empty) for arg in call.args]
    seed += [(kw.arg, ast.literal_eval(kw.value)) for kw in call.keywords]
    ours = inspect.signature(tf.data.experimental.service.distribute).parameters.values()
    assert [(p.name, p.default) for p in ours][: len(seed)] == seed


def _iterations(stdout: str) -> list[list[int]]:
    """One list of ints per printed line, whatever the element reprs."""
    return [
        [int(n) for n in re.findall(r"-?\d+", normalise(line))]
        for line in stdout.splitlines()
        if line.strip()
    ]


def _every_element_once(first: list[list[int]], second: list[list[int]]) -> bool:
    return len(first) == len(second) == 3 and all(
        sorted(a + b) == [0, 1, 2, 3, 4] for a, b in zip(first, second, strict=True)
    )


def test_the_page_outcome_passes_the_check() -> None:
    assert _every_element_once(
        _iterations(expected("001_05_process_1")), _iterations(expected("001_05_process_2"))
    )


def test_shared_job_across_two_processes() -> None:  # block 5
    import feedline as tf

    service = tf.data.experimental.service
    dispatcher = service.DispatchServer()
    worker = service.WorkerServer(
        service.WorkerConfig(dispatcher_address=dispatcher.target.split("://")[1])
    )
    try:
        port = dispatcher.target.rsplit(":", 1)[1]
        results = launcher.run(
            SHARED_JOB,
            [("process:1", {}), ("process:2", {})],
            timeout=60,
            env={**PAGE_ENV, "SEED_DISPATCHER": f"localhost:{port}"},
        )
    finally:
        worker.stop()
        dispatcher.stop()
    first, second = (_iterations(results[name].stdout) for name in ("process:1", "process:2"))
    assert _every_element_once(first, second), (first, second)
