"""The layout of a snapshot that several writers fill at once (``distributed_save``).

A distributed save is one run of the snapshot format (``_snapshot_format``) whose shards are
*streams*, each written by one writer at a time, and a ``SAVING`` file that says what the save
is while it runs (described in docs/snapshot_format.md)::

    <path>/SAVING                                          JSON: run, fingerprint, streams
    <path>/<run>/snapshot.metadata                         as in every run
    <path>/<run>/shard_<stream>/chunk_<k>_<count>_<g>.flchunk    chunk k, count elements, by
                                                                 the writer of generation g
    <path>/<run>/shard_<stream>/chunk_<k>_<count>_<g>.committed  empty: that chunk is committed
    <path>/<run>/shard_<stream>/DONE                             JSON: the stream is complete
    <path>/DONE                                            as in every run: the save is finished
    <path>/ERROR                                           JSON: the save failed, and why

Each hand-over of a stream to a writer has a *generation*, which the writer's chunk files
carry in their names. A writer publishes a chunk in two steps, each a file written whole (no
rename needed, so object stores do): the chunk's file, then, once the chunk is accepted (the
dispatcher accepts chunk ``k`` of a stream only from the stream's current writer, and only
one chunk ``k``), its empty ``.committed`` marker. A stream's committed elements are the
chunks of its markers ``0, 1, ...``, their counts in the names: a reader lists the stream's
directory and knows them without opening a file. The chunk file of a writer whose stream was
handed to another (a *zombie*: paused past the dispatcher's timeout, then resumed) is refused
and never gets a marker, so no reader counts it. A writer taking a stream over starts from
the committed chunks it is handed, publishing any marker its predecessor did not write, and
writes on after them: it runs the stream's part of the dataset again and skips as many
elements as are committed, which is exact because a stream's part yields the same elements
each time it runs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Sequence
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
_CHUNK_SUFFIX = ".flchunk"
_COMMITTED_SUFFIX = ".committed"
_COMMITTED = re.compile(r"^(chunk_(\d{8})_(\d+)_[0-9a-f]{16})\.committed$")

#: Asks whether a writer may publish: ``(chunks, elements, nbytes, chunk)``, the stream's
#: totals with ``chunk`` (its name and count; None: the stream is complete). False: the stream
#: was handed to another writer, which this one leaves it to.
Accept = Callable[[int, int, int, "tuple[str, int] | None"], bool]


def stream_chunk_name(index: int, count: int, generation: int = 0) -> str:
    """The file name of chunk ``index`` (``count`` elements) of a writer of ``generation``."""
    return f"chunk_{index:08d}_{count}_{generation:016x}{_CHUNK_SUFFIX}"


_CHUNK_NAME = re.compile(r"^chunk_\d{8}_\d+_[0-9a-f]{16}\.flchunk$")


def is_chunk_name(name: str) -> bool:
    """Whether ``name`` is the name of a stream's chunk file (``stream_chunk_name``)."""
    return _CHUNK_NAME.match(name) is not None


def _marker(name: str) -> str:
    return name.removesuffix(_CHUNK_SUFFIX) + _COMMITTED_SUFFIX


def committed_chunks(stream_dir: str) -> list[tuple[str, int]]:
    """The committed chunks of the stream in ``stream_dir``, in order: names and counts.

    Chunks after a gap are not counted: a writer publishes chunk ``k`` only after ``k - 1``.

    Raises:
      DataLossError: two chunks are committed at one place (two writers wrote the directory
        without a dispatcher between them).
    """
    found: dict[int, tuple[str, int]] = {}
    for name in fs.listdir(stream_dir):
        match = _COMMITTED.match(name)
        if match:
            index = int(match.group(2))
            chunk = (match.group(1) + _CHUNK_SUFFIX, int(match.group(3)))
            if found.setdefault(index, chunk) != chunk:
                raise DataLossError(
                    f"distributed_save: chunk {index} of the stream in {stream_dir} is "
                    f"committed twice ({found[index][0]} and {chunk[0]})",
                    filename=stream_dir,
                )
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


