"""The dispatcher's journal: every state update, durable in SQLite under ``work_dir``.

With ``DispatcherConfig(work_dir=..., fault_tolerant_mode=True)`` the dispatcher appends each
update of ``state`` that it applies (``append``) to an SQLite database,
``<work_dir>/dispatcher.journal.sqlite``, and commits them (``commit``) before it sends any reply
that depends on them: what a worker or consumer was told is never forgotten by a dispatcher
killed at any moment (kill -9 included). A dispatcher started again on the same ``work_dir``
(``open_journal``) replays the journal to the same state and the same *incarnation*, so that
its workers and consumers carry on with their jobs.

Layout (one database, WAL mode):

=========  ================================================================================
meta       ``format`` (``FORMAT``; a newer one is refused), ``incarnation``
snapshot   at most one row: the whole state (``_state.state_to_json``) as of its writing
updates    ``seq``, ``body``: the updates since the snapshot (``_state.update_to_json``)
=========  ================================================================================

Beside the database, ``dispatcher.journal.marker`` (JSON: format, incarnation) says that the
work_dir holds a journal: a journal file that is then missing, empty or of another incarnation
is refused (``DataLossError``) rather than replaced by an empty state. Replay checks every
dataset against the sha256 it was registered with (its fingerprint): a changed byte is a
``DataLossError`` naming the dataset, never a dataset that reads other elements. The work_dir's
files are opened without following symbolic links and must belong to the dispatcher's user
(``work_dir``).

Replay is the snapshot, then the updates in ``seq`` order. A commit that finds the updates
since the snapshot larger than twice the snapshot (and 1 MiB) replaces both with a new snapshot
in the same transaction, so that replay time follows the state's size, not the service's age,
at an amortised constant cost per update.

Durability: with ``synchronous="FULL"`` (the default) every commit is fsynced before a reply that
may depend on it is sent: an update survives a crash of the machine too, not only of the process
(``NORMAL`` survives kill -9 but may lose the last commits to a power cut;
``benchmarks/service_journal.py`` measures both). The fsync is the journal's own, of the WAL
file, outside the dispatcher's lock (``sync``): SQLite writes each commit to the WAL without
one (``PRAGMA synchronous=NORMAL``), and requests that commit while one fsync runs share the next
(group commit), so that a request's fsync neither holds the lock nor waits for another's. One
dispatcher at a time uses a ``work_dir``: ``dispatcher.lock`` is held with ``flock`` while the
journal is open, and the kernel releases it when the process dies.

A journal that cannot be read as one (a damaged file, an update that does not apply) raises
``DataLossError``; one of a newer format raises ``FailedPreconditionError``. Neither is ever
replaced by an empty state silently: moving ``work_dir`` away starts afresh, with its jobs lost.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import IO

from feedline.errors import (
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)
from feedline.service.dispatcher import work_dir as _work_dir
from feedline.service.dispatcher.state import (
    DispatcherState,
    Update,
    state_from_json,
    state_to_json,
    update_from_json,
    update_to_json,
)

__all__ = ["FORMAT", "JOURNAL_FILE", "LOCK_FILE", "MARKER_FILE", "Journal", "open_journal"]

logger = logging.getLogger(__name__)

#: The journal format this code writes and reads; a journal of a higher one is refused.
FORMAT = 1
JOURNAL_FILE = "dispatcher.journal.sqlite"
LOCK_FILE = "dispatcher.lock"
MARKER_FILE = "dispatcher.journal.marker"
# The files SQLite keeps beside the database.
_SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")
# ``PRAGMA application_id``: marks the database as a feedline dispatcher journal ("fdln").
_APPLICATION_ID = 0x66646C6E
# A snapshot is written once the updates since the last one pass this many bytes and twice it.
_MIN_COMPACT_BYTES = 1 << 20
_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE snapshot (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL);
CREATE TABLE updates (seq INTEGER PRIMARY KEY, body TEXT NOT NULL);
"""
_SYNCHRONOUS = ("FULL", "NORMAL")


