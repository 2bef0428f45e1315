"""The layout of a snapshot that several writers fill at once (``distributed_save``).

A distributed save is one run of the snapshot format (``_snapshot_format``) whose shards are
*streams*, each written by one writer at a time, and a ``SAVING`` file that says what the save
is while it runs (described in docs/snapshot_format.md)::

    <path>/SAVING                                          JSON: run, fingerprint, streams
    <path>/<run>/snapshot.metadata                         as in every run
    <path>/<run>/shard_<stream>/chunk_<k>_<count>.flchunk  chunk k of the stream, count elements
    <path>/<run>/shard_<stream>/DONE                       JSON: the stream is complete
    <path>/DONE                                            as in every run: the save is finished
    <path>/ERROR                                           JSON: the save failed, and why

A chunk is committed when its file appears (files are published whole), so a stream's
committed elements are its chunks ``0, 1, ...`` that exist, and their counts are in their
names: a reader, or a writer that takes the stream over, lists the stream's directory and
knows them without opening a file. A writer taking a stream over writes on after them: it
runs the stream's part of the dataset again and skips as many elements as are committed,
which is exact because a stream's part yields the same elements each time it runs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from feedline import structure
from feedline.data.ops import _snapshot_fs as fs
from feedline.data.ops._snapshot_format import (
    CHUNK_BYTES,
    CHUNK_ROWS,
    DONE,
    FORMAT,
    METADATA,
    ShardChunks,
    _nbytes,
    read_json,
    shard_dir,
    spec_to_json,
    write_chunk,
    write_json,
)
from feedline.errors import DataLossError

SAVING = "SAVING"
#: Written where a save failed: its dataset raised while a stream was written.
ERROR = "ERROR"
#: The ``sharding`` of the metadata of a distributed save's run: one shard per stream.
STREAMS = "streams"
#: A chunk is committed at the latest this long after its first element was buffered.
COMMIT_INTERVAL_S = 2.0
_CHUNK = re.compile(r"^chunk_(\d{8})_(\d+)\.flchunk$")


def stream_chunk_name(index: int, count: int) -> str:
    return f"chunk_{index:08d}_{count}.flchunk"


def committed_chunks(stream_dir: str) -> list[tuple[str, int]]:
    """The committed chunks of the stream in ``stream_dir``, in order: names and counts.

    Chunks after a gap are not counted: a writer publishes chunk ``k`` only after ``k - 1``.
    """
    found: dict[int, tuple[str, int]] = {}
    for name in fs.listdir(stream_dir):
        match = _CHUNK.match(name)
        if match:
            found[int(match.group(1))] = (name, int(match.group(2)))
    chunks: list[tuple[str, int]] = []
    while len(chunks) in found:
        chunks.append(found[len(chunks)])
    return chunks


def start_save(
    path: str, run: str, element_spec: Any, codec: str, num_streams: int, **facts: Any
) -> None:
    """Writes the run's metadata, then ``SAVING`` (``run``, ``codec``, ``num_streams`` and
    ``facts``):
    from then on a reader can follow the save. Idempotent."""
    fs.makedirs(fs.join(path, run))
    meta = {
        "format": FORMAT,
        "element_spec": spec_to_json(element_spec),
        "codec": codec,
        "sharding": STREAMS,
    }
    write_json(fs.join(path, run, METADATA), meta)
    body = {"format": FORMAT, "run": run, "codec": codec, "num_streams": num_streams, **facts}
    write_json(fs.join(path, SAVING), body)


def read_saving(path: str) -> dict[str, Any] | None:
    """What ``SAVING`` says of the save running at ``path``, None where there is none."""
    try:
        return read_json(fs.join(path, SAVING))
    except FileNotFoundError:
        return None


def write_error(path: str, message: str) -> None:
    write_json(fs.join(path, ERROR), {"format": FORMAT, "error": message})


def read_error(path: str) -> str | None:
    """Why the save at ``path`` failed, None where it did not."""
    try:
        return str(read_json(fs.join(path, ERROR))["error"])
    except FileNotFoundError:
        return None


def stream_done(stream_dir: str) -> list[tuple[str, int]] | None:
    """The chunks of a complete stream, None while it is not complete."""
    try:
        body = read_json(fs.join(stream_dir, DONE))
    except FileNotFoundError:
        return None
    return [(str(name), int(count)) for name, count in body["chunks"]]


def finish_save(path: str, run: str, num_streams: int) -> int:
    """Writes the save's ``DONE`` from its complete streams and removes ``SAVING``; returns
    the number of elements. Idempotent.

    Raises:
      DataLossError: a stream is not complete.
    """
    run_dir = fs.join(path, run)
    shards = []
    for stream in range(num_streams):
        chunks = stream_done(shard_dir(run_dir, stream))
        if chunks is None:
            raise DataLossError(
                f"distributed_save: stream {stream} of {path} has no DONE file", filename=path
            )
        shards.append(ShardChunks(stream, tuple(chunks)))
    elements = sum(s.elements for s in shards)
    done = {
        "format": FORMAT,
        "run": run,
        "elements": elements,
        "shards": [{"shard": s.shard, "chunks": [list(c) for c in s.chunks]} for s in shards],
    }
    write_json(fs.join(path, DONE), done)
    fs.remove(fs.join(path, SAVING))
    return elements


class StreamWriter:
    """Writes one stream's elements as chunks, each committed once it holds ``CHUNK_ROWS``
    elements, ``CHUNK_BYTES`` bytes or is ``commit_interval_s`` old, whichever comes first.

    ``write(elements)`` skips the elements already committed (a stream taken over), writes the
    rest, then the stream's ``DONE``. ``on_commit(chunks, elements, nbytes)`` hears the
    stream's totals after every chunk. Not thread-safe.
    """

    def __init__(
        self,
        stream_dir: str,
        element_spec: Any,
        codec: str,
        on_commit: Callable[[int, int, int], None] | None = None,
        commit_interval_s: float = COMMIT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._dir = stream_dir
        self._codec = codec
        self._num_leaves = len(structure.flatten(element_spec)[0])
        self._on_commit = on_commit
        self._interval = commit_interval_s
        self._clock = clock
        self.chunks = committed_chunks(stream_dir)
        self.committed = sum(count for _, count in self.chunks)
        self.nbytes = 0
        self._rows: list[list[np.ndarray]] = []
        self._bytes = 0
        self._since = 0.0

    def write(self, elements: Iterator[Any], stopped: Callable[[], bool] = lambda: False) -> bool:
        """Writes the stream; returns False where ``stopped()`` ended it early (its committed
        chunks stay, for whoever takes it over)."""
        if stream_done(self._dir) is not None:
            return True
        fs.makedirs(self._dir)
        skip = self.committed
        for element in elements:
            if stopped():
                return False
            if skip:
                skip -= 1
                continue
            leaves = [np.asarray(a) for a in structure.flatten(element)[0]]
            if not self._rows:
                self._since = self._clock()
            self._rows.append(leaves)
            self._bytes += sum(_nbytes(a) for a in leaves)
            if (
                len(self._rows) >= CHUNK_ROWS
                or self._bytes >= CHUNK_BYTES
                or self._clock() - self._since >= self._interval
            ):
                self._commit()
        if skip:
            raise DataLossError(
                f"distributed_save: the stream in {self._dir} has {self.committed} elements "
                f"committed, but its part of the dataset now yields {self.committed - skip}: "
                "the dataset does not yield the same elements each time it runs",
                filename=self._dir,
            )
        self._commit()
        write_json(
            fs.join(self._dir, DONE), {"format": FORMAT, "chunks": [list(c) for c in self.chunks]}
        )
        return True

    def _commit(self) -> None:
        if not self._rows:
            return
        name = stream_chunk_name(len(self.chunks), len(self._rows))
        self.nbytes += write_chunk(fs.join(self._dir, name), self._codec, self._rows)
        self.chunks.append((name, len(self._rows)))
        self.committed += len(self._rows)
        self._rows, self._bytes = [], 0
        if self._on_commit is not None:
            self._on_commit(len(self.chunks), self.committed, self.nbytes)