def finish_save(
    path: str,
    run: str,
    num_streams: int,
    chains: Sequence[Sequence[tuple[str, int]]] | None = None,
) -> int:
    """Writes the save's ``DONE`` and removes ``SAVING``; returns the number of elements.
    Idempotent.

    Args:
      chains: each stream's committed chunks (names and counts), as the dispatcher accepted
        them; None: as the streams' ``DONE`` files list them.

    Raises:
      DataLossError: a stream is not complete.
    """
    run_dir = fs.join(path, run)
    shards = []
    for stream in range(num_streams):
        chunks: list[tuple[str, int]] | None
        if chains is not None:
            chunks = [(str(name), int(count)) for name, count in chains[stream]]
        else:
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
    rest, then the stream's ``DONE``. Each chunk's file is written, then ``accept`` is asked
    (with the stream's totals and the chunk), then the chunk's marker is written; ``accept``
    is asked again before ``DONE``. Where ``accept`` says no, the stream was handed to another
    writer: ``write`` stops there and returns False, its chunk never committed. Not
    thread-safe.

    Args:
      stream_dir: the stream's directory.
      element_spec: the elements' spec.
      codec: the chunks' compression.
      generation: this writer's hand-over of the stream, in its chunks' names.
      chunks: the stream's committed chunks as the dispatcher knows them; None: those that
        ``stream_dir`` holds.
      accept: what decides whether a chunk is committed (see ``Accept``); None: each is.
      commit_interval_s: the longest a chunk stays open.
      clock: the time of ``commit_interval_s``.
    """

    def __init__(
        self,
        stream_dir: str,
        element_spec: Any,
        codec: str,
        *,
        generation: int = 0,
        chunks: Sequence[tuple[str, int]] | None = None,
        accept: Accept | None = None,
        commit_interval_s: float = COMMIT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._dir = stream_dir
        self._codec = codec
        self._num_leaves = len(structure.flatten(element_spec)[0])
        self._generation = generation
        self._accept = accept
        self._interval = commit_interval_s
        self._clock = clock
        given = chunks is not None
        self.chunks = list(chunks) if chunks is not None else committed_chunks(stream_dir)
        self._markers_known = not given
        self.committed = sum(count for _, count in self.chunks)
        self.nbytes = 0
        #: Whether ``accept`` said no: the stream is another writer's now.
        self.revoked = False
        self._rows: list[list[np.ndarray]] = []
        self._bytes = 0
        self._since = 0.0

    def write(self, elements: Iterator[Any], stopped: Callable[[], bool] = lambda: False) -> bool:
        """Writes the stream; returns False where ``stopped()`` ended it early (its committed
        chunks stay, for whoever takes it over) or the stream was handed to another writer
        (``revoked``)."""
        if stream_done(self._dir) is not None:
            return True
        fs.makedirs(self._dir)
        self._publish_markers()
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
            ) and not self._commit():
                return False
        if skip:
            raise DataLossError(
                f"distributed_save: the stream in {self._dir} has {self.committed} elements "
                f"committed, but its part of the dataset now yields {self.committed - skip}: "
                "the dataset does not yield the same elements each time it runs",
                filename=self._dir,
            )
        if not self._commit() or not self._asked(None):
            return False
        write_json(
            fs.join(self._dir, DONE), {"format": FORMAT, "chunks": [list(c) for c in self.chunks]}
        )
        return True

    def _publish_markers(self) -> None:
        """Writes the markers of the committed chunks handed over that a writer before this one
        could not write (it stopped between a chunk's acceptance and its marker)."""
        if self._markers_known or not self.chunks:
            return
        present = set(fs.listdir(self._dir))
        for name, _ in self.chunks:
            if _marker(name) not in present:
                fs.write_atomic(fs.join(self._dir, _marker(name)), b"")
        self._markers_known = True

    def _asked(self, chunk: tuple[str, int] | None, nbytes: int = 0) -> bool:
        if self._accept is None:
            return True
        count = 0 if chunk is None else chunk[1]
        accepted = self._accept(
            len(self.chunks) + (chunk is not None),
            self.committed + count,
            self.nbytes + nbytes,
            chunk,
        )
        self.revoked = not accepted
        return accepted

    def _commit(self) -> bool:
        """Commits the open chunk (if any); False where it was refused."""
        if not self._rows:
            return True
        name = stream_chunk_name(len(self.chunks), len(self._rows), self._generation)
        nbytes = write_chunk(fs.join(self._dir, name), self._codec, self._rows)
        if not self._asked((name, len(self._rows)), nbytes):
            return False
        fs.write_atomic(fs.join(self._dir, _marker(name)), b"")
        self.chunks.append((name, len(self._rows)))
        self.committed += len(self._rows)
        self.nbytes += nbytes
        self._rows, self._bytes = [], 0
        return True
