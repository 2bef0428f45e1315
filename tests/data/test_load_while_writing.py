"""Tests of feedline/data/ops/load_while_writing.py and _snapshot_streams.py: the streams of a
distributed save, written chunk by chunk, taken over by another writer, and read by
``Dataset.load(path, wait=True)`` while they are written."""

from __future__ import annotations

import os
import pathlib
import tempfile
import threading
import time
from collections import Counter
from typing import Any
from unittest import mock

import pytest

from feedline.data import Dataset
from feedline.data.ops import _snapshot_format as fmt
from feedline.data.ops import _snapshot_streams as streams
from feedline.data.ops.load_while_writing import LoadWhileWritingDataset
from feedline.errors import DataLossError, InvalidArgumentError
from tests.data.checkpoint_utils import checkpoint_test

_SCRATCH = tempfile.TemporaryDirectory(prefix="feedline-test-load-while-writing-")
SPEC = Dataset.range(1).element_spec


def write_stream(
    path: str, stream: int, values: range, every: int = 2, stop_after: int | None = None
) -> Any:
    """Writes ``values`` as stream ``stream`` of run ``run``, a chunk every ``every`` elements
    (the writer's clock moves one second per element); stops after ``stop_after`` elements."""
    now = [0.0]

    def elements() -> Any:
        for x in Dataset.range(values.start, values.stop):
            now[0] += 1
            yield x

    writer = streams.StreamWriter(
        fmt.shard_dir(f"{path}/run", stream),
        SPEC,
        "NONE",
        commit_interval_s=every - 1,
        clock=lambda: now[0],
    )
    stopped = (lambda: now[0] > stop_after) if stop_after is not None else (lambda: False)
    return writer, writer.write(elements(), stopped)


def finished_streams(name: str) -> LoadWhileWritingDataset:
    """Three streams of 5, 0 and 7 elements in chunks of two, finished."""
    path = os.path.join(_SCRATCH.name, name)
    if not fmt.is_finished(path):
        streams.start_save(path, "run", SPEC, "NONE", 3)
        for stream, values in enumerate([range(0, 5), range(0), range(100, 107)]):
            write_stream(path, stream, values)
        streams.finish_save(path, "run", 3)
    return LoadWhileWritingDataset(path, "run", 3, SPEC)


test_checkpointing = checkpoint_test(__name__, streams=lambda: finished_streams("ckpt"))


def test_a_chunk_is_committed_by_rows_bytes_or_time(tmp_path: pathlib.Path) -> None:
    writer, complete = write_stream(str(tmp_path), 0, range(5))
    assert complete
    assert writer.chunks == [
        (streams.stream_chunk_name(0, 2), 2),
        (streams.stream_chunk_name(1, 2), 2),
        (streams.stream_chunk_name(2, 1), 1),
    ]
    assert writer.chunks[0][0] == "chunk_00000000_2_0000000000000000.flchunk"
    directory = fmt.shard_dir(f"{tmp_path}/run", 0)
    assert streams.committed_chunks(directory) == writer.chunks
    assert streams.stream_done(directory) == writer.chunks


def test_a_stream_taken_over_keeps_the_committed_chunks_and_writes_on(
    tmp_path: pathlib.Path,
) -> None:
    directory = fmt.shard_dir(f"{tmp_path}/run", 0)
    # The first writer stops at its 6th element (its third chunk not committed).
    assert write_stream(str(tmp_path), 0, range(9), stop_after=5) == (mock.ANY, False)
    assert streams.committed_chunks(directory) == [
        (streams.stream_chunk_name(0, 2), 2),
        (streams.stream_chunk_name(1, 2), 2),
    ]
    assert streams.stream_done(directory) is None
    # Another writer takes it over: it skips the 4 committed elements.
    reports: list[tuple[int, int, int, Any]] = []

    def accept(*report: Any) -> bool:
        reports.append(report)
        return True

    second = streams.StreamWriter(directory, SPEC, "NONE", accept=accept, commit_interval_s=60)
    assert second.committed == 4
    assert second.write(iter(Dataset.range(9)))
    assert [count for _, count in streams.stream_done(directory) or []] == [2, 2, 5]
    # The third chunk is asked for, then the stream's end.
    assert [r[:2] for r in reports] == [(3, 9), (3, 9)]
    assert reports[0][3] == (streams.stream_chunk_name(2, 5), 5) and reports[1][3] is None
    path = str(tmp_path)
    streams.start_save(path, "run", SPEC, "NONE", 1)
    streams.finish_save(path, "run", 1)
    assert [int(x) for x in Dataset.load(path)] == list(range(9))


