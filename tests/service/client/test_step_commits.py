"""Tests of feedline/service/client/step_commits.py: consumers of a shared exactly-once job that
acknowledge on commit (``acknowledge="on_commit"``).

Trainers are real processes reading one shared ``distributed_epoch`` job of a fault-tolerant
dispatcher; each logs the elements of a step once ``commit()`` returned. One trainer is killed
with kill -9 after ``next()`` gave it a batch and before it committed it: what it held goes back
to the service, and the committed logs of all trainers together are ``range(N)`` exactly.
"""

from __future__ import annotations

import doctest
import json
import logging
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from feedline import service
from feedline.data import Dataset
from feedline.data.committed import CommittedIterator
from feedline.errors import ConsumerReleasedError, FailedPreconditionError, InvalidArgumentError
from feedline.service.client import step_commits
from feedline.service.client.queue import Item
from feedline.service.client.step_commits import StepCommits
from tests.launcher import Processes, free_port
from tests.service.procs import ServiceProcesses, release_consumer

pytestmark = pytest.mark.timeout(240)

#: One trainer: reads batches of the shared job, sleeps PAUSE s per step, commits, then logs the
#: step's elements (a line of JSON per step). The victim (DIE_AT) touches READY once it read a
#: batch (the others start then), and at step DIE_AT writes its batch to MARKER and waits there
#: to be killed.
TRAINER = """
import json, os, time
from pathlib import Path
from feedline import service
from feedline.data import Dataset
from tests.launcher import report

from feedline.errors import ConsumerReleasedError

n, die_at = int(os.environ["N"]), int(os.environ.get("DIE_AT", "0"))
stop_at = int(os.environ.get("STOP_AT", "0"))
pause = float(os.environ["PAUSE"])
dataset = Dataset.range(n).batch(4).apply(
    service.distribute(
        "distributed_epoch",
        os.environ["FEEDLINE_TARGET"],
        job_name="shared",
        acknowledge="on_commit",
    )
)
ready = Path(os.environ["READY"])
deadline = time.monotonic() + 90
while not die_at and not ready.exists():  # the others start once the victim reads
    if time.monotonic() > deadline:
        raise SystemExit("the victim did not start reading")
    time.sleep(0.02)
iterator = iter(dataset)
steps = released = 0
with open(os.environ["LOG"], "a") as log:
    for batch in iterator:
        steps += 1
        ids = [int(x) for x in batch]
        if die_at:
            ready.touch()
        if steps in (die_at, stop_at):  # whole once it exists: the test acts on seeing it
            marker = Path(os.environ["MARKER"])
            marker.with_suffix(".tmp").write_text(json.dumps(ids))
            os.replace(marker.with_suffix(".tmp"), marker)
            time.sleep(600 if steps == die_at else 1.0)  # killed, or stopped, before the end
        time.sleep(pause)
        try:
            iterator.commit()
        except ConsumerReleasedError:  # the step's batch went back to the job
            released += 1
            continue
        log.write(json.dumps(ids) + "\\n")
        log.flush()
report({"steps": steps, "released": released})
"""


def test_module_doctests() -> None:
    assert doctest.testmod(step_commits).failed == 0


def test_an_aborted_step_comes_again_first_in_order() -> None:
    steps = StepCommits()
    for offset in range(3):
        steps.returned(Item(offset, 8, 1, [0, offset]))
    assert steps.abort() == 3 and steps.step_size == 0
    again = steps.again()
    assert again is not None and again.element == 0
    steps.returned(again)
    assert steps.abort() == 1  # the element taken again belongs to the new step
    assert [item.element for item in iter(steps.again, None)] == [0, 1, 2]
    steps.returned(Item(9, 8, 1, [4, 9]))
    steps.returned(Item(3, 8, 1, [0, 3]))
    assert steps.step_ranges() == [[0, [[3, 4]]], [4, [[9, 10]]]]
    steps.committed()
    assert steps.step_ranges() == [] and steps.again() is None


def test_a_flush_is_reported_once_the_requests_in_flight_then_are_answered() -> None:
    steps = StepCommits()
    assert steps.flush_report(lambda mark: True) == 0  # none asked
    steps.asked(3, mark=10)
    assert steps.flush_pending()
    answered: dict[int, bool] = {10: False}
    assert steps.flush_report(answered.__getitem__) == 0
    answered[10] = True
    assert steps.flush_report(answered.__getitem__) == 3 and not steps.flush_pending()
    steps.asked(2, mark=11)  # an older round: already reported
    assert not steps.flush_pending()


