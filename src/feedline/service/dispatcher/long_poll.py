"""The dispatcher's job views and the heartbeat long poll.

Part of ``DispatchServer`` (``dispatcher``): ``LongPoll`` holds its methods that say which waiting
heartbeats an update concerns (``_affected``), let a heartbeat wait for news of its own job or
worker (``_wait``), build a job's view for its consumers (``_job_view``) and answer
ClientHeartbeat. At most ``_MAX_WAITING_CONSUMERS`` consumer heartbeats wait at once (past that a
heartbeat is answered at once and the consumer waits on its side), so that long polls never take
every thread of the server.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from feedline._net.rpc import field
from feedline.errors import NotFoundError
from feedline.service.dispatcher.state import (
    AcquireClient,
    CreateTask,
    FinishJob,
    FinishTask,
    JobRecord,
    ReleaseClient,
    RemoveWorker,
    ReportSplits,
    Update,
)
from feedline.service.ledger import check_report

# The longest a heartbeat waits at the dispatcher for news.
_MAX_WAIT_S = 2.0
# The most consumer heartbeats that wait here at once (each holds a server thread).
_MAX_WAITING_CONSUMERS = 16


class LongPoll:
    """The job views and heartbeat waits of ``DispatchServer``.

    A base of ``DispatchServer`` only: its methods use the server's state and lock.
    """

    def _affected(self, update: Update) -> set[tuple[str, Any]]:
        """The jobs and workers whose heartbeats ``update`` (just applied) has news for."""
        state = self._state
        match update:
            case CreateTask(task_id, job_id, address):
                return {("job", job_id), ("worker", address)}
            case FinishTask(task_id):
                return {("job", state.tasks[task_id].job_id)}
            case FinishJob(job_id):
                return {("job", job_id)} | {
                    ("worker", task.worker_address) for task in state.job_tasks(job_id)
                }
            case RemoveWorker(address):
                return {("worker", address)} | {
                    ("job", task.job_id) for task in state.worker_tasks(address)
                }
            case AcquireClient(_, job_id):
                return {("job", job_id)}
            case ReleaseClient(client_id):
                client = state.clients.get(client_id)
                return set() if client is None else {("job", client.job_id)}
        return set()

    def _wait(self, who: str | int, seconds: float, key: tuple[str, Any]) -> None:
        """Waits (under the lock) until an update concerns ``key`` (``("job", job_id)`` or
        ``("worker", address)``) or ``seconds`` pass, ``who`` counting as alive meanwhile."""
        self._waiting[who] += 1
        entry = self._wakeups.get(key)
        if entry is None:
            entry = self._wakeups[key] = (threading.Condition(self._mutex), [0])
        entry[1][0] += 1
        try:
            self._commit()
            entry[0].wait(seconds)
        finally:
            entry[1][0] -= 1
            if not entry[1][0]:
                del self._wakeups[key]
            self._waiting[who] -= 1
            if not self._waiting[who]:
                del self._waiting[who]

    def _job_view(self, job: JobRecord) -> dict[str, Any]:
        """What a consumer of ``job`` needs to know of it (under the lock)."""
        tasks = [
            [
                task.task_id,
                task.worker_address,
                "lost" if task.lost else "done" if task.finished else "running",
            ]
            for task in self._state.job_tasks(job.job_id)
        ]
        # What a consumer saves as its position (``position``).
        streams = [
            [task.task_id, task.worker_index, task.num_workers, task.skip]
            for task in self._state.job_tasks(job.job_id)
        ]
        return {
            "tasks": tasks,
            "streams": streams,
            "finished": job.finished,
            "error": job.error,
            "consumers": len(self._state.active_clients(job.job_id)),
            "joined": len(job.client_ids),
            "exactly_once": job.exactly_once,
            # What an exactly-once job's split keys mean (a consumer's position saves it).
            "split_cursor": self._state.split_cursors.get((job.job_id, 0))
            if job.exactly_once
            else None,
            "version": self._job_versions[job.job_id],
        }

    def _take_report(
        self, client_id: int, job: JobRecord, header: dict[str, Any]
    ) -> list[list[int]] | None:
        """Applies what a consumer of an exactly-once job reports (the offsets it received, the
        lost tasks it closed); ``[key, count]`` of the splits it reported or holds that are
        done, or None for other jobs."""
        ledger = self._state.ledgers.get(job.job_id)
        if ledger is None:
            return None
        received, closed = check_report(header.get("received", []), header.get("closed", []))
        news = [[key, ranges] for key, ranges in received if ledger.adds(key, ranges)]
        closed = [task_id for task_id in closed if ledger.awaits(client_id, task_id)]
        if news or closed:
            self._apply(ReportSplits(job.job_id, client_id, news, closed))
        holding = field(header, "holding", list, [])
        keys = {key for key, _ in received} | {k for k in holding if isinstance(k, int)}
        return [[key, ledger.done[key]] for key in sorted(keys) if key in ledger.done]

    def _client_heartbeat(self, header: dict[str, Any], buffers: list[memoryview]) -> Any:
        version = field(header, "version", int, -1)
        wait_s = min(field(header, "wait_ms", int, 0) / 1000, _MAX_WAIT_S)
        deadline = time.monotonic() + wait_s
        with self._lock:
            client_id, job = self._client(header)
            done = self._take_report(client_id, job, header)
            while True:
                client = self._state.clients.get(client_id)
                if client is None or client.released:  # None: collected with its job
                    raise NotFoundError(
                        f"consumer {client_id} was released (it said it was done, or it missed "
                        f"heartbeats for {self._config.client_timeout_s} s)"
                    )
                self._client_seen[client_id] = time.monotonic()
                remaining = deadline - time.monotonic()
                if (
                    self._job_versions[job.job_id] != version
                    or remaining <= 0
                    or self._stopped.is_set()
                    or self._waiting_consumers >= _MAX_WAITING_CONSUMERS
                ):
                    reply = {"incarnation": self._incarnation, **self._job_view(job)}
                    if done is not None:
                        reply["splits_done"] = done
                    return reply, ()
                self._waiting_consumers += 1
                try:
                    self._wait(client_id, remaining, ("job", job.job_id))
                finally:
                    self._waiting_consumers -= 1
