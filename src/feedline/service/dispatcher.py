"""``DispatchServer``: the data service's control plane.

The dispatcher registers datasets and workers, creates a job for each iteration of a distributed
dataset (shared by name), assigns the job's tasks to workers, hands out the splits of DYNAMIC
jobs, and forgets consumers and workers that stop heartbeating. It never runs a dataset: it
keeps registered datasets as the bytes clients sent.

Its durable state is ``_state.DispatcherState``, changed only through ``_apply``; everything
else here (heartbeat times, waiting heartbeats) is volatile.

RPCs (each a frame of ``_wire``; see the handlers for their fields):

==================  ============================================================================
RegisterDataset     a pickled dataset and its facts -> ``dataset_id`` (the same dataset twice
                    gets the same id)
GetDatasetDef       ``dataset_id`` -> the pickled dataset (for workers)
GetElementSpec      ``dataset_id`` -> the pickled element spec (for ``from_dataset_id``)
GetOrCreateJob      a consumer joins the job of ``(job_name, iteration)`` or a new anonymous job
ClientHeartbeat     the job's tasks as the consumer should read them; waits for news
ReleaseClient       a consumer is done with its job
WorkerHeartbeat     a worker's liveness -> tasks to start and to delete; waits for news
GetSplit            the next split of a DYNAMIC job's repetition, or none
==================  ============================================================================
"""

from __future__ import annotations

import collections
import hashlib
import logging
import threading
import time
from typing import Any

from feedline.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from feedline.service import _rpc
from feedline.service._rpc import field
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
    RemoveWorker,
    TaskRecord,
    Update,
)
from feedline.service.config import DispatcherConfig, ShardingPolicy

__all__ = ["DispatchServer"]

logger = logging.getLogger(__name__)