class Journal:
    """An open journal of ``state``; made by ``open_journal``. Not thread-safe: the dispatcher
    calls it under its lock, except ``sync`` (any thread, outside the lock).

    Attributes:
      path: the database file.
      state: the state it journals (the one ``open_journal`` replayed).
      replayed: how many updates the opening replayed after the snapshot.
      replay_seconds: how long opening and replaying took.
      snapshots: how many snapshots this journal object has written.
      commits: how many commits this journal object has made (``sync`` takes one of these).
      fsyncs: how many fsyncs ``sync`` has made.
      syncs: whether ``sync`` fsyncs (``synchronous="FULL"``) or does nothing (``"NORMAL"``).
    """

    def __init__(
        self,
        path: Path,
        connection: sqlite3.Connection,
        lock: IO[str],
        state: DispatcherState,
        snapshot_bytes: int,
        log_bytes: int,
    ) -> None:
        self.path = path
        self.state = state
        self.replayed = 0
        self.replay_seconds = 0.0
        self.snapshots = 0
        self._db: sqlite3.Connection | None = connection
        self._lock = lock
        self._pending = 0
        self._snapshot_bytes = snapshot_bytes
        self._log_bytes = log_bytes
        self.commits = 0
        self.fsyncs = 0
        self.syncs = True
        self._synced = 0  # every commit up to this one is fsynced
        self._syncing = False  # an fsync is running (one at a time)
        self._sync_cond = threading.Condition()
        self._wal: int | None = None  # the WAL file, opened for the first fsync
        # The first fsync that failed: every later sync fails too (after a failed fsync the
        # kernel may have dropped the pages, and a later fsync succeed without them).
        self._sync_error: OSError | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            raise UnavailableError(f"the dispatcher journal {self.path} is closed")
        return self._db

    def append(self, update: Update) -> None:
        """Adds ``update`` (already applied to ``state``) to the open transaction; durable at the
        next ``commit``."""
        db = self._connection()
        body = json.dumps(update_to_json(update), separators=(",", ":"))
        if not self._pending:
            db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO updates (body) VALUES (?)", (body,))
        self._pending += 1
        self._log_bytes += len(body)

    def commit(self) -> None:
        """Makes every appended update durable (fsynced); a no-op when none is pending. Writes a
        snapshot in the same transaction once the updates since the last one have grown past
        twice its size."""
        if not self._pending:
            return
        db = self._connection()
        if self._log_bytes > max(_MIN_COMPACT_BYTES, 2 * self._snapshot_bytes):
            self._write_snapshot(db)
        db.execute("COMMIT")
        self._pending = 0
        self.commits += 1

    def sync(self, through: int) -> None:
        """Returns once commits up to number ``through`` (``commits`` read after them, under
        the dispatcher's lock) are fsynced; call it outside that lock. One fsync of the WAL
        file at a time: a caller that finds one running waits for it, then makes the next,
        which covers every commit made meanwhile (group commit). Nothing to do with
        ``synchronous="NORMAL"``.

        Raises:
          OSError: this fsync, or an earlier one, failed (the commits may not be durable).
        """
        if not self.syncs:
            return
        through = min(through, self.commits)  # never more than were made
        with self._sync_cond:
            while self._synced < through:
                if self._sync_error is not None:
                    raise OSError(
                        self._sync_error.errno, f"an earlier fsync failed: {self._sync_error}"
                    )
                if self._syncing:
                    self._sync_cond.wait()
                    continue
                self._syncing = True
                target = self.commits  # >= through: commits only grow
                self._sync_cond.release()  # commits go on meanwhile; the next fsync has them
                try:
                    self._fsync_wal()
                except OSError as error:
                    self._sync_error = error
                    raise
                finally:
                    self._sync_cond.acquire()
                    self._syncing = False
                    self._sync_cond.notify_all()
                self._synced = target

    def _fsync_wal(self) -> None:
        if self._wal is None:  # made by the first commit; kept while the database is open
            self._wal = _work_dir.open_file(Path(f"{self.path}-wal"), os.O_RDONLY)
            _fsync_folder(self.path.parent)  # the WAL file's name, once
        os.fsync(self._wal)
        self.fsyncs += 1

    def _write_snapshot(self, db: sqlite3.Connection) -> None:
        body = json.dumps(state_to_json(self.state), separators=(",", ":"))
        db.execute("DELETE FROM updates")
        db.execute("INSERT OR REPLACE INTO snapshot (id, body) VALUES (1, ?)", (body,))
        self._snapshot_bytes, self._log_bytes = len(body), 0
        self.snapshots += 1

    def compact(self) -> None:
        """Writes a snapshot now (and commits)."""
        db = self._connection()
        if not self._pending:
            db.execute("BEGIN IMMEDIATE")
            self._pending = 1
        self._write_snapshot(db)
        self.commit()

    def close(self) -> None:
        """Commits what is pending and closes the database and the lock; idempotent."""
        if self._db is None:
            return
        try:
            self.commit()
            self.sync(self.commits)
        finally:
            self._db.close()  # the last connection: checkpoints (fsynced) and removes the WAL
            self._db = None
            if self._wal is not None:
                os.close(self._wal)
                self._wal = None
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()


