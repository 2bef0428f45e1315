"""The elements of a snapshot by place: element ``offset`` of stream ``k``, of a finished
snapshot or of one that ``distributed_save`` is still writing.

A snapshot's elements have fixed places: each stream (a shard of ``save``, a stream of
``distributed_save``: one split of the source) holds its elements in order, in chunks whose
counts are in ``DONE`` or, while a save runs, in the names of its committed chunks
(``_snapshot_streams``). Chunks, once committed, never change, and a stream taken over by
another writer goes on after its committed chunks with the same elements (a split yields the
same elements each time it runs). So ``rows(k, start, end)`` is the same whoever asks, whenever,
and whichever writers wrote the stream: what ``GlobalBatches`` reads a saved dataset by.

A place not committed yet is waited for: the reader lists the stream's directory again,
pausing longer each time (up to ``MAX_POLL_S``), for at most ``timeout_s`` without the stream
moving; a save that failed (its ``ERROR`` file) ends the wait at once.

Example:
  >>> import tempfile
  >>> from feedline.data import Dataset
  >>> path = tempfile.mkdtemp()
  >>> Dataset.range(10).save(path, shard_func=lambda x: x % 2)
  >>> positions = SnapshotPositions.open(path, Dataset.load(path).element_spec)
  >>> positions.num_streams, [positions.length(k) for k in range(2)]
  (2, [5, 5])
  >>> [int(x) for x in positions.rows(1, 1, 3)]
  [3, 5]
"""

from __future__ import annotations

import bisect
import collections
import time
from collections.abc import Callable
from typing import Any

from feedline import structure
from feedline.data.ops import _snapshot_fs as fs
from feedline.data.ops._snapshot_format import (
    Finished,
    finished_run,
    read_chunk,
    read_finished,
    shard_dir,
)
from feedline.data.ops._snapshot_streams import (
    committed_chunks,
    read_error,
    read_saving,
    stream_done,
)
from feedline.errors import (
    DataLossError,
    FailedPreconditionError,
    NotFoundError,
    OutOfRangeError,
    UnavailableError,
)

__all__ = ["SnapshotPositions"]

#: The longest pause between two looks at a stream that is still being written.
MAX_POLL_S = 0.5
#: How long a read waits for a stream that does not move before it gives up.
DEFAULT_TIMEOUT_S = 600.0
#: Decoded chunks kept, the most recently read (a global batch's rows come from a few).
_KEPT_CHUNKS = 8


