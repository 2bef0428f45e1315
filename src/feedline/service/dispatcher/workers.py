"""The dispatcher's workers: WorkerHeartbeat and the tasks it starts, ends and drops.

Part of ``DispatchServer`` (``dispatcher``): ``WorkerHandlers`` holds its methods that register
workers, give them tasks of running jobs, tell them which tasks to start, delete or drop, end a job
when a task fails or all its tasks ended, and forget workers that left.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from feedline._net.rpc import field
from feedline.errors import FailedPreconditionError, InvalidArgumentError
from feedline.service.config import ShardingPolicy
from feedline.service.dispatcher.long_poll import _MAX_WAIT_S
from feedline.service.dispatcher.state import (
    CreateTask,
    FinishJob,
    FinishTask,
    JobRecord,
    RegisterWorker,
    RemoveWorker,
    TaskRecord,
)
from feedline.service.protocol import incarnation_of

# The dispatcher's logger, as before these methods moved here.
logger = logging.getLogger("feedline.service.dispatcher.server")

# The longest text kept of a failed task's error message and traceback.
_MAX_ERROR_CHARS = 16_000


class WorkerHandlers:
    """The worker methods of ``DispatchServer``.

    A base of ``DispatchServer`` only: its methods use the server's state and lock.
    """

    def _worker_heartbeat(self, header: dict[str, Any], buffers: list[memoryview]) -> Any:
        address = field(header, "address", str)
        tags = field(header, "tags", list, [])
        current = set(field(header, "current_tasks", list, []))
        finished = field(header, "finished_tasks", list, [])
        failed = field(header, "failed_tasks", list, [])
        draining = field(header, "draining", bool, False)
        leaving = field(header, "leaving", bool, False)
        wait_s = min(field(header, "wait_ms", int, 0) / 1000, _MAX_WAIT_S)
        deadline = time.monotonic() + wait_s
        self._telemetry.worker_report(header.get("task_stats"))  # for the status page
        with self._lock:
            state = self._state
            allowed = self._config.worker_addresses
            if allowed is not None and address not in allowed:
                raise FailedPreconditionError(
                    f"worker {address} is not in the dispatcher's worker_addresses {list(allowed)};"
                    " a dispatcher with a fixed worker list accepts only those workers (set "
                    "WorkerConfig.worker_address to one of them)"
                )
            for task_id in finished:
                task = state.tasks.get(task_id)
                if task is not None and task.worker_address == address and not task.finished:
                    self._apply(FinishTask(task_id))
                    self._finish_job_if_done(state.jobs[task.job_id])
            for report in failed:
                self._fail_job(address, report)
            if leaving:
                self._remove_worker(address, "it left")
                return {"incarnation": self._incarnation, "new_tasks": [], "delete_tasks": []}, ()
            if address not in state.workers:
                if draining:  # a worker on its way out that was dropped: it stays out
                    return {"incarnation": self._incarnation, "new_tasks": []}, ()
                self._apply(RegisterWorker(address, tuple(tags)))
                self._assign_running_jobs(address)
                logger.info("worker %s registered", address)
            if draining:
                self._draining.add(address)
            else:
                self._draining.discard(address)
            while True:
                self._worker_seen[address] = time.monotonic()
                reply = self._worker_news(address, current, draining)
                remaining = deadline - time.monotonic()
                if reply["new_tasks"] or len(reply) > 1 or remaining <= 0 or self._stopped.is_set():
                    return {"incarnation": self._incarnation, **reply}, ()
                self._wait(address, remaining, ("worker", address))

    def _worker_news(self, address: str, current: set[int], draining: bool) -> dict[str, Any]:
        """What the worker at ``address`` running ``current`` must hear: only the lists that
        are not empty, under ``new_tasks`` (to start), ``delete_tasks`` (their job ended;
        ``task_errors`` has the error of those whose job failed) and ``lost_tasks`` (tasks of an
        earlier life of this dispatcher). Always has ``new_tasks``."""
        state = self._state
        tasks = state.worker_tasks(address)
        news: dict[str, Any] = {
            "new_tasks": []
            if draining
            else [self._task_def(t) for t in tasks if not t.finished and t.task_id not in current]
        }
        delete = [
            t.task_id for t in tasks if t.task_id in current and state.jobs[t.job_id].finished
        ]
        # A task this life does not know: from an earlier life, or already forgotten here.
        unknown = sorted(current - {t.task_id for t in tasks})
        lost = [t for t in unknown if incarnation_of(t) != self._incarnation]
        delete += [t for t in unknown if incarnation_of(t) == self._incarnation]
        if delete:
            news["delete_tasks"] = delete
            errors = {
                str(t): state.jobs[state.tasks[t].job_id].error
                for t in delete
                if t in state.tasks and state.jobs[state.tasks[t].job_id].error is not None
            }
            if errors:
                news["task_errors"] = errors
        if lost:
            news["lost_tasks"] = lost
        return news

    def _fail_job(self, address: str, report: Any) -> None:
        """A worker's task failed: its job ends with the task's error (the first one reported),
        which every consumer of the job then receives."""
        if not isinstance(report, dict) or not isinstance(report.get("task_id"), int):
            raise InvalidArgumentError(f"malformed request: a failed task is {report!r}")
        task = self._state.tasks.get(report["task_id"])
        if task is None or task.worker_address != address:
            return
        job = self._state.jobs[task.job_id]
        if job.finished:
            return
        error = {
            key: str(report.get(key, ""))[:_MAX_ERROR_CHARS]
            for key in ("type", "message", "traceback")
        }
        error.update(worker=address, task_id=task.task_id)
        logger.warning(
            "job %d failed: task %d on worker %s raised %s: %s",
            job.job_id,
            task.task_id,
            address,
            error["type"],
            error["message"],
        )
        self._telemetry.job_failed(job.job_id, error)
        self._apply(FinishJob(job.job_id, error))

    def _remove_worker(self, address: str, why: str) -> None:
        """Forgets the worker at ``address``: its unfinished tasks are lost (under the lock)."""
        state = self._state
        self._worker_seen.pop(address, None)
        self._draining.discard(address)
        if address not in state.workers:
            return
        logger.info("worker %s removed: %s", address, why)
        jobs = {task.job_id for task in state.worker_tasks(address)}
        self._apply(RemoveWorker(address))
        for job_id in sorted(jobs):
            self._finish_job_if_done(state.jobs[job_id])

    def _assign_running_jobs(self, address: str) -> None:
        """Gives a newly registered worker a task of every running OFF or DYNAMIC job (jobs of
        static sharding and round-robin jobs keep the workers they were made with)."""
        state = self._state
        if address in self._draining:
            return
        for job in list(state.jobs.values()):
            if job.finished or job.num_consumers is not None:
                continue
            if ShardingPolicy(job.mode).is_static:
                continue
            if any(t.worker_address == address for t in state.job_tasks(job.job_id)):
                continue
            count = len(job.task_ids)
            self._apply(CreateTask(state.new_id(), job.job_id, address, count, count + 1))

    def _task_def(self, task: TaskRecord) -> dict[str, Any]:
        job = self._state.jobs[task.job_id]
        return {
            "task_id": task.task_id,
            "job_id": job.job_id,
            "dataset_id": job.dataset_id,
            "fingerprint": self._state.datasets[job.dataset_id].fingerprint,
            "mode": job.mode,
            "worker_index": task.worker_index,
            "num_workers": task.num_workers,
            "num_consumers": job.num_consumers,
            "skip": task.skip,
            "exactly_once": job.exactly_once,
            # Consumers of a named job share its tasks' elements first come, first served.
            "shared": job.job_name is not None and job.num_consumers is None,
        }

    def _finish_job_if_done(self, job: JobRecord) -> None:
        """Ends ``job`` once every task ended and at least one ended because its input did. A
        job whose tasks were all lost with their workers is not over: under DYNAMIC sharding
        the next worker to register takes its remaining splits, and its consumers wait (for
        their bounded time) instead of taking the loss for the end of the data."""
        tasks = self._state.job_tasks(job.job_id)
        ledger = self._state.ledgers.get(job.job_id)
        if (
            not job.finished
            and tasks
            and all(t.finished for t in tasks)
            and not all(t.lost for t in tasks)
            and (ledger is None or ledger.settled)
        ):
            self._apply(FinishJob(job.job_id))