def open_journal(
    work_dir: str | os.PathLike[str], incarnation: int, *, synchronous: str = "FULL"
) -> Journal:
    """Opens (or creates) the journal in ``work_dir`` and replays it.

    Args:
      work_dir: the dispatcher's folder; made if missing.
      incarnation: the incarnation of a new journal (a replayed one keeps its own).
      synchronous: ``"FULL"`` (fsync every commit) or ``"NORMAL"`` (see the module docstring).

    Returns:
      The journal; ``journal.state`` is the replayed state (empty, of ``incarnation``, for a
      new journal).

    Raises:
      DataLossError: the journal is damaged, missing or empty where the marker says one was,
        a dataset differs from its sha256, or it is not a feedline dispatcher journal.
      FailedPreconditionError: the journal has a newer format, or another dispatcher uses
        ``work_dir``.
      PermissionDeniedError: ``work_dir`` or a file in it belongs to another user, others may
        write ``work_dir``, or a file in it is a symbolic link.
    """
    if synchronous not in _SYNCHRONOUS:
        raise InvalidArgumentError(
            f"synchronous must be one of {_SYNCHRONOUS}, got {synchronous!r}"
        )
    started = time.perf_counter()
    folder = Path(work_dir)
    _work_dir.check_folder(folder)
    lock = _lock(folder)
    path = folder / JOURNAL_FILE
    try:
        for suffix in _SQLITE_SUFFIXES:
            _work_dir.check_file(Path(f"{path}{suffix}"))
        marker = _read_marker(folder)
        if marker is not None and not path.exists():
            raise _damaged(
                path,
                f"it is missing, but {folder / MARKER_FILE} says it held the state of "
                f"incarnation {marker:x}",
            )
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as error:
        _unlock(lock)
        raise DataLossError(
            f"cannot open the dispatcher journal {path}: {error}", str(path)
        ) from error
    except BaseException:
        _unlock(lock)
        raise
    try:
        journal = _replay(path, db, lock, incarnation, marker)
        journal.syncs = synchronous == "FULL"
    except BaseException:
        db.close()
        _unlock(lock)
        raise
    journal.replay_seconds = time.perf_counter() - started
    return journal


def _lock(folder: Path) -> IO[str]:
    fd = _work_dir.open_file(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    lock = os.fdopen(fd, "r+")  # held while the journal is open
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise FailedPreconditionError(
            f"another dispatcher (pid {holder}) uses the work_dir {folder}: one dispatcher at a "
            "time may keep its journal there"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def _unlock(lock: IO[str]) -> None:
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()


def _read_marker(folder: Path) -> int | None:
    """The incarnation that ``MARKER_FILE`` names; None without a marker."""
    try:
        fd = _work_dir.open_file(folder / MARKER_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as file:
        text = file.read()
    try:
        return int(json.loads(text)["incarnation"])
    except (ValueError, KeyError, TypeError) as error:
        raise DataLossError(
            f"the dispatcher journal's marker {folder / MARKER_FILE} is damaged ({error!r}): "
            "the dispatcher does not start rather than forget its jobs; move the work_dir "
            "away to start with an empty state (its jobs are then lost)",
            str(folder / MARKER_FILE),
        ) from error


def _write_marker(folder: Path, incarnation: int) -> None:
    """Writes ``MARKER_FILE`` (through a temporary file renamed into place, fsynced)."""
    temporary = folder / f".{MARKER_FILE}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)
    fd = _work_dir.open_file(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "wb") as file:
        file.write(json.dumps({"format": FORMAT, "incarnation": incarnation}).encode())
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, folder / MARKER_FILE)
    _fsync_folder(folder)


def _fsync_folder(folder: Path) -> None:
    """fsyncs ``folder``: the names made or replaced in it are durable."""
    directory = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _damaged(path: Path, what: str) -> DataLossError:
    return DataLossError(
        f"the dispatcher journal {path} is damaged: {what}. The dispatcher does not start "
        "rather than forget its jobs; move the work_dir away to start with an empty state "
        "(its jobs are then lost)",
        str(path),
    )


def _replay(
    path: Path,
    db: sqlite3.Connection,
    lock: IO[str],
    incarnation: int,
    marker: int | None,
) -> Journal:
    try:
        check = db.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise _damaged(path, f"SQLite's quick_check says {check!r}")
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        if not tables and marker is not None:
            raise _damaged(
                path,
                f"it is empty, but {path.parent / MARKER_FILE} says it held the state of "
                f"incarnation {marker:x}",
            )
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise _damaged(path, f"it cannot be put in WAL mode (it is in {mode!r} mode)")
        # Commits go to the WAL without an fsync; with FULL, ``Journal.sync`` makes them durable
        # before any reply (group commit, outside the dispatcher's lock).
        db.execute("PRAGMA synchronous=NORMAL")
        if not tables:
            db.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA.strip().split(";")[:-1]:
                db.execute(statement)
            db.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?)",
                [("format", str(FORMAT)), ("incarnation", str(incarnation))],
            )
            db.execute(f"PRAGMA application_id={_APPLICATION_ID}")
            db.execute("COMMIT")
            logger.info("dispatcher journal %s created (incarnation %x)", path, incarnation)
            journal = Journal(path, db, lock, DispatcherState(incarnation), 0, 0)
            journal._fsync_wal()  # the schema, before the marker says that a journal is here
            _write_marker(path.parent, incarnation)
            return journal
        journal = _read(path, db, lock)
        if marker is None:  # a journal of a feedline from before markers
            _write_marker(path.parent, journal.state.incarnation)
        elif marker != journal.state.incarnation:
            raise _damaged(
                path,
                f"it holds incarnation {journal.state.incarnation:x}, but "
                f"{path.parent / MARKER_FILE} says the work_dir's journal held {marker:x}",
            )
        return journal
    except sqlite3.DatabaseError as error:
        raise _damaged(path, f"SQLite says {error}") from error