def test_a_refused_writer_commits_nothing_and_its_successor_publishes_what_was_accepted(
    tmp_path: pathlib.Path,
) -> None:
    directory = fmt.shard_dir(f"{tmp_path}/run", 0)
    accepted: list[tuple[str, int]] = []  # the chain the dispatcher keeps

    def owner(generation: int) -> Any:
        """What the dispatcher answers: the writer of ``generation`` owns the stream."""

        def accept(chunks: int, elements: int, nbytes: int, chunk: Any) -> bool:
            if generation != current[0] or (chunk is not None and chunks != len(accepted) + 1):
                return False
            if chunk is not None:
                accepted.append(chunk)
            return True

        return accept

    current = [1]
    now = [0.0]

    def elements() -> Any:
        """0 to 8, the clock moving a second each (a chunk every two); the writer is dropped
        after the third, and the stream goes to generation 2."""
        for x in Dataset.range(9):
            now[0] += 1
            if int(x) == 3:
                current[0] = 2
            yield x

    zombie = streams.StreamWriter(
        directory,
        SPEC,
        "NONE",
        generation=1,
        chunks=[],
        accept=owner(1),
        commit_interval_s=1,
        clock=lambda: now[0],
    )
    assert not zombie.write(elements()) and zombie.revoked
    assert accepted == [(streams.stream_chunk_name(0, 2, 1), 2)]
    # Chunk 0 was accepted; say its marker was lost with its writer: the successor is handed
    # the accepted chunk and publishes the marker.
    os.remove(os.path.join(directory, streams.stream_chunk_name(0, 2, 1)[:-8] + ".committed"))
    assert streams.committed_chunks(directory) == []
    successor = streams.StreamWriter(
        directory, SPEC, "NONE", generation=2, chunks=list(accepted), accept=owner(2)
    )
    assert successor.write(iter(Dataset.range(9)))
    # The zombie's refused chunk file is there, and counts for nobody.
    refused = streams.stream_chunk_name(1, 2, 1)
    assert refused in os.listdir(directory)
    assert [c for c, _ in streams.committed_chunks(directory)] == [c for c, _ in accepted]
    assert streams.committed_chunks(directory)[1] == (streams.stream_chunk_name(1, 7, 2), 7)
    path = str(tmp_path)
    streams.start_save(path, "run", SPEC, "NONE", 1)
    streams.finish_save(path, "run", 1, [accepted])
    assert [int(x) for x in Dataset.load(path)] == list(range(9))


def test_a_stream_that_yields_fewer_elements_when_taken_over_is_data_loss(
    tmp_path: pathlib.Path,
) -> None:
    directory = fmt.shard_dir(f"{tmp_path}/run", 0)
    write_stream(str(tmp_path), 0, range(4))
    os.remove(os.path.join(directory, fmt.DONE))
    writer = streams.StreamWriter(directory, SPEC, "NONE")
    with pytest.raises(DataLossError, match="does not yield the same elements"):
        writer.write(iter(Dataset.range(2)))