@pytest.fixture
def fault_tolerant(tmp_path: Path) -> Iterator[service.DispatchServer]:
    """A fault-tolerant dispatcher (consumers released after 1 s of silence) and two workers,
    in this process."""
    config = service.DispatcherConfig(
        work_dir=str(tmp_path / "work"), fault_tolerant_mode=True, client_timeout_ms=1000
    )
    dispatcher = service.DispatchServer(config)
    address = dispatcher.target.split("://")[1]
    workers = [
        service.WorkerServer(service.WorkerConfig(dispatcher_address=address)) for _ in range(2)
    ]
    try:
        yield dispatcher
    finally:
        for server in [*workers, dispatcher]:
            server.stop()


def shared(target: str, n: int, **kw: object) -> Dataset:
    return (
        Dataset.range(n)
        .batch(4)
        .apply(
            service.distribute(
                "distributed_epoch", target, job_name="shared", acknowledge="on_commit", **kw
            )
        )
    )


def test_abort_returns_the_step_again_and_commit_counts_it_once(
    fault_tolerant: service.DispatchServer,
) -> None:
    dispatcher = fault_tolerant
    iterator = iter(shared(dispatcher.target, 40))
    committed: list[int] = []
    for step, batch in enumerate(iterator):
        if step % 3 == 1:  # the step fails: its batch comes again
            assert iterator.abort() == 1
            assert [int(x) for x in next(iterator)] == [int(x) for x in batch]
        assert iterator.commit() == 1
        committed.extend(int(x) for x in batch)
    assert sorted(committed) == list(range(40))


def test_on_commit_needs_an_exactly_once_job(
    fault_tolerant: service.DispatchServer,
) -> None:
    dispatcher = fault_tolerant
    with pytest.raises(InvalidArgumentError, match="needs processing_mode 'distributed_epoch'"):
        service.distribute("parallel_epochs", dispatcher.target, acknowledge="on_commit")
    with pytest.raises(InvalidArgumentError, match="acknowledge must be one of"):
        service.distribute("distributed_epoch", dispatcher.target, acknowledge="later")
    plain = service.DispatchServer()
    try:
        dataset = Dataset.range(4).apply(
            service.distribute("distributed_epoch", plain.target, acknowledge="on_commit")
        )
        with pytest.raises(FailedPreconditionError, match="fault_tolerant_mode=True"):
            iter(dataset)
        receipt = iter(Dataset.range(4).apply(service.distribute("parallel_epochs", plain.target)))
        with pytest.raises(FailedPreconditionError, match="acknowledge='on_commit'"):
            receipt.commit()  # type: ignore[attr-defined]
        receipt.close()
    finally:
        plain.stop()


def read_logs(paths: list[Path]) -> list[int]:
    return [
        x
        for path in paths
        if path.exists()
        for line in path.read_text().split("\n")
        if line
        for x in json.loads(line)
    ]


def run_trainers(
    target: str, tmp_path: Path, n: int, after_kill: Callable[[], None] | None = None
) -> tuple[list[int], list[int]]:
    """Three trainer processes on the shared job; ``victim`` is killed -9 at its 3rd step,
    holding a batch it did not commit, then ``after_kill`` runs. The committed elements of all,
    and the victim's batch."""
    logs = [tmp_path / f"{name}.log" for name in ("a", "b", "victim")]
    marker = tmp_path / "victim.batch"
    common = {"N": str(n), "FEEDLINE_TARGET": target, "READY": str(tmp_path / "victim.ready")}
    with Processes(
        TRAINER,
        [
            ("a", {"LOG": str(logs[0]), "PAUSE": "0.02"}),
            ("b", {"LOG": str(logs[1]), "PAUSE": "0.02"}),
            ("victim", {"LOG": str(logs[2]), "PAUSE": "0", "DIE_AT": "3", "MARKER": str(marker)}),
        ],
        timeout=150,
        env=common,
    ) as trainers:
        trainers.wait_for(marker, timeout=90)
        trainers.send("victim", signal.SIGKILL)
        if after_kill is not None:
            after_kill()
        # The faults came mid-epoch: the survivors had not committed everything yet.
        assert len(read_logs(logs)) < n
        results = trainers.wait()
    for name in ("a", "b"):
        assert results[name].ok, results[name].describe()
    return read_logs(logs), json.loads(marker.read_text())


def check_exactly_once(committed: list[int], n: int) -> None:
    assert sorted(committed) == list(range(n)), {
        "lost": sorted(set(range(n)) - set(committed)),
        "twice": sorted(x for x in set(committed) if committed.count(x) > 1),
    }


