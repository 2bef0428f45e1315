"""The dispatcher's core: what its parts share.

``DispatcherCore`` holds the durable state (``state.DispatcherState``) and its one entry point,
``apply``; the log that updates go to (the journal of ``fault_tolerant_mode``, ``durability``);
the lock every part works under; the wake-ups of waiting heartbeats and the versions of the jobs'
views; the incarnation; and the volatile liveness that several parts read and write (when each
worker and consumer was last heard from, which of them wait here now, since when a named job has
no consumer, when each dataset was last used, the load they report). The parts of the
dispatcher (``datasets``, ``jobs``, ``workers``, ``split_handout``, ``long_poll``, ``gc``,
``durability``) each receive the core, and the other parts they call, in their constructors: a
core with no server and no journal is enough to drive them in a test.

A heartbeat waits here for news of its own job or worker only: ``apply`` wakes the heartbeats an
update concerns (``("job", job_id)`` or ``("worker", address)``), never all of them.
"""

from __future__ import annotations

import collections
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from feedline.errors import FailedPreconditionError, NotFoundError
from feedline.service.config import DispatcherConfig
from feedline.service.dispatcher.demand import Load
from feedline.service.dispatcher.state import (
    AcquireClient,
    CreateTask,
    DispatcherState,
    FinishJob,
    FinishTask,
    JobRecord,
    ReleaseClient,
    RemoveWorker,
    Update,
)
from feedline.service.protocol import incarnation_of, new_incarnation

__all__ = ["DispatcherCore", "Reply", "UpdateLog", "WakeKey"]

#: What a handler of the dispatcher returns: a reply header and its buffers.
Reply = tuple[dict[str, Any], tuple[bytes, ...]]
#: What a heartbeat waits on: ``("job", job_id)`` or ``("worker", address)``.
WakeKey = tuple[str, Any]


class UpdateLog(Protocol):
    """Where every applied update also goes (the journal, ``durability.Durability``)."""

    def append(self, update: Update) -> None:
        """Adds ``update``, committed by the next ``commit``."""

    def commit(self) -> None:
        """Commits the updates appended so far (the journal fsyncs them before any reply that
        may depend on them: ``durability.Durability.durable``)."""