def test_load_wait_reads_chunks_as_they_are_committed_and_ends_with_the_save(
    tmp_path: pathlib.Path,
) -> None:
    path = str(tmp_path)
    streams.start_save(path, "run", SPEC, "NONE", 2)
    first_read = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            write_stream(path, 0, range(0, 6))
            assert first_read.wait(30), "the reader got nothing while the save ran"
            write_stream(path, 1, range(100, 104))
            streams.finish_save(path, "run", 2)
        except BaseException as error:
            errors.append(error)

    writer = threading.Thread(target=write, name="writer", daemon=True)
    got: list[int] = []
    iterator = iter(Dataset.load(path, wait=True))
    writer.start()
    for x in iterator:
        got.append(int(x))
        first_read.set()
    writer.join(30)
    assert not errors, errors
    assert sorted(got) == [*range(6), *range(100, 104)]


def test_a_position_saved_while_writing_restores_after_the_save_finished(
    tmp_path: pathlib.Path,
) -> None:
    path = str(tmp_path)
    streams.start_save(path, "run", SPEC, "NONE", 2)
    write_stream(path, 0, range(0, 4))
    iterator = iter(Dataset.load(path, wait=True))
    head = [int(next(iterator)) for _ in range(3)]
    state = iterator.get_state()
    iterator.close()
    write_stream(path, 1, range(100, 105))
    streams.finish_save(path, "run", 2)
    restored = iter(Dataset.load(path, wait=True))
    restored.set_state(state)
    rest = [int(x) for x in restored]
    assert Counter(head + rest) == Counter([*range(4), *range(100, 105)])


def test_a_damaged_chunk_is_data_loss_naming_it(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path)
    streams.start_save(path, "run", SPEC, "NONE", 1)
    write_stream(path, 0, range(4))
    chunk = os.path.join(fmt.shard_dir(f"{path}/run", 0), streams.stream_chunk_name(1, 2))
    data = bytearray(pathlib.Path(chunk).read_bytes())
    data[-6] ^= 0xFF
    pathlib.Path(chunk).write_bytes(bytes(data))
    with pytest.raises(DataLossError, match=r"chunk_00000001_2_0{16}\.flchunk") as raised:
        list(Dataset.load(path, wait=True))
    assert raised.value.filename == chunk
    streams.finish_save(path, "run", 1)
    with pytest.raises(DataLossError, match=r"chunk_00000001_2_0{16}\.flchunk"):
        list(Dataset.load(path))


def test_load_wait_of_a_save_in_progress_takes_no_reader_func(tmp_path: pathlib.Path) -> None:
    streams.start_save(str(tmp_path), "run", SPEC, "NONE", 1)
    with pytest.raises(InvalidArgumentError, match="takes no reader_func"):
        Dataset.load(str(tmp_path), wait=True, reader_func=lambda d: d.flat_map(lambda x: x))
    loaded = Dataset.load(str(tmp_path), wait=True, element_spec=SPEC)
    assert loaded.element_spec == SPEC


def test_a_finished_distributed_save_loads_with_the_default_reader(tmp_path: pathlib.Path) -> None:
    finished = finished_streams("default-reader")
    path = finished._path
    assert len(Dataset.load(path)) == 12
    assert sorted(int(x) for x in Dataset.load(path)) == [*range(5), *range(100, 107)]
    assert not os.path.exists(os.path.join(path, streams.SAVING))


def test_the_reader_waits_without_spinning(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path)
    streams.start_save(path, "run", SPEC, "NONE", 1)
    iterator = iter(Dataset.load(path, wait=True))
    got: list[int] = []
    waited: list[float] = []  # the reader thread's CPU seconds and wall seconds until data

    def read() -> None:
        cpu, wall = time.thread_time(), time.monotonic()
        got.append(int(next(iterator)))
        waited.extend([time.thread_time() - cpu, time.monotonic() - wall])
        got.extend(int(x) for x in iterator)

    reader = threading.Thread(target=read, name="reader", daemon=True)
    reader.start()
    time.sleep(1.0)
    write_stream(path, 0, range(3))
    streams.finish_save(path, "run", 1)
    reader.join(10)
    assert got == [0, 1, 2]
    cpu_s, wall_s = waited
    assert wall_s >= 1.0 and cpu_s < 0.25 * wall_s  # it sleeps between looks