class _Stream:
    """What is known of one stream: its committed chunks, and whether they are all of it."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.chunks: tuple[tuple[str, int], ...] = ()
        self.ends: list[int] = []  # the offset after each chunk
        self.complete = False

    @property
    def committed(self) -> int:
        return self.ends[-1] if self.ends else 0

    def extend(self, chunks: tuple[tuple[str, int], ...], complete: bool) -> None:
        if chunks[: len(self.chunks)] != self.chunks:
            raise DataLossError(
                f"the committed chunks of {self.directory} changed while they were read: "
                f"{list(self.chunks)} became {list(chunks[: len(self.chunks)])}",
                filename=self.directory,
            )
        for _, count in chunks[len(self.chunks) :]:
            self.ends.append(self.committed + count)
        self.chunks = chunks
        self.complete = complete


class SnapshotPositions:
    """Reads the elements of a snapshot by stream and offset; see the module docstring.

    Not thread-safe. Use ``open``.
    """

    def __init__(
        self,
        path: str,
        run: str,
        num_streams: int,
        element_spec: Any,
        finished: Finished | None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._path = path
        self._run = run
        self._timeout = timeout_s
        run_dir = fs.join(path, run)
        self._streams = [_Stream(shard_dir(run_dir, k)) for k in range(num_streams)]
        leaves, self._treespec = structure.flatten(element_spec)
        self._bytes_leaves = [s.dtype == structure.BYTES for s in leaves]
        self._single = self._treespec.num_nodes == 1
        self._decoded: collections.OrderedDict[tuple[int, int], list[list[Any]]] = (
            collections.OrderedDict()
        )
        self._finished = False
        if finished is not None:
            self._finish(finished)

    @classmethod
    def open(
        cls, path: str, element_spec: Any, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> SnapshotPositions:
        """The snapshot at ``path``: finished, or being written by ``distributed_save``.

        Raises:
          NotFoundError: ``path`` holds neither.
        """
        try:
            finished = read_finished(path, "load")
        except NotFoundError:
            saving = read_saving(path)
            if saving is None:
                raise
            return cls(
                path, str(saving["run"]), int(saving["num_streams"]), element_spec, None, timeout_s
            )
        streams = 1 + max((s.shard for s in finished.shards), default=-1)
        return cls(path, finished.run, streams, element_spec, finished, timeout_s)

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    def length(self, stream: int) -> int | None:
        """The elements of ``stream``, None while it is still being written."""
        known = self._streams[stream]
        return known.committed if known.complete else None

    def committed(self, stream: int) -> int:
        """The elements of ``stream`` committed so far."""
        return self._streams[stream].committed

    def total(self) -> int | None:
        """The snapshot's elements, None while a stream is still being written."""
        if all(s.complete for s in self._streams):
            return sum(s.committed for s in self._streams)
        return None

    def rows(self, stream: int, start: int, end: int) -> list[Any]:
        """Elements ``start`` to ``end`` of ``stream``, waiting for them to be committed.

        Raises:
          OutOfRangeError: the stream is complete with fewer than ``end`` elements.
          UnavailableError: the stream did not move for ``timeout_s``.
          FailedPreconditionError: the save failed.
        """
        known = self._streams[stream]
        self.wait(stream, lambda: known.committed >= end or known.complete)
        if known.committed < end:
            raise OutOfRangeError(
                f"stream {stream} of {self._path} has {known.committed} elements, not {end}"
            )
        out: list[Any] = []
        tree = self._treespec
        offset = start
        while offset < end:
            chunk = bisect.bisect_right(known.ends, offset)
            first = known.ends[chunk - 1] if chunk else 0
            rows = self._chunk(stream, chunk)
            for leaves in rows[offset - first : min(end, known.ends[chunk]) - first]:
                out.append(leaves[0] if self._single else structure.unflatten(tree, leaves))
            offset = known.ends[chunk]
        return out

    def wait(self, stream: int, ready: Callable[[], bool]) -> None:
        """Looks at ``stream`` again until ``ready()`` (pausing longer each time), for at most
        ``timeout_s`` without the stream moving."""
        known = self._streams[stream]
        pause = 0.01
        deadline = time.monotonic() + self._timeout
        while not ready():
            before = (known.committed, known.complete)
            self._look(stream)
            if ready():
                return
            if (known.committed, known.complete) != before:
                deadline = time.monotonic() + self._timeout
                continue
            error = read_error(self._path)
            if error is not None:
                raise FailedPreconditionError(
                    f"the distributed_save to {self._path} failed, so it will not finish: {error}"
                )
            if time.monotonic() > deadline:
                raise UnavailableError(
                    f"stream {stream} of the snapshot at {self._path} has not moved for "
                    f"{self._timeout:g} s (its writers may all be gone): {known.committed} "
                    "elements committed"
                )
            time.sleep(pause)
            pause = min(pause * 2, MAX_POLL_S)

    # -- looking at the files -------------------------------------------------------------------
    def _look(self, stream: int) -> None:
        if self._finished:
            return
        finished = finished_run(self._path, self._run, "load")
        if finished is not None:
            self._finish(finished)
            return
        known = self._streams[stream]
        done = stream_done(known.directory)
        chunks = done if done is not None else committed_chunks(known.directory)
        known.extend(tuple(chunks), done is not None)

    def _finish(self, finished: Finished) -> None:
        for shard in finished.shards:
            self._streams[shard.shard].extend(shard.chunks, True)
        for known in self._streams:
            known.complete = True
        self._finished = True

    def _chunk(self, stream: int, chunk: int) -> list[list[Any]]:
        """The rows (each a list of leaves) of chunk ``chunk`` of ``stream``."""
        key = (stream, chunk)
        if key in self._decoded:
            self._decoded.move_to_end(key)
            return self._decoded[key]
        known = self._streams[stream]
        name, count = known.chunks[chunk]
        groups = read_chunk(fs.join(known.directory, name), count, self._bytes_leaves)
        rows = [[c[i, ...] for c in columns] for columns in groups for i in range(len(columns[0]))]
        self._decoded[key] = rows
        while len(self._decoded) > _KEPT_CHUNKS:
            self._decoded.popitem(last=False)
        return rows
