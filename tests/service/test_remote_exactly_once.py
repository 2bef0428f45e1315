"""Exactly-once DYNAMIC epochs over objects of a store: a fault-tolerant ``feedline dispatcher``,
real ``feedline worker`` processes that read the objects from a real S3-compatible server on
loopback (``tests/conftest.py``), and one of them killed with kill -9 in the middle of an
object, after the consumer received part of it. Every record reaches the consumer exactly once.

How the kill lands mid-object: the pipeline's map stops at one chosen record of one object, the
first time any worker reaches it, and writes that worker's process id to a marker file (the
replayed split passes through, since the marker exists then). The test waits until the marker
names a worker and the consumer holds the records of that object before the chosen one, then
kills that worker: its reader holds the object open with records left unread. With records of
1 MiB the objects are 12 MiB and the chosen record lies in their first 8 MiB, the range a reader
fetches at a time (``_REMOTE_BLOCK``): unless it reads further ahead, the worker dies with the
rest of the object not yet read from the store.
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

import pytest

from feedline.data import Dataset, TFRecordDataset
from feedline.io import TFRecordWriter, gfile
from feedline.service import ShardingPolicy, distribute
from feedline.service.splits import SplitCursor, split_plan
from tests.service.procs import ServiceProcesses

pytestmark = pytest.mark.timeout(240)


def record_of(k: int, j: int, size: int) -> bytes:
    """Record ``j`` of object ``k``: ``b"K.J"``, padded with dots to ``size`` bytes."""
    return (b"%d.%d" % (k, j)).ljust(size, b".")


def write_objects(prefix: str, files: int, per_file: int, size: int) -> list[bytes]:
    """``files`` TFRecord objects ``prefix/part-KK.tfrecord`` of ``per_file`` records
    (``record_of``); all the records."""
    records = []
    for k in range(files):
        with TFRecordWriter(f"{prefix}/part-{k:02d}.tfrecord") as writer:
            for j in range(per_file):
                record = record_of(k, j, size)
                writer.write(record)
                records.append(record)
    return records


def stop_once_at(record: bytes, marker: str, x: Any) -> Any:
    """The map of the pipeline: the first worker to reach ``record`` writes its process id to
    ``marker`` and stops there (until it is killed); every other call passes ``x`` through."""
    if x.item() == record:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return x
        os.write(fd, b"%d" % os.getpid())
        os.close(fd)
        time.sleep(600)  # killed long before
    return x


def pipeline(prefix: str, stop: Callable[[Any], Any], listed: bool = True) -> Dataset:
    """The objects ``prefix/part-*.tfrecord`` two at a time: listed (``list_files``), or
    named one by one (``TFRecordDataset`` of their URLs, which no listing pins)."""
    if not listed:
        urls = sorted(gfile.glob(f"{prefix}/part-*.tfrecord"))
        return TFRecordDataset(urls, num_parallel_reads=2).map(stop)
    files = Dataset.list_files(f"{prefix}/part-*.tfrecord", shuffle=False)
    return files.interleave(TFRecordDataset, cycle_length=2).map(stop)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting until {what}")
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("files", "per_file", "size", "workers", "objects_per_split"),
    [(6, 12, 0, 3, 1), (64, 3, 0, 2, 2), (3, 12, 1 << 20, 2, 1)],
    ids=["one-object-splits", "two-object-splits", "12-mib-objects"],
)
def test_a_worker_killed_mid_object_loses_and_repeats_no_record(
    s3_bucket: str,
    tmp_path: Path,
    files: int,
    per_file: int,
    size: int,
    workers: int,
    objects_per_split: int,
) -> None:
    prefix = f"{s3_bucket}/shards"
    records = write_objects(prefix, files, per_file, size)
    plan = split_plan(pipeline(prefix, lambda x: x))
    assert SplitCursor.start(plan, 0, workers).split_size == objects_per_split
    chosen_object = files // 2
    chosen = per_file // 2
    marker = tmp_path / "stopped"
    before = [record_of(chosen_object, j, size) for j in range(chosen)]
    stop = functools.partial(stop_once_at, record_of(chosen_object, chosen, size), str(marker))

    with ServiceProcesses() as cluster:
        cluster.start_dispatcher(*_dispatcher_args(tmp_path))
        names = [cluster.start_worker() for _ in range(workers)]
        dataset = pipeline(prefix, stop).apply(distribute(ShardingPolicy.DYNAMIC, cluster.target))
        iterator = iter(dataset)
        got, raised, reader, victim = _read_until_a_worker_stops(cluster, iterator, names, marker)
        wait_until(
            lambda: set(before) <= set(got) or bool(raised),
            60,
            f"the consumer has records 0-{chosen - 1} of object {chosen_object}",
        )
        assert not raised, raised
        cluster.send(victim, signal.SIGKILL)
        assert cluster.wait_exit(victim, 30) == -signal.SIGKILL
        reader.join(150)
        hung = reader.is_alive()
        iterator.close()

    assert not hung, f"the consumer hung ({len(got)} of {len(records)} records read)"
    assert not raised, raised
    duplicated = sorted(r[:8] for r, n in Counter(got).items() if n > 1)
    assert duplicated == [], "records delivered twice"
    assert sorted(r[:8] for r in set(records) - set(got)) == [], "records lost"
    assert sorted(got) == sorted(records)


@pytest.mark.parametrize("listed", [True, False], ids=["listed", "named"])
def test_an_object_replaced_before_its_split_runs_again_is_data_loss(
    s3_bucket: str, tmp_path: Path, listed: bool
) -> None:
    """The worker reading object 1 stops in its middle; the object is replaced in the store,
    then the worker is killed. The split runs again on the other worker, which finds another
    version than the one the first run read (the listing's, or for objects named one by one the
    one the first run pinned at the dispatcher): the consumer gets a DataLossError naming the
    object, never the new version's records after the old one's."""
    from feedline.errors import DataLossError

    prefix = f"{s3_bucket}/replaced-{'listed' if listed else 'named'}"
    files, per_file = 4, 6
    write_objects(prefix, files, per_file, 0)
    chosen_object, chosen = 1, 3
    url = f"{prefix}/part-{chosen_object:02d}.tfrecord"
    marker = tmp_path / "stopped"
    before = [record_of(chosen_object, j, 0) for j in range(chosen)]
    stop = functools.partial(stop_once_at, record_of(chosen_object, chosen, 0), str(marker))

    with ServiceProcesses() as cluster:
        cluster.start_dispatcher(*_dispatcher_args(tmp_path))
        names = [cluster.start_worker() for _ in range(2)]
        dataset = pipeline(prefix, stop, listed).apply(
            distribute(ShardingPolicy.DYNAMIC, cluster.target)
        )
        iterator = iter(dataset)
        got, raised, reader, victim = _read_until_a_worker_stops(cluster, iterator, names, marker)
        wait_until(lambda: set(before) <= set(got) or bool(raised), 60, "records 0-2 of object 1")
        assert not raised, raised
        with TFRecordWriter(url) as writer:  # another version, as long as the first
            for j in range(per_file):
                writer.write(b"new %d" % j)
        cluster.send(victim, signal.SIGKILL)
        assert cluster.wait_exit(victim, 30) == -signal.SIGKILL
        reader.join(150)
        hung = reader.is_alive()
        iterator.close()

    assert not hung, f"the consumer hung ({len(got)} records read)"
    assert [type(error) for error in raised] == [DataLossError], raised
    assert url in str(raised[0]) and "changed since it was listed or first read" in str(raised[0])
    assert not [r for r in got if r.startswith(b"new")], "records of the new version delivered"


def _dispatcher_args(tmp_path: Path) -> tuple[str, ...]:
    """A fault-tolerant dispatcher that drops a killed worker (and runs its splits again)
    after 3 s, not 10."""
    return ("--work-dir", str(tmp_path / "work"), "--fault-tolerant", "--worker-timeout-ms", "3000")


def _read_until_a_worker_stops(
    cluster: ServiceProcesses, iterator: Any, names: list[str], marker: Path
) -> tuple[list[bytes], list[BaseException], threading.Thread, str]:
    """Reads ``iterator`` in a thread until the worker that ``marker`` names (its pid, written
    when it stopped mid-object) stopped: what was read, what was raised, the thread, and the
    stopped worker's name."""
    got: list[bytes] = []
    raised: list[BaseException] = []

    def read() -> None:
        try:
            for x in iterator:
                got.append(x.item())
        except BaseException as error:
            raised.append(error)

    reader = threading.Thread(target=read, name="consumer", daemon=True)
    reader.start()
    wait_until(lambda: marker.exists() and marker.read_text() != "", 120, "a worker stops")
    pid = int(marker.read_text())
    (victim,) = [name for name in names if cluster.pid(name) == pid]
    return got, raised, reader, victim
