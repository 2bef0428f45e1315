"""``ClusterCoordinator`` with real worker processes (``feedline server``) and a chief process:
scheduling, per-worker datasets and values, errors, and a worker killed with SIGKILL."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from feedline.distribute import ParameterServerStrategy
from feedline.distribute.cluster_resolver import ClusterSpec, SimpleClusterResolver
from feedline.distribute.coordinator import ClusterCoordinator
from feedline.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from tests import launcher
from tests.distribute.parameter_server._cluster import chief_strategy, only, ps_here, servers

CHIEF = """
import os, threading, time, torch
from pathlib import Path
import feedline as tf
from feedline.distribute.coordinator import ClusterCoordinator, PerWorkerValues
from tests.launcher import report

folder = Path(os.environ["FEEDLINE_TEST_RESULT_DIR"])
strategy = tf.distribute.ParameterServerStrategy(connect_timeout=60)
coordinator = ClusterCoordinator(strategy)
with strategy.scope():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

# Element i of worker w's dataset is 10 * i + w.
per_worker = coordinator.create_per_worker_dataset(
    lambda context: tf.data.Dataset.range(10**6).map(lambda i: 10 * i + context.input_pipeline_id))
iterator = iter(per_worker)

def read(iterator, pause=0.0):
    time.sleep(pause)
    value = int(next(iterator))
    return [value % 10, value // 10]  # [worker, position]
"""

BASICS = (
    CHIEF
    + """
results = {"plain": coordinator.schedule(lambda: 40 + 2).fetch()}
# As in TensorFlow, one coordinator per strategy.
results["one_per_strategy"] = ClusterCoordinator(strategy) is coordinator

names = PerWorkerValues(["zero", "one"])
def read_named(iterator, name):
    return read(iterator, 0.05) + [name]
got = [coordinator.schedule(read_named, args=(iterator, names)) for _ in range(12)]
coordinator.join()
got = [value.fetch() for value in got]
results["pairs"] = sorted({(w, name) for w, _, name in got})
results["positions"] = {w: sorted(p for v, p, _ in got if v == w) for w in (0, 1)}

# As the seed does it: the strategy's distribute_datasets_from_function, made on each worker.
def dataset_fn(input_context):
    dataset = tf.data.Dataset.from_tensor_slices(["a", "c", "e"]).repeat()
    return dataset.batch(input_context.get_per_replica_batch_size(4))
seeded = iter(coordinator.create_per_worker_dataset(
    lambda: strategy.distribute_datasets_from_function(dataset_fn)))
first_batch = coordinator.schedule(lambda it: next(it), args=(seeded,)).fetch()
results["seed"] = [x.decode() for x in first_batch.tolist()]

def train_step():
    optimizer.zero_grad()
    loss = (model(torch.ones(2)) - 1.0).square().sum()
    loss.backward()
    optimizer.step()
    return float(loss)
losses = [coordinator.schedule(train_step) for _ in range(20)]
coordinator.join()
results["losses"] = [loss.fetch() for loss in losses]

def boom():
    raise ValueError("boom on the worker")
failed = coordinator.schedule(boom)
try:
    coordinator.join()
except ValueError as error:
    results["error"] = [str(error), "\\n".join(error.__notes__)]
try:
    failed.fetch()
except ValueError as error:
    results["fetch_error"] = str(error)
coordinator.join()  # raised once, then cleared

lock = threading.Lock()
def uses_lock():
    return lock.locked()
try:
    coordinator.schedule(uses_lock)
except tf.errors.InvalidArgumentError as error:
    results["unpicklable"] = str(error)

plain = torch.nn.Linear(2, 1)
coordinator.schedule(lambda: plain(torch.ones(2)))
try:
    coordinator.join()
except tf.errors.FailedPreconditionError as error:
    results["outside_scope"] = str(error)
results["done"] = coordinator.done()

def broken_dataset_fn():
    raise KeyError("no data here")
broken = iter(coordinator.create_per_worker_dataset(broken_dataset_fn))
try:
    coordinator.schedule(lambda it: next(it), args=(broken,))
    coordinator.join()
except KeyError as error:
    results["dataset_error"] = [str(error), error.__notes__[0].split(";")[0]]
report(results)
"""
)


def test_schedule_fetch_join_per_worker_values_and_errors() -> None:
    cluster = launcher.tf_config_envs({"chief": 1, "worker": 2, "ps": 1})
    with ps_here(cluster), servers(only(cluster, "worker:0", "worker:1"), wait=False):
        results = launcher.run(BASICS, only(cluster, "chief:0"), timeout=120)["chief:0"].result
    assert results["plain"] == 42 and results["one_per_strategy"] is True
    # Each worker got its own element of the PerWorkerValues and read its own dataset in order.
    assert results["pairs"] == [[0, "zero"], [1, "one"]]
    for positions in results["positions"].values():
        assert positions == list(range(len(positions)))
    assert sum(map(len, results["positions"].values())) == 12
    assert results["seed"] == ["a", "c", "e", "a"]
    # Steps run asynchronously and pull the parameters when they start, so the first scheduled
    # step may run last; the first step to run sees the initial parameters, the last ones a
    # trained model.
    losses = results["losses"]
    assert len(losses) == 20 and max(losses) > 0
    assert min(losses) < max(losses) / 10
    message, notes = results["error"]
    assert message == "boom on the worker" and results["fetch_error"] == message
    assert notes.startswith("raised on worker ") and "the remote traceback:" in notes
    assert notes.endswith(", in boom\nValueError: boom on the worker")
    assert "global 'lock', a _thread.lock, does not pickle" in results["unpicklable"]
    assert (
        "Linear has parameters ['weight', 'bias'] made outside the scope"
        in results["outside_scope"]
    )
    assert results["done"] is True
    message, where = results["dataset_error"]
    assert message == "'no data here'" and where.startswith("raised on worker ")


KILL = (
    CHIEF
    + """
first = [coordinator.schedule(read, args=(iterator, 0.25)) for _ in range(24)]
deadline = time.monotonic() + 60  # until worker 1 has run a function
while not any(v.done and v.fetch()[0] == 1 for v in first) and time.monotonic() < deadline:
    time.sleep(0.02)
(folder / "scheduled").touch()
coordinator.join(timeout=120)
deadline = time.monotonic() + 60
while not (folder / "restarted").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
second = [coordinator.schedule(read, args=(iterator, 0.15)) for _ in range(24)]
coordinator.join(timeout=120)
report({"first": [v.fetch() for v in first], "second": [v.fetch() for v in second]})
"""
)


def test_a_killed_worker_s_functions_run_elsewhere_and_its_datasets_are_rebuilt() -> None:
    cluster = launcher.tf_config_envs({"chief": 1, "worker": 2, "ps": 1})
    worker_1 = only(cluster, "worker:1")
    with (
        ps_here(cluster),
        servers(only(cluster, "worker:0", "worker:1"), wait=False) as workers,
        launcher.Processes(KILL, only(cluster, "chief:0"), timeout=150) as chief,
    ):
        chief.wait_for(chief.dir / "scheduled", timeout=90)
        time.sleep(0.1)  # worker 1 is inside its next function (each sleeps 0.25 s)
        workers.send("worker:1", signal.SIGKILL)
        assert workers.wait_exit("worker:1", timeout=20) == -signal.SIGKILL
        with servers(worker_1):  # the same task comes back
            (chief.dir / "restarted").touch()
            result = chief.wait()["chief:0"]
    assert result.ok, result.describe()
    first, second = result.result["first"], result.result["second"]
    assert len(first) == 24 and len(second) == 24  # every function ran (at least once)
    # Worker 1 read from position 0 twice: its dataset and iterator were made again.
    one = [p for w, p in first + second if w == 1]
    assert one.count(0) == 2 and max(one.count(p) for p in one) == 2
    zero = sorted(p for w, p in first + second if w == 0)
    assert zero == list(range(len(zero)))  # worker 0's iterator went on


def test_schedule_blocks_only_when_the_queue_is_full(ps_spec) -> None:
    # One worker that never answers: the functions wait in the queue.
    spec = ClusterSpec({**ps_spec.as_dict(), "worker": [f"127.0.0.1:{launcher.free_port()}"]})
    strategy = chief_strategy(spec)
    coordinator = ClusterCoordinator(strategy, max_pending=3)
    started = time.monotonic()
    for _ in range(3):
        coordinator.schedule(time.sleep, args=(0,))
    assert time.monotonic() - started < 2
    blocked: list[BaseException] = []
    extra = threading.Thread(target=lambda: _catch(blocked, _schedule_two, coordinator))
    extra.start()
    extra.join(0.5)
    assert extra.is_alive() and not coordinator.done()  # full: they wait for room
    with pytest.raises(UnavailableError, match=r"did not finish within 0\.2 s"):
        coordinator.join(timeout=0.2)
    coordinator.close()
    extra.join(5)
    assert isinstance(blocked[0], FailedPreconditionError)
    with pytest.raises(InvalidArgumentError, match="runs on the chief"):
        ClusterCoordinator(
            ParameterServerStrategy(SimpleClusterResolver(spec, task_type="worker", task_id=0))
        )


def _schedule_two(coordinator: ClusterCoordinator) -> None:
    for _ in range(2):
        coordinator.schedule(time.sleep, args=(0,))


def _catch(into: list, fn, *args) -> None:
    try:
        fn(*args)
    except BaseException as error:
        into.append(error)


def test_functions_do_not_wait_forever_for_workers_that_never_answer(ps_spec) -> None:
    address = f"127.0.0.1:{launcher.free_port()}"
    spec = ClusterSpec({**ps_spec.as_dict(), "worker": [address]})
    coordinator = ClusterCoordinator(chief_strategy(spec), worker_timeout=0.5)
    value = coordinator.schedule(time.sleep, args=(0,))
    with pytest.raises(UnavailableError, match=rf"no worker answered for 0.5 s \({address}\)"):
        coordinator.join(timeout=30)
    with pytest.raises(UnavailableError, match="no worker answered"):
        value.fetch(timeout=30)
    coordinator.close()
