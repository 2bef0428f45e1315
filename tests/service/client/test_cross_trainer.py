"""Tests of feedline/service/client/cross_trainer.py: trainers sharing one job by its name, each
reading every element, against in-process servers; and a trainer killed -9 mid-epoch and
restarted from its checkpoint, with real processes (``tests/service/procs.py``)."""

from __future__ import annotations

import dataclasses
import doctest
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from benchmarks.cross_trainer_chaos import run_round

from feedline import service
from feedline.data import Dataset
from feedline.errors import FailedPreconditionError, InvalidArgumentError
from feedline.service.client import cross_trainer
from feedline.service.client.cross_trainer import TrainerPosition
from tests.service.conftest import Cluster
from tests.service.http_helpers import fetch, scrape

pytestmark = pytest.mark.timeout(180)


def trainer_dataset(
    cluster: Cluster,
    trainer_id: str,
    dataset: Dataset,
    mode: str = "distributed_epoch",
    job_name: str = "shared",
) -> Dataset:
    return dataset.apply(
        service.distribute(
            mode,
            cluster.target,
            job_name=job_name,
            cross_trainer_cache=service.CrossTrainerCache(trainer_id),
        )
    )


def read_concurrently(iterables: dict[str, Any], pause: dict[str, float]) -> dict[str, list[int]]:
    """Reads each iterable to its end on a thread of its own (pausing ``pause[name]`` seconds
    after each element); what each read, as the ints of the elements' first values."""
    got: dict[str, list[int]] = {name: [] for name in iterables}
    errors: list[BaseException] = []

    def read(name: str) -> None:
        try:
            for x in iterables[name]:
                got[name].append(int(np.asarray(x).reshape(-1)[0]))
                time.sleep(pause.get(name, 0.0))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=read, args=(name,), daemon=True) for name in iterables]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a trainer hung"
    assert not errors, errors
    return got


def test_doctests() -> None:
    assert doctest.testmod(cross_trainer).failed == 0


def test_bad_arguments_say_what_to_change() -> None:
    dataset = Dataset.range(4)
    with pytest.raises(InvalidArgumentError, match="non-empty trainer_id"):
        service.CrossTrainerCache("")
    with pytest.raises(InvalidArgumentError, match="non-empty trainer_id"):
        service.CrossTrainerCache(3)  # type: ignore[arg-type]
    cache = service.CrossTrainerCache("a")
    with pytest.raises(InvalidArgumentError, match="job_name must be set"):
        service.distribute("distributed_epoch", "localhost:1", cross_trainer_cache=cache)
    with pytest.raises(
        InvalidArgumentError, match=r"must be a feedline\.service\.CrossTrainerCache"
    ):
        service.distribute(
            "distributed_epoch", "localhost:1", job_name="j", cross_trainer_cache="a"
        )
    with pytest.raises(InvalidArgumentError, match="num_consumers"):
        service.distribute(
            "parallel_epochs",
            "localhost:1",
            job_name="j",
            consumer_index=0,
            num_consumers=2,
            cross_trainer_cache=cache,
        )
    with pytest.raises(InvalidArgumentError, match=r"OFF .* or DYNAMIC"):
        service.distribute(
            service.ShardingPolicy.DATA, "localhost:1", job_name="j", cross_trainer_cache=cache
        )
    # TensorFlow's rule: under OFF the dataset must be infinite.
    with pytest.raises(InvalidArgumentError, match=r"infinite dataset.*\.repeat\(\)"):
        dataset.apply(
            service.distribute(
                "parallel_epochs", "localhost:1", job_name="j", cross_trainer_cache=cache
            )
        )
    dataset.repeat().apply(
        service.distribute(
            "parallel_epochs", "localhost:1", job_name="j", cross_trainer_cache=cache
        )
    )
    assert service.CrossTrainerCache("a") == cache and "'a'" in repr(cache)


