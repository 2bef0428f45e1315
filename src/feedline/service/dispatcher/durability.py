"""The dispatcher's journal (``fault_tolerant_mode``): opening and replaying it, making it
durable, and what happens when it cannot be written.

``Durability`` opens the journal of ``work_dir`` (``journal``) and hands the state it replayed,
with its incarnation, to the core (``core.DispatcherCore.resume``), whose updates it then logs:
every update the core applies is appended (``append``) and committed (``commit``) before a
heartbeat waits and before any reply is sent (``durable``), and the reply waits, outside the
dispatcher's lock, for the journal's fsync of every commit made so far (``Journal.sync``; one
fsync serves every request that committed while the one before ran). A journal that cannot be
written stops the dispatcher rather than let it tell anyone what it could forget; ``error`` then
says why, so that ``feedline dispatcher`` exits non-zero and a supervisor restarts it.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from feedline._net import rpc as _rpc
from feedline.errors import FailedPreconditionError, UnavailableError
from feedline.service.dispatcher.core import DispatcherCore
from feedline.service.dispatcher.journal import Journal, open_journal
from feedline.service.dispatcher.state import Update

__all__ = ["Durability"]

# The dispatcher's logger, as before these methods moved here.
logger = logging.getLogger("feedline.service.dispatcher.server")


class Durability:
    """The journal of a dispatcher: its ``core.UpdateLog`` once ``open`` ran.

    Args:
      core: the dispatcher's core.
      stop: stops the dispatcher (called on a thread of its own when the journal fails).
    """

    def __init__(self, core: DispatcherCore, stop: Callable[[], None]) -> None:
        self._core = core
        self._stop = stop
        #: The open journal, None before ``open`` (and without ``fault_tolerant_mode``).
        self.journal: Journal | None = None
        #: Why the journal stopped the dispatcher (a write failed), None while it has not.
        self.error: UnavailableError | None = None

    def open(self) -> None:
        """Opens the journal of ``work_dir`` and resumes the core from the state it replayed:
        the workers and consumers of its jobs carry on.

        Raises:
          DataLossError: the journal is damaged.
          FailedPreconditionError: a journal of a newer format, or no ``work_dir``.
        """
        core = self._core
        if core.config.work_dir is None:
            raise FailedPreconditionError("a dispatcher journal needs DispatcherConfig.work_dir")
        journal = open_journal(
            core.config.work_dir, core.incarnation, synchronous=core.config.journal_sync.upper()
        )
        self.journal = journal
        core.resume(journal.state, self)
        state = journal.state
        if state.jobs or state.datasets:
            logger.info(
                "dispatcher resumed from %s in %.3f s: %d datasets, %d workers, %d jobs",
                journal.path,
                journal.replay_seconds,
                len(state.datasets),
                len(state.workers),
                len(state.jobs),
            )

    def append(self, update: Update) -> None:
        """Journals ``update`` (under the lock); durable once ``commit`` ran."""
        if self.journal is not None:
            try:
                self.journal.append(update)
            except sqlite3.Error as error:
                self._failed(error)

    def commit(self) -> None:
        """Makes the journaled updates durable (under the lock)."""
        if self.journal is not None:
            try:
                self.journal.commit()
            except sqlite3.Error as error:
                self._failed(error)

    def sync(self, through: int) -> None:
        """Waits until commits up to number ``through`` are durable (outside the lock)."""
        if self.journal is not None:
            try:
                self.journal.sync(through)
            except OSError as error:
                with self._core.lock:
                    self._failed(error)

    def _failed(self, error: sqlite3.Error | OSError) -> NoReturn:
        """The journal cannot be written: the dispatcher stops rather than tell anyone what it
        could forget; started again, it resumes from what the journal holds."""
        logger.critical("writing the dispatcher journal failed (%s); the dispatcher stops", error)
        failure = UnavailableError(
            f"the dispatcher at {self._core.address()} cannot write its journal "
            f"{self.journal.path if self.journal else ''} ({error}) and stops"
        )
        if self.error is None:
            self.error = failure
        threading.Thread(target=self._stop, name="feedline-dispatcher-stop", daemon=True).start()
        raise failure from error

    def durable(self, handler: _rpc.Handler) -> _rpc.Handler:
        """``handler``, its reply (or error) sent once the journal holds, fsynced, every update
        made before it: its own and those of the state it read."""

        def handle(header: dict[str, Any], buffers: list[memoryview]) -> Any:
            try:
                return handler(header, buffers)
            finally:
                with self._core.lock:
                    self.commit()
                    through = 0 if self.journal is None else self.journal.commits
                self.sync(through)

        return handle

    def close(self) -> None:
        """Closes the journal (under the lock); a failure is logged."""
        if self.journal is None:
            return
        with self._core.lock:
            try:
                self.journal.close()
            except (sqlite3.Error, OSError) as error:
                logger.error("closing the dispatcher journal failed: %s", error)
