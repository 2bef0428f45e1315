"""The dispatcher's job views and the consumers' heartbeat long poll: ClientHeartbeat.

``LongPoll`` builds a job's view for its consumers (``job_view``; GetOrCreateJob's reply carries
it too), takes what a consumer of an exactly-once job reports (``ledger``), and lets a heartbeat
wait for news of its own job (``core.DispatcherCore.wait``). At most ``_MAX_WAITING_CONSUMERS``
consumer heartbeats wait at once (past that a heartbeat is answered at once and the consumer
waits on its side), so that long polls never take every thread of the server.

A job's view is built once per change: it is kept, with the heartbeat reply that carries it
encoded, until the job's version (or, in an exactly-once job, its split cursor) moves, so that
the many heartbeats of a job's consumers that bring no news cost a lookup, not a view of all its
tasks each (about 0.7 ms for 256 tasks, under the lock). A consumer whose view is current (the
``version`` it sent is the job's) is answered ``unchanged``, without the view (about 18 KB for
256 tasks), except in an exactly-once job, whose view also moves with its split cursor.
"""

from __future__ import annotations

import time
from typing import Any

from feedline._net.wire import encode_frame
from feedline.errors import ConsumerReleasedError, NotFoundError
from feedline.service.dispatcher.core import DispatcherCore, Reply
from feedline.service.dispatcher.state import JobRecord, ReportSplits
from feedline.service.ledger import check_report
from feedline.service.protocol import (
    ClientHeartbeatRequest,
    HeartbeatReply,
    JobView,
    StreamView,
    TaskView,
)
from feedline.service.splits import SplitCursor

__all__ = ["MAX_WAIT_S", "LongPoll"]

#: The longest a heartbeat waits at the dispatcher for news.
MAX_WAIT_S = 2.0
# The most consumer heartbeats that wait here at once (each holds a server thread).
_MAX_WAITING_CONSUMERS = 16