def test_a_trainer_killed_before_its_commit_loses_nothing_and_repeats_nothing(
    fault_tolerant: service.DispatchServer, tmp_path: Path
) -> None:
    n = 600
    committed, held = run_trainers(fault_tolerant.target, tmp_path, n)
    assert len(held) == 4
    check_exactly_once(committed, n)


def test_a_killed_trainer_and_a_killed_service_worker(tmp_path: Path) -> None:
    n = 600
    config = service.DispatcherConfig(
        work_dir=str(tmp_path / "work"),
        fault_tolerant_mode=True,
        client_timeout_ms=1000,
        worker_timeout_ms=2000,
    )
    dispatcher = service.DispatchServer(config)
    try:
        with ServiceProcesses(timeout=200) as cluster:
            cluster.port = int(dispatcher.target.rsplit(":", 1)[1])  # workers of this dispatcher
            doomed = cluster.start_worker()
            cluster.start_worker()

            def kill_worker() -> None:  # the service worker dies just after the trainer
                time.sleep(0.2)
                cluster.send(doomed, signal.SIGKILL)

            committed, _ = run_trainers(dispatcher.target, tmp_path, n, kill_worker)
            assert not cluster.alive(doomed)
    finally:
        dispatcher.stop()
    check_exactly_once(committed, n)


def test_a_killed_trainer_across_a_dispatcher_restart(tmp_path: Path) -> None:
    n = 600
    config = service.DispatcherConfig(
        port=free_port(),
        work_dir=str(tmp_path / "work"),
        fault_tolerant_mode=True,
        client_timeout_ms=1000,
    )
    dispatchers = [service.DispatchServer(config)]
    address = dispatchers[0].target.split("://")[1]
    workers = [
        service.WorkerServer(service.WorkerConfig(dispatcher_address=address)) for _ in range(2)
    ]

    def restart() -> None:  # the journal holds what each consumer held and committed
        dispatchers[-1].stop()
        time.sleep(0.5)
        dispatchers.append(service.DispatchServer(config))

    try:
        committed, _ = run_trainers(dispatchers[0].target, tmp_path, n, restart)
    finally:
        for server in [*workers, *dispatchers]:
            server.stop()
    check_exactly_once(committed, n)


def test_a_committed_iterator_over_the_service_uses_the_services_commits(
    fault_tolerant: service.DispatchServer,
) -> None:
    iterator = CommittedIterator(iter(shared(fault_tolerant.target, 16)))
    first = [int(x) for x in next(iterator)]
    iterator.abort()
    assert [int(x) for x in next(iterator)] == first
    iterator.commit()
    rest = [int(x) for batch in iterator for x in batch]  # never committed
    assert sorted(first + rest) == list(range(16))
    state = iterator.get_state()  # the position counts the committed step's element only
    counted = sum(b - a for _, ranges in state["partial"] for a, b in ranges)
    assert counted + sum(count for _, count in state["done"]) == 1
    iterator.close()


def test_the_input_ends_before_the_last_step_commits_and_the_job_after(
    fault_tolerant: service.DispatchServer,
) -> None:
    iterator = iter(shared(fault_tolerant.target, 12))
    # Never committed: the input ends once the job waits for nothing but this step's commit.
    got = [int(x) for batch in iterator for x in batch]
    assert sorted(got) == list(range(12))
    assert iterator.commit() > 0
    with pytest.raises(StopIteration):  # now the job itself ended
        next(iterator)


def test_commits_left_to_the_heartbeat_arrive_and_end_the_job(
    fault_tolerant: service.DispatchServer,
) -> None:
    iterator = iter(shared(fault_tolerant.target, 40))
    got, batches = [], 0
    for batch in iterator:  # ends only once the dispatcher has every step's commit
        got.extend(int(x) for x in batch)
        batches += 1
        iterator.commit(wait=False)
    assert sorted(got) == list(range(40))
    state = iterator.get_state()  # every batch (an element of the job) counts in the position
    counted = sum(count for _, count in state["done"])
    counted += sum(b - a for _, ranges in state["partial"] for a, b in ranges)
    assert counted == batches


