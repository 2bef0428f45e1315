"""``DispatchServer``: the data service's control plane.

The dispatcher registers datasets and workers, creates a job for each iteration of a distributed
dataset (shared by name), assigns the job's tasks to workers, hands out the splits of DYNAMIC
jobs, and forgets consumers and workers that stop heartbeating. It never runs a dataset: it
keeps registered datasets as the bytes clients sent.

What it keeps does not grow with the jobs it has run: an anonymous job is collected as soon as
its consumer is done, a named job ``job_gc_timeout_ms`` after its last consumer left, and a
dataset that no job reads ``job_gc_timeout_ms`` after it was last registered, asked about or
read (``gc``).

The dispatcher is a ``DispatcherCore`` (``core``: the durable state ``state.DispatcherState``,
changed only through its ``apply``, the lock, the wake-ups of waiting heartbeats, the
incarnation and the volatile liveness of workers and consumers) and parts that each receive the
core, and the other parts they call, explicitly: ``datasets.Datasets``, ``jobs.Jobs``,
``workers.Workers``, ``split_handout.SplitHandout``, ``long_poll.LongPoll``, ``gc.Collector``
and ``durability.Durability``. With ``fault_tolerant_mode`` every update also goes to the journal
(``journal``), committed before any reply is sent and before a heartbeat waits; a dispatcher
started again on the same ``work_dir`` replays it and keeps the incarnation, so its workers and
consumers carry on (``durability``). ``DispatchServer`` builds the parts, serves their handlers
and owns the lifecycle.

RPCs (each a frame of ``feedline._net.wire``; their requests are the dataclasses of
``protocol``, their handlers RegisterDataset, GetDatasetDef and GetElementSpec in ``datasets``,
GetOrCreateJob and ReleaseClient in ``jobs``, ClientHeartbeat in ``long_poll``, WorkerHeartbeat
in ``workers``, GetSplit, PinSplitVersion(s) and SplitVersions in ``split_handout``):

==================  ============================================================================
RegisterDataset     a pickled dataset and its facts -> ``dataset_id`` (the same dataset twice
                    gets the same id); an upload (``feedline._net.rpc``), of at most
                    ``MAX_DATASET_BYTES``
GetDatasetDef       ``dataset_id`` -> the pickled dataset (for workers)
GetElementSpec      ``dataset_id`` -> the element spec as data (for ``from_dataset_id``)
GetOrCreateJob      a consumer joins the job of ``(job_name, iteration)`` or a new anonymous job;
                    the reply carries the job's view (below). With ``resume`` (a consumer's
                    position from a checkpoint, ``position``) it joins a new job whose tasks
                    skip what the consumer had received; a named job of no consumer that is
                    still kept is collected first. A join again with the same ``request_id``
                    is answered with the consumer it made (a retry whose reply was lost)
ClientHeartbeat     the job's view once it differs from the ``version`` the consumer has (or after
                    ``wait_ms``): its tasks ``[task_id, address, "running"|"done"|"lost"]``
                    and their streams ``[task_id, worker_index, num_workers, skip]``, whether
                    it finished, its error, its number of consumers (``consumers``) and of
                    consumers ever (``joined``); after ``wait_ms`` without news, ``unchanged``
                    instead of the view (but the view in an exactly-once job)
ReleaseClient       a consumer is done with its job
WorkerHeartbeat     a worker's liveness, its finished and failed tasks, whether it drains or
                    leaves -> tasks to start, tasks to delete (with their job's error), tasks of
                    an earlier dispatcher life to drop; waits for news. Also what each task
                    served (``task_stats``), for the status page (``status.page``)
GetSplit            the next split of a DYNAMIC job's repetition, or none; a task that asks
                    again with the same ``request`` number gets the same split (its reply was
                    lost), so that a dispatcher killed mid-reply skips nothing; in an
                    exactly-once job, a split run again comes with the object versions its
                    first run opened, and while the job's splits are out and not done the
                    call waits up to its ``wait_ms`` for one to come back or all to be done
PinSplitVersion     (exactly-once jobs) a task opened an object of a split as a version -> the
                    version the split is held to (the first pinned)
PinSplitVersions    the same for several objects of a split at once (those the dataset's
                    source listed, when a run opens the first of them) -> the versions held
SplitVersions       (exactly-once jobs) a consumer saving its position asks for the versions
                    that the splits it returned part of are held to (they travel with the
                    position to the job it resumes in)
GetLoad             the workers the running jobs need (``demand``), each worker with its load
                    and whether it may drain, each running job's load (``protocol.LoadReply``):
                    what ``feedline autoscale`` and ``feedline diagnose`` read
Snapshot            ``distributed_save``: a save of a registered dataset to a path starts, or
                    resumes (``snapshots``)
GetSnapshotStream   a worker asks for the stream of a save it writes, or a new one
SnapshotProgress    a worker committed a chunk of its stream, or completed it
==================  ============================================================================

Every reply to a heartbeat and to GetOrCreateJob carries the dispatcher's ``incarnation``, drawn
at random at each start; every job, task and consumer id carries it too (``state``), so that
workers and consumers recognise what belongs to an earlier life of a restarted dispatcher.

A heartbeat waits here for news of its own job or worker only, and a GetSplit of an
exactly-once job whose splits are out for a change of its job: an update wakes the calls it
concerns (``core``), never all of them, and at most 16 of each kind (consumer and worker
heartbeats, GetSplit) wait at once (past that a call is answered at once and its sender waits on
its side), so that long polls never take every thread of the server.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from feedline._net import exit as _exit
from feedline._net import rpc as _rpc
from feedline._net.security import check_exposure
from feedline.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from feedline.service.config import DispatcherConfig
from feedline.service.dispatcher.core import DispatcherCore
from feedline.service.dispatcher.core import Reply as _Reply
from feedline.service.dispatcher.datasets import Datasets
from feedline.service.dispatcher.demand import desired_workers, load_reply
from feedline.service.dispatcher.durability import Durability
from feedline.service.dispatcher.gc import Collector
from feedline.service.dispatcher.jobs import Jobs
from feedline.service.dispatcher.journal import JOURNAL_FILE, Journal
from feedline.service.dispatcher.long_poll import LongPoll
from feedline.service.dispatcher.snapshots import Snapshots
from feedline.service.dispatcher.split_handout import SplitHandout
from feedline.service.dispatcher.state import DispatcherState
from feedline.service.dispatcher.workers import Workers
from feedline.service.protocol import DISPATCHER_SERVICE, MAX_DATASET_BYTES
from feedline.service.status.metrics import DispatcherTelemetry
from feedline.service.status.page import DispatcherSnapshot, render_dispatcher
from feedline.service.status.server import StatusServer

__all__ = ["DispatchServer"]

logger = logging.getLogger(__name__)

# How long a stopping dispatcher lets the calls in flight finish (heartbeats waiting for news
# are answered at once); the stop takes that long only if a call does.
_STOP_GRACE_S = 2.0


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
        self._tls = self._config.tls
        # Refused before the journal opens: a server nobody could trust never starts.
        check_exposure(
            self._config.bind, self._token, self._tls, self._config.insecure, "the dispatcher"
        )
        self._core = DispatcherCore(self._config, address=lambda: self.target.split("://")[-1])
        self._server: Any = None
        self._port: int | None = None
        self._gc_thread: threading.Thread | None = None
        # The status page and metrics (``status_port``): counted only when served.
        self._started_at = time.monotonic()
        self._telemetry = DispatcherTelemetry(
            self._config.status_port is not None, self._status_snapshot
        )
        self._status_server: StatusServer | None = None
        # The parts, each given what it shares explicitly.
        core = self._core
        self._datasets = Datasets(core)
        self._long_poll = LongPoll(core)
        self._workers = Workers(core, self._telemetry)
        self._jobs = Jobs(core, self._datasets, self._workers, self._long_poll)
        self._split_handout = SplitHandout(core)
        self._snapshots = Snapshots(core)
        self._collector = Collector(core, self._jobs, self._workers, self._telemetry)
        self._durability = Durability(core, self.stop)
        if self._config.fault_tolerant_mode:
            self._durability.open()
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
        handlers: dict[str, _rpc.Handler] = {
            "RegisterDataset": self._datasets.register_dataset,
            "GetDatasetDef": self._datasets.get_dataset_def,
            "GetElementSpec": self._datasets.get_element_spec,
            "GetOrCreateJob": self._jobs.get_or_create_job,
            "ClientHeartbeat": self._long_poll.client_heartbeat,
            "ReleaseClient": self._jobs.release_client,
            "WorkerHeartbeat": self._workers.worker_heartbeat,
            "GetSplit": self._split_handout.get_split,
            "PinSplitVersion": self._split_handout.pin_split_version,
            "PinSplitVersions": self._split_handout.pin_split_versions,
            "SplitVersions": self._split_handout.split_versions,
            "GetLoad": self._get_load,
            "Snapshot": self._snapshots.snapshot,
            "GetSnapshotStream": self._snapshots.get_snapshot_stream,
            "SnapshotProgress": self._snapshots.snapshot_progress,
        }
        if self._durability.journal is not None:
            durable = self._durability.durable
            handlers = {name: durable(handler) for name, handler in handlers.items()}
        handlers = {name: self._refused_once_stopping(h) for name, h in handlers.items()}
        handlers = self._telemetry.instrument(handlers)
        self._server, self._port = _rpc.start_server(
            DISPATCHER_SERVICE,
            handlers,
            bind=self._config.bind,
            port=self._config.port,
            token=self._token,
            upload_limits={"RegisterDataset": MAX_DATASET_BYTES},
            max_workers=64,
            tls=self._tls,
            insecure=self._config.insecure,
        )
        if self._config.status_port is not None:
            self._start_status_server()
        self._gc_thread = threading.Thread(
            target=self._collector.loop, name="feedline-dispatcher-gc", daemon=True
        )
        self._gc_thread.start()
        _exit.register(self, "stop", _exit.DISPATCHER)
        logger.info("dispatcher serving at %s", self.target)

    def join(self) -> None:
        """Blocks until the server stops."""
        if self._server is not None:
            self._server.wait_for_termination()

    @property
    def error(self) -> BaseException | None:
        """Why the dispatcher stopped on its own (its journal could not be written), or None."""
        return self._durability.error

    @property
    def stopped(self) -> bool:
        """Whether the dispatcher has stopped (``stop()``, or on its own: see ``error``)."""
        return self._core.stopped.is_set()

    @property
    def incarnation(self) -> int:
        """This dispatcher life's random id: every job, task and consumer id carries it."""
        return self._core.incarnation

    def stop(self) -> None:
        """Stops serving; idempotent.

        A graceful stop loses no call: from now on every call is refused with an
        ``UnavailableError`` (which its caller tries again, as for an unreachable dispatcher),
        heartbeats waiting for news are answered at once, and the calls in flight are given
        ``_STOP_GRACE_S`` to finish before the port closes and the journal after it.
        """
        self._core.stop()
        if self._status_server is not None:
            self._status_server.stop()
        if self._server is not None:
            self._server.stop(grace=0.0 if _exit.exiting() else _STOP_GRACE_S)
        self._durability.close()

    def _refused_once_stopping(self, handler: _rpc.Handler) -> _rpc.Handler:
        """``handler``, refusing calls with ``UnavailableError`` once the dispatcher stops: it
        changes nothing after that, and its callers try again."""
        stopped = self._core.stopped

        def handle(header: dict[str, Any], buffers: list[memoryview]) -> Any:
            if stopped.is_set():
                raise UnavailableError(
                    f"the dispatcher at {self._core.address()} is stopping; try again once it "
                    "is back (with fault_tolerant_mode it resumes its jobs on the same work_dir)"
                )
            return handler(header, buffers)

        return handle

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
                token=self._server.token,
                setting="DispatcherConfig.status_port (feedline dispatcher --status-port)",
                tls=self._tls,
            )
        except Exception:
            self.stop()
            raise

    def _get_load(self, header: dict[str, Any], buffers: list[memoryview]) -> _Reply:
        """GetLoad: the workers the running jobs need, the workers and the jobs' load
        (``feedline autoscale``, ``feedline diagnose``)."""
        core = self._core
        with core.lock:
            reply = load_reply(core.state, core.load, self._workers.draining)
        return reply.to_header(), ()

    def _status_snapshot(self) -> DispatcherSnapshot:
        """What the status page and the metrics' gauges show, copied under the lock."""
        core = self._core
        with core.lock:
            state = core.state
            core.load.keep_only(state.tasks, state.clients)
            loads = core.load.jobs(state, self._workers.available())
            return DispatcherSnapshot.capture(
                target=self.target,
                state=core.state,
                started=self._started_at,
                worker_seen=core.worker_seen,
                client_seen=core.client_seen,
                waiting=core.waiting,
                draining=self._workers.draining,
                telemetry=self._telemetry,
                loads=loads,
                desired_workers=desired_workers(loads),
                saves=self._snapshots.progress(),
            )

    def __enter__(self) -> DispatchServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- for tests and benchmarks ---------------------------------------------------------
    @property
    def _state(self) -> DispatcherState:
        """The durable state (read it under ``_lock``)."""
        return self._core.state

    @property
    def _lock(self) -> threading.Condition:
        """The lock every part works under."""
        return self._core.lock

    @property
    def _journal(self) -> Journal | None:
        """The journal of ``fault_tolerant_mode``, None without one."""
        return self._durability.journal
