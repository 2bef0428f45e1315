"""``distributed_save`` with real ``feedline worker`` and ``feedline dispatcher`` processes:
a worker killed with kill -9 in the middle of a chunk (on a local path and on S3), a worker
stopped (SIGSTOP) past ``worker_timeout_ms`` and resumed while its stream is another's (a
zombie), a fault-tolerant dispatcher killed with kill -9 and started again on its journal, and
a worker that joins halfway. Every save ends with a snapshot holding every element exactly
once.

Each element is ``(x, pid)``: the process id of the worker that computed it, so a test can tell
who wrote what. How a kill lands mid-chunk: the map stops at one chosen element, the first time
any worker reaches it, after the stream's first chunk is committed, and writes that worker's
process id to a marker file (the stream's new writer passes through, since the marker exists
then); the test kills that worker. Every wait has a timeout.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from feedline import service
from feedline.data import Dataset
from feedline.data.ops import _snapshot_fs as fs
from feedline.data.ops._snapshot_format import CHUNK_BYTES, is_finished
from feedline.data.ops._snapshot_streams import read_saving
from tests.service.procs import ServiceProcesses

pytestmark = pytest.mark.timeout(180)

#: 640 elements over 32 streams (two workers: splits of 20), each stream two chunks: the first
#: committed at 16 elements of 256 KiB (``CHUNK_BYTES``), the second at the stream's end.
ELEMENTS = 640
WIDTH = CHUNK_BYTES // 16 // 4
#: Element 117 is the 18th of stream 5 (elements 100-119): its first chunk is committed.
CHOSEN = 117


def tagged(marker: str | None, pause_s: float, x: Any) -> Any:
    """``(x, pid, a row of x)``; at ``CHOSEN``, the first worker to reach it writes its pid to
    ``marker`` and stops there until it is killed."""
    if marker is not None and int(x) == CHOSEN:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            pass
        else:
            os.write(fd, b"%d" % os.getpid())
            os.close(fd)
            time.sleep(600)  # killed long before
    if pause_s:
        time.sleep(pause_s)
    return x, np.int64(os.getpid()), np.full(WIDTH, x, np.float32)


def gated(marker: str, go: str, x: Any) -> Any:
    """``tagged``, except that the worker stopping at ``CHOSEN`` and the last element wait for
    the file ``go`` (at most 120 s) instead of a kill."""
    if int(x) in (CHOSEN, ELEMENTS - 1):
        first = True
        if int(x) == CHOSEN:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                first = False
            else:
                os.write(fd, b"%d" % os.getpid())
                os.close(fd)
        deadline = time.monotonic() + 120
        while first and not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.02)
    return tagged(None, 0.0, x)


def dataset(marker: Path | None = None, pause_s: float = 0.0) -> Dataset:
    stop = functools.partial(tagged, None if marker is None else str(marker), pause_s)
    return Dataset.range(ELEMENTS).map(stop)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting until {what}")
        time.sleep(0.02)


def saved(path: str) -> list[tuple[int, int]]:
    """``(x, pid)`` of every element of the finished snapshot, checking each row."""
    found = []
    for x, pid, row in Dataset.load(path):
        assert row.shape == (WIDTH,) and row[0] == x and row[-1] == x
        found.append((int(x), int(pid)))
    return found


def check_exactly_once(found: list[tuple[int, int]]) -> None:
    counts = Counter(x for x, _ in found)
    assert sorted(x for x, n in counts.items() if n > 1) == [], "elements saved twice"
    assert sorted(set(range(ELEMENTS)) - set(counts)) == [], "elements lost"


def kill_mid_chunk(cluster: ServiceProcesses, names: list[str], marker: Path) -> int:
    """Kills the worker stopped at ``CHOSEN``; its process id."""
    wait_until(lambda: marker.exists() and marker.read_text() != "", 90, "a worker stops")
    pid = int(marker.read_text())
    (victim,) = [name for name in names if cluster.pid(name) == pid]
    cluster.send(victim, signal.SIGKILL)
    assert cluster.wait_exit(victim, 30) == -signal.SIGKILL
    return pid


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_worker_killed_mid_chunk_leaves_every_element_once(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    path = str(tmp_path / "snapshot")
    if store == "s3":
        path = f"{request.getfixturevalue('s3_bucket')}/snapshot"
    marker = tmp_path / "stopped"
    with ServiceProcesses() as cluster:
        config = service.DispatcherConfig(
            port=cluster.port, worker_timeout_ms=1000, job_gc_check_interval_ms=100
        )
        with service.DispatchServer(config) as dispatcher:
            names = [cluster.start_worker() for _ in range(2)]
            service.distributed_save(dataset(marker), path, cluster.address)
            saving = read_saving(path)
            assert saving is not None and saving["num_streams"] == 32
            killed = kill_mid_chunk(cluster, names, marker)
            stream = fs.join(path, saving["run"], "shard_00005")
            # The stream's first chunk was committed before the kill, and is kept.
            assert any(name.startswith("chunk_00000000_16") for name in fs.listdir(stream))
            wait_until(lambda: is_finished(path), 90, "the save finishes")
            # The dispatcher records the save as finished once it has written DONE.
            record = dispatcher._state.snapshots[path]
            wait_until(lambda: record.finished, 30, "the dispatcher records the end")
    found = saved(path)
    check_exactly_once(found)
    # The killed worker's committed chunk stays: elements 100-115 are its own.
    assert {pid for x, pid in found if 100 <= x < 116} == {killed}
    assert killed not in {pid for x, pid in found if 116 <= x < 120}


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_worker_stopped_past_its_timeout_cannot_commit_when_it_resumes(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The zombie: a worker stopped (SIGSTOP) mid-stream past ``worker_timeout_ms`` is dropped
    and its stream finished by another; resumed (SIGCONT), it writes its next chunk, which is
    refused: neither the snapshot nor a reader following the save counts it. The save cannot
    finish before the zombie has written (its last element waits for the same ``go`` file)."""
    path = str(tmp_path / "snapshot")
    if store == "s3":
        path = f"{request.getfixturevalue('s3_bucket')}/snapshot"
    marker, go = tmp_path / "stopped", tmp_path / "go"
    with ServiceProcesses() as cluster:
        config = service.DispatcherConfig(
            port=cluster.port, worker_timeout_ms=1000, job_gc_check_interval_ms=100
        )
        with service.DispatchServer(config):
            names = [cluster.start_worker() for _ in range(2)]
            save = Dataset.range(ELEMENTS).map(functools.partial(gated, str(marker), str(go)))
            service.distributed_save(save, path, cluster.address)
            names.append(cluster.start_worker())  # the stream with the last element waits
            saving = read_saving(path)
            assert saving is not None and saving["num_streams"] == 32
            stream = fs.join(path, saving["run"], "shard_00005")
            read: list[tuple[int, int]] = []
            reader = threading.Thread(
                target=lambda: read.extend(
                    (int(x), int(p)) for x, p, _ in Dataset.load(path, wait=True)
                ),
                daemon=True,
            )
            reader.start()
            wait_until(lambda: marker.exists() and marker.read_text() != "", 90, "a worker stops")
            zombie = int(marker.read_text())
            (name,) = [n for n in names if cluster.pid(n) == zombie]
            cluster.send(name, signal.SIGSTOP)
            try:
                # Dropped after worker_timeout_ms, its stream goes to another worker.
                wait_until(lambda: fs.exists(fs.join(stream, "DONE")), 90, "stream 5 is done")
                files = {n for n in fs.listdir(stream) if n.endswith(".flchunk")}
                go.touch()
            finally:
                cluster.send(name, signal.SIGCONT)
            # Resumed, the zombie writes the chunk it had open (its clock says it is due).
            wait_until(
                lambda: len({n for n in fs.listdir(stream) if n.endswith(".flchunk")} - files),
                60,
                "the zombie writes a chunk",
            )
            wait_until(lambda: is_finished(path), 90, "the save finishes")
            reader.join(60)
            assert not reader.is_alive()
            assert cluster.alive(name)
    found = saved(path)
    check_exactly_once(found)
    assert sorted(read) == sorted(found)  # the reader that followed the save read the same
    assert {pid for x, pid in found if 100 <= x < 116} == {zombie}  # committed before it stopped
    assert zombie not in {pid for x, pid in found if 116 <= x < 120}