def test_a_trainer_that_joins_after_the_only_one_died_gets_what_it_held(
    fault_tolerant: service.DispatchServer, tmp_path: Path
) -> None:
    n = 200
    logs = [tmp_path / "victim.log", tmp_path / "joiner.log"]
    marker = tmp_path / "victim.batch"
    common = {"N": str(n), "FEEDLINE_TARGET": fault_tolerant.target}
    common["READY"] = str(tmp_path / "victim.ready")
    victim_env = {"LOG": str(logs[0]), "PAUSE": "0", "DIE_AT": "3", "MARKER": str(marker)}
    with Processes(TRAINER, [("victim", victim_env)], timeout=150, env=common) as victim:
        victim.wait_for(marker, timeout=90)
        victim.send("victim", signal.SIGKILL)
        assert victim.wait_exit("victim", timeout=30) is not None
    joiner_env = {"LOG": str(logs[1]), "PAUSE": "0"}
    with Processes(TRAINER, [("joiner", joiner_env)], timeout=150, env=common) as joiner:
        results = joiner.wait()
    assert results["joiner"].ok, results["joiner"].describe()
    check_exactly_once(read_logs(logs), n)
    assert read_logs(logs[:1])  # the victim committed its first steps


def test_a_consumer_released_while_it_lived_joins_again_and_its_lost_step_comes_again(
    fault_tolerant: service.DispatchServer, caplog: pytest.LogCaptureFixture
) -> None:
    iterator = iter(shared(fault_tolerant.target, 40))
    committed: list[int] = []
    refused: list[list[int]] = []
    with caplog.at_level(logging.WARNING, logger="feedline.service.client.dataset"):
        for step, batch in enumerate(iterator):
            ids = [int(x) for x in batch]
            if step in (2, 5):  # released while the step runs; the commit is refused
                release_consumer(fault_tolerant.target, iterator)
            try:
                iterator.commit()
            except ConsumerReleasedError as error:
                assert "not committed" in str(error) and "joined the job again" in str(error)
                refused.append(ids)
                continue
            committed.extend(ids)
    assert len(refused) == 2
    # Nothing the dispatcher counted for a released consumer: each refused batch came again.
    assert sorted(committed) == list(range(40))
    rejoins = [r.getMessage() for r in caplog.records if "joined the job again" in r.getMessage()]
    assert len(rejoins) == 2 and "the step in progress (elements read: 1)" in rejoins[0], rejoins
    assert iterator.abort() == 0  # the job ended: nothing left to give back


def test_a_consumer_paused_past_the_client_timeout_carries_on(
    fault_tolerant: service.DispatchServer, tmp_path: Path
) -> None:
    # The dispatcher releases consumers after 1 s of silence: the paused trainer is released
    # with the step it was in, and goes on once it runs again, losing nothing.
    n = 400
    logs = [tmp_path / "a.log", tmp_path / "paused.log"]
    marker = tmp_path / "paused.batch"
    common = {"N": str(n), "FEEDLINE_TARGET": fault_tolerant.target, "READY": str(tmp_path)}
    paused_env = {"LOG": str(logs[1]), "PAUSE": "0.01", "STOP_AT": "3", "MARKER": str(marker)}
    with Processes(
        TRAINER,
        [("a", {"LOG": str(logs[0]), "PAUSE": "0.05"}), ("paused", paused_env)],
        timeout=150,
        env=common,
    ) as trainers:
        trainers.wait_for(marker, timeout=90)
        trainers.send("paused", signal.SIGSTOP)
        time.sleep(3.0)  # past client_timeout_ms: released, what it held goes to "a"
        trainers.send("paused", signal.SIGCONT)
        results = trainers.wait()
        reports = trainers.reports()
    for name in ("a", "paused"):
        assert results[name].ok, results[name].describe()
    assert reports["paused"]["released"] == 1, reports
    assert "joined the job again" in results["paused"].stderr, results["paused"].describe()
    check_exactly_once(read_logs(logs), n)


def test_a_step_of_several_reads_released_midway_does_not_commit_any_of_them(
    fault_tolerant: service.DispatchServer,
) -> None:
    iterator = iter(shared(fault_tolerant.target, 48))
    committed: list[int] = []
    refused = 0
    for step in range(1000):  # two reads a step
        ids: list[int] = []
        try:
            ids += [int(x) for x in next(iterator)]
            if step == 2:  # released after the step's first read, noticed by its second
                release_consumer(fault_tolerant.target, iterator)
                time.sleep(0.5)
            ids += [int(x) for x in next(iterator)]
        except StopIteration:
            if ids:  # a last step of one read
                iterator.commit()
                committed.extend(ids)
            break
        try:
            iterator.commit()
        except ConsumerReleasedError:
            refused += 1
            continue
        committed.extend(ids)
    assert refused == 1
    # What the step read after the consumer joined again came again too, and counted once.
    assert sorted(committed) == list(range(48))
