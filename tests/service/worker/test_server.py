"""Tests of feedline/service/worker/server.py: what a task runs under each sharding policy (the
module's table), and a worker's lifecycle."""

from __future__ import annotations

import logging
import pathlib
import threading
import time
from typing import Any

import pytest

from feedline import errors, service
from feedline._net.rpc import RpcClient
from feedline.data import Dataset, TextLineDataset
from feedline.data.ops.shard import SHARD_HINT
from feedline.service.config import ShardingPolicy
from feedline.service.protocol import WORKER_SERVICE, local_worker_addresses
from feedline.service.worker import server as worker_module
from feedline.service.worker.task import task_dataset
from tests.launcher import free_port
from tests.service.conftest import WAITING_READ, waiting_reads_taken
from tests.service.dispatcher.test_server import wait_until


def run(mode: ShardingPolicy, dataset: Dataset, num_workers: int = 2) -> list[list[Any]]:
    return [
        [x.item() for x in task_dataset(dataset, mode, num_workers, index, None)]
        for index in range(num_workers)
    ]


def test_off_runs_everything() -> None:
    assert run(ShardingPolicy.OFF, Dataset.range(4)) == [[0, 1, 2, 3], [0, 1, 2, 3]]


def test_data_keeps_every_nth_element() -> None:
    assert run(ShardingPolicy.DATA, Dataset.range(7)) == [[0, 2, 4, 6], [1, 3, 5]]
    assert run(ShardingPolicy.FILE_OR_DATA, Dataset.range(4)) == [[0, 2], [1, 3]]


def test_file_reads_each_workers_share_of_the_files(tmp_path: pathlib.Path) -> None:
    names = []
    for index in range(2):
        path = tmp_path / f"f{index}.txt"
        path.write_text(f"{index}a\n{index}b\n")
        names.append(str(path))
    lines = TextLineDataset(names)
    expected = [[b"0a", b"0b"], [b"1a", b"1b"]]
    assert run(ShardingPolicy.FILE, lines) == expected
    assert run(ShardingPolicy.FILE_OR_DATA, lines) == expected


def test_file_without_files_is_an_error() -> None:
    with pytest.raises(errors.NotFoundError):
        run(ShardingPolicy.FILE, Dataset.range(4))


def test_hint_fills_in_the_shard_hint() -> None:
    hinted = Dataset.range(6).shard(SHARD_HINT, SHARD_HINT)
    assert run(ShardingPolicy.HINT, hinted, 3) == [[0, 3], [1, 4], [2, 5]]


