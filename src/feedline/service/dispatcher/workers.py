"""The dispatcher's workers: WorkerHeartbeat and the tasks it starts, ends and drops.

``Workers`` registers workers, gives them tasks of running jobs, tells them which tasks to start,
delete or drop, ends a job when a task fails or all its tasks ended, and forgets workers that
left. A worker that drains gets no new tasks (``available``); which workers drain is volatile
and kept here.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from feedline.errors import FailedPreconditionError
from feedline.service.config import ShardingPolicy
from feedline.service.dispatcher.core import DispatcherCore, Reply
from feedline.service.dispatcher.long_poll import MAX_WAIT_S
from feedline.service.dispatcher.state import (
    CreateTask,
    FinishJob,
    FinishTask,
    JobRecord,
    RegisterWorker,
    RemoveWorker,
    TaskRecord,
)
from feedline.service.protocol import (
    TaskDef,
    WorkerHeartbeatReply,
    WorkerHeartbeatRequest,
    incarnation_of,
)
from feedline.service.status.metrics import DispatcherTelemetry
from feedline.service.status.text import printable

__all__ = ["Workers"]

# The dispatcher's logger, as before these methods moved here.
logger = logging.getLogger("feedline.service.dispatcher.server")

# The longest text kept of a failed task's error message and traceback.
_MAX_ERROR_CHARS = 16_000
# The most worker heartbeats that wait here at once (each holds a server thread); past that a
# heartbeat is answered at once with ``retry_after_ms`` and the worker waits on its side.
_MAX_WAITING_WORKERS = 16


class Workers:
    """The worker handler of a dispatcher and the tasks of its workers.

    Args:
      core: the dispatcher's core.
      telemetry: what the status page shows (the workers' task stats, failed jobs).
    """

    def __init__(self, core: DispatcherCore, telemetry: DispatcherTelemetry) -> None:
        self._core = core
        self._telemetry = telemetry
        # Workers that drain before leaving: no new tasks for them (volatile).
        self._draining: set[str] = set()
        # Worker heartbeats waiting here now (at most _MAX_WAITING_WORKERS).
        self._waiting = 0
        # The worker processes that another took the address of, by address (volatile).
        self._replaced: dict[str, set[int]] = {}

    @property
    def draining(self) -> set[str]:
        """The workers that drain now, a copy (under the lock)."""
        return set(self._draining)

    def available(self) -> tuple[str, ...]:
        """The registered workers that do not drain, sorted: those a new job's tasks may go to
        (under the lock)."""
        return tuple(sorted(set(self._core.state.workers) - self._draining))

    def worker_heartbeat(self, header: dict[str, Any], buffers: list[memoryview]) -> Reply:
        """WorkerHeartbeat: the worker's news (``_worker_news``) and the ``incarnation``; waits
        up to ``wait_ms`` for tasks to start or delete."""
        request = WorkerHeartbeatRequest.from_header(header)
        address = request.address
        current = set(request.current_tasks)
        draining = request.draining
        deadline = time.monotonic() + min(request.wait_ms / 1000, MAX_WAIT_S)
        core = self._core
        with core.lock:
            state = core.state
            allowed = core.config.worker_addresses
            if allowed is not None and address not in allowed:
                raise FailedPreconditionError(
                    f"worker {address} is not in the dispatcher's worker_addresses {list(allowed)};"
                    " a dispatcher with a fixed worker list accepts only those workers (set "
                    "WorkerConfig.worker_address to one of them)"
                )
            self._check_instance(address, request.instance)
            for task_id in request.finished_tasks:
                task = state.tasks.get(task_id)
                if task is not None and task.worker_address == address and not task.finished:
                    core.apply(FinishTask(task_id))
                    self._core.finish_job_if_done(state.jobs[task.job_id])
            for report in request.failed_tasks:
                self._fail_job(address, report)

            # For the status page and the estimate of the workers needed: the tasks it issued
            # to this worker only.
            def issued(task_id: int) -> bool:
                task = state.tasks.get(task_id)
                return task is not None and task.worker_address == address

            self._telemetry.worker_report(request.task_stats, issued)
            core.load.worker_report(request.task_load, issued)
            if request.leaving:
                self.remove_worker(address, "it left")
                return WorkerHeartbeatReply(core.incarnation).to_header(), ()
            if address not in state.workers:
                if draining:  # a worker on its way out that was dropped: it stays out
                    return WorkerHeartbeatReply(core.incarnation).to_header(), ()
                core.apply(RegisterWorker(address, request.tags, request.instance))
                self._assign_running_jobs(address)
                logger.info("worker %s registered", address)
            if draining:
                self._draining.add(address)
            else:
                self._draining.discard(address)
            while True:
                if address not in core.state.workers:  # it left meanwhile (another call)
                    return WorkerHeartbeatReply(core.incarnation).to_header(), ()
                core.worker_seen[address] = core.clock()
                reply = self._worker_news(address, current, draining)
                news = (
                    reply.new_tasks or reply.delete_tasks or reply.lost_tasks or reply.dropped_tasks
                )
                remaining = deadline - time.monotonic()
                if news or remaining <= 0 or core.stopped.is_set():
                    return reply.to_header(), ()
                if self._waiting >= _MAX_WAITING_WORKERS:
                    reply = dataclasses.replace(reply, retry_after_ms=max(1, int(remaining * 1000)))
                    return reply.to_header(), ()
                self._waiting += 1
                try:
                    core.wait(address, remaining, ("worker", address))
                finally:
                    self._waiting -= 1

    def _check_instance(self, address: str, instance: int | None) -> None:
        """A worker process other than the one registered at ``address`` heartbeats from it
        (under the lock): the registered one restarted there, or died and another took its
        address. The old worker is gone (its tasks are lost, as when it is dropped), and the
        new one registers as a new worker. A heartbeat of a process that was replaced so is
        refused: two live workers cannot share one address.

        Raises:
          FailedPreconditionError: ``instance`` is a process that another replaced.
        """
        if instance is None:
            return
        if instance in self._replaced.get(address, ()):
            raise FailedPreconditionError(
                f"another worker process has taken the address {address} of this worker, "
                f"which the dispatcher dropped: give each worker an address of its own "
                "(WorkerConfig.worker_address / --worker-address)"
            )
        record = self._core.state.workers.get(address)
        if record is None:
            return
        if record.instance is None:  # registered before workers said who they are
            self._core.apply(RegisterWorker(address, record.tags, instance))
        elif record.instance != instance:
            self._replaced.setdefault(address, set()).add(record.instance)
            self.remove_worker(address, "a new worker process took its address (it restarted)")

    def _worker_news(self, address: str, current: set[int], draining: bool) -> WorkerHeartbeatReply:
        """What the worker at ``address`` running ``current`` must hear: ``new_tasks`` (to
        start), ``delete_tasks`` (their job ended; ``task_errors`` has the error of those whose
        job failed), ``lost_tasks`` (tasks of an earlier life of this dispatcher) and
        ``dropped_tasks`` (lost when the worker was dropped)."""
        state = self._core.state
        incarnation = self._core.incarnation
        tasks = state.worker_tasks(address)
        new_tasks = (
            ()
            if draining
            else tuple(
                self._task_def(t) for t in tasks if not t.finished and t.task_id not in current
            )
        )
        delete = [
            t.task_id for t in tasks if t.task_id in current and state.jobs[t.job_id].finished
        ]
        # Lost with this worker, which was dropped while it lived on: its consumers read them no
        # more (their splits run again elsewhere); it frees them.
        dropped = [
            t.task_id
            for t in tasks
            if t.task_id in current and t.lost and not state.jobs[t.job_id].finished
        ]
        # A task this life does not know: from an earlier life, or already forgotten here.
        unknown = sorted(current - {t.task_id for t in tasks})
        lost = [t for t in unknown if incarnation_of(t) != incarnation]
        delete += [t for t in unknown if incarnation_of(t) == incarnation]
        errors = {
            t: error
            for t in delete
            if t in state.tasks and (error := state.jobs[state.tasks[t].job_id].error) is not None
        }
        return WorkerHeartbeatReply(
            incarnation, new_tasks, tuple(delete), errors, tuple(lost), dropped_tasks=tuple(dropped)
        )

    def _fail_job(self, address: str, report: dict[str, Any]) -> None:
        """A worker's task failed: its job ends with the task's error (the first one reported),
        which every consumer of the job then receives."""
        state = self._core.state
        task = state.tasks.get(report["task_id"])
        if task is None or task.worker_address != address:
            return
        job = state.jobs[task.job_id]
        if job.finished:
            return
        # What the worker reported, as printable text: the page, the metrics and the journal
        # show and keep it, and the job's consumers raise it.
        error: dict[str, Any] = {
            key: printable(report.get(key, ""), _MAX_ERROR_CHARS)
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
        self._core.apply(FinishJob(job.job_id, error))

    def remove_worker(self, address: str, why: str) -> None:
        """Forgets the worker at ``address``: its unfinished tasks are lost (under the lock)."""
        core = self._core
        state = core.state
        core.worker_seen.pop(address, None)
        self._draining.discard(address)
        if address not in state.workers:
            return
        logger.info("worker %s removed: %s", address, why)
        jobs = {task.job_id for task in state.worker_tasks(address)}
        core.apply(RemoveWorker(address))
        for job_id in sorted(jobs):
            self._core.finish_job_if_done(state.jobs[job_id])
            self.run_replays(state.jobs[job_id])

    def run_replays(self, job: JobRecord) -> None:
        """Splits of exactly-once ``job`` wait to run again while none of its tasks asks for
        splits any more (each was told that they ended, or was lost): a cross-trainer job's
        done split, open again for a trainer that lacks it once its worker was lost. A live
        worker gets a new task of the job, which runs them (under the lock); with none live,
        the next worker to register does (``_assign_running_jobs``)."""
        state = self._core.state
        ledger = state.ledgers.get(job.job_id)
        if job.finished or ledger is None or not ledger.replay:
            return
        tasks = state.job_tasks(job.job_id)
        if any(not t.finished and not t.splits_ended for t in tasks):
            return
        live = [address for address in state.workers if address not in self._draining]
        if live:  # the one running the fewest tasks
            self._add_task(
                job,
                min(
                    live,
                    key=lambda a: (sum(not t.finished for t in state.worker_tasks(a)), a),
                ),
            )

    def _add_task(self, job: JobRecord, address: str, shard: TaskRecord | None = None) -> None:
        """Gives the worker at ``address`` a new task of ``job``: as the job's last worker, or
        (a static job) as the worker of ``shard``, a task lost before it."""
        state, count = self._core.state, len(job.task_ids)
        index, workers = (
            (count, count + 1) if shard is None else (shard.worker_index, shard.num_workers)
        )
        self._core.apply(CreateTask(state.new_id(), job.job_id, address, index, workers))

    def _assign_running_jobs(self, address: str) -> None:
        """Gives a newly registered worker a task of every running OFF or DYNAMIC job. Jobs of
        static sharding and round-robin jobs keep the workers they were made with; a worker
        that comes back at the address of one of a static job's, whose task was lost with it,
        begins that worker's shard again from its start, as in TensorFlow."""
        state = self._core.state
        if address in self._draining:
            return
        for job in list(state.jobs.values()):
            if job.finished or job.num_consumers is not None:
                continue
            # A worker that comes back at the address of one that was dropped (or that
            # restarted there) is a new worker: the tasks lost with the old one do not count.
            mine = [t for t in state.job_tasks(job.job_id) if t.worker_address == address]
            if any(not t.lost for t in mine):
                continue
            if not ShardingPolicy(job.mode).is_static:
                self._add_task(job, address)
            elif mine:  # its shard, again
                self._add_task(job, address, shard=mine[-1])

    def _task_def(self, task: TaskRecord) -> TaskDef:
        """The definition of ``task`` that its worker runs."""
        state = self._core.state
        job = state.jobs[task.job_id]
        return TaskDef(
            task_id=task.task_id,
            job_id=job.job_id,
            dataset_id=job.dataset_id,
            mode=ShardingPolicy(job.mode),
            worker_index=task.worker_index,
            num_workers=task.num_workers,
            num_consumers=job.num_consumers,
            fingerprint=state.datasets[job.dataset_id].fingerprint,
            skip=task.skip,
            exactly_once=job.exactly_once,
            # Consumers of a named job share its tasks' elements first come, first served;
            # the trainers of a cross-trainer job each read all of them.
            shared=job.job_name is not None and job.num_consumers is None and not job.cross_trainer,
            cross_trainer=job.cross_trainer,
        )