def test_a_dispatcher_killed_and_restarted_on_its_journal_finishes_the_save(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "snapshot")
    args = ("--work-dir", str(tmp_path / "work"), "--fault-tolerant")
    with ServiceProcesses() as cluster:
        dispatcher = cluster.start_dispatcher(*args)
        for _ in range(2):
            cluster.start_worker()
        service.distributed_save(dataset(pause_s=0.01), path, cluster.address)
        saving = read_saving(path)
        assert saving is not None
        run = fs.join(path, saving["run"])

        def streams_done() -> int:
            return sum(
                fs.exists(fs.join(run, f"shard_{s:05d}", "DONE"))
                for s in range(saving["num_streams"])
            )

        wait_until(lambda: streams_done() >= 2, 60, "two streams are complete")
        cluster.send(dispatcher, signal.SIGKILL)
        assert cluster.wait_exit(dispatcher, 30) == -signal.SIGKILL
        assert not is_finished(path)
        cluster.start_dispatcher(*args)
        wait_until(lambda: is_finished(path), 90, "the save finishes")
    check_exactly_once(saved(path))


def test_a_worker_added_mid_save_writes_streams(tmp_path: Path) -> None:
    path = str(tmp_path / "snapshot")
    with ServiceProcesses() as cluster:
        config = service.DispatcherConfig(port=cluster.port)
        with service.DispatchServer(config):
            first = cluster.start_worker()
            service.distributed_save(dataset(pause_s=0.008), path, cluster.address)
            run = fs.join(path, read_saving(path)["run"])  # type: ignore[index]
            wait_until(lambda: fs.exists(fs.join(run, "shard_00000", "DONE")), 60, "a stream")
            second = cluster.start_worker()
            pids = {cluster.pid(first), cluster.pid(second)}
            wait_until(lambda: is_finished(path), 90, "the save finishes")
    found = saved(path)
    check_exactly_once(found)
    assert {pid for _, pid in found} == pids