def test_a_worker_is_local_while_it_runs(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    worker = cluster.workers[0]
    assert worker.worker_address in local_worker_addresses()
    worker.stop()
    assert worker.worker_address not in local_worker_addresses()


def test_worker_address_template(make_cluster: Any) -> None:
    cluster = make_cluster(0)
    worker = cluster.add_worker(worker_address="localhost:%port%")
    assert worker.worker_address.startswith("localhost:")
    assert worker.worker_address.split(":")[1].isdigit()


def test_a_worker_whose_address_another_worker_took_stops_with_a_clear_error(
    make_cluster: Any,
) -> None:
    """Two live workers given one address: the second is taken for the first restarted there
    (the first one's tasks are lost), and the first, refused at its next heartbeat, stops with
    an error that says what to change, rather than the two taking turns."""
    cluster = make_cluster(0)
    first = cluster.add_worker(worker_address="shared:%port%", heartbeat_interval_ms=50)
    address = first.worker_address
    second = cluster.add_worker(worker_address=address, port=0, heartbeat_interval_ms=50)
    wait_until(lambda: first.stopped, timeout=10)
    assert isinstance(first.error, errors.FailedPreconditionError)
    assert f"taken the address {address}" in str(first.error)
    assert "an address of its own" in str(first.error)
    assert not second.stopped
    state = cluster.dispatcher._core.state
    assert state.workers[address].instance == second._instance  # the one registered now


def _slow(x: Any) -> Any:
    time.sleep(0.002)
    return x


@pytest.mark.parametrize("when", ["at-once", "after-the-drop"])
def test_a_static_worker_restarted_at_its_address_begins_its_shard_again(when: str) -> None:
    """A fixed list of two workers, ``DATA`` sharding: worker 1 dies and a new one starts at its
    address (before or after the dispatcher dropped it). As in TensorFlow, it begins worker
    1's shard again from its start: the consumer gets every element, worker 0's once."""
    ports = [free_port(), free_port()]
    addresses = [f"127.0.0.1:{port}" for port in ports]
    dispatcher = service.DispatchServer(
        service.DispatcherConfig(worker_addresses=addresses, worker_timeout_ms=500)
    )
    target = dispatcher.target.split("://")[1]

    def worker(index: int) -> service.WorkerServer:
        config = service.WorkerConfig(
            target, worker_address=addresses[index], port=ports[index], heartbeat_interval_ms=100
        )
        return service.WorkerServer(config)

    workers = [worker(0), worker(1)]
    try:
        dataset = Dataset.range(1000).map(_slow)
        iterator = iter(
            dataset.apply(
                service.distribute(
                    ShardingPolicy.DATA, dispatcher.target, max_outstanding_requests=4
                )
            )
        )
        got = [int(next(iterator)) for _ in range(100)]
        workers[1].stop()
        state = dispatcher._core.state
        if when == "after-the-drop":
            wait_until(lambda: addresses[1] not in state.workers)
        workers[1] = worker(1)
        got += [int(x) for x in iterator]
    finally:
        for server in [*workers, dispatcher]:
            server.stop()
    assert set(got) == set(range(1000))
    evens = [x for x in got if x % 2 == 0]  # worker 0's shard: each once
    assert sorted(evens) == list(range(0, 1000, 2))


def test_a_worker_dropped_while_it_lived_on_frees_its_lost_tasks_and_takes_new_ones(
    make_cluster: Any, tmp_path: pathlib.Path
) -> None:
    """The dispatcher drops a worker that lives on (as after a pause past worker_timeout_ms):
    at its next heartbeat the worker registers again, stops the tasks lost with it (their
    consumers hear that they are gone) and gets new tasks of the running jobs; the exactly-once
    epoch reaches every element once."""
    cluster = make_cluster(0, fault_tolerant_mode=True, work_dir=str(tmp_path))
    workers = [cluster.add_worker(heartbeat_interval_ms=100) for _ in range(2)]
    dataset = Dataset.range(2000).map(_slow)
    iterator = iter(
        dataset.apply(
            service.distribute("distributed_epoch", cluster.target, max_outstanding_requests=8)
        )
    )
    got = [int(next(iterator)) for _ in range(200)]
    dispatcher = cluster.dispatcher
    state = dispatcher._core.state
    address = workers[0].worker_address
    (old,) = [t.task_id for t in state.worker_tasks(address)]
    with dispatcher._core.lock:
        dispatcher._workers.remove_worker(address, "missed heartbeats (a test)")
    assert state.tasks[old].lost
    wait_until(lambda: old not in workers[0]._tasks)
    assert workers[0]._ended[old] is worker_module._DROPPED
    # It took a new task of the job (before the epoch ends and the job is collected).
    assert any(not t.lost for t in state.worker_tasks(address))
    got += [int(x) for x in iterator]
    assert sorted(got) == list(range(2000))  # nothing lost, nothing twice


def test_an_unreachable_dispatcher_is_an_error_after_the_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = service.WorkerConfig(dispatcher_address="127.0.0.1:1", dispatcher_timeout_ms=300)
    with (
        caplog.at_level(logging.WARNING, logger=worker_module.__name__),
        pytest.raises(errors.UnavailableError) as raised,
    ):
        service.WorkerServer(config)
    message = str(raised.value)  # what, where, for how long, and what to change
    assert "registering" in message and "127.0.0.1:1" in message, message
    assert "dispatcher_timeout_ms = 300" in message and "wait_forever" in message, message
    # The wait is not silent: the first attempt that failed said it would try again.
    assert any("trying again" in record.getMessage() for record in caplog.records), caplog.text


def test_a_worker_that_waits_forever_registers_with_a_dispatcher_that_comes_up_late() -> None:
    """--wait-forever holds from the start: a worker started before its dispatcher (as a
    cluster's pods start in any order) waits for it past ``dispatcher_timeout_ms``."""
    port = free_port()  # below the ephemeral range: no outgoing connection takes it meanwhile
    config = service.WorkerConfig(
        dispatcher_address=f"127.0.0.1:{port}", dispatcher_timeout_ms=200, wait_forever=True
    )
    started: list[Any] = []
    thread = threading.Thread(target=lambda: started.append(_started(config)), daemon=True)
    thread.start()
    time.sleep(1.0)  # five times the timeout: a bounded worker would have given up
    assert thread.is_alive() and not started
    with service.DispatchServer(service.DispatcherConfig(port=port)) as dispatcher:
        thread.join(30)
        assert started, "the worker did not register"
        worker = started[0]
        assert not isinstance(worker, BaseException), worker
        try:
            dataset = Dataset.range(5).apply(
                service.distribute("parallel_epochs", dispatcher.target)
            )
            assert [int(x) for x in dataset] == list(range(5))
        finally:
            worker.stop()


def _started(config: service.WorkerConfig) -> Any:
    try:
        return service.WorkerServer(config)
    except BaseException as error:  # the test reports it
        return error


def test_a_worker_drops_a_dataset_no_task_has_run_for_a_while(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "_DATASET_KEEP_S", 0.3)
    cluster = make_cluster(1, job_gc_check_interval_ms=50)
    worker = cluster.workers[0]
    endless = Dataset.range(3).repeat().apply(service.distribute("parallel_epochs", cluster.target))
    iterator = iter(endless)
    assert [int(next(iterator)) for _ in range(4)] == [0, 1, 2, 0]
    time.sleep(1.0)  # past the keep time: a running task keeps its dataset
    assert len(worker._datasets) == 1
    iterator.close()
    wait_until(lambda: not worker._tasks and not worker._datasets)
    # Needed again, it is fetched again.
    assert sorted(
        int(x)
        for x in Dataset.range(2).apply(service.distribute("parallel_epochs", cluster.target))
    ) == [0, 1]


def test_get_elements_past_the_bound_are_answered_at_once_with_a_retry_time(
    make_cluster: Any,
) -> None:
    # Waiting requests hold a server thread each: at most _MAX_WAITING_READS wait, the others
    # are told to wait on their consumer's side, so that the worker's threads stay free.
    worker = make_cluster(1).workers[0]
    with waiting_reads_taken(worker) as client:
        for _ in range(20):  # one may come as a holder's request ends and it sends the next
            reply, _ = client.call("GetElements", WAITING_READ, timeout=30)
            if reply != {"eos": False}:
                break
        assert reply == {"eos": False, "retry_after_ms": 1000}
    assert worker._waiting_reads == 0
    # A request alone waits again (it is answered after its time, without a retry time).
    reply, _ = RpcClient(worker.worker_address, WORKER_SERVICE).call(
        "GetElements", WAITING_READ, timeout=30
    )
    assert reply == {"eos": False}