class LongPoll:
    """The job views and the ClientHeartbeat handler of a dispatcher.

    Args:
      core: the dispatcher's core.
    """

    def __init__(self, core: DispatcherCore) -> None:
        self._core = core
        # Consumer heartbeats waiting here now (at most _MAX_WAITING_CONSUMERS).
        self._waiting_consumers = 0
        # Each job's last view: (what it was built for, the view, the heartbeat reply that
        # carries it, encoded once asked for).
        self._views: dict[int, tuple[tuple[int, int, Any], JobView, list[bytes]]] = {}
        # The encoded reply to a consumer whose view is current: (incarnation, frame).
        self._unchanged: tuple[int, bytes] | None = None

    def job_view(self, job: JobRecord) -> JobView:
        """What a consumer of ``job`` needs to know of it (under the lock)."""
        return self._view_entry(job)[1]

    def forget(self, job_id: int) -> None:
        """Drops what is kept of job ``job_id``'s view (it was collected; under the lock)."""
        self._views.pop(job_id, None)

    def _view_entry(self, job: JobRecord) -> tuple[tuple[int, int, Any], JobView, list[bytes]]:
        core = self._core
        cursor = core.state.split_cursors.get((job.job_id, 0)) if job.exactly_once else None
        built_for = (core.incarnation, core.job_versions[job.job_id], cursor)
        entry = self._views.get(job.job_id)
        if entry is None or entry[0] != built_for:
            entry = self._views[job.job_id] = (built_for, self._build_view(job), [])
        return entry

    def _reply_frame(self, job: JobRecord) -> bytes:
        """The encoded heartbeat reply of a consumer of ``job`` without ``splits_done``."""
        _, view, frame = self._view_entry(job)
        if not frame:
            frame.append(encode_frame(HeartbeatReply(self._core.incarnation, view).to_header()))
        return frame[0]

    def _unchanged_frame(self) -> bytes:
        """The encoded heartbeat reply that says a consumer's view is current."""
        incarnation = self._core.incarnation
        if self._unchanged is None or self._unchanged[0] != incarnation:
            frame = encode_frame(HeartbeatReply(incarnation, None).to_header())
            self._unchanged = (incarnation, frame)
        return self._unchanged[1]

    def _build_view(self, job: JobRecord) -> JobView:
        state = self._core.state
        tasks = tuple(
            TaskView(
                task.task_id,
                task.worker_address,
                "lost" if task.lost else "done" if task.finished else "running",
            )
            for task in state.job_tasks(job.job_id)
        )
        # What a consumer saves as its position (``position``).
        streams = tuple(
            StreamView(task.task_id, task.worker_index, task.num_workers, task.skip)
            for task in state.job_tasks(job.job_id)
        )
        return JobView(
            tasks=tasks,
            streams=streams,
            finished=job.finished,
            error=job.error,
            consumers=len(state.active_clients(job.job_id)),
            joined=len(job.client_ids),
            exactly_once=job.exactly_once,
            # What an exactly-once job's split keys mean (a consumer's position saves it).
            split_cursor=state.split_cursors.get((job.job_id, 0)) if job.exactly_once else None,
            version=self._core.job_versions[job.job_id],
        )

    def _take_report(
        self, client_id: int, job: JobRecord, request: ClientHeartbeatRequest
    ) -> tuple[tuple[tuple[int, int], ...], int, bool, bool] | None:
        """Applies what a consumer of an exactly-once job reports (the offsets it received, the
        lost tasks it closed; on commit: the offsets committed, the flush round reported);
        ``(key, count)`` of the splits it reported or holds that are done, the flush round it
        is asked for, whether the job waits for commits only, and (a cross-trainer job)
        whether its trainer has every element of the epoch; or None for other jobs."""
        ledger = self._core.state.ledgers.get(job.job_id)
        if ledger is None:
            return None
        received, closed = check_report(request.received, request.closed)
        committed, _ = check_report(request.committed, [])
        news = [[key, ranges] for key, ranges in received if ledger.adds(key, ranges, client_id)]
        closed = [task_id for task_id in closed if ledger.awaits(client_id, task_id)]
        commits = [[key, ranges] for key, ranges in committed if key in ledger.open]
        wanted = ledger.flush_wanted(client_id) if ledger.commits and request.flushed else 0
        flushed = request.flushed if 0 < wanted <= request.flushed else 0
        if news or closed or commits or flushed:
            self._core.apply(ReportSplits(job.job_id, client_id, news, closed, commits, flushed))
            self._core.finish_job_if_done(job)
        keys = {key for key, _ in (*received, *committed)}
        keys |= {k for k in request.holding if isinstance(k, int)}
        done = tuple(ledger.done_for(client_id, keys))
        if not ledger.commits and not ledger.per_trainer:
            return done, 0, False, False
        cursor = self._core.state.split_cursors.get((job.job_id, 0))
        handed_out_all = cursor is not None and SplitCursor.from_json(cursor).done
        if not ledger.commits:  # a cross-trainer job (its cursor goes when the job ends)
            complete = (handed_out_all or job.finished) and ledger.complete_for(client_id)
            return done, 0, False, complete
        awaits = handed_out_all and ledger.awaits_commits()
        return done, ledger.flush_wanted(client_id), awaits, False

    def _check_reading(self, client_id: int) -> None:
        """Raises unless consumer ``client_id`` still reads its job (under the lock).

        Raises:
          ConsumerReleasedError: it was released (it said it was done, or missed heartbeats).
          NotFoundError: it was collected with its job.
        """
        client = self._core.state.clients.get(client_id)
        if client is None:
            raise NotFoundError(f"consumer {client_id} was collected with its job")
        if client.released:
            raise ConsumerReleasedError(
                f"consumer {client_id} was released (it said it was done, or the dispatcher "
                f"heard no heartbeat from it for {self._core.config.client_timeout_s:g} s, "
                "DispatcherConfig.client_timeout_ms); what it had not committed went back to "
                "its job"
            )

    def client_heartbeat(self, header: dict[str, Any], buffers: list[memoryview]) -> Reply | bytes:
        """ClientHeartbeat: the job's view once its version differs from the consumer's, or
        after ``wait_ms`` (``unchanged``, without the view, where the consumer's is current);
        with ``splits_done`` and the view for a consumer of an exactly-once job."""
        request = ClientHeartbeatRequest.from_header(header)
        wait_s = min(request.wait_ms / 1000, MAX_WAIT_S)
        deadline = time.monotonic() + wait_s
        core = self._core
        client_id = request.client_id
        with core.lock:
            job = core.consumer(client_id)
            ledger = core.state.ledgers.get(job.job_id)
            if ledger is not None and ledger.commits:
                # A released consumer's report counts for nothing: what it held went back to
                # the job when it was released, and a step it commits now is not committed.
                # (On receipt, what it received and reports last still counts as delivered.)
                self._check_reading(client_id)
            done = self._take_report(client_id, job, request)
            core.load.consumer_report(client_id, request.input_wait)
            while True:
                self._check_reading(client_id)
                core.client_seen[client_id] = core.clock()
                remaining = deadline - time.monotonic()
                if (
                    core.job_versions[job.job_id] != request.version
                    or remaining <= 0
                    or core.stopped.is_set()
                    or self._waiting_consumers >= _MAX_WAITING_CONSUMERS
                ):
                    if done is None:
                        if core.job_versions[job.job_id] == request.version:
                            return self._unchanged_frame()
                        return self._reply_frame(job)
                    reply = HeartbeatReply(core.incarnation, self.job_view(job), *done)
                    return reply.to_header(), ()
                self._waiting_consumers += 1
                try:
                    core.wait(client_id, remaining, ("job", job.job_id))
                finally:
                    self._waiting_consumers -= 1
