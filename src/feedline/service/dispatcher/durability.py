"""The dispatcher's journal (``fault_tolerant_mode``): resuming from it, and making it durable.

Part of ``DispatchServer`` (``dispatcher``): ``Durability`` holds its methods that resume the
state a journal replayed (``_resume``), commit the journal before every reply and before a
heartbeat waits (``_commit``, ``_durable``), stop the dispatcher when the journal cannot be
written, and collect a named job that a consumer resumes from a checkpoint
(``_collect_for_resume``). They work on the server's state, under its lock where their docstrings
say so.
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
import threading
import time
from typing import Any, NoReturn

from feedline._net import rpc as _rpc
from feedline.errors import FailedPreconditionError, UnavailableError
from feedline.service.dispatcher.journal import Journal
from feedline.service.dispatcher.state import FinishJob, JobRecord

# The dispatcher's logger, as before these methods moved here.
logger = logging.getLogger("feedline.service.dispatcher.server")


class Durability:
    """The journal and resume methods of ``DispatchServer``.

    A base of ``DispatchServer`` only: its methods use the server's state and lock.
    """

    def _resume(self, journal: Journal) -> None:
        """Takes the state ``journal`` replayed, and its incarnation: the workers and consumers
        of its jobs carry on. What is volatile starts as if every one of them had just been
        heard from, so that those that are gone are dropped after their timeouts."""
        self._journal = journal
        self._state = journal.state
        self._incarnation = journal.state.incarnation
        now = time.monotonic()
        state = self._state
        self._worker_seen = dict.fromkeys(state.workers, now)
        self._client_seen = {c.client_id: now for c in state.clients.values() if not c.released}
        # A job's version restarts far from any its consumers saw, so each hears the job anew.
        base = secrets.randbits(40) + (1 << 40)
        for job in state.jobs.values():
            self._job_versions[job.job_id] = base
            if not state.active_clients(job.job_id):
                self._job_idle_since[job.job_id] = now
        if state.jobs or state.datasets:
            logger.info(
                "dispatcher resumed from %s in %.3f s: %d datasets, %d workers, %d jobs",
                journal.path,
                journal.replay_seconds,
                len(state.datasets),
                len(state.workers),
                len(state.jobs),
            )

    def _commit(self) -> None:
        """Makes the journaled updates durable (under the lock): before any reply, and before a
        heartbeat waits."""
        if self._journal is not None:
            try:
                self._journal.commit()
            except sqlite3.Error as error:
                self._journal_failed(error)

    def _journal_failed(self, error: sqlite3.Error) -> NoReturn:
        """The journal cannot be written: the dispatcher stops rather than tell anyone what it
        could forget; started again, it resumes from what the journal holds."""
        logger.critical("writing the dispatcher journal failed (%s); the dispatcher stops", error)
        threading.Thread(target=self.stop, name="feedline-dispatcher-stop", daemon=True).start()
        raise UnavailableError(
            f"the dispatcher at {self.target.split('://')[-1]} cannot write its journal "
            f"({error}) and stops"
        ) from error

    def _durable(self, handler: _rpc.Handler) -> _rpc.Handler:
        """``handler``, committing the journal before its reply (or error) is sent."""

        def handle(header: dict[str, Any], buffers: list[memoryview]) -> Any:
            try:
                return handler(header, buffers)
            finally:
                with self._lock:
                    self._commit()

        return handle

    def _collect_for_resume(self, job: JobRecord) -> None:
        """A consumer resumes the named ``job`` from a checkpoint: the job is collected, so
        that a new one of its name starts at the consumer's position (under the lock).

        Raises:
          FailedPreconditionError: other consumers read the job: the position of one of them
            is not the job's.
        """
        active = self._state.active_clients(job.job_id)
        if active:
            raise FailedPreconditionError(
                f"cannot resume job {job.job_name!r} (iteration {job.iteration}) from a "
                f"checkpoint: {len(active)} other consumer(s) read it now, and a consumer's "
                "position is the job's only when it reads the job alone. Resume before other "
                "consumers join, or use another job_name"
            )
        if not job.finished:
            self._apply(FinishJob(job.job_id))
        self._remove_job(job)