SERVICE_NAME = "feedline.service.Dispatcher"
_TARGET_WORKERS = ("AUTO", "ANY", "LOCAL")
# The longest a heartbeat waits at the dispatcher for news.
_MAX_WAIT_S = 2.0
_INFINITE = -1


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
        if self._config.fault_tolerant_mode:
            raise InvalidArgumentError(
                "DispatcherConfig.fault_tolerant_mode is not available yet: the dispatcher keeps "
                "its state in memory, so a restarted dispatcher starts empty"
            )
        self._token = _rpc.resolve_token(self._config.token)
        self._state = DispatcherState()
        self._lock = threading.Condition()
        self._worker_seen: dict[str, float] = {}
        self._client_seen: dict[int, float] = {}
        self._job_idle_since: dict[int, float] = {}
        # Workers and consumers whose heartbeat is waiting here right now: alive by definition.
        self._waiting: collections.Counter[str | int] = collections.Counter()
        self._server: Any = None
        self._port: int | None = None
        self._stopped = threading.Event()
        self._gc_thread: threading.Thread | None = None
        if start:
            self.start()

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
        self._server, self._port = _rpc.start_server(
            SERVICE_NAME,
            handlers,
            bind=self._config.bind,
            port=self._config.port,
            token=self._token,
            max_workers=64,
        )
        self._gc_thread = threading.Thread(
            target=self._gc_loop, name="feedline-dispatcher-gc", daemon=True
        )
        self._gc_thread.start()
        logger.info("dispatcher serving at %s", self.target)

    def join(self) -> None:
        """Blocks until the server stops."""
        if self._server is not None:
            self._server.wait_for_termination()

    def stop(self) -> None:
        """Stops serving; idempotent."""
        self._stopped.set()
        if self._server is not None:
            self._server.stop(grace=0.5)
        with self._lock:
            self._lock.notify_all()

    def __enter__(self) -> DispatchServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- state ------------------------------------------------------------------------------
    def _apply(self, update: Update) -> None:
        """Applies ``update`` (call under the lock); the one place state changes."""
        self._state.apply(update)
        self._lock.notify_all()

    def _wait(self, who: str | int, seconds: float) -> None:
        """Waits (under the lock) for a state change, ``who`` counting as alive meanwhile."""
        self._waiting[who] += 1
        try:
            self._lock.wait(seconds)
        finally:
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
                return {"dataset_id": wanted}, ()
            if wanted is None and fingerprint in state.dataset_by_fingerprint:
                return {"dataset_id": state.dataset_by_fingerprint[fingerprint]}, ()
            dataset_id = wanted or str(1000 + len(state.datasets))
            while dataset_id in state.datasets:
                dataset_id += "_"
            self._apply(
                RegisterDataset(
                    DatasetRecord(
                        dataset_id, fingerprint, payload, spec, compression, cardinality, plan
                    )
                )
            )
        return {"dataset_id": dataset_id}, ()

    def _dataset(self, dataset_id: Any) -> DatasetRecord:
        if not isinstance(dataset_id, str):
            raise InvalidArgumentError(f"dataset_id must be a string, got {dataset_id!r}")
        record = self._state.datasets.get(dataset_id)
        if record is None:
            raise NotFoundError(f"dataset {dataset_id!r} is not registered with this dispatcher")
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
            if job is not None:
                self._check_same_job(job, record.dataset_id, mode, num_consumers, target_workers)
            else:
                job = self._create_job(
                    record, mode, job_name, iteration, num_consumers, target_workers
                )
            client_id = self._state.new_id()
            self._apply(AcquireClient(client_id, job.job_id))
            self._client_seen[client_id] = time.monotonic()
            self._job_idle_since.pop(job.job_id, None)
            return {"job_id": job.job_id, "client_id": client_id, "finished": job.finished}, ()

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
    ) -> JobRecord:
        state = self._state
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
        if mode.is_static:
            addresses = self._config.worker_addresses
            if addresses is None:
                raise FailedPreconditionError(
                    f"ShardingPolicy.{mode.name} shards by worker index, which needs the "
                    "dispatcher's fixed list of workers: start it with "
                    "DispatcherConfig(worker_addresses=[...])"
                )
        else:
            addresses = tuple(sorted(state.workers))
            if num_consumers is not None and not addresses:
                raise FailedPreconditionError(
                    "round-robin reads (num_consumers) need the workers registered before the "
                    "job starts; no worker is registered with this dispatcher yet"
                )
        for index, address in enumerate(addresses):
            self._apply(CreateTask(state.new_id(), job_id, address, index, len(addresses)))
        return state.jobs[job_id]

    def _client(self, header: dict[str, Any]) -> tuple[int, JobRecord]:
        client_id = field(header, "client_id", int)
        client = self._state.clients.get(client_id)
        if client is None:
            raise NotFoundError(f"no consumer {client_id} is known to the dispatcher")
        return client_id, self._state.jobs[client.job_id]

    def _client_heartbeat(self, header: dict[str, Any], buffers: list[memoryview]) -> Any:
        known = field(header, "known_tasks", list, [])
        wait_s = min(field(header, "wait_ms", int, 0) / 1000, _MAX_WAIT_S)
        deadline = time.monotonic() + wait_s
        with self._lock:
            client_id, job = self._client(header)
            while True:
                self._client_seen[client_id] = time.monotonic()
                if self._state.clients[client_id].released:
                    raise NotFoundError(
                        f"consumer {client_id} was released (it missed heartbeats for "
                        f"{self._config.client_timeout_s} s)"
                    )
                tasks = [
                    [task.task_id, task.worker_address, task.finished]
                    for task in self._state.job_tasks(job.job_id)
                ]
                changed = {t for t, _, done in tasks if not done} != set(known)
                remaining = deadline - time.monotonic()
                if changed or job.finished or remaining <= 0 or self._stopped.is_set():
                    return {"tasks": tasks, "finished": job.finished}, ()
                self._wait(client_id, remaining)

    def _release_client(self, header: dict[str, Any], buffers: list[memoryview]) -> Any:
        with self._lock:
            client_id, job = self._client(header)
            self._release(client_id, job)
        return {}, ()

    def _release(self, client_id: int, job: JobRecord) -> None:
        if not self._state.clients[client_id].released:
            self._apply(ReleaseClient(client_id))
        self._client_seen.pop(client_id, None)
        if job.finished or self._state.active_clients(job.job_id):
            return
        if job.job_name is None:
            self._apply(FinishJob(job.job_id))  # nobody else can join an anonymous job
        else:
            self._job_idle_since[job.job_id] = time.monotonic()

    # -- workers ----------------------------------------------------------------------------
    def _worker_heartbeat(self, header: dict[str, Any], buffers: list[memoryview]) -> Any:
        address = field(header, "address", str)
        tags = field(header, "tags", list, [])
        current = set(field(header, "current_tasks", list, []))
        finished = field(header, "finished_tasks", list, [])
        wait_s = min(field(header, "wait_ms", int, 0) / 1000, _MAX_WAIT_S)
        deadline = time.monotonic() + wait_s
        with self._lock:
            state = self._state
            allowed = self._config.worker_addresses
            if allowed is not None and address not in allowed:
                raise FailedPreconditionError(
                    f"worker {address} is not in the dispatcher's worker_addresses {list(allowed)};"
                    " a dispatcher with a fixed worker list accepts only those workers (set "
                    "WorkerConfig.worker_address to one of them)"
                )
            if address not in state.workers:
                self._apply(RegisterWorker(address, tuple(tags)))
                self._assign_running_jobs(address)
                logger.info("worker %s registered", address)
            for task_id in finished:
                task = state.tasks.get(task_id)
                if task is not None and task.worker_address == address and not task.finished:
                    self._apply(FinishTask(task_id))
                    self._finish_job_if_done(state.jobs[task.job_id])
            while True:
                self._worker_seen[address] = time.monotonic()
                tasks = state.worker_tasks(address)
                new = [
                    self._task_def(t) for t in tasks if not t.finished and t.task_id not in current
                ]
                delete = [
                    t.task_id
                    for t in tasks
                    if t.task_id in current and state.jobs[t.job_id].finished
                ]
                remaining = deadline - time.monotonic()
                if new or delete or remaining <= 0 or self._stopped.is_set():
                    return {"new_tasks": new, "delete_tasks": delete}, ()
                self._wait(address, remaining)

    def _assign_running_jobs(self, address: str) -> None:
        """Gives a newly registered worker a task of every running OFF or DYNAMIC job (jobs of
        static sharding and round-robin jobs keep the workers they were made with)."""
        state = self._state
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
            "mode": job.mode,
            "worker_index": task.worker_index,
            "num_workers": task.num_workers,
            "num_consumers": job.num_consumers,
        }

    def _finish_job_if_done(self, job: JobRecord) -> None:
        tasks = self._state.job_tasks(job.job_id)
        if not job.finished and tasks and all(t.finished for t in tasks):
            self._apply(FinishJob(job.job_id))

    def _get_split(self, header: dict[str, Any], buffers: list[memoryview]) -> Any:
        job_id = field(header, "job_id", int)
        repetition = field(header, "repetition", int)
        with self._lock:
            job = self._state.jobs.get(job_id)
            if job is None:
                raise NotFoundError(f"no job {job_id}")
            if job.finished:
                return {"split": None}, ()
            record = self._state.datasets[job.dataset_id]
            if record.split_plan is None:
                raise FailedPreconditionError(f"job {job_id} reads a dataset without splits")
            key = (job_id, repetition)
            saved = self._state.split_cursors.get(key)
            if saved is None:
                cursor = SplitCursor.start(
                    SplitPlan.from_json(record.split_plan), repetition, max(1, len(job.task_ids))
                )
            else:
                cursor = SplitCursor.from_json(saved)
            split = cursor.next()
            self._apply(MoveSplitCursor(job_id, repetition, cursor.to_json()))
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
                    del self._worker_seen[address]
                    jobs = {task.job_id for task in state.worker_tasks(address)}
                    self._apply(RemoveWorker(address))
                    for job_id in sorted(jobs):
                        self._finish_job_if_done(state.jobs[job_id])
            for client_id, seen in list(self._client_seen.items()):
                if now - seen > config.client_timeout_s and client_id not in self._waiting:
                    logger.warning("consumer %d missed heartbeats; releasing it", client_id)
                    self._release(client_id, state.jobs[state.clients[client_id].job_id])
            for job_id, since in list(self._job_idle_since.items()):
                job = state.jobs[job_id]
                if job.finished or state.active_clients(job_id):
                    del self._job_idle_since[job_id]
                elif now - since > config.gc_timeout_s:
                    del self._job_idle_since[job_id]
                    self._apply(FinishJob(job_id))
