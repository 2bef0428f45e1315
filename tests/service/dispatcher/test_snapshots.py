"""Tests of feedline/service/dispatcher/snapshots.py (and the client's ``distributed_save``):
saves started, refused and resumed, their streams in the state and its journal, and their
progress on the status page and ``/metrics``. A dispatcher and its workers in this process;
the kill tests with real processes are in tests/service/test_distributed_save.py."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from feedline import errors, service
from feedline._net import rpc as _rpc
from feedline.data import Dataset
from feedline.data import experimental as exp
from feedline.data.ops._snapshot_format import is_finished
from feedline.data.ops._snapshot_streams import read_saving
from feedline.service.dispatcher.core import DispatcherCore
from feedline.service.dispatcher.snapshots import Snapshots
from feedline.service.dispatcher.state import (
    AssignStream,
    CommitChunk,
    DatasetRecord,
    DispatcherState,
    FinishSnapshot,
    FinishStream,
    RegisterDataset,
    RegisterWorker,
    RemoveWorker,
    StartSnapshot,
    state_from_json,
    state_to_json,
    update_from_json,
    update_to_json,
)
from feedline.service.protocol import (
    DISPATCHER_SERVICE,
    GetSnapshotStreamRequest,
    SnapshotProgressRequest,
    SnapshotRequest,
    SnapshotStreamReply,
)
from tests.service.http_helpers import fetch, scrape, table, value

pytestmark = pytest.mark.timeout(60)


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def pairs(n: int) -> Dataset:
    return Dataset.range(n).map(lambda x: (x, np.full(4, x, np.float32)))


def test_a_save_is_cut_in_streams_of_the_splits_and_finishes(
    make_cluster: Any, tmp_path: pathlib.Path
) -> None:
    cluster = make_cluster(2, status_port=0)
    path = str(tmp_path / "snapshot")
    exp.distributed_save(pairs(100), path, cluster.address)
    saving = read_saving(path)
    # 100 elements over 2 workers: splits of 100 // 32 = 3 elements, 34 streams.
    assert saving is not None and saving["num_streams"] == 34 and saving["codec"] == "LZ4"
    wait_until(lambda: is_finished(path))
    assert sorted(int(x) for x, _ in Dataset.load(path)) == list(range(100))
    assert read_saving(path) is None
    wait_until(lambda: cluster.dispatcher._state.snapshots[path].finished)
    # The status page and the metrics show the save's progress.
    status, _, page = fetch(cluster.dispatcher.status_url)
    assert status == 200
    (row,) = table(page, "Saves (distributed_save)")
    assert row["streams done"] == "34 of 34" and row["elements"] == "100"
    assert row["state"] == "finished" and row["chunks"] == "34"
    assert int(row["bytes"].replace(",", "")) > 0
    samples = scrape(cluster.dispatcher.status_url)
    assert value(samples, "feedline_dispatcher_save_streams", path=path, state="done") == 34
    assert value(samples, "feedline_dispatcher_save_elements", path=path) == 100
    assert value(samples, "feedline_dispatcher_save_chunks", path=path) == 34


def test_a_source_that_does_not_split_is_one_stream(
    make_cluster: Any, tmp_path: pathlib.Path
) -> None:
    cluster = make_cluster(1)
    path = str(tmp_path / "snapshot")
    dataset = Dataset.from_generator(
        lambda: iter(range(7)), output_signature=exp.get_structure(Dataset.range(1))
    )
    service.distributed_save(dataset, path, cluster.target, compression=None)
    assert read_saving(path)["num_streams"] == 1  # type: ignore[index]
    wait_until(lambda: is_finished(path))
    assert [int(x) for x in Dataset.load(path)] == list(range(7))


def test_a_finished_snapshot_is_not_saved_over(make_cluster: Any, tmp_path: pathlib.Path) -> None:
    cluster = make_cluster(1)
    path = str(tmp_path / "snapshot")
    exp.distributed_save(pairs(5), path, cluster.address)
    wait_until(lambda: is_finished(path))
    with pytest.raises(errors.AlreadyExistsError, match="already holds a finished snapshot"):
        exp.distributed_save(pairs(5), path, cluster.address)
    Dataset.range(3).save(str(tmp_path / "single"))
    with pytest.raises(errors.AlreadyExistsError, match="already holds a finished snapshot"):
        exp.distributed_save(pairs(5), str(tmp_path / "single"), cluster.address)


def test_a_save_of_another_dataset_is_refused(make_cluster: Any, tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "snapshot")
    cluster = make_cluster(0)  # no worker: the save stays unfinished
    exp.distributed_save(pairs(5), path, cluster.address)
    exp.distributed_save(pairs(5), path, cluster.address)  # the same save again: accepted
    with pytest.raises(errors.InvalidArgumentError, match="another dataset"):
        exp.distributed_save(pairs(6), path, cluster.address)
    # A dispatcher that does not know the save reads the refusal from the directory.
    other = make_cluster(0)
    with pytest.raises(errors.InvalidArgumentError, match="unfinished save of another dataset"):
        exp.distributed_save(pairs(6), path, other.address)


def test_an_unfinished_save_resumes_where_its_files_are(
    make_cluster: Any, tmp_path: pathlib.Path
) -> None:
    path = str(tmp_path / "snapshot")
    first = make_cluster(0)
    exp.distributed_save(pairs(20), path, first.address)
    run = read_saving(path)["run"]  # type: ignore[index]
    first.stop()
    # Another dispatcher (no journal): the same dataset resumes the same run.
    second = make_cluster(2)
    exp.distributed_save(pairs(20), path, second.address)
    assert second.dispatcher._state.snapshots[path].run == run
    wait_until(lambda: is_finished(path))
    assert sorted(int(x) for x, _ in Dataset.load(path)) == list(range(20))


def fails_at_seven(x: Any) -> Any:
    if int(x) == 7:
        raise ValueError("no seven")
    return x


def test_a_dataset_that_raises_fails_the_save(make_cluster: Any, tmp_path: pathlib.Path) -> None:
    cluster = make_cluster(2, status_port=0)
    path = str(tmp_path / "snapshot")
    exp.distributed_save(Dataset.range(40).map(fails_at_seven), path, cluster.address)
    with pytest.raises(errors.FailedPreconditionError, match="ValueError: no seven"):
        for _ in Dataset.load(path, wait=True):
            pass
    assert cluster.dispatcher._state.snapshots[path].error.startswith("ValueError: no seven")
    with pytest.raises(errors.FailedPreconditionError, match="failed"):
        exp.distributed_save(Dataset.range(40).map(fails_at_seven), path, cluster.address)
    (row,) = table(fetch(cluster.dispatcher.status_url)[2], "Saves (distributed_save)")
    assert row["state"] == "failed"
    assert not is_finished(path)


def test_a_dropped_worker_frees_its_streams_and_the_state_round_trips() -> None:
    state = DispatcherState(incarnation=7)
    updates = [
        RegisterWorker("w1:1"),
        RegisterWorker("w2:1"),
        StartSnapshot(
            "/s",
            "d1",
            "00ff",
            "run",
            "LZ4",
            3,
            {"num_units": 9, "split_size": 3, "position": 0, "seed": None},
        ),
        AssignStream("/s", 0, "w1:1", 11),
        AssignStream("/s", 1, "w2:1", 12),
        CommitChunk("/s", 0, 11, "chunk_00000000_3_000000000000000b.flchunk", 3),
        FinishStream("/s", 0),
        AssignStream("/s", 2, "w1:1", 13),
        RemoveWorker("w1:1"),
    ]
    for update in updates:
        assert update_from_json(update_to_json(update)) == update  # as the journal keeps it
        state.apply(update)
    snapshot = state.snapshots["/s"]
    assert snapshot.writers == [None, "w2:1", None] and snapshot.done == [True, False, False]
    assert snapshot.generations == [11, 12, 13]
    assert snapshot.chains == [[["chunk_00000000_3_000000000000000b.flchunk", 3]], [], []]
    copy = state_from_json(state_to_json(state))
    assert dataclasses.asdict(copy.snapshots["/s"]) == dataclasses.asdict(snapshot)
    state.apply(FinishSnapshot("/s"))
    assert state.snapshots["/s"].finished


def test_bad_arguments_are_refused(make_cluster: Any, tmp_path: pathlib.Path) -> None:
    cluster = make_cluster(0)
    with pytest.raises(errors.InvalidArgumentError, match="expects a Dataset"):
        exp.distributed_save([1, 2], str(tmp_path), cluster.address)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidArgumentError, match="unsupported compression"):
        exp.distributed_save(pairs(2), str(tmp_path), cluster.address, compression="ZIP")
    with pytest.raises(errors.InvalidArgumentError, match="host:port"):
        exp.distributed_save(pairs(2), str(tmp_path), "")


SNAPSHOT = {
    "path": "s3://bucket/snapshot",
    "dataset_id": "12",
    "fingerprint": "00112233aabbccdd",
    "codec": "LZ4",
    "element_spec": {"spec": {"shape": [], "dtype": "<i8"}},
}
PROGRESS = {
    "address": "localhost:5051",
    "path": "/data/snapshot",
    "stream": 3,
    "chunks": 2,
    "elements": 2048,
    "nbytes": 1 << 20,
    "done": False,
    "error": None,
    "generation": 1 << 33,
    "chunk": "chunk_00000001_1024_0000000200000001.flchunk",
    "count": 1024,
}
STREAM = {
    "path": "/data/snapshot",
    "stream": 3,
    "dataset_id": "12",
    "fingerprint": "ab",
    "run": "r",
    "codec": "NONE",
    "units": [9, 10, 11],
    "generation": 7,
    "chunks": [["chunk_00000000_4_0000000000000005.flchunk", 4]],
}


@pytest.mark.parametrize(
    ("kind", "header"),
    [
        (SnapshotRequest, SNAPSHOT),
        (SnapshotProgressRequest, PROGRESS),
        (SnapshotStreamReply, STREAM),
        (SnapshotStreamReply, {**STREAM, "units": None, "chunks": []}),
        (GetSnapshotStreamRequest, {"address": "localhost:5051"}),
    ],
)
def test_a_header_reads_back_to_itself(kind: Any, header: dict[str, Any]) -> None:
    message = kind.from_header(header)
    assert message.to_header() == header
    assert SnapshotStreamReply.from_header({"stream": None}) is None


@pytest.mark.parametrize(
    ("kind", "header", "message"),
    [
        (SnapshotRequest, {**SNAPSHOT, "codec": "ZIP"}, "unknown codec"),
        (SnapshotRequest, {**SNAPSHOT, "path": ""}, "path must not be empty"),
        (SnapshotRequest, {**SNAPSHOT, "path": "a\nb"}, "printable"),
        (SnapshotProgressRequest, {**PROGRESS, "elements": -1}, "elements must be >= 0"),
        (SnapshotProgressRequest, {**PROGRESS, "done": 1}, "'done'"),
        (SnapshotProgressRequest, {**PROGRESS, "generation": -1}, "generation must be >= 0"),
        (SnapshotStreamReply, {**STREAM, "chunks": [["a", -1]]}, "chunks must be"),
        (GetSnapshotStreamRequest, {"address": 5}, "'address'"),
    ],
)
def test_a_malformed_header_is_refused(kind: Any, header: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=message):
        kind.from_header(header)


def test_a_malformed_call_is_refused_and_the_dispatcher_serves_on(make_cluster: Any) -> None:
    cluster = make_cluster(0)
    raw = _rpc.RpcClient(cluster.address, DISPATCHER_SERVICE)
    with pytest.raises(errors.InvalidArgumentError, match="path"):
        raw.call("Snapshot", {**SNAPSHOT, "path": 3}, timeout=5)
    with pytest.raises(errors.NotFoundError, match="no dataset"):
        raw.call("Snapshot", SNAPSHOT, timeout=5)
    with pytest.raises(errors.NotFoundError, match="no distributed_save"):
        raw.call("SnapshotProgress", PROGRESS, timeout=5)
    reply, _ = raw.call("GetSnapshotStream", {"address": "nobody:1"}, timeout=5)
    assert reply == {"stream": None}
    raw.close()


def test_only_a_streams_current_writer_commits_its_chunks(tmp_path: pathlib.Path) -> None:
    """The fence, at the handler: a writer dropped while it still runs is refused its next
    chunk and its stream's end; an answer asked again is the same answer."""
    path = str(tmp_path)
    core = DispatcherCore()
    snapshots = Snapshots(core)
    with core.lock:
        core.apply(RegisterDataset(DatasetRecord("d1", "00ff", b"", b"", None, 4, None)))
        core.apply(StartSnapshot(path, "d1", "00ff", "run", "NONE", 1, None))
        core.apply(RegisterWorker("a:1"))
        core.apply(RegisterWorker("b:1"))

    def ask(address: str) -> SnapshotStreamReply:
        reply = snapshots.get_snapshot_stream({"address": address}, [])[0]
        stream = SnapshotStreamReply.from_header(reply)
        assert stream is not None
        return stream

    def commit(address: str, generation: int, index: int, count: int, total: int) -> bool:
        chunk = f"chunk_{index:08d}_{count}_{generation:016x}.flchunk"
        request = SnapshotProgressRequest(
            address, path, 0, index + 1, total, 0, False, None, generation, chunk, count
        )
        return snapshots.snapshot_progress(request.to_header(), [])[0]["accepted"]

    def done(address: str, generation: int, chunks: int) -> bool:
        request = SnapshotProgressRequest(
            address, path, 0, chunks, 0, 0, True, generation=generation
        )
        return snapshots.snapshot_progress(request.to_header(), [])[0]["accepted"]

    first = ask("a:1")
    assert first.generation > 0 and first.chunks == []
    assert commit("a:1", first.generation, 0, 2, 2)
    assert commit("a:1", first.generation, 0, 2, 2)  # asked again: the same answer
    assert not commit("a:1", first.generation, 0, 3, 3)  # another chunk 0: never
    assert not commit("a:1", first.generation, 2, 2, 6)  # past a gap: never
    with core.lock:
        core.apply(RemoveWorker("a:1"))  # missed its heartbeats; it runs on, a zombie
    second = ask("b:1")
    assert second.generation > first.generation
    assert second.chunks == [(f"chunk_00000000_2_{first.generation:016x}.flchunk", 2)]
    assert not commit("a:1", first.generation, 1, 2, 4)  # the zombie's next chunk
    with core.lock:
        core.apply(RegisterWorker("a:1"))  # it registers again: still not its stream
    assert not commit("a:1", first.generation, 1, 2, 4)
    assert not done("a:1", first.generation, 1)
    assert commit("b:1", second.generation, 1, 5, 7)
    assert not done("b:1", second.generation, 1)  # it has two chunks
    assert done("b:1", second.generation, 2)
    assert done("b:1", second.generation, 2)  # asked again
    record = core.state.snapshots[path]
    assert record.done == [True] and record.finished  # its DONE lists the accepted chunks
    assert [count for _, count in record.chains[0]] == [2, 5]
    assert [
        shard["chunks"] for shard in json.loads((tmp_path / "DONE").read_text())["body"]["shards"]
    ] == [record.chains[0]]
