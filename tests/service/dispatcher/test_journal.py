"""Tests of feedline/service/dispatcher/journal.py: a dispatcher with ``fault_tolerant_mode``
journals its state in SQLite under ``work_dir``, and one killed with kill -9 and started again
on the same ``work_dir`` and port resumes it: its consumers and workers carry on with the same
jobs.

A dispatcher kill loses nothing with the journal: ``parallel_epochs`` tasks run on, and a DYNAMIC
split whose ``GetSplit`` reply was on its way when the dispatcher died is handed out again when
the worker asks again with the same request number.

The multi-process tests run real ``feedline dispatcher`` and ``feedline worker`` processes
(``tests/service/procs.py``); the consumers run here. Every wait has a timeout.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from feedline import errors, service
from feedline._net import rpc as _rpc
from feedline.data import Dataset
from feedline.service.client.dataset import register_dataset
from feedline.service.dispatcher import journal as _journal
from feedline.service.dispatcher import state as st
from feedline.service.protocol import DISPATCHER_SERVICE as SERVICE_NAME
from tests.launcher import FEEDLINE_CLI, Processes
from tests.service.procs import ServiceProcesses, read_in_thread

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cluster() -> Iterator[ServiceProcesses]:
    with ServiceProcesses() as processes:
        yield processes


def read_rest(iterator: Any, timeout: float) -> list[int]:
    """Reads ``iterator`` to its end on a thread; fails the test on an error or a hang."""
    got, raised = read_in_thread(iterator, timeout)
    if raised is not None:
        raise raised
    return got


def kill_and_restart(cluster: ServiceProcesses, dispatcher: str, *args: str) -> str:
    cluster.send(dispatcher, signal.SIGKILL)
    assert cluster.wait_exit(dispatcher) is not None
    return cluster.start_dispatcher(*args)


def missing_runs(missing: set[int]) -> list[tuple[int, int]]:
    """``missing`` as runs ``(first, last)`` of consecutive ints."""
    runs: list[tuple[int, int]] = []
    for x in sorted(missing):
        if runs and runs[-1][1] == x - 1:
            runs[-1] = (runs[-1][0], x)
        else:
            runs.append((x, x))
    return runs


# -- a dispatcher killed mid-job ----------------------------------------------------------------

ELEMENTS = 10_000
WORKERS = 2


def slowly(x: Any) -> Any:
    """0.2 ms an element: the workers are still producing (and asking for DYNAMIC splits)
    when the dispatcher is killed."""
    time.sleep(0.0002)
    return x


@pytest.mark.parametrize(
    ("mode", "sync"),
    [("distributed_epoch", "full"), ("parallel_epochs", "full"), ("distributed_epoch", "normal")],
)
def test_a_dispatcher_killed_mid_job_resumes_it_from_its_journal(
    cluster: ServiceProcesses, tmp_path: Path, mode: str, sync: str
) -> None:
    # --journal-sync normal skips the fsync of each commit: a kill -9 loses nothing still.
    args = ("--work-dir", str(tmp_path / "work"), "--fault-tolerant", "--journal-sync", sync)
    dispatcher = cluster.start_dispatcher(*args)
    for _ in range(WORKERS):
        cluster.start_worker()
    dataset = Dataset.range(ELEMENTS).map(slowly).apply(service.distribute(mode, cluster.target))
    iterator = iter(dataset)
    first = [int(next(iterator)) for _ in range(100)]
    restarted = kill_and_restart(cluster, dispatcher, *args)
    got = first + read_rest(iterator, timeout=60)
    assert "dispatcher resumed from" in cluster.output(restarted)
    # Nothing lost, nothing twice: each worker's whole epoch, or the one distributed epoch.
    expected = range(ELEMENTS) if mode == "distributed_epoch" else list(range(ELEMENTS)) * WORKERS
    missing = set(range(ELEMENTS)) - set(got)
    assert sorted(got) == sorted(expected), (len(got), missing_runs(missing))


def test_a_restarted_dispatcher_keeps_its_datasets_and_named_jobs(
    cluster: ServiceProcesses, tmp_path: Path
) -> None:
    args = ("--work-dir", str(tmp_path / "work"), "--fault-tolerant")
    dispatcher = cluster.start_dispatcher(*args)
    cluster.start_worker()
    source = Dataset.range(2_000)
    dataset_id = register_dataset(cluster.target, source)

    def shared() -> Any:  # a dataset object of its own: iteration 0 of the job's name
        return service.from_dataset_id(
            "parallel_epochs", cluster.target, dataset_id, job_name="shared"
        )

    first_consumer = iter(shared())
    first = [int(next(first_consumer)) for _ in range(50)]
    kill_and_restart(cluster, dispatcher, *args)
    # The same dataset gets the same id, and a consumer of the job's name (and iteration)
    # joins the same job: the two share one epoch, nobody starts another.
    assert register_dataset(cluster.target, source) == dataset_id
    second_consumer = iter(shared())
    both = first + read_rest(second_consumer, 60) + read_rest(first_consumer, 60)
    assert sorted(both) == list(range(2_000))


def test_a_split_asked_for_again_is_the_same_split_across_a_restart(tmp_path: Path) -> None:
    """A worker asks again with the same request number when the reply was lost: it gets the
    split it was handed, from the dispatcher that handed it out or from its next life."""
    config = service.DispatcherConfig(work_dir=str(tmp_path), fault_tolerant_mode=True)
    dispatcher = service.DispatchServer(config)
    port = int(dispatcher.target.rsplit(":", 1)[1])
    client = _rpc.RpcClient(f"127.0.0.1:{port}", SERVICE_NAME, None)
    client.call(  # the first call: a fresh port may be one another test's client last failed on
        "WorkerHeartbeat", {"address": "127.0.0.1:1", "wait_ms": 0}, timeout=10, wait_for_ready=True
    )
    job = client.call(
        "GetOrCreateJob",
        {
            "dataset_id": register_dataset(dispatcher.target, Dataset.range(64)),
            "mode": int(service.ShardingPolicy.DYNAMIC),
            "job_name": None,
            "iteration": 0,
            "num_consumers": None,
            "target_workers": "AUTO",
        },
        timeout=10,
    )[0]
    ((task_id, _, _),) = job["tasks"]

    def split(request: int) -> list[int]:
        header = {"job_id": job["job_id"], "repetition": 0, "task_id": task_id}
        return client.call("GetSplit", {**header, "request": request}, timeout=30)[0]["split"]

    assert split(0) == [0, 1, 2, 3] and split(0) == [0, 1, 2, 3]  # 64 // 16 per split
    assert split(1) == [4, 5, 6, 7]
    dispatcher.stop()
    dispatcher = service.DispatchServer(dataclasses.replace(config, port=port))
    try:
        assert split(1) == [4, 5, 6, 7] and split(2) == [8, 9, 10, 11]
    finally:
        dispatcher.stop()


# -- the journal itself -------------------------------------------------------------------------


def _history() -> list[st.Update]:
    payload = b"\x00payload\xff"
    fingerprint = hashlib.sha256(payload).hexdigest()  # replay checks it
    record = st.DatasetRecord("1000", fingerprint, payload, b"spec", "AUTO", 10, None)
    return [
        st.RegisterDataset(record),
        st.RegisterWorker("127.0.0.1:1", ("gpu",)),
        st.RegisterWorker("127.0.0.1:2"),
        st.CreateJob(11, "1000", 1, "job", 0, None, "ANY"),
        st.CreateTask(12, 11, "127.0.0.1:1", 0, 2),
        st.CreateTask(13, 11, "127.0.0.1:2", 1, 2),
        st.AcquireClient(14, 11, request_id="join-14"),
        st.MoveSplitCursor(11, 0, {"num_units": 10, "split_size": 1, "position": 3, "seed": 7}),
        st.MoveSplitCursor(
            11,
            0,
            {"num_units": 10, "split_size": 1, "position": 4, "seed": 7},
            13,
            0,
            {"num_units": 10, "split_size": 1, "position": 3, "seed": 7},
        ),
        st.FinishTask(12),
        st.RemoveWorker("127.0.0.1:2"),
        st.ReleaseClient(14),
        st.CreateJob(15, "1000", 0, None, 0, None, "ANY"),
        st.FinishJob(11, {"type": "KeyError", "message": "no label"}),
    ]


def _journal_of(work_dir: Path, updates: list[st.Update], compact_at: int = -1) -> dict[str, Any]:
    """Journals ``updates`` (one commit each, a snapshot after update ``compact_at``) and
    closes the journal; the state they made, as JSON."""
    journal = _journal.open_journal(work_dir, incarnation=0)
    for index, update in enumerate(updates):
        journal.state.apply(update)
        journal.append(update)
        journal.commit()
        if index == compact_at:
            journal.compact()
    live = st.state_to_json(journal.state)
    journal.close()
    return live


@pytest.mark.parametrize("compact_at", [-1, 5, 13], ids=["log", "snapshot+log", "snapshot"])
def test_a_reopened_journal_replays_to_the_same_state(tmp_path: Path, compact_at: int) -> None:
    live = _journal_of(tmp_path, _history(), compact_at)
    journal = _journal.open_journal(tmp_path, incarnation=99)  # a replayed one keeps its own
    assert st.state_to_json(journal.state) == live
    assert journal.state.incarnation == 0
    assert journal.replayed == len(_history()) - 1 - compact_at
    assert journal.state.tasks[13].last_split == {
        "request": 0,
        "repetition": 0,
        "cursor": {"num_units": 10, "split_size": 1, "position": 3, "seed": 7},
    }
    journal.close()


def test_a_damaged_journal_is_an_error_never_an_empty_state(tmp_path: Path) -> None:
    _journal_of(tmp_path, _history())
    db = sqlite3.connect(tmp_path / _journal.JOURNAL_FILE)
    db.execute("INSERT INTO updates (body) VALUES (?)", (json.dumps({"type": "FinishTask"}),))
    db.commit()
    db.close()
    config = service.DispatcherConfig(work_dir=str(tmp_path), fault_tolerant_mode=True)
    with pytest.raises(errors.DataLossError, match=r"damaged: update 15 .*FinishTask"):
        service.DispatchServer(config)
    # Garbage where the database was: SQLite's own error, named as a damaged journal.
    (tmp_path / _journal.JOURNAL_FILE).write_bytes(b"not a database " * 1000)
    for name in ("-wal", "-shm"):
        (tmp_path / (_journal.JOURNAL_FILE + name)).unlink(missing_ok=True)
    with pytest.raises(errors.DataLossError, match="damaged: SQLite says file is not a database"):
        service.DispatchServer(config)


def test_a_journal_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    _journal_of(tmp_path, _history()[:3])
    db = sqlite3.connect(tmp_path / _journal.JOURNAL_FILE)
    db.execute("UPDATE meta SET value = ? WHERE key = 'format'", (str(_journal.FORMAT + 1),))
    db.commit()
    db.close()
    with pytest.raises(errors.FailedPreconditionError, match="format 2, written by a newer"):
        _journal.open_journal(tmp_path, incarnation=1)


def test_one_dispatcher_at_a_time_per_work_dir(tmp_path: Path) -> None:
    config = service.DispatcherConfig(work_dir=str(tmp_path), fault_tolerant_mode=True)
    with (
        service.DispatchServer(config),
        pytest.raises(errors.FailedPreconditionError, match="another dispatcher"),
    ):
        service.DispatchServer(config)
    service.DispatchServer(config).stop()  # stopped, it let go of the work_dir


@pytest.mark.parametrize(("sync", "fsyncs"), [("full", True), ("normal", False)])
def test_journal_sync_sets_whether_a_reply_waits_for_an_fsync(
    tmp_path: Path, sync: str, fsyncs: bool
) -> None:
    config = service.DispatcherConfig(
        work_dir=str(tmp_path), fault_tolerant_mode=True, journal_sync=sync
    )
    server = service.DispatchServer(config)
    try:
        journal = server._journal
        assert journal is not None
        # SQLite writes a commit without an fsync; the journal fsyncs before a reply (FULL).
        assert journal._connection().execute("PRAGMA synchronous").fetchone()[0] == 1
        before = journal.fsyncs
        register_dataset(server.target, Dataset.range(3))
        assert journal.commits >= 1
        assert (journal.fsyncs > before) == fsyncs
    finally:
        server.stop()
    with pytest.raises(
        errors.InvalidArgumentError, match="journal_sync must be one of full, normal"
    ):
        service.DispatcherConfig(work_dir=str(tmp_path), journal_sync="FULL")


def test_a_reply_is_sent_once_its_commit_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = service.DispatchServer(
        service.DispatcherConfig(work_dir=str(tmp_path), fault_tolerant_mode=True)
    )
    try:
        journal = server._journal
        assert journal is not None
        synced: list[int] = []  # the commits made when each fsync began
        fsync = journal._fsync_wal

        def slow_fsync() -> None:
            seen = journal.commits
            time.sleep(0.2)  # a slow disk: the reply must wait for it, not pass it
            fsync()
            synced.append(seen)

        monkeypatch.setattr(journal, "_fsync_wal", slow_fsync)
        register_dataset(server.target, Dataset.range(5))
        committed = journal.commits
        # The registration's commit was fsynced before its reply came back.
        assert synced and max(synced) == committed
    finally:
        server.stop()


def test_commits_made_during_an_fsync_share_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = _journal.open_journal(tmp_path, incarnation=0)
    opened = journal.fsyncs  # the new journal's schema, fsynced before its marker
    dispatcher_lock = threading.Lock()  # the dispatcher's: commits are made under it
    first_started, release_first = threading.Event(), threading.Event()
    fsync = journal._fsync_wal
    fsynced: list[int] = []

    def gated_fsync() -> None:
        fsynced.append(journal.commits)  # the commits it covers
        if len(fsynced) == 1:
            first_started.set()
            assert release_first.wait(30)
        fsync()

    monkeypatch.setattr(journal, "_fsync_wal", gated_fsync)
    updates = iter(_history())

    def request() -> None:
        with dispatcher_lock:
            update = next(updates)
            journal.state.apply(update)
            journal.append(update)
            journal.commit()
            through = journal.commits
        journal.sync(through)  # outside the lock, as the dispatcher's reply waits for it

    first = threading.Thread(target=request)
    first.start()
    assert first_started.wait(30)  # its fsync runs, and is slow
    others = [threading.Thread(target=request) for _ in range(4)]
    for thread in others:
        thread.start()
    deadline = time.monotonic() + 30
    while journal.commits < 5 and time.monotonic() < deadline:
        time.sleep(0.01)  # the four commit (the lock is free) and wait for an fsync
    assert journal.commits == 5 and all(thread.is_alive() for thread in others)
    release_first.set()
    for thread in [first, *others]:
        thread.join(30)
        assert not thread.is_alive()
    # Five commits, two fsyncs: the first one's, and one for the four made while it ran.
    assert fsynced == [1, 5]
    assert journal.fsyncs - opened == 2

    def io_error() -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(journal, "_fsync_wal", io_error)
    with pytest.raises(OSError, match="Input/output error"):
        request()  # the sixth commit's fsync fails...
    with pytest.raises(OSError, match="an earlier fsync failed"):
        journal.sync(journal.commits)  # ...and no later sync says it is durable
    monkeypatch.setattr(journal, "_fsync_wal", fsync)
    with pytest.raises(OSError, match="an earlier fsync failed"):
        journal.sync(journal.commits)
    with pytest.raises(OSError, match="an earlier fsync failed"):
        journal.close()  # closed all the same (the dispatcher stops)
    reopened = _journal.open_journal(tmp_path, incarnation=1)
    assert reopened.replayed == 6
    reopened.close()


def test_fault_tolerant_mode_needs_a_work_dir() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="no work_dir is configured"):
        service.DispatcherConfig(fault_tolerant_mode=True)


def test_the_command_line_refuses_a_damaged_journal(tmp_path: Path) -> None:
    (tmp_path / _journal.JOURNAL_FILE).write_bytes(b"\x00" * 4096 + b"junk")
    argv = ["dispatcher", "--port", "0", "--work-dir", str(tmp_path), "--fault-tolerant"]
    with Processes(FEEDLINE_CLI, [("dispatcher", {})], argv=argv, timeout=60) as process:
        assert process.wait_exit("dispatcher", 30) == 2
        assert "error: the dispatcher journal" in process.output("dispatcher", "stdout")


@pytest.mark.parametrize("fails", ["write", "fsync"])
def test_a_journal_that_cannot_be_written_stops_the_dispatcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    """The dispatcher never answers what it could not make durable (an update it cannot
    write, or a commit it cannot fsync): it stops, and started again it has what the journal
    holds. The client whose call failed tries it again, as for any dispatcher that stops, and
    is answered by the dispatcher started again."""
    config = service.DispatcherConfig(work_dir=str(tmp_path), fault_tolerant_mode=True)
    dispatcher = service.DispatchServer(config)
    port = int(dispatcher.target.rsplit(":", 1)[1])
    dataset_id = register_dataset(dispatcher.target, Dataset.range(3))
    journal = dispatcher._journal
    assert journal is not None

    def disk_full(update: st.Update) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    def io_error() -> None:
        raise OSError(5, "Input/output error")

    if fails == "write":
        monkeypatch.setattr(journal, "append", disk_full)
    else:
        monkeypatch.setattr(journal, "_fsync_wal", io_error)
    registered: list[str] = []
    registering = threading.Thread(
        target=lambda: registered.append(register_dataset(dispatcher.target, Dataset.range(4))),
        daemon=True,
    )
    registering.start()
    deadline = time.monotonic() + 10
    while not dispatcher._core.stopped.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dispatcher._core.stopped.is_set()
    dispatcher.stop()
    monkeypatch.undo()
    assert registering.is_alive() and not registered  # refused: it tries again
    with service.DispatchServer(dataclasses.replace(config, port=port), start=False) as again:
        held = list(again._state.datasets)
        # A commit that was written but not fsynced may be held: nobody was told of it.
        assert held[0] == dataset_id and (len(held) == 1 or fails == "fsync")
        again.start()
        registering.join(30)
        assert registered and list(again._state.datasets) == [dataset_id, registered[0]]
