"""``DispatchServer``: the data service's control plane.

The dispatcher registers datasets and workers, creates a job for each iteration of a distributed
dataset (shared by name), assigns the job's tasks to workers, hands out the splits of DYNAMIC
jobs, and forgets consumers and workers that stop heartbeating. It never runs a dataset: it
keeps registered datasets as the bytes clients sent.

What it keeps does not grow with the jobs it has run: an anonymous job is collected as soon as
its consumer is done, a named job ``job_gc_timeout_ms`` after its last consumer left, and a
dataset that no job reads ``job_gc_timeout_ms`` after it was last registered, asked about or
read (``gc``).

Its durable state is ``_state.DispatcherState``, changed only through ``_apply``; everything
else here (heartbeat times, waiting heartbeats) is volatile. With ``fault_tolerant_mode`` every
update also goes to the journal (``journal``), committed before any reply is sent and before a
heartbeat waits; a dispatcher started again on the same ``work_dir`` replays it and keeps the
incarnation, so its workers and consumers carry on (``durability``).

``DispatchServer`` keeps its lifecycle, its state's one entry point (``_apply``), the dataset
handlers and the RPC handler table; the rest are its bases, one module each: ``jobs``,
``long_poll``, ``workers``, ``split_handout``, ``gc`` and ``durability``.

RPCs (each a frame of ``feedline._net.wire``; see the handlers for their fields: datasets here,
GetOrCreateJob and ReleaseClient in ``jobs``, ClientHeartbeat in ``long_poll``,
WorkerHeartbeat in ``workers``, GetSplit in ``split_handout``):

==================  ============================================================================
RegisterDataset     a pickled dataset and its facts -> ``dataset_id`` (the same dataset twice
                    gets the same id); an upload (``feedline._net.rpc``), of at most
                    ``MAX_DATASET_BYTES``
GetDatasetDef       ``dataset_id`` -> the pickled dataset (for workers)
GetElementSpec      ``dataset_id`` -> the pickled element spec (for ``from_dataset_id``)
GetOrCreateJob      a consumer joins the job of ``(job_name, iteration)`` or a new anonymous job;
                    the reply carries the job's view (below). With ``resume`` (a consumer's
                    position from a checkpoint, ``position``) it joins a new job whose tasks
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
                    served (``task_stats``), for the status page (``status.page``)
GetSplit            the next split of a DYNAMIC job's repetition, or none; a task that asks
                    again with the same ``request`` number gets the same split (its reply was
                    lost), so that a dispatcher killed mid-reply skips nothing
==================  ============================================================================

Every reply to a heartbeat and to GetOrCreateJob carries the dispatcher's ``incarnation``, drawn
at random at each start; every job, task and consumer id carries it too (``state``), so that
workers and consumers recognise what belongs to an earlier life of a restarted dispatcher.

A heartbeat waits here for news of its own job or worker only: an update wakes the heartbeats it
concerns (``long_poll``), never all of them, and at most ``_MAX_WAITING_CONSUMERS`` consumer
heartbeats wait at once (past that a heartbeat is answered at once and the consumer waits on its
side), so that long polls never take every thread of the server.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from feedline._net import exit as _exit
from feedline._net import rpc as _rpc
from feedline._net.rpc import field
from feedline.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from feedline.service.config import DispatcherConfig
from feedline.service.dispatcher.durability import Durability
from feedline.service.dispatcher.gc import Collector
from feedline.service.dispatcher.jobs import JobHandlers
from feedline.service.dispatcher.journal import JOURNAL_FILE, Journal, open_journal
from feedline.service.dispatcher.long_poll import LongPoll
from feedline.service.dispatcher.split_handout import SplitHandout
from feedline.service.dispatcher.state import (
    DatasetRecord,
    DispatcherState,
    RegisterDataset,
    Update,
)
from feedline.service.dispatcher.workers import WorkerHandlers
from feedline.service.protocol import DISPATCHER_SERVICE, MAX_DATASET_BYTES, new_incarnation
from feedline.service.splits import SplitPlan
from feedline.service.status.metrics import DispatcherTelemetry
from feedline.service.status.page import DispatcherSnapshot, render_dispatcher
from feedline.service.status.server import StatusServer

__all__ = ["DispatchServer"]

logger = logging.getLogger(__name__)



class DispatchServer(Durability, LongPoll, JobHandlers, WorkerHandlers, SplitHandout, Collector):
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
        # The journal of fault_tolerant_mode (``journal``): every update, durable before the
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
            DISPATCHER_SERVICE,
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
