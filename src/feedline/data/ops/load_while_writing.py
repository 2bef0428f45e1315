"""``Dataset.load(path, wait=True)`` of a snapshot that ``distributed_save`` is still writing.

The reader follows the save's streams (``_snapshot_streams``): it yields the elements of each
committed chunk as soon as its commit marker appears, taking one whole chunk of each stream in
turn, waits (polling the streams' directories) while no new chunk is committed, and ends once
the save's ``DONE`` is written and every chunk it lists has been read. Its place is the chunk
and row reached in every stream, the stream whose chunk it reads and how many rows of that
chunk are left: a restored iterator goes on from there, whether the save has finished since or
not.

Two readers of the same snapshot, or one reader restored at different times, may see the
streams' chunks in different orders (whichever is committed first); every element of the
snapshot is yielded exactly once.
"""

from __future__ import annotations

import time
from typing import Any

from feedline.data.dataset import UNKNOWN_CARDINALITY, Dataset, DatasetIterator, IteratorContext
from feedline.data.ops import _snapshot_fs as fs
from feedline.data.ops._snapshot_format import ChunkCursor, finished_run, shard_dir
from feedline.data.ops._snapshot_streams import committed_chunks, read_error
from feedline.errors import DataLossError, FailedPreconditionError

#: The longest pause between two looks for new chunks.
MAX_POLL_S = 0.5


class LoadWhileWritingDataset(Dataset):
    """The elements of the distributed save at ``path`` (run ``run``, ``num_streams`` streams),
    read as its chunks are committed; see the module docstring.

    Example:
      >>> import tempfile
      >>> from feedline.data import Dataset
      >>> from feedline.data.ops._snapshot_streams import StreamWriter, finish_save, start_save
      >>> from feedline.data.ops._snapshot_format import shard_dir
      >>> path = tempfile.mkdtemp()
      >>> spec = Dataset.range(1).element_spec
      >>> start_save(path, "run", spec, "NONE", 2)
      >>> for stream in range(2):
      ...     writer = StreamWriter(shard_dir(f"{path}/run", stream), spec, "NONE")
      ...     _ = writer.write(iter(Dataset.range(stream * 10, stream * 10 + 2)))
      >>> finish_save(path, "run", 2)
      4
      >>> sorted(int(x) for x in LoadWhileWritingDataset(path, "run", 2, spec))
      [0, 1, 10, 11]
    """

    def __init__(self, path: str, run: str, num_streams: int, element_spec: Any) -> None:
        super().__init__()
        self._path = path
        self._run = run
        self._num_streams = num_streams
        self._element_spec = element_spec

    def _cardinality(self) -> int:
        return UNKNOWN_CARDINALITY

    def _make_iterator(self, ctx: IteratorContext) -> _LoadWhileWritingIterator:
        return _LoadWhileWritingIterator(self, ctx)

    def __repr__(self) -> str:
        return f"<LoadWhileWritingDataset {self._path} streams={self._num_streams}>"


class _LoadWhileWritingIterator(DatasetIterator):
    """Single-threaded, as every iterator's API; waits (sleeping) for chunks to be committed."""

    def __init__(self, dataset: LoadWhileWritingDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._path = dataset._path
        self._run = dataset._run
        run_dir = fs.join(dataset._path, dataset._run)
        self._dirs = [shard_dir(run_dir, s) for s in range(dataset._num_streams)]
        self._cursors = [ChunkCursor(d, (), dataset.element_spec) for d in self._dirs]
        # Whether each stream's list of chunks is final (from the save's DONE).
        self._final = False
        self._turn = 0
        self._left = 0  # rows of the turn's chunk still to read

    def _next(self) -> Any:
        pause = 0.01
        while True:
            if self._left:
                self._left -= 1
                return self._cursors[self._turn].next()
            if self._take_turn():
                continue
            if self._final:
                raise StopIteration
            if not self._look():
                time.sleep(pause)
                pause = min(pause * 2, MAX_POLL_S)

    def _take_turn(self) -> bool:
        """Moves to the next stream (in turn) with an unread chunk; False where none has one."""
        count = len(self._cursors)
        for step in range(1, count + 1):
            stream = (self._turn + step) % count
            cursor = self._cursors[stream]
            if cursor.chunk < len(cursor.chunks):
                rows = cursor.chunks[cursor.chunk][1] - cursor.row
                if rows > 0:
                    self._turn, self._left = stream, rows
                    return True
                cursor.restore({"chunk": cursor.chunk + 1, "row": 0})
                return True
        return False

    def _look(self) -> bool:
        """Learns the chunks committed since the last look; True where there are new ones (or
        the save finished)."""
        finished = finished_run(self._path, self._run, "load(wait=True)")
        if finished is not None:
            for shard in finished.shards:
                self._extend(shard.shard, shard.chunks)
            self._final = True
            return True
        grew = False
        for stream, directory in enumerate(self._dirs):
            grew |= self._extend(stream, tuple(committed_chunks(directory)))
        if not grew:
            error = read_error(self._path)
            if error is not None:
                raise FailedPreconditionError(
                    f"load(wait=True): the distributed_save to {self._path} failed, so it will "
                    f"not finish: {error}"
                )
        return grew

    def _extend(self, stream: int, chunks: tuple[tuple[str, int], ...]) -> bool:
        cursor = self._cursors[stream]
        known = cursor.chunks
        if chunks[: len(known)] != known:
            raise DataLossError(
                f"load(wait=True): the chunks of {self._dirs[stream]} changed while they were "
                f"read: {list(known)} became {list(chunks[: len(known)])}",
                filename=self._dirs[stream],
            )
        cursor.extend(chunks)
        return len(chunks) > len(known)

    def _get_state(self) -> dict[str, Any]:
        return {
            "streams": [[c.chunk, c.row] for c in self._cursors],
            "turn": self._turn,
            "left": self._left,
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        positions = state["streams"]
        if len(positions) != len(self._cursors):
            raise DataLossError(
                f"load(wait=True): the saved position has {len(positions)} streams, the snapshot "
                f"at {self._path} {len(self._cursors)}",
                filename=self._path,
            )
        for cursor, (chunk, row) in zip(self._cursors, positions, strict=True):
            cursor.restore({"chunk": chunk, "row": row})
        self._turn, self._left = int(state["turn"]), int(state["left"])
        self._final = False
        self._look()  # the chunks up to the position exist: committed chunks stay