def test_the_dispatcher_checks_what_from_dataset_id_cannot(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(1)
    finite = service.register_dataset(cluster.target, Dataset.range(4))
    reader = service.from_dataset_id(
        "parallel_epochs",
        cluster.target,
        finite,
        job_name="j",
        cross_trainer_cache=service.CrossTrainerCache("a"),
    )
    with pytest.raises(FailedPreconditionError, match="needs an infinite dataset"):
        list(reader)
    # A trainer and a plain consumer cannot share one job: they read it differently.
    plain = Dataset.range(4).apply(
        service.distribute("distributed_epoch", cluster.target, job_name="k")
    )
    plain_iterator = iter(plain)
    with pytest.raises(InvalidArgumentError, match="cross_trainer_cache"):
        iter(trainer_dataset(cluster, "a", Dataset.range(4), job_name="k"))
    plain_iterator.close()


def test_three_trainers_each_read_a_finite_epoch_once_computed_once(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(0)
    for _ in range(2):  # a small cache: most of the epoch spills to disk
        cluster.add_worker(cross_trainer_cache_size_bytes=4096)
    elements = 600
    dataset = Dataset.range(elements).map(lambda x: np.full(32, x))
    trainers = {name: trainer_dataset(cluster, name, dataset) for name in ("a", "b", "slow")}
    got = read_concurrently(trainers, {"slow": 0.002})
    for name, values in got.items():
        assert sorted(values) == list(range(elements)), name
    served = sum(
        task["elements"] for worker in cluster.workers for task in worker._status_snapshot().tasks
    )

    def cache_states() -> list[dict[str, Any]]:
        return [
            task["trainer_cache"]
            for worker in cluster.workers
            for task in worker._status_snapshot().tasks
        ]

    states = cache_states()
    made = sum(state["end"] for state in states)
    assert made == elements  # each element made once, by one of the workers
    assert served == 3 * elements  # and handed to each of the three trainers
    assert sum(state["spilled"] for state in states) > 0  # the slow trainer read the spill

    # Each trainer tells a worker it returned a task's last element once its ``next`` did
    # (a reader thread's last request, which may come just after the iterator ended).
    def every_trainer_passed_every_element() -> bool:
        return all(
            state["trainers"] == {"a": state["end"], "b": state["end"], "slow": state["end"]}
            for state in cache_states()
        )

    deadline = time.monotonic() + 30
    while not every_trainer_passed_every_element() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert every_trainer_passed_every_element(), cache_states()


def test_an_infinite_dataset_under_off_keeps_tensorflows_sliding_window(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(0)
    cluster.add_worker(cross_trainer_cache_size_bytes=8 * 20)  # 20 elements of 8 bytes
    dataset = Dataset.range(1_000_000).repeat()
    fast = iter(trainer_dataset(cluster, "fast", dataset, "parallel_epochs"))
    first_fast = [int(next(fast)) for _ in range(500)]
    slow = iter(trainer_dataset(cluster, "slow", dataset, "parallel_epochs"))
    first_slow = int(next(slow))
    assert first_fast == list(range(500))
    # The slow trainer starts in the window (the newest 20 elements, and what the fast one's
    # fetches pulled ahead), not at 0: elements before the window are gone.
    assert first_slow > 400
    rest = [int(next(slow)) for _ in range(5)]
    assert rest == list(range(first_slow + 1, first_slow + 6))
    fast.close()
    slow.close()


def test_a_restored_trainer_resumes_where_its_state_says_while_others_go_on(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(2)
    dataset = Dataset.range(100)
    steady = iter(trainer_dataset(cluster, "steady", dataset))
    restarted = iter(trainer_dataset(cluster, "restarted", dataset))
    before = [int(next(restarted)) for _ in range(30)]
    state = restarted.get_state()
    position = TrainerPosition.from_state(state)
    assert position.trainer_id == "restarted" and sum(position.tasks.values()) == 30
    more = [int(next(restarted)) for _ in range(10)]  # read, then lost with the process
    restarted.close()
    assert len(set(before + more)) == 40
    again = iter(trainer_dataset(cluster, "restarted", dataset))
    again.set_state(state)
    after = [int(x) for x in again]
    assert sorted(before + after) == list(range(100))
    assert sorted(int(x) for x in steady) == list(range(100))
    # Another trainer's state, or a plain position, is refused with the reason.
    other = iter(trainer_dataset(cluster, "other", dataset))
    with pytest.raises(InvalidArgumentError, match="position of trainer 'restarted'"):
        other.set_state(state)
    with pytest.raises(InvalidArgumentError, match="not the position of a trainer"):
        other.set_state({"tasks": []})
    other.close()


def test_the_status_page_and_metrics_show_each_trainers_position(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(0)
    worker = cluster.add_worker(status_port=0)
    dataset = Dataset.range(50)
    a = iter(trainer_dataset(cluster, "alpha", dataset))
    b = iter(trainer_dataset(cluster, "beta", dataset))
    assert len([next(a) for _ in range(50)]) == 50
    assert int(next(b)) == 0
    url = worker.status_url
    assert url is not None
    deadline = time.monotonic() + 30
    while True:  # the position of a trainer is what it asked for last: "alpha" read all
        samples = scrape(url)
        positions = {
            dict(labels)["trainer"]: value
            for (name, labels), value in samples.items()
            if name == "feedline_worker_trainer_position"
        }
        if positions.get("alpha") == 50 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert positions["alpha"] == 50 and 0 <= positions["beta"] <= 1, positions
    status, _, page = fetch(url)
    assert status == 200 and "trainers: alpha at 50, beta at" in page
    a.close()
    b.close()


def test_a_dispatcher_restarted_on_its_journal_keeps_the_trainers_job(tmp_path: Path) -> None:
    config = service.DispatcherConfig(work_dir=str(tmp_path), fault_tolerant_mode=True)
    dispatcher = service.DispatchServer(config)
    port = int(dispatcher.target.rsplit(":", 1)[1])
    cluster = Cluster(dispatcher)
    try:
        for _ in range(2):
            cluster.add_worker()
        dataset = Dataset.range(200)
        a = iter(trainer_dataset(cluster, "a", dataset))
        b = iter(trainer_dataset(cluster, "b", dataset))
        got_a = [int(next(a)) for _ in range(50)]
        got_b = [int(next(b)) for _ in range(20)]
        dispatcher.stop()
        cluster.dispatcher = service.DispatchServer(dataclasses.replace(config, port=port))
        got_a += [int(x) for x in a]
        got_b += [int(x) for x in b]
    finally:
        cluster.stop()
    assert sorted(got_a) == sorted(got_b) == list(range(200))


@pytest.mark.parametrize(
    ("fault_tolerant", "fault_fraction"),
    [(False, 0.3), (True, 0.6)],
    ids=["plain", "fault_tolerant"],
)
def test_a_trainer_killed_and_restarted_from_its_checkpoint_loses_and_repeats_nothing(
    tmp_path: Path, fault_tolerant: bool, fault_fraction: float
) -> None:
    """Three trainer processes read one epoch; one is killed (kill -9) mid-epoch and restarted
    from its last checkpoint (``benchmarks/cross_trainer_chaos.py``, one round each)."""
    elements = 400
    row = run_round(
        tmp_path,
        elements=elements,
        fault_fraction=fault_fraction,
        fault_tolerant=fault_tolerant,
        hang_seconds=60,
    )
    print(json.dumps(dataclasses.asdict(row)))
    assert not row.failed and not row.hung, row
    assert 0 < row.killed_at < elements  # killed mid-epoch
    assert row.lost == row.duplicated == {"a": 0, "b": 0, "victim": 0}, row


def test_a_worker_killed_mid_epoch_under_fault_tolerance_costs_no_trainer_anything(
    tmp_path: Path,
) -> None:
    """Three trainer processes read one epoch from two workers under a fault-tolerant
    dispatcher; one worker is killed (kill -9) mid-epoch and a new one started: the splits the
    dead worker held run again, and each trainer gets exactly the elements it had not received
    (``benchmarks/cross_trainer_chaos.py --kill worker``, one round)."""
    elements = 400
    row = run_round(
        tmp_path,
        elements=elements,
        fault_fraction=0.3,
        fault_tolerant=True,
        hang_seconds=90,
        kill="worker",
    )
    print(json.dumps(dataclasses.asdict(row)))
    assert not row.failed and not row.hung, row
    assert 0 < row.killed_at < elements  # killed mid-epoch
    assert row.lost == row.duplicated == {"a": 0, "b": 0, "victim": 0}, row


def test_a_trainer_that_first_joins_after_a_worker_died_gets_every_element_once(
    tmp_path: Path,
) -> None:
    """As above, and a fourth trainer process first joins once the dispatcher dropped the dead
    worker: the dead worker's splits, which the three others had received in full, run again
    for it (``benchmarks/cross_trainer_chaos.py --kill worker --late-trainer``, one round)."""
    elements = 400
    row = run_round(
        tmp_path,
        elements=elements,
        fault_fraction=0.3,
        fault_tolerant=True,
        hang_seconds=90,
        kill="worker",
        late=True,
    )
    print(json.dumps(dataclasses.asdict(row)))
    assert not row.failed and not row.hung, row
    assert 0 < row.killed_at < elements  # killed mid-epoch
    assert row.lost == row.duplicated == {"a": 0, "b": 0, "victim": 0, "late": 0}, row


def _fault_tolerant_trainers(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> tuple[Cluster, Callable[[str], Any]]:
    """A fault-tolerant cluster (workers dropped after 1 s) with two workers, and a function
    that makes trainer ``name``'s iterator of the job "ft" over ``Dataset.range(300)``."""
    cluster = make_cluster(
        0, fault_tolerant_mode=True, work_dir=str(tmp_path), worker_timeout_ms=1000
    )
    for _ in range(2):
        cluster.add_worker(heartbeat_interval_ms=100)

    def trainer(name: str) -> Any:
        return iter(
            Dataset.range(300).apply(
                service.distribute(
                    "distributed_epoch",
                    cluster.target,
                    job_name="ft",
                    cross_trainer_cache=service.CrossTrainerCache(name),
                    max_outstanding_requests=4,
                )
            )
        )

    return cluster, trainer


def test_a_trainer_restored_from_before_a_worker_died_loses_and_repeats_nothing(
    tmp_path: Path,
) -> None:
    """Trainer processes: a worker is killed (kill -9) once every trainer has read 100 elements
    past the victim's last checkpoint, then the victim, which is restarted from that checkpoint
    at once, before the dispatcher drops the dead worker, while the others read on to the end
    of the epoch (``benchmarks/cross_trainer_chaos.py --kill worker+trainer --back-before-drop
    --no-hold``, one round)."""
    row = run_round(
        tmp_path,
        elements=400,
        fault_fraction=0.2,
        fault_tolerant=True,
        kill="worker+trainer",
        back_before_drop=True,
        hold=False,
    )
    print(json.dumps(dataclasses.asdict(row)))
    assert not row.failed and not row.hung, row
    assert row.lost == row.duplicated == {"a": 0, "b": 0, "victim": 0}, row


def test_a_trainers_position_passes_over_what_it_drops_once_the_elements_before_are_returned() -> (
    None
):
    """Under a fault-tolerant dispatcher each element is tagged ``[position, split, offset]``:
    what the trainer already has of a replayed split is dropped, its position moves past it
    once everything before it was returned, and the position saves what it returned per split
    (a restored trainer drops those offsets again)."""
    from feedline.service.client.cross_trainer import TrainerPositions
    from feedline.service.client.exactly_once import SplitReceipts

    positions = TrainerPositions("t", None)
    receipts = SplitReceipts()
    assert positions.admit(receipts, 5, [[0, 4, 0], [1, 4, 1]], 2) == [True, True]
    assert positions.admit(receipts, 6, [[0, 4, 1], [1, 4, 2]], 2) == [False, True]
    assert positions.admit(receipts, 6, [[2]], 1) is None  # no split tags: refused
    assert positions.returned_in(6) == 1  # the dropped element 0 was next: passed over
    positions.returned(5, [0, 4, 0])
    assert positions.admit(receipts, 5, [[2, 4, 2], [3, 4, 3]], 2) == [False, True]
    assert positions.returned_in(5) == 1  # element 1 is not returned yet: 2 waits for it
    positions.returned(5, [1, 4, 1])
    assert positions.returned_in(5) == 3  # 1 returned, then the dropped 2 passed over
    saved = positions.position(9)
    assert saved.tasks == {5: 3, 6: 1} and saved.splits == {4: [[0, 2]]}
    restored = TrainerPositions("t", TrainerPosition.from_state(saved.to_state()))
    again = SplitReceipts(received=restored.restored_splits())
    assert restored.admit(again, 6, [[1, 4, 1], [2, 4, 2]], 2) == [False, True]
    assert restored.returned_in(6) == 2


def test_a_late_restore_after_the_job_was_collected_says_so(
    make_cluster: Callable[..., Cluster],
) -> None:
    """A trainer restored after its job was collected (``job_gc_timeout_ms`` after its last
    trainer left) gets an error that says what happened and what to do, not an end of input."""
    cluster = make_cluster(1, job_gc_timeout_ms=200)
    dataset = Dataset.range(20)
    steady = iter(trainer_dataset(cluster, "steady", dataset))
    late = iter(trainer_dataset(cluster, "late", dataset))
    before = [int(next(late)) for _ in range(4)]
    state = late.get_state()
    late.close()
    assert sorted(int(x) for x in steady) == list(range(20))
    deadline = time.monotonic() + 30
    while cluster.dispatcher._core.state.jobs and time.monotonic() < deadline:
        time.sleep(0.05)  # the job is collected once its trainers left for 200 ms
    assert not cluster.dispatcher._core.state.jobs
    restored = iter(trainer_dataset(cluster, "late", dataset))
    with pytest.raises(FailedPreconditionError, match=r"that job is gone.*job_gc_timeout_ms"):
        restored.set_state(state)
    assert before == sorted(before)
    # Started afresh, without the state, the trainer reads the new job from its start.
    assert sorted(int(x) for x in trainer_dataset(cluster, "late", dataset)) == list(range(20))


def test_a_trainer_restored_after_a_worker_died_takes_its_replayed_splits_once(
    tmp_path: Path, make_cluster: Callable[..., Cluster]
) -> None:
    """Under a fault-tolerant dispatcher: a trainer saves its position, a worker dies (its
    splits, which the other trainer has not received in full, run again on another worker), the
    trainer reads on, then is restored from the position it saved: it gets every element it had
    not returned by then, once, wherever the splits ran. (Splits that every trainer had received
    in full when the worker died are not run again: docs/data_service.md.)"""
    cluster, trainer = _fault_tolerant_trainers(make_cluster, tmp_path)

    steady, restarted = trainer("steady"), trainer("restarted")
    before = [int(next(restarted)) for _ in range(30)]
    state = restarted.get_state()
    lost_with_the_process = [int(next(restarted)) for _ in range(10)]
    # steady has fetched at most 4 elements (max_outstanding_requests): no split of 9 in full.
    cluster.workers[0].stop()  # it dies with what its caches held
    cluster.add_worker(heartbeat_interval_ms=100)
    lost_with_the_process += [int(next(restarted)) for _ in range(60)]
    restarted.close()
    assert len(set(before + lost_with_the_process)) == 100
    again = trainer("restarted")
    again.set_state(state)
    # Read together: the epoch ends once every trainer reading the job received all of it.
    got = read_concurrently({"restarted": again, "steady": steady}, {})
    assert sorted(before + got["restarted"]) == list(range(300))
    assert sorted(got["steady"]) == list(range(300))


def test_a_trainer_restored_from_before_a_worker_died_gets_the_splits_every_trainer_had(
    tmp_path: Path, make_cluster: Callable[..., Cluster]
) -> None:
    """Under a fault-tolerant dispatcher: a trainer saves its position, both trainers read on
    past many splits, which are then done (each trainer received all of them); the trainer is
    gone, a worker dies, and the trainer is restored from the position it saved before. The
    dead worker's done splits that its position lacks run again for it: it gets every element
    it had not returned by then, once; the other trainer gets nothing twice."""
    cluster, trainer = _fault_tolerant_trainers(make_cluster, tmp_path)

    steady, restarted = trainer("steady"), trainer("restarted")
    before = [int(next(restarted)) for _ in range(20)]
    state = restarted.get_state()
    after = [int(next(restarted)) for _ in range(160)]
    first = [int(next(steady)) for _ in range(160)]
    ledger = cluster.dispatcher._core.state.ledgers
    (job_ledger,) = ledger.values()
    dead = cluster.workers[0].worker_address
    tasks = {
        t.task_id for t in cluster.dispatcher._core.state.tasks.values() if t.worker_address == dead
    }
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
        s.holder in tasks for s in list(job_ledger.finished.values())
    ):
        time.sleep(0.05)  # the trainers' reports arrive with their heartbeats
    assert any(s.holder in tasks for s in list(job_ledger.finished.values()))  # done there
    restarted.close()  # the trainer is gone, then the worker dies
    cluster.workers[0].stop()
    cluster.add_worker(heartbeat_interval_ms=100)
    deadline = time.monotonic() + 30
    while not set(job_ledger.lost) & tasks and time.monotonic() < deadline:
        time.sleep(0.05)  # the dispatcher dropped the dead worker
    assert set(job_ledger.lost) & tasks
    assert len(set(before + after)) == 180
    again = trainer("restarted")
    again.set_state(state)
    got = read_concurrently({"restarted": again, "steady": steady}, {})
    assert sorted(before + got["restarted"]) == list(range(300))
    assert sorted(first + got["steady"]) == list(range(300))


def _restore_after_the_worker_dies(
    make_cluster: Callable[..., Cluster], tmp_path: Path, wait_for_the_drop: bool
) -> None:
    """Trainer "restarted" saves its position after 20 elements, reads 100, and leaves;
    "steady" reads the whole epoch, and the first worker dies (once the dispatcher dropped it,
    with ``wait_for_the_drop``). The trainer, restored from its position, gets every element
    it had not returned by then, once: the dead worker's splits, done for every trainer, run
    again for it in a task of a live worker, though the job's other tasks ended their splits."""
    cluster, trainer = _fault_tolerant_trainers(make_cluster, tmp_path)
    steady, restarted = trainer("steady"), trainer("restarted")
    before = [int(next(restarted)) for _ in range(20)]
    state = restarted.get_state()
    assert len({int(next(restarted)) for _ in range(100)} | set(before)) == 120
    restarted.close()
    assert sorted(int(x) for x in steady) == list(range(300))
    core = cluster.dispatcher._core
    (job_ledger,) = core.state.ledgers.values()
    dead = cluster.workers[0].worker_address
    tasks = {t.task_id for t in core.state.tasks.values() if t.worker_address == dead}
    cluster.workers[0].stop()
    deadline = time.monotonic() + 30
    while wait_for_the_drop and not set(job_ledger.lost) & tasks and time.monotonic() < deadline:
        time.sleep(0.05)  # the dispatcher drops the dead worker after 1 s
    again = trainer("restarted")
    again.set_state(state)
    got = read_concurrently({"restarted": again}, {})
    assert sorted(before + got["restarted"]) == list(range(300))
    assert set(job_ledger.lost) & tasks  # the worker was lost, its splits ran elsewhere


def test_a_trainer_restored_once_the_others_ended_the_epoch_gets_a_dead_workers_splits(
    tmp_path: Path, make_cluster: Callable[..., Cluster]
) -> None:
    _restore_after_the_worker_dies(make_cluster, tmp_path, wait_for_the_drop=True)


def test_a_trainer_restored_before_a_dead_worker_is_dropped_gets_its_splits(
    tmp_path: Path, make_cluster: Callable[..., Cluster]
) -> None:
    """As above, the trainer restored before the dispatcher dropped the dead worker: its
    epoch does not end when the tasks it can read ended, but once the dispatcher says it has
    every element."""
    _restore_after_the_worker_dies(make_cluster, tmp_path, wait_for_the_drop=False)


def test_a_trainer_that_joins_after_the_epoch_ended_is_told_what_it_lacks(
    tmp_path: Path, make_cluster: Callable[..., Cluster]
) -> None:
    """Under a fault-tolerant dispatcher the job ends once every trainer reading it received
    all of its epoch, and its workers let go of the elements. A trainer that joins then, lacking
    part of the epoch (a new one, or one restored from a position taken mid-epoch), is refused
    with what it lacks and what to do, in place of an end of input; one restored from the
    epoch's end lacks nothing and gets its end."""
    cluster, trainer = _fault_tolerant_trainers(make_cluster, tmp_path)
    first, second = trainer("first"), trainer("second")
    early = [int(next(first)) for _ in range(50)]
    mid_epoch = first.get_state()
    got = read_concurrently({"first": first, "second": second}, {})
    assert sorted(early + got["first"]) == sorted(got["second"]) == list(range(300))
    at_the_end = first.get_state()
    (job,) = cluster.dispatcher._core.state.jobs.values()
    deadline = time.monotonic() + 30
    while not job.finished and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.finished
    lacks = r"trainer '{}' joined job 'ft' after its epoch ended.* lacks {} elements"
    with pytest.raises(FailedPreconditionError, match=lacks.format("late", 300)):
        next(trainer("late"))
    restored = trainer("first")
    with pytest.raises(FailedPreconditionError, match=lacks.format("first", 250)):
        restored.set_state(mid_epoch)
    finished = trainer("first")
    finished.set_state(at_the_end)
    assert list(finished) == []


def test_under_fault_tolerance_a_fast_trainer_ends_its_epoch_without_waiting_for_a_slow_one(
    tmp_path: Path, make_cluster: Callable[..., Cluster]
) -> None:
    """Under a fault-tolerant dispatcher a split stays open until every trainer has all of it
    (a worker's death could run it again), but a trainer that has every element of the epoch
    ends its epoch then: a stalled trainer does not hold it back, and reads on after."""
    cluster, trainer = _fault_tolerant_trainers(make_cluster, tmp_path)
    fast, stalled = trainer("fast"), trainer("stalled")
    first = [int(next(stalled)) for _ in range(20)]
    got = read_concurrently({"fast": fast}, {})  # 60 s at most, else "a trainer hung"
    assert sorted(got["fast"]) == list(range(300))
    (job,) = cluster.dispatcher._core.state.jobs.values()
    assert not job.finished  # the stalled trainer's epoch goes on
    rest = [int(x) for x in stalled]
    assert sorted(first + rest) == list(range(300))
