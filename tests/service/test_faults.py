"""The data service under faults, with real ``feedline dispatcher`` and ``feedline worker``
processes: never wrong data, never a silent short epoch, never a hang.

Each test injects one fault (a dispatcher restarted, a task that fails, an error raised inside
the pipeline, a worker killed or stopped, a dispatcher gone for good) and checks what every
consumer sees. Consumers run in this process unless the test is about them; servers are
processes of ``tests.launcher`` (``tests/service/procs.py``). Every wait has a timeout.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from feedline import errors
from feedline.data import Dataset, Options
from feedline.service import ShardingPolicy, distribute
from tests.launcher import free_port
from tests.service.procs import ServiceProcesses, read_in_thread

pytestmark = pytest.mark.timeout(120)


def ints(dataset: Any) -> list[int]:
    return sorted(int(x) for x in dataset)


def with_timeout(dataset: Dataset, ms: int) -> Dataset:
    """``dataset`` whose service consumers wait at most ``ms`` for what they wait for."""
    options = Options()
    options.experimental_distribute.service_timeout_ms = ms
    return dataset.with_options(options)


@pytest.fixture
def cluster() -> Iterator[ServiceProcesses]:
    with ServiceProcesses() as processes:
        yield processes


# -- 1. a restarted dispatcher ------------------------------------------------------------------


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "kill-9"])
@pytest.mark.parametrize("work_dir", [False, True], ids=["memory", "work-dir"])
def test_a_restarted_dispatcher_never_makes_workers_serve_another_dataset(
    cluster: ServiceProcesses, tmp_path: Path, stop: int, work_dir: bool
) -> None:
    args = ["--work-dir", str(tmp_path)] if work_dir else []
    dispatcher = cluster.start_dispatcher(*args)
    for _ in range(2):
        cluster.start_worker("--wait-forever")
    old = Dataset.range(100).apply(distribute("parallel_epochs", cluster.target))
    assert ints(old) == sorted(list(range(100)) * 2)
    cluster.send(dispatcher, stop)
    assert cluster.wait_exit(dispatcher) is not None
    cluster.start_dispatcher(*args)  # the same port: every id starts again from its first
    new = Dataset.range(1000, 1100).apply(distribute("parallel_epochs", cluster.target))
    # Each worker that has found the new dispatcher when the job starts runs it whole (a
    # worker that registers after the job ended has no part in it); none ever serves the old
    # job's elements.
    _assert_whole_epochs(ints(new), range(1000, 1100))
    _assert_whole_epochs(ints(old), range(100))  # registered again, under a new id


def _assert_whole_epochs(got: list[int], expected: range) -> None:
    """``got`` is one or two whole epochs of ``expected`` (parallel_epochs on two workers)."""
    assert got in (sorted(expected), sorted(list(expected) * 2)), got[:10]


def test_a_job_lost_with_a_restarted_dispatcher_is_an_error_not_an_end(
    cluster: ServiceProcesses,
) -> None:
    dispatcher = cluster.start_dispatcher()
    cluster.start_worker("--wait-forever")
    dataset = Dataset.range(10**6).apply(
        distribute("distributed_epoch", cluster.target, max_outstanding_requests=8)
    )
    iterator = iter(dataset)
    first = [int(next(iterator)) for _ in range(10)]
    cluster.send(dispatcher, signal.SIGKILL)
    assert cluster.wait_exit(dispatcher) is not None
    cluster.start_dispatcher()
    got, raised = read_in_thread(iterator, timeout=60)
    assert isinstance(raised, errors.FailedPreconditionError), raised
    assert "restarted" in str(raised)
    seen = first + got
    assert len(seen) == len(set(seen)) and all(0 <= x < 10**6 for x in seen)


# -- 2. a task that fails -------------------------------------------------------------------


def explode(x: Any) -> Any:
    """A map function that fails on element 37."""
    if int(x) == 37:
        raise KeyError(f"element {int(x)} has no label")
    return x


def explode_first(x: Any) -> Any:
    """Fails on the first element of ``range(5, 105)`` (spec inference runs it on 0 and 1)."""
    if int(x) == 5:
        raise ArithmeticError("the first element already fails")
    return x


@pytest.fixture
def unpicklable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], Any]:
    """A map function from a module that this process can import and the workers cannot:
    the dataset fails to unpickle on the workers."""
    (tmp_path / "only_here.py").write_text("def double(x):\n    return x * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_here  # type: ignore[import-not-found]

    yield only_here.double
    sys.modules.pop("only_here", None)


# The failed-task test's workers heartbeat every 0.2 s: it watches them for two heartbeats.
HEARTBEAT_S = 0.2
_HEARTBEAT = ("--heartbeat-interval-ms", str(round(HEARTBEAT_S * 1000)))


def _static_cluster(cluster: ServiceProcesses) -> None:
    ports = [free_port(), free_port()]
    addresses = ",".join(f"127.0.0.1:{port}" for port in ports)
    cluster.start_dispatcher("--worker-addresses", addresses)
    for port in ports:
        cluster.start_worker("--worker-address", f"127.0.0.1:{port}", *_HEARTBEAT, port=port)


def _dynamic_cluster(cluster: ServiceProcesses) -> None:
    cluster.start_dispatcher()
    for _ in range(2):
        cluster.start_worker(*_HEARTBEAT)


FAILURES = {
    # name: (dataset maker, the error type every consumer gets, text of the remote traceback)
    "sharding": (lambda _: Dataset.range(10), errors.NotFoundError, "auto_shard"),
    "unpickling": (
        lambda fn: Dataset.range(10).map(fn),
        ModuleNotFoundError,
        "only_here",
    ),
    "first element": (
        lambda _: Dataset.range(5, 105).map(explode_first),
        ArithmeticError,
        "explode_first",
    ),
    "map function": (lambda _: Dataset.range(100).map(explode), KeyError, "explode"),
}


@pytest.mark.parametrize(
    ("pool", "failure"),
    [
        ("static", "sharding"),
        ("static", "unpickling"),
        ("static", "first element"),
        ("static", "map function"),
        ("dynamic", "unpickling"),
        ("dynamic", "first element"),
        ("dynamic", "map function"),
    ],
)
def test_a_failed_task_reaches_every_consumer_and_ends_only_its_job(
    cluster: ServiceProcesses, unpicklable: Any, pool: str, failure: str
) -> None:
    (_static_cluster if pool == "static" else _dynamic_cluster)(cluster)
    make, kind, where = FAILURES[failure]
    policy = {
        "static": ShardingPolicy.FILE if failure == "sharding" else ShardingPolicy.DATA,
        "dynamic": ShardingPolicy.DYNAMIC,
    }[pool]
    # Three consumers: two share a named job (each may read either worker), one has its own.
    shared = [
        make(unpicklable).apply(distribute(policy, cluster.target, job_name="failing"))
        for _ in range(2)
    ]
    alone = make(unpicklable).apply(distribute(policy, cluster.target))
    iterators = [iter(dataset) for dataset in [*shared, alone]]
    started = time.monotonic()
    for iterator in iterators:
        got, raised = read_in_thread(iterator, timeout=30)
        assert isinstance(raised, kind), f"{type(raised).__name__}: {raised}"
        notes = "\n".join(getattr(raised, "__notes__", []))
        assert "data service" in notes and where in notes, notes
        assert len(got) == len(set(got))
        with pytest.raises(kind):  # the error stays: the job is over
            next(iterator)
    assert time.monotonic() - started < 20
    # The job ended; the workers serve other jobs, and retry nothing.
    policy_ok = ShardingPolicy.DATA if pool == "static" else ShardingPolicy.DYNAMIC
    assert ints(Dataset.range(20).apply(distribute(policy_ok, cluster.target))) == list(range(20))
    time.sleep(2.5 * HEARTBEAT_S)  # two heartbeats: a retried task would fail again
    logs = [cluster.output(name) for name in cluster.addresses]
    failures = sum(log.count(" failed: ") for log in logs)
    assert 1 <= failures <= 4, logs  # one task per worker and job at most, each once


# -- 3. errors inside the pipeline are not a dead worker -----------------------------------------


def raise_unavailable(x: Any) -> Any:
    if int(x) == 500:
        raise errors.UnavailableError("a service the map function calls is down")
    return x


def raise_worker_died(x: Any) -> Any:
    if int(x) == 500:
        raise errors.WorkerDiedError("a helper process of the map function died", pid=1)
    return x


@pytest.mark.parametrize("fn", [raise_unavailable, raise_worker_died])
def test_an_unavailable_error_inside_the_pipeline_is_the_jobs_error(
    cluster: ServiceProcesses, fn: Callable[[Any], Any]
) -> None:
    cluster.start_dispatcher()
    cluster.start_worker()
    dataset = Dataset.range(1000).map(fn).apply(distribute("parallel_epochs", cluster.target))
    got, raised = read_in_thread(iter(dataset), timeout=30)
    assert isinstance(raised, errors.UnavailableError), raised
    assert (
        type(raised).__name__
        == fn.__name__.replace("raise_", "").title().replace("_", "") + "Error"
    )
    assert "map function" in str(raised)
    assert got == list(range(len(got))) and len(got) <= 500  # and never a silent short epoch


def test_a_split_the_worker_cannot_get_is_an_error_not_an_end(cluster: ServiceProcesses) -> None:
    dispatcher = cluster.start_dispatcher()
    cluster.start_worker("--dispatcher-timeout", "3")
    dataset = with_timeout(
        Dataset.range(10**6).apply(
            distribute("distributed_epoch", cluster.target, max_outstanding_requests=4)
        ),
        8_000,
    )
    iterator = iter(dataset)
    first = [int(next(iterator)) for _ in range(5)]
    cluster.send(dispatcher, signal.SIGKILL)
    started = time.monotonic()
    got, raised = read_in_thread(iterator, timeout=45)
    # The worker's GetSplit gives up (an error inside the task, which reaches the consumer),
    # or the consumer's own wait for the dispatcher does: an error either way, never an end.
    assert isinstance(raised, errors.UnavailableError), raised
    assert time.monotonic() - started < 30
    seen = first + got
    assert len(seen) == len(set(seen))


# -- 4. errors do not stick ------------------------------------------------------------------


def slow_at_three(x: Any) -> Any:
    if int(x) == 3:
        time.sleep(5)
    return x


def test_after_a_retriable_error_the_iterator_goes_on(cluster: ServiceProcesses) -> None:
    dispatcher = cluster.start_dispatcher()
    cluster.start_worker("--wait-forever")
    dataset = with_timeout(
        Dataset.range(6)
        .map(slow_at_three)
        .apply(distribute("parallel_epochs", cluster.target, max_outstanding_requests=1)),
        1500,
    )
    iterator = iter(dataset)
    got = [int(next(iterator)) for _ in range(3)]
    cluster.send(dispatcher, signal.SIGSTOP)  # unreachable: it answers nothing
    try:
        with pytest.raises(errors.UnavailableError, match="has not answered"):
            got.append(int(next(iterator)))
    finally:
        cluster.send(dispatcher, signal.SIGCONT)
    got += [int(x) for x in iterator]  # the same iterator goes on to the end
    assert got == [0, 1, 2, 3, 4, 5]


def test_a_job_name_can_be_tried_again_after_a_refused_join(cluster: ServiceProcesses) -> None:
    cluster.start_dispatcher()
    dataset = (
        Dataset.range(8)
        .repeat()
        .apply(
            distribute(
                "parallel_epochs",
                cluster.target,
                job_name="retried",
                consumer_index=0,
                num_consumers=1,
            )
        )
    )
    with pytest.raises(errors.FailedPreconditionError, match="no worker is registered"):
        iter(dataset)
    cluster.start_worker()
    iterator = iter(dataset)  # the same name, the same iteration: a fresh job, not a stuck one
    got, raised = [], None
    try:
        got = [int(next(iterator)) for _ in range(10)]
    finally:
        iterator.close()
    assert got == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1] and raised is None


def relabel(x: Any) -> Any:
    """Changes the keys of its dicts after element 2 (spec inference sees the first keys)."""
    return {"a": x, "b": x} if int(x) < 3 else {"a": x, "c": x}


def test_an_element_whose_structure_changes_is_an_error(cluster: ServiceProcesses) -> None:
    cluster.start_dispatcher()
    cluster.start_worker()
    dataset = Dataset.range(6).map(relabel).apply(distribute("parallel_epochs", cluster.target))
    got: list[Any] = []
    with pytest.raises(errors.InvalidArgumentError, match="structure"):
        for element in dataset:
            got.append(element)
    assert [sorted(e) for e in got] == [["a", "b"]] * len(got) and len(got) <= 3


# -- 5. a worker stopped cleanly, a worker gone from round-robin reads ----------------------------


def slowly(x: Any) -> Any:
    time.sleep(0.002)
    return x


def _slow_epoch(cluster: ServiceProcesses) -> tuple[Any, list[int]]:
    """The iterator of a 3,000-element epoch made 2 ms an element, and its first 300."""
    dataset = (
        Dataset.range(3000)
        .map(slowly)
        .apply(distribute("distributed_epoch", cluster.target, max_outstanding_requests=16))
    )
    iterator = iter(dataset)
    return iterator, [int(next(iterator)) for _ in range(300)]


def test_a_worker_stopped_by_sigterm_hands_out_what_it_holds(cluster: ServiceProcesses) -> None:
    cluster.start_dispatcher()
    workers = [cluster.start_worker("--drain-seconds", "20") for _ in range(3)]
    iterator, got = _slow_epoch(cluster)
    cluster.send(workers[0], signal.SIGTERM)
    rest, raised = read_in_thread(iterator, timeout=60)
    assert raised is None
    assert sorted(got + rest) == list(range(3000))  # nothing lost, nothing twice
    assert cluster.wait_exit(workers[0], timeout=30) == 0
    assert "drain" in cluster.output(workers[0])


def test_a_killed_workers_port_taken_by_another_server_is_a_lost_worker(
    cluster: ServiceProcesses,
) -> None:
    # On a busy host another process may bind the port of a worker that died: its calls are
    # then answered "not served here" (UNIMPLEMENTED), which is the worker being gone.
    from feedline._net import rpc

    cluster.start_dispatcher()
    workers = [cluster.start_worker() for _ in range(2)]
    iterator, got = _slow_epoch(cluster)
    cluster.send(workers[0], signal.SIGKILL)
    assert cluster.wait_exit(workers[0], timeout=30) == -signal.SIGKILL
    port = int(cluster.addresses[workers[0]].rsplit(":", 1)[1])
    other, _ = rpc.start_server("other.Service", {}, bind="127.0.0.1", port=port, token=None)
    try:
        rest, raised = read_in_thread(iterator, timeout=90)
    finally:
        other.stop(0.0)
    assert raised is None  # the usual lost worker: what it held is lost, the rest comes
    received = got + rest
    assert len(received) == len(set(received)) and len(received) > 1000


@pytest.mark.parametrize("when", ["at-once", "after-the-drop"])
def test_a_worker_killed_and_restarted_at_its_address_is_a_new_worker(
    cluster: ServiceProcesses, tmp_path: Path, when: str
) -> None:
    """The only worker, on a fixed port, is killed (kill -9) and started again on that port, at
    once (before the dispatcher's worker_timeout_ms) or once the dispatcher dropped it. The new
    process is a new worker: the old one's tasks are lost and the new one gets tasks of the
    running jobs, so the exactly-once epoch reaches every element once."""
    dispatcher = cluster.start_dispatcher(
        "--work-dir", str(tmp_path), "--fault-tolerant", "--worker-timeout-ms", "1000"
    )
    port = free_port()
    worker = cluster.start_worker(port=port)
    iterator, got = _slow_epoch(cluster)
    cluster.send(worker, signal.SIGKILL)
    assert cluster.wait_exit(worker, timeout=30) == -signal.SIGKILL
    if when == "after-the-drop":
        deadline = time.monotonic() + 30
        while "missed heartbeats" not in cluster.output(dispatcher):
            assert time.monotonic() < deadline, "the dispatcher did not drop the dead worker"
            time.sleep(0.05)
    cluster.start_worker(port=port)
    rest, raised = read_in_thread(iterator, timeout=90)
    assert raised is None, raised
    assert sorted(got + rest) == list(range(3000))  # nothing lost, nothing twice


def test_round_robin_consumers_get_an_error_naming_a_worker_that_died(
    cluster: ServiceProcesses,
) -> None:
    cluster.start_dispatcher()
    workers = [cluster.start_worker() for _ in range(2)]

    def consumer(index: int) -> Any:
        dataset = Dataset.range(10**6).repeat().map(slowly)
        return iter(
            with_timeout(
                dataset.apply(
                    distribute(
                        "parallel_epochs",
                        cluster.target,
                        job_name="rr",
                        consumer_index=index,
                        num_consumers=2,
                        max_outstanding_requests=2,
                    )
                ),
                3000,
            )
        )

    iterators = [consumer(0), consumer(1)]
    for _ in range(5):
        for iterator in iterators:
            next(iterator)
    cluster.send(workers[1], signal.SIGKILL)
    dead = cluster.addresses[workers[1]]
    outcomes = [read_in_thread(iterator, timeout=40) for iterator in iterators]
    for _, raised in outcomes:
        assert isinstance(raised, errors.UnavailableError), raised
        assert dead in str(raised)


# -- 6. every wait is bounded ----------------------------------------------------------------------


def test_a_consumer_raises_when_the_dispatcher_is_gone_for_good(cluster: ServiceProcesses) -> None:
    dispatcher = cluster.start_dispatcher()
    cluster.start_worker("--wait-forever")
    dataset = with_timeout(
        Dataset.range(10**6).apply(
            distribute("distributed_epoch", cluster.target, max_outstanding_requests=4)
        ),
        2000,
    )
    iterator = iter(dataset)
    next(iterator)
    cluster.send(dispatcher, signal.SIGKILL)
    started = time.monotonic()
    _, raised = read_in_thread(iterator, timeout=30)
    assert isinstance(raised, errors.UnavailableError), raised
    assert cluster.address in str(raised)
    assert time.monotonic() - started < 15
    # A new iterator cannot even join: the wait for the dispatcher is bounded too.
    started = time.monotonic()
    with pytest.raises(errors.UnavailableError, match=r"joining a job|registering"):
        iter(
            with_timeout(
                Dataset.range(3).apply(distribute("parallel_epochs", cluster.target)), 2000
            )
        )
    assert time.monotonic() - started < 15


def test_a_worker_whose_dispatcher_never_returns_exits_after_its_bound(
    cluster: ServiceProcesses,
) -> None:
    dispatcher = cluster.start_dispatcher()
    bounded = cluster.start_worker("--dispatcher-timeout", "2")
    patient = cluster.start_worker("--dispatcher-timeout", "2", "--wait-forever")
    cluster.send(dispatcher, signal.SIGKILL)
    assert cluster.wait_exit(bounded, timeout=30) == 2
    log = cluster.output(bounded)
    assert log.count("unreachable") == 2, log  # once when it went, once when the worker gave up
    assert "feedline worker: error: " in cluster.output(bounded, "stdout")
    assert cluster.alive(patient)
