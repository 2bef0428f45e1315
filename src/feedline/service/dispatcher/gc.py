"""The dispatcher's garbage collection.

Part of ``DispatchServer`` (``dispatcher``): ``Collector`` holds its methods that, every
``gc_check_interval_s``, drop workers and release consumers that missed heartbeats, collect named
jobs ``job_gc_timeout_ms`` after their last consumer left, and datasets that no job reads
``job_gc_timeout_ms`` after they were last registered, asked about or read.
"""

from __future__ import annotations

import logging
import time

from feedline.service.dispatcher.state import FinishJob, RemoveDataset

# The dispatcher's logger, as before these methods moved here.
logger = logging.getLogger("feedline.service.dispatcher.server")


class Collector:
    """The garbage collection of ``DispatchServer``.

    A base of ``DispatchServer`` only: its methods use the server's state and lock.
    """

    def _gc_loop(self) -> None:
        while not self._stopped.wait(self._config.gc_check_interval_s):
            try:
                self._collect()
            except Exception:
                logger.exception("dispatcher garbage collection failed")

    def _collect(self) -> None:
        now = time.monotonic()
        config = self._config
        with self._lock:
            state = self._state
            for address, seen in list(self._worker_seen.items()):
                if now - seen > config.worker_timeout_s and address not in self._waiting:
                    logger.warning(
                        "worker %s missed heartbeats for %.1f s; dropping it and its tasks",
                        address,
                        now - seen,
                    )
                    self._telemetry.heartbeat_missed("worker", address)
                    self._remove_worker(address, "it missed heartbeats")
            for client_id, seen in list(self._client_seen.items()):
                if now - seen > config.client_timeout_s and client_id not in self._waiting:
                    client = state.clients.get(client_id)
                    if client is None:  # collected with its job
                        self._client_seen.pop(client_id, None)
                        continue
                    job = state.jobs[client.job_id]
                    # A consumer of an ended job may stop heartbeating before it says goodbye.
                    log = logger.debug if job.finished else logger.warning
                    log("consumer %d missed heartbeats; releasing it", client_id)
                    if not job.finished:
                        self._telemetry.heartbeat_missed("consumer", client_id)
                    self._release(client_id, job)
            for job_id, since in list(self._job_idle_since.items()):
                job = state.jobs.get(job_id)
                if job is None or state.active_clients(job_id):
                    del self._job_idle_since[job_id]
                elif now - since > config.gc_timeout_s:
                    if not job.finished:
                        self._apply(FinishJob(job_id))
                    self._remove_job(job)
            self._collect_datasets(now)
            self._commit()

    def _collect_datasets(self, now: float) -> None:
        """Forgets the datasets that no job reads and that nobody registered, asked about or
        read within ``job_gc_timeout_ms`` (under the lock)."""
        state = self._state
        read = {job.dataset_id for job in state.jobs.values()}
        for dataset_id in list(state.datasets):
            if dataset_id in read:
                continue
            used = self._dataset_used.setdefault(dataset_id, now)
            if now - used > self._config.gc_timeout_s:
                logger.info("dataset %s collected: unused for %.0f s", dataset_id, now - used)
                self._apply(RemoveDataset(dataset_id))
                del self._dataset_used[dataset_id]
