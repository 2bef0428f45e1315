"""Tests of feedline/data/ops/snapshot_positions.py: the elements of a snapshot by stream and
offset, finished or still being written (waiting for chunks, a stalled or failed save, chunks
that change under the reader)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from feedline.data import Dataset
from feedline.data.ops import _snapshot_format as fmt
from feedline.data.ops import _snapshot_fs as fs
from feedline.data.ops import _snapshot_streams as streams
from feedline.data.ops.snapshot_positions import SnapshotPositions
from feedline.errors import (
    DataLossError,
    FailedPreconditionError,
    NotFoundError,
    OutOfRangeError,
    UnavailableError,
)
from tests.data.test_load_while_writing import SPEC, write_stream


def test_a_finished_snapshot_s_places_across_chunks_and_element_structures(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "saved")
    elements = Dataset.range(50).map(
        lambda x: {"id": x, "row": np.full(3, x, np.float32), "name": b"e%d" % int(x)}
    )
    elements.save(path, shard_func=lambda e: e["id"] // 20)  # shards of 20, 20 and 10
    with pytest.MonkeyPatch.context() as patch:  # several chunks a shard
        patch.setattr(fmt, "CHUNK_ROWS", 7)
        elements.save(str(tmp_path / "chunked"), shard_func=lambda e: e["id"] // 20)
    for where in (path, str(tmp_path / "chunked")):
        positions = SnapshotPositions.open(where, elements.element_spec)
        assert positions.num_streams == 3
        assert [positions.length(k) for k in range(3)] == [20, 20, 10]
        assert positions.total() == 50
        rows = positions.rows(1, 3, 19)  # across chunks of 7: 0-6, 7-13, 14-19
        assert [int(r["id"]) for r in rows] == list(range(23, 39))
        assert rows[0]["name"] == b"e23" and rows[0]["row"].tolist() == [23.0] * 3
        assert positions.rows(2, 10, 10) == []
        with pytest.raises(OutOfRangeError):
            positions.rows(2, 5, 11)


def test_a_save_being_written_is_read_as_its_chunks_are_committed(tmp_path: Path) -> None:
    path = str(tmp_path / "saving")
    streams.start_save(path, "run", SPEC, "NONE", 2)
    positions = SnapshotPositions.open(path, SPEC, timeout_s=30)
    assert positions.length(0) is None and positions.total() is None
    read: list[tuple[float, list[int]]] = []
    started = time.monotonic()

    def reader() -> None:
        rows = [int(x) for x in positions.rows(1, 2, 6)]
        read.append((time.monotonic() - started, rows))

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()  # nothing of stream 1 yet
    write_stream(path, 1, range(100, 110), stop_after=4)  # 4 of the 6: still waiting
    time.sleep(0.3)
    assert thread.is_alive() and positions.length(1) is None
    writer = streams.StreamWriter(fmt.shard_dir(f"{path}/run", 1), SPEC, "NONE")
    write_stream(path, 0, range(0, 3))
    assert writer.write(iter(Dataset.range(100, 110)))  # takes over, skips the committed 4
    thread.join(30)
    assert not thread.is_alive() and read[0][1] == [102, 103, 104, 105] and read[0][0] > 0.5
    positions.wait(1, lambda: positions.length(1) is not None)  # its DONE, now written
    assert positions.length(1) == 10 and positions.length(0) is None  # not looked at yet
    assert [int(x) for x in positions.rows(0, 0, 3)] == [0, 1, 2]
    assert positions.total() == 13
    streams.finish_save(path, "run", 2)
    assert [int(x) for x in SnapshotPositions.open(path, SPEC).rows(1, 0, 10)] == list(
        range(100, 110)
    )


def test_a_stalled_save_times_out_and_a_failed_one_says_why(tmp_path: Path) -> None:
    path = str(tmp_path / "stalled")
    streams.start_save(path, "run", SPEC, "NONE", 1)
    write_stream(path, 0, range(0, 4), stop_after=2)  # two committed, then the writer stops
    positions = SnapshotPositions.open(path, SPEC, timeout_s=0.5)
    assert [int(x) for x in positions.rows(0, 0, 2)] == [0, 1]
    started = time.monotonic()
    with pytest.raises(UnavailableError, match=r"has not moved for 0\.5 s"):
        positions.rows(0, 0, 3)
    assert 0.5 <= time.monotonic() - started < 5
    streams.write_error(path, "ValueError: bad element 3")
    with pytest.raises(FailedPreconditionError, match="bad element 3"):
        SnapshotPositions.open(path, SPEC, timeout_s=30).rows(0, 0, 3)
    with pytest.raises(NotFoundError):
        SnapshotPositions.open(str(tmp_path / "nothing"), SPEC)


def test_committed_chunks_that_change_under_the_reader_are_data_loss(tmp_path: Path) -> None:
    path = str(tmp_path / "changed")
    streams.start_save(path, "run", SPEC, "NONE", 1)
    write_stream(path, 0, range(0, 4), stop_after=2)
    positions = SnapshotPositions.open(path, SPEC, timeout_s=5)
    assert [int(x) for x in positions.rows(0, 0, 2)] == [0, 1]
    directory = fmt.shard_dir(f"{path}/run", 0)
    for name in fs.listdir(directory):  # another save's stream in its place
        fs.remove(fs.join(directory, name))
    write_stream(path, 0, range(10, 16), every=3)
    with pytest.raises(DataLossError, match="changed while they were read"):
        positions.rows(0, 0, 3)
