"""The dispatcher's garbage collection.

``Collector`` runs every ``gc_check_interval_s`` (``loop``): it drops workers and releases
consumers that missed heartbeats, collects named jobs ``job_gc_timeout_ms`` after their last
consumer left, and datasets that no job reads ``job_gc_timeout_ms`` after they were last
registered, asked about or read.
"""

from __future__ import annotations

import logging

from feedline.service.dispatcher.core import DispatcherCore
from feedline.service.dispatcher.jobs import Jobs
from feedline.service.dispatcher.state import FinishJob, RemoveDataset
from feedline.service.dispatcher.workers import Workers
from feedline.service.status.metrics import DispatcherTelemetry

__all__ = ["Collector"]

# The dispatcher's logger, as before these methods moved here.
logger = logging.getLogger("feedline.service.dispatcher.server")


class Collector:
    """The garbage collection of a dispatcher.

    Args:
      core: the dispatcher's core.
      jobs: its jobs (releasing consumers, collecting jobs).
      workers: its workers (dropping those that missed heartbeats).
      telemetry: what the status page shows (missed heartbeats).
    """

    def __init__(
        self, core: DispatcherCore, jobs: Jobs, workers: Workers, telemetry: DispatcherTelemetry
    ) -> None:
        self._core = core
        self._jobs = jobs
        self._workers = workers
        self._telemetry = telemetry

    def loop(self) -> None:
        """Collects every ``gc_check_interval_s`` until the dispatcher stops (its thread)."""
        core = self._core
        while not core.stopped.wait(core.config.gc_check_interval_s):
            try:
                self.collect()
            except Exception:
                logger.exception("dispatcher garbage collection failed")

    def collect(self) -> None:
        """One round of collection, at ``core.clock()`` (any thread)."""
        core = self._core
        config = core.config
        with core.lock:
            now = core.clock()
            state = core.state
            for address, seen in list(core.worker_seen.items()):
                if now - seen > config.worker_timeout_s and address not in core.waiting:
                    logger.warning(
                        "worker %s missed heartbeats for %.1f s; dropping it and its tasks",
                        address,
                        now - seen,
                    )
                    self._telemetry.heartbeat_missed("worker", address)
                    self._workers.remove_worker(address, "it missed heartbeats")
            for client_id, seen in list(core.client_seen.items()):
                if now - seen > config.client_timeout_s and client_id not in core.waiting:
                    client = state.clients.get(client_id)
                    if client is None:  # collected with its job
                        core.client_seen.pop(client_id, None)
                        continue
                    of_client = state.jobs[client.job_id]
                    # A consumer of an ended job may stop heartbeating before it says goodbye.
                    log = logger.debug if of_client.finished else logger.warning
                    log("consumer %d missed heartbeats; releasing it", client_id)
                    if not of_client.finished:
                        self._telemetry.heartbeat_missed("consumer", client_id)
                    self._jobs.release(client_id, of_client)
            for job_id, since in list(core.job_idle_since.items()):
                job = state.jobs.get(job_id)
                if job is None or state.active_clients(job_id):
                    del core.job_idle_since[job_id]
                elif now - since > config.gc_timeout_s:
                    if not job.finished:
                        core.apply(FinishJob(job_id))
                    self._jobs.remove_job(job)
            self._collect_datasets(now)
            # What the status page shows of tasks the dispatcher no longer knows goes too.
            self._telemetry.rates.keep_only(state.tasks)
            core.commit()

    def _collect_datasets(self, now: float) -> None:
        """Forgets the datasets that no job reads and that nobody registered, asked about or
        read within ``job_gc_timeout_ms`` (under the lock)."""
        core = self._core
        state = core.state
        read = {job.dataset_id for job in state.jobs.values()}
        read |= {s.dataset_id for s in state.snapshots.values() if not s.finished}
        for dataset_id in list(state.datasets):
            if dataset_id in read:
                continue
            used = core.dataset_used.setdefault(dataset_id, now)
            if now - used > core.config.gc_timeout_s:
                logger.info("dataset %s collected: unused for %.0f s", dataset_id, now - used)
                core.apply(RemoveDataset(dataset_id))
                del core.dataset_used[dataset_id]
