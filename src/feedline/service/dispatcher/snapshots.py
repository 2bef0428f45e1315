"""The dispatcher's part of ``distributed_save``: saves, their streams, and who writes each.

A save to ``path`` is cut in *streams* when it starts: one per split of the dataset's source
(``splits.SplitCursor``, about 16 per worker), or a single stream where the source does not
split. The dispatcher hands each stream to one worker at a time (``GetSnapshotStream``): a
worker asking again gets the stream it writes already (its reply may have been lost, or it
restarted on the same address), else the next stream nobody writes. A worker reports every
chunk it commits and the end of its stream (``SnapshotProgress``); once every stream is
complete the dispatcher writes the save's ``DONE`` (``_snapshot_streams.finish_save``).

Which elements the snapshot holds is decided here, one chunk at a time: each hand-over of a
stream is a new *generation* (an id, never reused), and a writer asks to commit each chunk it
has written (``SnapshotProgress`` with the chunk): the dispatcher accepts chunk ``k`` of a
stream only from the stream's current writer and generation, and only one chunk ``k``, and
only then does the writer publish the chunk's marker (``_snapshot_streams``). A stream whose
worker died (dropped after ``worker_timeout_ms`` without heartbeats: ``RemoveWorker`` frees its
streams) goes to another worker with the chunks committed so far, which skips their elements
and writes on; a dropped worker that still runs (a zombie: paused, then resumed) is refused
its next chunk, so what it writes is never counted. The state (the journal's
``StartSnapshot``, ``AssignStream``, ``CommitChunk``, ``FinishStream``, ``FinishSnapshot``)
says which saves run, who writes what and which chunks are committed, so that a restarted
dispatcher carries on; a save resumed without a journal starts from the committed chunks its
streams' directories hold.

Progress (chunks, elements and bytes of each stream) is what workers report, kept in memory
for the status page and ``/metrics``: after a restart it fills again as chunks are committed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import uuid
from typing import Any

from feedline.data.ops import _snapshot_fs as fs
from feedline.data.ops._snapshot_format import is_finished, shard_dir, spec_from_json
from feedline.data.ops._snapshot_streams import (
    committed_chunks,
    finish_save,
    is_chunk_name,
    read_error,
    read_saving,
    start_save,
    stream_done,
    write_error,
)
from feedline.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    FeedlineError,
    InvalidArgumentError,
    NotFoundError,
)
from feedline.service.dispatcher.core import DispatcherCore, Reply
from feedline.service.dispatcher.state import (
    AssignStream,
    CommitChunk,
    FailSnapshot,
    FinishSnapshot,
    FinishStream,
    SnapshotRecord,
    StartSnapshot,
    Update,
)
from feedline.service.protocol import (
    GetSnapshotStreamRequest,
    SnapshotProgressRequest,
    SnapshotRequest,
    SnapshotStreamReply,
)
from feedline.service.splits import SplitCursor, SplitPlan

__all__ = ["SaveProgress", "Snapshots"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SaveProgress:
    """What the status page shows of a save: its streams, and what workers reported."""

    path: str
    streams: int
    streams_done: int
    writing: int
    chunks: int
    elements: int
    nbytes: int
    finished: bool
    error: str | None = None


def _failed(path: str, error: str) -> str:
    return (
        f"distributed_save: the save to {path} failed ({error}); fix the dataset, then remove "
        "the directory (or save to another path) and save again"
    )


class Snapshots:
    """The Snapshot, GetSnapshotStream and SnapshotProgress handlers.

    Args:
      core: the dispatcher's core (state, lock, journal).
    """

    def __init__(self, core: DispatcherCore) -> None:
        self._core = core
        # (path, stream) -> (chunks, elements, bytes) as last reported (volatile).
        self._progress: dict[tuple[str, int], tuple[int, int, int]] = {}

    # -- Snapshot ---------------------------------------------------------------------------
    def snapshot(self, header: dict[str, Any], buffers: list[memoryview]) -> Reply:
        """Snapshot: starts (or resumes) a save; returns once it is recorded."""
        request = SnapshotRequest.from_header(header)
        core = self._core
        with core.lock:
            record = core.state.datasets.get(request.dataset_id)
            if record is None:
                raise NotFoundError(f"no dataset {request.dataset_id} is registered")
            plan = record.split_plan
            known = core.state.snapshots.get(request.path)
            if known is not None:
                self._check_same(known, request)
                return {}, ()
            workers = len(core.state.workers)
        # The files, outside the lock: a finished snapshot, or an unfinished save to resume.
        if is_finished(request.path):
            raise AlreadyExistsError(
                f"distributed_save: {request.path} already holds a finished snapshot; load it "
                "with Dataset.load, or save to another path (or remove it first)"
            )
        failed = read_error(request.path)
        if failed is not None:
            raise FailedPreconditionError(_failed(request.path, failed))
        saving = read_saving(request.path)
        found: list[Update] = []
        if saving is not None:
            if saving.get("fingerprint") != request.fingerprint:
                raise InvalidArgumentError(
                    f"distributed_save: {request.path} holds an unfinished save of another "
                    f"dataset (fingerprint {saving.get('fingerprint')}, this dataset's "
                    f"{request.fingerprint}); save to another path, or remove it first"
                )
            start = StartSnapshot(
                request.path,
                request.dataset_id,
                request.fingerprint,
                str(saving["run"]),
                str(saving["codec"]),
                int(saving["num_streams"]),
                saving["cursor"],
            )
            found = self._found(start)
        else:
            start = self._plan(request, plan, workers)
            start_save(
                request.path,
                start.run,
                spec_from_json(request.element_spec),
                start.codec,
                start.num_streams,
                fingerprint=start.fingerprint,
                cursor=start.cursor,
            )
        with core.lock:
            known = core.state.snapshots.get(request.path)
            if known is not None:
                self._check_same(known, request)
            else:
                core.apply(start)
                for update in found:
                    core.apply(update)
                logger.info(
                    "distributed_save to %s: %d streams%s",
                    start.path,
                    start.num_streams,
                    " (resumed)" if saving is not None else "",
                )
        return {}, ()

    @staticmethod
    def _check_same(known: SnapshotRecord, request: SnapshotRequest) -> None:
        if known.fingerprint != request.fingerprint:
            raise InvalidArgumentError(
                f"distributed_save: a save of another dataset (fingerprint {known.fingerprint}, "
                f"this dataset's {request.fingerprint}) runs to {request.path}; save to another "
                "path"
            )
        if known.error is not None:
            raise FailedPreconditionError(_failed(request.path, known.error))
        if known.finished:
            raise AlreadyExistsError(
                f"distributed_save: {request.path} already holds a finished snapshot; load it "
                "with Dataset.load, or save to another path"
            )

    @staticmethod
    def _found(start: StartSnapshot) -> list[Update]:
        """What the directories of a save resumed without the dispatcher's journal hold: each
        stream's committed chunks, and which streams are complete."""
        run_dir = fs.join(start.path, start.run)
        found: list[Update] = []
        for stream in range(start.num_streams):
            directory = shard_dir(run_dir, stream)
            done = stream_done(directory)
            for name, count in committed_chunks(directory) if done is None else done:
                found.append(CommitChunk(start.path, stream, 0, name, count))
            if done is not None:
                found.append(FinishStream(start.path, stream))
        return found

    @staticmethod
    def _plan(request: SnapshotRequest, plan: dict[str, Any] | None, workers: int) -> StartSnapshot:
        """The streams of a new save: one per split of the source, or one."""
        cursor = None
        streams = 1
        if plan is not None:
            start = SplitCursor.start(SplitPlan.from_json(plan), 0, max(1, workers))
            cursor = start.to_json()
            streams = max(1, math.ceil(start.num_units / start.split_size))
        return StartSnapshot(
            request.path,
            request.dataset_id,
            request.fingerprint,
            uuid.uuid4().hex,
            request.codec,
            streams,
            cursor,
        )

    # -- GetSnapshotStream ------------------------------------------------------------------
    def get_snapshot_stream(self, header: dict[str, Any], buffers: list[memoryview]) -> Reply:
        """GetSnapshotStream: the stream this worker writes, or the next that nobody writes."""
        request = GetSnapshotStreamRequest.from_header(header)
        core = self._core
        self._finish_complete()
        with core.lock:
            if request.address not in core.state.workers:  # dropped: it registers again first
                return {"stream": None}, ()
            running = [
                s for s in core.state.snapshots.values() if not s.finished and s.error is None
            ]
            for snapshot in running:
                for stream, writer in enumerate(snapshot.writers):
                    if writer == request.address and not snapshot.done[stream]:
                        return self._stream(snapshot, stream), ()
            for snapshot in running:
                for stream, writer in enumerate(snapshot.writers):
                    if writer is None and not snapshot.done[stream]:
                        generation = core.state.new_id()
                        core.apply(AssignStream(snapshot.path, stream, request.address, generation))
                        return self._stream(snapshot, stream), ()
        return {"stream": None}, ()

    def _stream(self, snapshot: SnapshotRecord, stream: int) -> dict[str, Any]:
        units = None
        if snapshot.cursor is not None:
            cursor = SplitCursor.from_json(snapshot.cursor)
            start = stream * cursor.split_size
            units = cursor.units(start, min(start + cursor.split_size, cursor.num_units))
        dataset = self._core.state.datasets[snapshot.dataset_id]
        return SnapshotStreamReply(
            snapshot.path,
            stream,
            snapshot.dataset_id,
            dataset.fingerprint,
            snapshot.run,
            snapshot.codec,
            units,
            snapshot.generations[stream],
            [(str(name), int(count)) for name, count in snapshot.chains[stream]],
        ).to_header()

    # -- SnapshotProgress -------------------------------------------------------------------
    def snapshot_progress(self, header: dict[str, Any], buffers: list[memoryview]) -> Reply:
        """SnapshotProgress: a writer asks to commit a chunk or to complete its stream, or
        reports that the dataset raised; refused (``accepted`` False) where the stream is not
        the writer's (its generation) any more."""
        request = SnapshotProgressRequest.from_header(header)
        if request.chunk is not None and not is_chunk_name(request.chunk):
            raise InvalidArgumentError(
                f"malformed request: chunk must be a chunk file name, got {request.chunk!r:.100}"
            )
        core = self._core
        message = ""
        with core.lock:
            snapshot = core.state.snapshots.get(request.path)
            if snapshot is None or not 0 <= request.stream < snapshot.num_streams:
                raise NotFoundError(
                    f"no distributed_save to {request.path} has a stream {request.stream}"
                )
            accepted = self._accept(snapshot, request)
            if accepted:
                self._progress[(request.path, request.stream)] = (
                    request.chunks,
                    request.elements,
                    request.nbytes,
                )
            else:
                logger.warning(
                    "distributed_save to %s: refused worker %s (generation %d) its writes to "
                    "stream %d, which is another writer's now",
                    request.path,
                    request.address,
                    request.generation,
                    request.stream,
                )
            failed = accepted and request.error is not None and snapshot.error is None
            if failed:
                message = f"{request.error} (stream {request.stream}, worker {request.address})"
                core.apply(FailSnapshot(request.path, message))
                logger.error("distributed_save to %s failed: %s", request.path, message)
        if failed:
            write_error(request.path, message)
        self._finish_complete()
        return {"accepted": accepted}, ()

    def _accept(self, snapshot: SnapshotRecord, request: SnapshotProgressRequest) -> bool:
        """Whether the request's writer owns its stream; commits its chunk, or completes the
        stream, where it asks to (under the lock). An answer lost on the way is asked again
        and gets the same answer."""
        stream = request.stream
        chain = snapshot.chains[stream]
        if snapshot.generations[stream] != request.generation:
            return False
        if snapshot.writers[stream] != request.address:
            # Only a complete stream's last writer, asking again, still counts.
            return snapshot.done[stream] and request.done and request.chunks == len(chain)
        if request.chunk is not None:
            index = request.chunks - 1
            if index < len(chain):  # asked again
                return chain[index] == [request.chunk, request.count]
            if index > len(chain):
                return False
            self._core.apply(
                CommitChunk(request.path, stream, request.generation, request.chunk, request.count)
            )
        if request.done:
            if request.chunks != len(chain):
                return False
            self._core.apply(FinishStream(request.path, stream))
        return True

    def _finish_complete(self) -> None:
        """Writes the DONE of every save whose streams are all complete (the files outside the
        lock; writing DONE twice is harmless)."""
        core = self._core
        with core.lock:
            complete = [
                (s.path, s.run, s.num_streams, [[(n, c) for n, c in ch] for ch in s.chains])
                for s in core.state.snapshots.values()
                if not s.finished and s.error is None and all(s.done)
            ]
        for path, run, streams, chains in complete:
            try:
                elements = finish_save(path, run, streams, chains)
            except (FeedlineError, OSError) as error:
                logger.error("distributed_save to %s could not be finished: %s", path, error)
                continue
            with core.lock:
                snapshot = core.state.snapshots.get(path)
                if snapshot is not None and not snapshot.finished:
                    core.apply(FinishSnapshot(path))
                    core.commit()
                    logger.info("distributed_save to %s finished: %d elements", path, elements)

    # -- status -----------------------------------------------------------------------------
    def progress(self) -> list[SaveProgress]:
        """Every save's progress (under the lock)."""
        found = []
        for snapshot in self._core.state.snapshots.values():
            reported = [
                self._progress.get((snapshot.path, s), (0, 0, 0))
                for s in range(snapshot.num_streams)
            ]
            found.append(
                SaveProgress(
                    snapshot.path,
                    snapshot.num_streams,
                    sum(snapshot.done),
                    sum(w is not None for w in snapshot.writers),
                    sum(r[0] for r in reported),
                    sum(r[1] for r in reported),
                    sum(r[2] for r in reported),
                    snapshot.finished,
                    snapshot.error,
                )
            )
        return found