def _read(path: Path, db: sqlite3.Connection, lock: IO[str]) -> Journal:
    application_id = db.execute("PRAGMA application_id").fetchone()[0]
    if application_id != _APPLICATION_ID:
        raise _damaged(path, "it is an SQLite database, but not a feedline dispatcher journal")
    meta = dict(db.execute("SELECT key, value FROM meta"))
    try:
        found = int(meta["format"])
        incarnation = int(meta["incarnation"])
    except (KeyError, ValueError) as error:
        raise _damaged(path, f"its meta table is incomplete ({error!r})") from error
    if found > FORMAT:
        raise FailedPreconditionError(
            f"the dispatcher journal {path} has format {found}, written by a newer feedline; "
            f"this one reads formats up to {FORMAT}. Run the newer feedline's dispatcher on it"
        )
    row = db.execute("SELECT body FROM snapshot WHERE id = 1").fetchone()
    snapshot_bytes = 0
    if row is None:
        state = DispatcherState(incarnation)
    else:
        snapshot_bytes = len(row[0])
        try:
            state = state_from_json(json.loads(row[0]))
        except (ValueError, InvalidArgumentError) as error:
            raise _damaged(path, f"its snapshot does not read ({error})") from error
        if state.incarnation != incarnation:
            raise _damaged(path, "its snapshot is of another incarnation than its meta table")
    replayed, log_bytes = 0, 0
    for seq, body in db.execute("SELECT seq, body FROM updates ORDER BY seq"):
        try:
            state.apply(update_from_json(json.loads(body)))
        except (ValueError, TypeError, KeyError, AttributeError, InvalidArgumentError) as error:
            raise _damaged(path, f"update {seq} ({body[:200]!r}) does not apply: {error!r}") from (
                error
            )
        replayed += 1
        log_bytes += len(body)
    for record in state.datasets.values():
        digest = hashlib.sha256(record.payload).hexdigest()
        if digest != record.fingerprint:
            raise _damaged(
                path,
                f"dataset {record.dataset_id!r} does not match the sha256 it was registered "
                f"with ({record.fingerprint[:16]}..., now {digest[:16]}...)",
            )
    journal = Journal(path, db, lock, state, snapshot_bytes, log_bytes)
    journal.replayed = replayed
    logger.info(
        "dispatcher journal %s replayed: %d datasets, %d jobs, %d tasks, %d updates after the "
        "snapshot (incarnation %x)",
        path,
        len(state.datasets),
        len(state.jobs),
        len(state.tasks),
        replayed,
        incarnation,
    )
    return journal
