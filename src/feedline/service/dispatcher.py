"""``DispatchServer``: the data service's control plane.

The dispatcher registers datasets and workers, creates a job for each iteration of a distributed
dataset (shared by name), assigns the job's tasks to workers, hands out the splits of DYNAMIC
jobs, and forgets consumers and workers that stop heartbeating. It never runs a dataset: it
keeps registered datasets as the bytes clients sent.

What it keeps does not grow with the jobs it has run: an anonymous job is collected as soon as
its consumer is done, a named job ``job_gc_timeout_ms`` after its last consumer left, and a
dataset that no job reads ``job_gc_timeout_ms`` after it was last registered, asked about or
read (``_collect``).

Its durable state is ``_state.DispatcherState``, changed only through ``_apply``; everything
else here (heartbeat times, waiting heartbeats) is volatile. With ``fault_tolerant_mode`` every
update also goes to the journal (``_journal``), committed before any reply is sent
(``_durable``) and before a heartbeat waits; a dispatcher started again on the same ``work_dir``
replays it (``_resume``) and keeps the incarnation, so its workers and consumers carry on.

RPCs (each a frame of ``feedline._net.wire``; see the handlers for their fields):

==================  ============================================================================
RegisterDataset     a pickled dataset and its facts -> ``dataset_id`` (the same dataset twice
                    gets the same id); an upload (``feedline._net.rpc``), of at most
                    ``MAX_DATASET_BYTES``
GetDatasetDef       ``dataset_id`` -> the pickled dataset (for workers)
GetElementSpec      ``dataset_id`` -> the pickled element spec (for ``from_dataset_id``)
GetOrCreateJob      a consumer joins the job of ``(job_name, iteration)`` or a new anonymous job;
                    the reply carries the job's view (below). With ``resume`` (a consumer's
                    position from a checkpoint, ``_position``) it joins a new job whose tasks
                    skip what the consumer had received; a named job of no consumer that is
                    still kept is collected first
ClientHeartbeat     the job's view once it differs from the ``version`` the consumer has (or after
                    ``wait_ms``): its tasks ``[task_id, address, "running"|"done"|"lost"]``
                    and their streams ``[task_id, worker_index, num_workers, skip]``, whether
                    it finished, its error, its number of consumers (``consumers``) and of
                    consumers ever (``joined``)
ReleaseClient       a consumer is done with its job
WorkerHeartbeat     a worker's liveness, its finished and failed tasks, whether it drains or
                    leaves -> tasks to start, tasks to delete (with their job's error), tasks of
                    an earlier dispatcher life to drop; waits for news. Also what each task
                    served (``task_stats``), for the status page (``_status_page``)
GetSplit            the next split of a DYNAMIC job's repetition, or none; a task that asks
                    again with the same ``request`` number gets the same split (its reply was
                    lost), so that a dispatcher killed mid-reply skips nothing
==================  ============================================================================

Every reply to a heartbeat and to GetOrCreateJob carries the dispatcher's ``incarnation``, drawn
at random at each start; every job, task and consumer id carries it too (``_state``), so that
workers and consumers recognise what belongs to an earlier life of a restarted dispatcher.

A heartbeat waits here for news of its own job or worker only: an update wakes the heartbeats it
concerns (``_affected``), never all of them, and at most ``_MAX_WAITING_CONSUMERS`` consumer
heartbeats wait at once (past that a heartbeat is answered at once and the consumer waits on its
side), so that long polls never take every thread of the server.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from feedline._net import exit as _exit
from feedline._net import rpc as _rpc
from feedline._net.rpc import field
from feedline.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from feedline.service._journal import JOURNAL_FILE, Journal, open_journal
from feedline.service._metrics import DispatcherTelemetry
from feedline.service._position import JobPosition, check_checkpointable, resume_skips
from feedline.service._split import SplitCursor, SplitPlan
from feedline.service._state import (
    AcquireClient,
    CreateJob,
    CreateTask,
    DatasetRecord,
    DispatcherState,
    FinishJob,
    FinishTask,
    JobRecord,
    MoveSplitCursor,
    RegisterDataset,
    RegisterWorker,
    ReleaseClient,
    RemoveDataset,
    RemoveJob,
    RemoveWorker,
    TaskRecord,
    Update,
    incarnation_of,
    new_incarnation,
)
from feedline.service._status import StatusServer
from feedline.service._status_page import DispatcherSnapshot, render_dispatcher
from feedline.service.config import DispatcherConfig, ShardingPolicy

__all__ = ["DispatchServer"]

logger = logging.getLogger(__name__)

SERVICE_NAME = "feedline.service.Dispatcher"
_TARGET_WORKERS = ("AUTO", "ANY", "LOCAL")
# The longest a heartbeat waits at the dispatcher for news.
_MAX_WAIT_S = 2.0
# The most consumer heartbeats that wait here at once (each holds a server thread).
_MAX_WAITING_CONSUMERS = 16
#: The largest RegisterDataset request (the pickled dataset and its element spec). Every other
#: request is a small control message (``_rpc.DEFAULT_MAX_REQUEST_BYTES``).
MAX_DATASET_BYTES = 256 << 20
_INFINITE = -1
# The longest text kept of a failed task's error message and traceback.
_MAX_ERROR_CHARS = 16_000


class DispatchServer:
    """The dispatcher of a data service cluster.

    Example:
      >>> from feedline import service
      >>> dispatcher = service.DispatchServer()
      >>> dispatcher.target.startswith("grpc://127.0.0.1:")
      True
      >>> dispatcher.stop()

    Args:
      config: a ``DispatcherConfig``; the default listens on a free loopback port.
      start: start serving now (else call ``start()``).
    """

    def __init__(self, config: DispatcherConfig | None = None, start: bool = True) -> None:
        self._config = DispatcherConfig() if config is None else config
        if not isinstance(self._config, DispatcherConfig):
            raise InvalidArgumentError(
                f"config must be a DispatcherConfig, got {type(self._config).__name__}"
            )
        self._token = _rpc.resolve_token(self._config.token)
        self._incarnation = new_incarnation()
        self._state = DispatcherState(self._incarnation)
        # The journal of fault_tolerant_mode (``_journal``): every update, durable before the
        # reply that depends on it (``_durable``).
        self._journal: Journal | None = None
        self._mutex = threading.RLock()
        self._lock = threading.Condition(self._mutex)
        # Heartbeats waiting for news, by what they wait on: ("job", id) or ("worker", address).
        self._wakeups: dict[tuple[str, Any], tuple[threading.Condition, list[int]]] = {}
        # What a job's consumers see changes: its version goes up (volatile).
        self._job_versions: collections.Counter[int] = collections.Counter()
        self._waiting_consumers = 0
        # Workers that drain before leaving: no new tasks for them (volatile).
        self._draining: set[str] = set()
        self._worker_seen: dict[str, float] = {}
        self._client_seen: dict[int, float] = {}
        self._job_idle_since: dict[int, float] = {}
        # When each dataset was last registered, asked about or read (volatile): one that no
        # job reads is collected after job_gc_timeout_ms.
        self._dataset_used: dict[str, float] = {}
        # Workers and consumers whose heartbeat is waiting here right now: alive by definition.
        self._waiting: collections.Counter[str | int] = collections.Counter()
        self._server: Any = None
        self._port: int | None = None
        self._stopped = threading.Event()
        self._gc_thread: threading.Thread | None = None
        # The status page and metrics (``status_port``): counted only when served.
        self._started_at = time.monotonic()
        self._telemetry = DispatcherTelemetry(
            self._config.status_port is not None, self._status_snapshot
        )
        self._status_server: StatusServer | None = None
        if self._config.fault_tolerant_mode:
            self._resume(open_journal(self._config.work_dir, self._incarnation))
        elif self._config.work_dir is not None:
            journal_file = Path(self._config.work_dir) / JOURNAL_FILE
            (logger.warning if journal_file.exists() else logger.info)(
                "running with fault_tolerant_mode=False: the dispatcher keeps no journal in %s "
                "and will not recover its state on restart%s",
                self._config.work_dir,
                f" ({journal_file} is left as it is, unread)" if journal_file.exists() else "",
            )
        if start:
            self.start()

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

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def target(self) -> str:
        """``"grpc://host:port"``: what ``distribute(service=...)`` takes."""
        if self._port is None:
            raise FailedPreconditionError("the dispatcher is not started; call start() first")
        host = self._config.bind
        if host in ("0.0.0.0", "::", "[::]"):
            host = "localhost"
        return f"{self._config.protocol}://{host}:{self._port}"

    def start(self) -> None:
        """Starts serving; idempotent."""
        if self._server is not None:
            return
        handlers = {
            "RegisterDataset": self._register_dataset,
            "GetDatasetDef": self._get_dataset_def,
            "GetElementSpec": self._get_element_spec,
            "GetOrCreateJob": self._get_or_create_job,
            "ClientHeartbeat": self._client_heartbeat,
            "ReleaseClient": self._release_client,
            "WorkerHeartbeat": self._worker_heartbeat,
            "GetSplit": self._get_split,
        }
        if self._journal is not None:
            handlers = {name: self._durable(handler) for name, handler in handlers.items()}
        handlers = self._telemetry.instrument(handlers)
        self._server, self._port = _rpc.start_server(
            SERVICE_NAME,
            handlers,
            bind=self._config.bind,
            port=self._config.port,
            token=self._token,
            upload_limits={"RegisterDataset": MAX_DATASET_BYTES},
            max_workers=64,
        )
        if self._config.status_port is not None:
            self._start_status_server()
        self._gc_thread = threading.Thread(
            target=self._gc_loop, name="feedline-dispatcher-gc", daemon=True
        )
        self._gc_thread.start()
        _exit.register(self, "stop", _exit.DISPATCHER)
        logger.info("dispatcher serving at %s", self.target)

    def join(self) -> None:
        """Blocks until the server stops."""
        if self._server is not None:
            self._server.wait_for_termination()

    @property
    def incarnation(self) -> int:
        """This dispatcher life's random id: every job, task and consumer id carries it."""
        return self._incarnation

    def stop(self) -> None:
        """Stops serving; idempotent."""
        self._stopped.set()
        with self._lock:
            self._lock.notify_all()
            for condition, _ in self._wakeups.values():
                condition.notify_all()
        if self._status_server is not None:
            self._status_server.stop()
        if self._server is not None:
            self._server.stop(grace=0.0 if _exit.exiting() else 0.5)
        if self._journal is not None:
            with self._lock:
                try:
                    self._journal.close()
                except sqlite3.Error as error:
                    logger.error("closing the dispatcher journal failed: %s", error)

    @property
    def status_url(self) -> str | None:
        """``"http://host:port/"``: the status page (``status_port``), None without one; its
        Prometheus metrics are at ``status_url + "metrics"``."""
        return None if self._status_server is None else self._status_server.url

    def _start_status_server(self) -> None:
        """Serves the status page and metrics; a port that cannot be bound stops the
        dispatcher again and raises (``UnavailableError``, naming the port)."""
        try:
            self._status_server = StatusServer(
                owner="dispatcher",
                bind=self._config.bind,
                port=self._config.status_port or 0,
                page=lambda: render_dispatcher(self._status_snapshot()),
                metrics=self._telemetry.exposition,
                token=self._token,
                setting="DispatcherConfig.status_port (feedline dispatcher --status-port)",
            )
        except Exception:
            self.stop()
            raise

    def _status_snapshot(self) -> DispatcherSnapshot:
        """What the status page and the metrics' gauges show, copied under the lock."""
        with self._lock:
            return DispatcherSnapshot.capture(
                target=self.target,
                state=self._state,
                started=self._started_at,
                worker_seen=self._worker_seen,
                client_seen=self._client_seen,
                waiting=self._waiting,
                draining=self._draining,
                telemetry=self._telemetry,
            )

    def __enter__(self) -> DispatchServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- state ------------------------------------------------------------------------------
    def _apply(self, update: Update) -> None:
        """Applies ``update`` (call under the lock); the one place state changes. With a
        journal, the update is also appended to it, durable once ``_commit`` ran."""
        self._state.apply(update)
        if self._journal is not None:
            try:
                self._journal.append(update)
            except sqlite3.Error as error:
                self._journal_failed(error)
        for key in self._affected(update):
            if key[0] == "job":
                self._job_versions[key[1]] += 1
            entry = self._wakeups.get(key)
            if entry is not None:
                entry[0].notify_all()
        self._lock.notify_all()

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

    # -- datasets ---------------------------------------------------------------------------
    def _register_dataset(self, header: dict[str, Any], buffers: list[memoryview]) -> Any:
        if len(buffers) != 2:
            raise InvalidArgumentError("RegisterDataset carries the dataset and its element spec")
        payload, spec = bytes(buffers[0]), bytes(buffers[1])
        compression = field(header, "compression", (str, type(None)))
        if compression not in ("AUTO", None):
            raise InvalidArgumentError(f"compression must be 'AUTO' or None, got {compression!r}")
        cardinality = field(header, "cardinality", int)
        plan = field(header, "split_plan", (dict, type(None)))
        if plan is not None:
            plan = SplitPlan.from_json(plan).to_json()
        wanted = field(header, "dataset_id", (str, type(None)), None)
        if wanted is not None and not wanted:
            raise InvalidArgumentError("dataset_id must be a non-empty string")
        fingerprint = hashlib.sha256(payload).hexdigest()
        with self._lock:
            state = self._state
            if wanted is not None and wanted in state.datasets:
                if state.datasets[wanted].fingerprint != fingerprint:
                    raise InvalidArgumentError(
                        f"dataset_id {wanted!r} is already registered with another dataset; "
                        "choose another id or let the service pick one"
                    )
                self._dataset_used[wanted] = time.monotonic()
                return {"dataset_id": wanted}, ()
            if wanted is None and fingerprint in state.dataset_by_fingerprint:
                dataset_id = state.dataset_by_fingerprint[fingerprint]
                self._dataset_used[dataset_id] = time.monotonic()
                return {"dataset_id": dataset_id}, ()
            dataset_id = wanted or str(state.new_id())  # carries the incarnation, as job ids
            while dataset_id in state.datasets:
                dataset_id += "_"
            self._apply(
                RegisterDataset(
                    DatasetRecord(
                        dataset_id, fingerprint, payload, spec, compression, cardinality, plan
                    )
                )
            )
            self._dataset_used[dataset_id] = time.monotonic()
        return {"dataset_id": dataset_id}, ()

    def _dataset(self, dataset_id: Any) -> DatasetRecord:
        if not isinstance(dataset_id, str):
            raise InvalidArgumentError(f"dataset_id must be a string, got {dataset_id!r}")
        record = self._state.datasets.get(dataset_id)
        if record is None:
            raise NotFoundError(
                f"dataset {dataset_id!r} is not registered with this dispatcher (a dataset that "
                "no job reads is forgotten job_gc_timeout_ms after its last use; register it "
                "again)"
            )
        self._dataset_used[dataset_id] = time.monotonic()
        return record

    def _get_dataset_def(self, header: dict[str, Any], buffers: list[memoryview]) -> Any:
        with self._lock:
            record = self._dataset(header.get("dataset_id"))
        reply = {"compression": record.compression, "split_plan": record.split_plan}
        return reply, (record.payload,)

    def _get_element_spec(self, header: dict[str, Any], buffers: list[memoryview]) -> Any:
        with self._lock:
            record = self._dataset(header.get("dataset_id"))
        return {"cardinality": record.cardinality}, (record.element_spec,)

    # -- jobs -------------------------------------------------------------------------------
    def _get_or_create_job(self, header: dict[str, Any], buffers: list[memoryview]) -> Any:
        mode = ShardingPolicy(field(header, "mode", int))
        job_name = field(header, "job_name", (str, type(None)))
        iteration = field(header, "iteration", int)
        num_consumers = field(header, "num_consumers", (int, type(None)))
        target_workers = field(header, "target_workers", str)
        if target_workers not in _TARGET_WORKERS:
            raise InvalidArgumentError(
                f"target_workers must be one of {_TARGET_WORKERS}, got {target_workers!r}"
            )
        resume = header.get("resume")
        position = None
        if resume is not None:
            check_checkpointable(int(mode), num_consumers)
            position = JobPosition.from_state(resume, int(mode))
        with self._lock:
            record = self._dataset(header.get("dataset_id"))
            if mode == ShardingPolicy.DYNAMIC and record.split_plan is None:
                raise FailedPreconditionError(
                    f"dataset {record.dataset_id} has no splittable source, so it cannot be "
                    "read with ShardingPolicy.DYNAMIC"
                )
            if num_consumers is not None and record.cardinality != _INFINITE:
                raise FailedPreconditionError(
                    "round-robin reads (num_consumers) need a dataset of infinite cardinality, "
                    f"so that the consumers stay in step; dataset {record.dataset_id} has "
                    f"cardinality {record.cardinality}. Add .repeat() at the end of the dataset"
                )
            job = self._find_job(job_name, iteration)
            if job is not None and position is not None:
                self._collect_for_resume(job)
                job = None
            if job is not None:
                self._check_same_job(job, record.dataset_id, mode, num_consumers, target_workers)
            else:
                job = self._create_job(
                    record, mode, job_name, iteration, num_consumers, target_workers, position
                )
            client_id = self._state.new_id()
            self._apply(AcquireClient(client_id, job.job_id))
            self._client_seen[client_id] = time.monotonic()
            self._job_idle_since.pop(job.job_id, None)
            reply = {
                "job_id": job.job_id,
                "client_id": client_id,
                "incarnation": self._incarnation,
                "client_timeout_ms": int(self._config.client_timeout_s * 1000),
                **self._job_view(job),
            }
            return reply, ()

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
        # What a consumer saves as its position (``_position``).
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
            "version": self._job_versions[job.job_id],
        }

    def _find_job(self, job_name: str | None, iteration: int) -> JobRecord | None:
        if job_name is None:
            return None
        job_id = self._state.job_by_key.get((job_name, iteration))
        return None if job_id is None else self._state.jobs[job_id]

    @staticmethod
    def _check_same_job(
        job: JobRecord,
        dataset_id: str,
        mode: ShardingPolicy,
        num_consumers: int | None,
        target_workers: str,
    ) -> None:
        theirs = (job.dataset_id, ShardingPolicy(job.mode), job.num_consumers, job.target_workers)
        mine = (dataset_id, mode, num_consumers, target_workers)
        if theirs != mine:
            raise InvalidArgumentError(
                f"job {job.job_name!r} was created with (dataset, processing_mode, "
                f"num_consumers, target_workers) = {theirs}, but this consumer asks for {mine}; "
                "consumers that share a job must read the same dataset the same way"
            )

    def _create_job(
        self,
        record: DatasetRecord,
        mode: ShardingPolicy,
        job_name: str | None,
        iteration: int,
        num_consumers: int | None,
        target_workers: str,
        position: JobPosition | None = None,
    ) -> JobRecord:
        """A new job and its tasks; with ``position``, tasks skip what it says was read."""
        state = self._state
        addresses = self._job_workers(mode, num_consumers)
        skips = [0] * len(addresses)
        if position is not None:
            skips = resume_skips(position, int(mode), addresses)
        job_id = state.new_id()
        self._apply(
            CreateJob(
                job_id,
                record.dataset_id,
                int(mode),
                job_name,
                iteration,
                num_consumers,
                target_workers,
            )
        )
        for index, address in enumerate(addresses):
            self._apply(
                CreateTask(state.new_id(), job_id, address, index, len(addresses), skips[index])
            )
        return state.jobs[job_id]

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

    def _job_workers(self, mode: ShardingPolicy, num_consumers: int | None) -> tuple[str, ...]:
        """The workers a new job's tasks go to; checked before the job is made, so that a job
        that cannot start leaves nothing behind (a retry of its name starts afresh)."""
        if mode.is_static:
            addresses = self._config.worker_addresses
            if addresses is None:
                raise FailedPreconditionError(
                    f"ShardingPolicy.{mode.name} shards by worker index, which needs the "
                    "dispatcher's fixed list of workers: start it with "
                    "DispatcherConfig(worker_addresses=[...])"
                )
            return addresses
        addresses = tuple(sorted(set(self._state.workers) - self._draining))
        if num_consumers is not None and not addresses:
            raise FailedPreconditionError(
                "round-robin reads (num_consumers) need the workers registered before the "
                "job starts; no worker is registered with this dispatcher yet"
            )
        return addresses

    def _client(self, header: dict[str, Any]) -> tuple[int, JobRecord]:
        client_id = field(header, "client_id", int)
        client = self._state.clients.get(client_id)
        if client is None:
            if incarnation_of(client_id) != self._incarnation:
                raise FailedPreconditionError(
                    f"consumer {client_id} joined its job in an earlier life of the dispatcher "
                    f"at {self.target.split('://')[-1]}, which has restarted since without a "
                    "journal: the job is gone, and the elements not yet received with it. "
                    "Iterate the dataset again to start a new job"
                )
            raise NotFoundError(f"no consumer {client_id} is known to the dispatcher")
        return client_id, self._state.jobs[client.job_id]

    def _client_heartbeat(self, header: dict[str, Any], buffers: list[memoryview]) -> Any:
        version = field(header, "version", int, -1)
        wait_s = min(field(header, "wait_ms", int, 0) / 1000, _MAX_WAIT_S)
        deadline = time.monotonic() + wait_s
        with self._lock:
            client_id, job = self._client(header)
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
                    return {"incarnation": self._incarnation, **self._job_view(job)}, ()
                self._waiting_consumers += 1
                try:
                    self._wait(client_id, remaining, ("job", job.job_id))
                finally:
                    self._waiting_consumers -= 1

    def _release_client(self, header: dict[str, Any], buffers: list[memoryview]) -> Any:
        with self._lock:
            client_id, job = self._client(header)
            self._release(client_id, job)
        return {}, ()

    def _release(self, client_id: int, job: JobRecord) -> None:
        if not self._state.clients[client_id].released:
            self._apply(ReleaseClient(client_id))
        self._client_seen.pop(client_id, None)
        if self._state.active_clients(job.job_id):
            return
        if job.job_name is None:
            # Nobody else can join an anonymous job: it ends, and is collected now.
            if not job.finished:
                self._apply(FinishJob(job.job_id))
            self._remove_job(job)
        else:  # another consumer may still join it, until job_gc_timeout_ms
            self._job_idle_since[job.job_id] = time.monotonic()

    def _remove_job(self, job: JobRecord) -> None:
        """Collects ``job`` (ended, without consumers): its records go, and its workers, whose
        next heartbeat lists tasks this dispatcher no longer knows, are told to delete them
        (under the lock)."""
        self._apply(RemoveJob(job.job_id))
        self._job_versions.pop(job.job_id, None)
        self._job_idle_since.pop(job.job_id, None)
        for client_id in job.client_ids:
            self._client_seen.pop(client_id, None)
        self._dataset_used[job.dataset_id] = time.monotonic()

    # -- workers ----------------------------------------------------------------------------
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
            # Consumers of a named job share its tasks' elements first come, first served.
            "shared": job.job_name is not None and job.num_consumers is None,
        }

    def _finish_job_if_done(self, job: JobRecord) -> None:
        """Ends ``job`` once every task ended and at least one ended because its input did. A
        job whose tasks were all lost with their workers is not over: under DYNAMIC sharding
        the next worker to register takes its remaining splits, and its consumers wait (for
        their bounded time) instead of taking the loss for the end of the data."""
        tasks = self._state.job_tasks(job.job_id)
        if (
            not job.finished
            and tasks
            and all(t.finished for t in tasks)
            and not all(t.lost for t in tasks)
        ):
            self._apply(FinishJob(job.job_id))

    def _get_split(self, header: dict[str, Any], buffers: list[memoryview]) -> Any:
        job_id = field(header, "job_id", int)
        repetition = field(header, "repetition", int)
        with self._lock:
            job = self._state.jobs.get(job_id)
            if job is None and incarnation_of(job_id) != self._incarnation:
                raise FailedPreconditionError(
                    f"job {job_id} belongs to an earlier life of this dispatcher, which "
                    "has restarted since without a journal: the job is gone"
                )
            if job is None or job.finished:  # None: it ended and was collected
                return {"split": None}, ()
            record = self._state.datasets[job.dataset_id]
            if record.split_plan is None:
                raise FailedPreconditionError(f"job {job_id} reads a dataset without splits")
            task_id = field(header, "task_id", (int, type(None)), None)
            request = field(header, "request", (int, type(None)), None)
            task = self._state.tasks.get(task_id) if task_id is not None else None
            if task is not None and task.job_id != job_id:
                raise InvalidArgumentError(f"task {task_id} is not a task of job {job_id}")
            last = None if task is None else task.last_split
            if (
                request is not None
                and last is not None
                and last["request"] == request
                and last["repetition"] == repetition
            ):
                # The worker asks again: the reply to its request was lost (the dispatcher
                # restarted, or the call timed out). The same split, recomputed from the cursor
                # it came from: nothing is skipped.
                split = SplitCursor.from_json(last["cursor"]).next()
            else:
                saved = self._state.split_cursors.get((job_id, repetition))
                if saved is None:
                    plan = SplitPlan.from_json(record.split_plan)
                    cursor = SplitCursor.start(plan, repetition, max(1, len(job.task_ids)))
                else:
                    cursor = SplitCursor.from_json(saved)
                previous = cursor.to_json()
                split = cursor.next()
                mine = task is not None and request is not None
                self._apply(
                    MoveSplitCursor(
                        job_id,
                        repetition,
                        cursor.to_json(),
                        task_id if mine else None,
                        request if mine else None,
                        previous if mine else None,
                    )
                )
            return {"split": None if split is None else [int(i) for i in split]}, ()

    # -- garbage collection -----------------------------------------------------------------
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