class DispatcherCore:
    """The state, lock, wake-ups and liveness that the dispatcher's parts share.

    Every method and attribute is used under ``lock`` unless its docstring says otherwise.

    Args:
      config: the dispatcher's configuration (timeouts, fixed workers, fault tolerance).
      incarnation: this dispatcher life's id; None draws a new one.
      clock: the time of the liveness maps and of garbage collection (``time.monotonic``).
      address: the dispatcher's ``host:port`` for error messages, asked for when needed.
    """

    def __init__(
        self,
        config: DispatcherConfig | None = None,
        *,
        incarnation: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        address: Callable[[], str] | None = None,
    ) -> None:
        self.config = DispatcherConfig() if config is None else config
        self.incarnation = new_incarnation() if incarnation is None else incarnation
        self.state = DispatcherState(self.incarnation)
        #: Where updates also go (``fault_tolerant_mode``), None without a journal.
        self.log: UpdateLog | None = None
        self.mutex = threading.RLock()
        self.lock = threading.Condition(self.mutex)
        #: Set when the dispatcher stops: waiting heartbeats answer at once.
        self.stopped = threading.Event()
        self.clock = clock
        self._address = address
        # Heartbeats waiting for news, by what they wait on, with how many wait on it.
        self._wakeups: dict[WakeKey, tuple[threading.Condition, list[int]]] = {}
        #: What a job's consumers see changes: its version goes up (volatile).
        self.job_versions: collections.Counter[int] = collections.Counter()
        #: When each worker and consumer last heartbeated (volatile).
        self.worker_seen: dict[str, float] = {}
        self.client_seen: dict[int, float] = {}
        #: Since when each named job has had no consumer (volatile).
        self.job_idle_since: dict[int, float] = {}
        #: When each dataset was last registered, asked about or read (volatile): one that no
        #: job reads is collected ``job_gc_timeout_ms`` after it.
        self.dataset_used: dict[str, float] = {}
        #: Workers and consumers whose heartbeat is waiting here right now: alive by definition.
        self.waiting: collections.Counter[str | int] = collections.Counter()
        #: What workers and consumers report of their load (volatile; thread-safe on its own).
        self.load = Load(clock)

    def address(self) -> str:
        """The dispatcher's ``host:port``, as error messages name it (any thread)."""
        return "this dispatcher" if self._address is None else self._address()

    # -- the state --------------------------------------------------------------------------
    def apply(self, update: Update) -> None:
        """Applies ``update``; the one place state changes. With a log, the update is also
        appended to it, committed by the next ``commit``. Wakes the heartbeats it concerns."""
        self.state.apply(update)
        if self.log is not None:
            self.log.append(update)
        affected = self._affected(update)
        # A GetSplit that waits for an exactly-once job's splits (``split_handout``) hears of
        # every change of its job.
        jobs = {key[1] for key in affected if key[0] == "job"}
        jobs.add(getattr(update, "job_id", None))
        affected.update(("splits", job_id) for job_id in jobs if job_id is not None)
        for key in affected:
            if key[0] == "job":
                self.job_versions[key[1]] += 1
            entry = self._wakeups.get(key)
            if entry is not None:
                entry[0].notify_all()
        self.lock.notify_all()

    def _affected(self, update: Update) -> set[WakeKey]:
        """The jobs and workers whose heartbeats ``update`` (just applied) has news for."""
        state = self.state
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

    def commit(self) -> None:
        """Commits the logged updates: before any reply (which then waits for their fsync), and
        before a heartbeat waits."""
        if self.log is not None:
            self.log.commit()

    def resume(self, state: DispatcherState, log: UpdateLog) -> None:
        """Takes ``state`` (replayed from ``log``) and its incarnation: the workers and consumers
        of its jobs carry on. What is volatile starts as if every one of them had just been
        heard from, so that those that are gone are dropped after their timeouts."""
        self.log = log
        self.state = state
        self.incarnation = state.incarnation
        now = self.clock()
        self.worker_seen = dict.fromkeys(state.workers, now)
        self.client_seen = {c.client_id: now for c in state.clients.values() if not c.released}
        # A job's version restarts far from any its consumers saw, so each hears the job anew.
        base = secrets.randbits(40) + (1 << 40)
        for job in state.jobs.values():
            self.job_versions[job.job_id] = base
            if not state.active_clients(job.job_id):
                self.job_idle_since[job.job_id] = now

    def finish_job_if_done(self, job: JobRecord) -> None:
        """Ends ``job`` once every task ended, at least one because its input did, and (an
        exactly-once job) its splits are settled: a cross-trainer job's may settle after its
        tasks ended, once a trainer that joined late reports what it read from their caches,
        or leaves. A job whose tasks were all lost with their workers is not over: under
        DYNAMIC sharding the next worker to register takes its remaining splits, and its
        consumers wait (for their bounded time) instead of taking the loss for the end of the
        data."""
        tasks = self.state.job_tasks(job.job_id)
        ledger = self.state.ledgers.get(job.job_id)
        if (
            not job.finished
            and tasks
            and all(t.finished for t in tasks)
            and not all(t.lost for t in tasks)
            and (ledger is None or ledger.settled)
        ):
            self.apply(FinishJob(job.job_id))

    # -- queries ----------------------------------------------------------------------------
    def consumer(self, client_id: int) -> JobRecord:
        """The job of consumer ``client_id``.

        Raises:
          FailedPreconditionError: the consumer joined in an earlier life of the dispatcher.
          NotFoundError: no such consumer (it was collected with its job).
        """
        client = self.state.clients.get(client_id)
        if client is None:
            if incarnation_of(client_id) != self.incarnation:
                raise FailedPreconditionError(
                    f"consumer {client_id} joined its job in an earlier life of the dispatcher "
                    f"at {self.address()}, which has restarted since without a "
                    "journal: the job is gone, and the elements not yet received with it. "
                    "Iterate the dataset again to start a new job"
                )
            raise NotFoundError(f"no consumer {client_id} is known to the dispatcher")
        return self.state.jobs[client.job_id]

    # -- waiting ----------------------------------------------------------------------------
    def wait(self, who: str | int, seconds: float, key: WakeKey) -> None:
        """Waits until an update concerns ``key`` or ``seconds`` pass, ``who`` counting as
        alive meanwhile. Commits the log first: no transaction stays open while it waits."""
        self.waiting[who] += 1
        entry = self._wakeups.get(key)
        if entry is None:
            entry = self._wakeups[key] = (threading.Condition(self.mutex), [0])
        entry[1][0] += 1
        try:
            self.commit()
            entry[0].wait(seconds)
        finally:
            entry[1][0] -= 1
            if not entry[1][0]:
                del self._wakeups[key]
            self.waiting[who] -= 1
            if not self.waiting[who]:
                del self.waiting[who]

    def stop(self) -> None:
        """Sets ``stopped`` and wakes every waiting heartbeat, which then answers (any
        thread)."""
        self.stopped.set()
        with self.lock:
            self.lock.notify_all()
            for condition, _ in self._wakeups.values():
                condition.notify_all()
