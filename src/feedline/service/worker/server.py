"""``WorkerServer``: runs the tasks the dispatcher assigns and serves their elements.

A worker registers with the dispatcher and keeps a heartbeat open (``WorkerHeartbeat`` waits at
the dispatcher for news, so a new job's task starts at once). For each task it fetches the job's
dataset (cloudpickled, so any Python in the pipeline runs here), shapes it by the job's sharding
policy, and runs it on a producer thread into a buffer bounded in bytes and elements (a task:
``task``, on its ``buffer``; the replies it gives consumers: ``replies``; what a task needs of
its worker: ``host.TaskHost``, which ``WorkerServer`` is):

============  ==================================================================================
OFF           the whole dataset
DYNAMIC       the source replaced by the splits the dispatcher hands this task (``split_source``)
FILE          ``auto_shard(FILE)``: this worker's share of the files
DATA          ``shard(num_workers, worker_index)``
FILE_OR_DATA  FILE where the dataset reads files, else DATA
HINT          ``auto_shard(HINT)``: ``shard(SHARD_HINT, SHARD_HINT)`` filled in
============  ==================================================================================

A task of a job resumed from a consumer's checkpoint skips the ``skip`` elements of its stream
that the consumer had received (``position``) before it serves any.

Consumers call ``GetElements``. First come, first served: a reply carries as many buffered
elements as fit in the consumer's request (several small ones, or one large one as raw NumPy
buffers), but while another consumer of the task waits, the buffer is split between them and a
consumer holding ``_AHEAD`` unread elements takes no more (``replies``). Round robin
(``num_consumers``): the task cuts its output into rounds of ``num_consumers`` elements and
consumer ``i`` gets element ``i`` of each round it asks for; nobody waits for a consumer that
stopped asking, and rounds far behind the newest are dropped. At most ``_MAX_WAITING_READS``
requests wait here at once (each holds a server thread); the others are answered at once, with
nothing ready and ``retry_after_ms``, which their consumer waits out on its side.

Faults. Whatever fails while a task is built or run (shaping, unpickling, any element) fails the
task: the worker reports it to the dispatcher at once (a heartbeat), which ends the job with
that error; the error travels to consumers *inside* replies (``feedline._net.remote_errors``),
so that a failed call only ever means an unreachable worker. A worker remembers why each recent
task ended (its input ended, or the error its consumers get). It drops the tasks of an earlier
life of a restarted dispatcher (every id carries the dispatcher's incarnation), keys its
unpickled datasets by content, stops on its own after ``dispatcher_timeout_ms`` without a
dispatcher (unless ``wait_forever``), and drains when stopped with ``drain_seconds``: no new
task or split, the DYNAMIC split it holds finished, what it holds handed out, then it tells the
dispatcher it leaves.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import secrets
import threading
import time
from typing import Any

import cloudpickle

from feedline._net import exit as _exit
from feedline._net import rpc as _rpc
from feedline._net.retry import call_within
from feedline._net.wire import encode_frame
from feedline.data.dataset import Dataset
from feedline.errors import (
    FailedPreconditionError,
    FeedlineError,
    InvalidArgumentError,
    UnavailableError,
)
from feedline.service.config import WorkerConfig
from feedline.service.protocol import (
    DISPATCHER_SERVICE,
    WORKER_SERVICE,
    DatasetDefReply,
    ElementsReply,
    GetDatasetDefRequest,
    GetElementsRequest,
    TaskDef,
    WorkerHeartbeatReply,
    WorkerHeartbeatRequest,
    incarnation_of,
    register_local_worker,
    unregister_local_worker,
)
from feedline.service.shm import WorkerSegments
from feedline.service.status.metrics import WorkerTelemetry
from feedline.service.status.page import WorkerSnapshot, render_worker
from feedline.service.status.server import StatusServer
from feedline.service.worker.buffer import TaskBuffer
from feedline.service.worker.memory import BufferMemory
from feedline.service.worker.replies import NOTHING_YET, wait_seconds
from feedline.service.worker.snapshot_writer import SnapshotWriterLoop
from feedline.service.worker.task import Task

__all__ = ["WorkerServer"]

logger = logging.getLogger(__name__)

# A GetElements request is a small header; nothing larger is read.
_MAX_REQUEST_BYTES = 64 << 10
# The longest that one attempt to register waits for the dispatcher (gRPC's wait for ready):
# after the first, a warning says that the worker waits. Long enough that a dispatcher that is
# up on a loaded machine answers within it.
_REGISTER_ATTEMPT_S = 5.0
# How many ended tasks a worker remembers (what their consumers hear), and unpickled datasets.
_ENDED_KEPT = 4096
_DATASETS_KEPT = 16
# An unpickled dataset no task here has run for this long is dropped (fetched again if needed).
_DATASET_KEEP_S = 10.0
#: What the consumers of a task that the dispatcher dropped with this worker hear: it is gone.
_DROPPED: dict[str, Any] = {
    "type": "dropped",
    "message": "lost with this worker, which the dispatcher dropped (it missed its heartbeats)",
}
# The most GetElements requests that wait here at once for elements or for their task (each
# holds one of the server's threads): past that a request is answered at once, and with nothing
# ready its consumer waits on its side, so that waiting consumers never take every thread.
_MAX_WAITING_READS = 16


class WorkerServer:
    """A data service worker; to its tasks, their ``host.TaskHost``.

    Example:
      >>> from feedline import service
      >>> dispatcher = service.DispatchServer()
      >>> worker = service.WorkerServer(
      ...     service.WorkerConfig(dispatcher_address=dispatcher.target.split("://")[1]))
      >>> worker.stop(); dispatcher.stop()

    Args:
      config: a ``WorkerConfig``.
      start: start now: serve, and register with the dispatcher (waiting up to
        ``dispatcher_timeout_ms`` for it).
    """

    def __init__(self, config: WorkerConfig, start: bool = True) -> None:
        if not isinstance(config, WorkerConfig):
            raise InvalidArgumentError(
                f"config must be a WorkerConfig, got {type(config).__name__}"
            )
        self._config = config
        # This worker's id in its heartbeats: a new one at the same address is a restart.
        self._instance = secrets.randbits(62) + 1
        self._token = _rpc.resolve_token(config.token)
        self._tls = config.tls
        self._dispatcher = _rpc.RpcClient(
            _rpc.parse_service(config.dispatcher_address),
            DISPATCHER_SERVICE,
            self._token,
            self._tls,
        )
        self._tasks: dict[int, Task] = {}
        # Tasks that ended here, newest last, with what their consumers hear from now on:
        # None (the end of the task's input) or an error report.
        self._ended: collections.OrderedDict[int, dict[str, Any] | None] = collections.OrderedDict()
        # Unpickled datasets by fingerprint (their content): an id is not enough, since a
        # dispatcher restarted without its journal may give another dataset the same chosen id.
        self._datasets: collections.OrderedDict[str, tuple[Dataset, str | None]] = (
            collections.OrderedDict()
        )
        # Since when no task here runs each cached dataset.
        self._dataset_unused_since: dict[str, float] = {}
        self._incarnation: int | None = None
        # The incarnations of the dispatcher's earlier lives that this worker served: a task of
        # one of them is gone. A task of an incarnation not seen yet belongs to a newer life
        # whose heartbeat reply is still on its way here, and is waited for.
        self._past_incarnations: set[int] = set()
        self._lock = threading.Lock()
        self._task_started = threading.Condition(self._lock)
        # GetElements requests allowed to wait now (at most _MAX_WAITING_READS).
        self._waiting_reads = 0
        self._reply_lock = threading.Lock()
        self._stopped = threading.Event()
        self._draining = threading.Event()
        self._drain_cancelled = threading.Event()
        self._left = threading.Event()  # the dispatcher was told this worker leaves
        self._error: BaseException | None = None
        self._server: Any = None
        self._address: str | None = None
        self._heartbeat_thread: threading.Thread | None = None
        # Writes the streams of distributed_save that the dispatcher hands this worker.
        self._snapshot_thread: threading.Thread | None = None
        # The status page and metrics (``status_port``): counted only when served.
        self._started_at = time.monotonic()
        self._telemetry = WorkerTelemetry(config.status_port is not None, self._status_snapshot)
        self._status_server: StatusServer | None = None
        # Arenas of same-host consumers (replies through shared memory: _shm).
        self._shm = WorkerSegments(config.data_transfer_protocol != "grpc")
        # The one bound that every task's buffer shares.
        self._buffer_memory = BufferMemory(config.buffer_memory_bytes)
        if start:
            self.start()

    @property
    def worker_address(self) -> str:
        """The address consumers reach this worker at."""
        if self._address is None:
            raise FailedPreconditionError("the worker is not started; call start() first")
        return self._address

    @property
    def shm(self) -> WorkerSegments:
        """The arenas of same-host consumers (replies through shared memory: ``shm``)."""
        return self._shm

    @property
    def telemetry(self) -> WorkerTelemetry:
        """The worker's counters and metrics."""
        return self._telemetry

    @property
    def error(self) -> BaseException | None:
        """The error that stopped this worker on its own (its dispatcher stayed unreachable
        for longer than ``dispatcher_timeout_ms``), or None."""
        return self._error

    @property
    def stopped(self) -> bool:
        """Whether the worker has stopped (``stop()``, or on its own: see ``error``)."""
        return self._stopped.is_set()

    def start(self) -> None:
        """Starts serving and registers with the dispatcher; idempotent.

        Raises:
          UnavailableError: the dispatcher could not be reached within dispatcher_timeout_ms.
          FailedPreconditionError: the dispatcher refuses this worker (not in its fixed list).
        """
        if self._server is not None:
            return
        config = self._config
        self._server, port = _rpc.start_server(
            WORKER_SERVICE,
            {"GetElements": self._telemetry.instrument(self._get_elements)},
            bind=config.bind,
            port=config.port,
            token=self._token,
            max_request_bytes=_MAX_REQUEST_BYTES,
            tls=self._tls,
            insecure=config.insecure,
        )
        host = "localhost" if config.bind in ("0.0.0.0", "::", "[::]") else config.bind
        self._address = (config.worker_address or f"{host}:%port%").replace("%port%", str(port))
        register_local_worker(self._address)
        _exit.register(self, "stop", _exit.WORKER)
        try:
            if config.status_port is not None:
                self._start_status_server(config.status_port)
            self._register()
        except Exception:
            self.stop()
            raise
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, name=f"feedline-worker-{port}-heartbeat", daemon=True
        )
        self._heartbeat_thread.start()
        _exit.join_at_exit(self._heartbeat_thread)
        self._snapshot_thread = threading.Thread(
            target=SnapshotWriterLoop(self, self._stopped).run,
            name=f"feedline-worker-{port}-snapshot",
            daemon=True,
        )
        self._snapshot_thread.start()
        logger.info("worker %s registered with %s", self._address, self._dispatcher.address)

    def _register(self) -> None:
        """The first heartbeat, tried again while the dispatcher cannot be reached (it may
        start after this worker, or restart meanwhile) for ``dispatcher_timeout_ms``, or for
        as long as it takes with ``wait_forever``; a warning says so after the first attempt.

        Raises:
          UnavailableError: the dispatcher stayed unreachable; the message says for how long
            and what to change.
        """
        config = self._config
        started = time.monotonic()
        warned = False

        def attempt(timeout: float) -> None:
            nonlocal warned
            try:
                self._heartbeat(wait_s=0.0, timeout=timeout, wait_for_ready=True)
            except UnavailableError as error:
                if not warned and not self._stopped.is_set():
                    warned = True
                    logger.warning(
                        "worker %s: registering with the dispatcher at %s: %s; trying again %s",
                        self._address,
                        self._dispatcher.address,
                        error,
                        "until it answers"
                        if config.wait_forever
                        else f"for up to {config.dispatcher_timeout_s:g} s",
                    )
                raise

        try:
            call_within(
                math.inf if config.wait_forever else config.dispatcher_timeout_s,
                attempt,
                attempt_s=_REGISTER_ATTEMPT_S,
                stopped=self._stopped,
            )
        except UnavailableError as error:
            raise UnavailableError(
                f"worker {self._address}: the dispatcher at {self._dispatcher.address} could "
                f"not be reached for {time.monotonic() - started:.1f} s while registering "
                f"(WorkerConfig.dispatcher_timeout_ms = {config.dispatcher_timeout_s * 1000:.0f}, "
                "--dispatcher-timeout; WorkerConfig(wait_forever=True), --wait-forever, keeps "
                f"trying): {error}"
            ) from None

    def join(self) -> None:
        """Blocks until the server stops."""
        if self._server is not None:
            self._server.wait_for_termination()

    def stop(self, drain_seconds: float = 0.0) -> None:
        """Stops serving and every task; idempotent.

        Args:
          drain_seconds: first drain, for at most this long: take no new task or split,
            finish the splits of DYNAMIC jobs already begun, hand out what is buffered, then
            tell the dispatcher this worker leaves. What is still here after that is lost, as
            when a worker dies. ``cancel_drain()`` cuts a drain short.
        """
        if drain_seconds > 0 and self._server is not None and not self._stopped.is_set():
            self._drain(drain_seconds)
        self._stopped.set()
        with self._lock:
            self._task_started.notify_all()
        unregister_local_worker(self._address or "")
        if self._server is not None:
            self._server.stop(grace=0.0 if _exit.exiting() else 0.2)
        if self._status_server is not None:
            self._status_server.stop()
        with self._lock:
            tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.stop()
        self._shm.close()
        self._dispatcher.close()

    def cancel_drain(self) -> None:
        """Ends a drain in progress (``stop(drain_seconds=...)``) now; safe from any thread."""
        self._drain_cancelled.set()

    @property
    def status_url(self) -> str | None:
        """``"http://host:port/"``: the status page (``status_port``), None without one; its
        Prometheus metrics are at ``status_url + "metrics"``."""
        return None if self._status_server is None else self._status_server.url

    def _start_status_server(self, port: int) -> None:
        self._status_server = StatusServer(
            owner="worker",
            bind=self._config.bind,
            port=port,
            page=lambda: render_worker(self._status_snapshot()),
            metrics=self._telemetry.exposition,
            token=self._server.token,
            setting="WorkerConfig.status_port (feedline worker --status-port)",
            tls=self._tls,
        )

    def _status_snapshot(self) -> WorkerSnapshot:
        """What the status page and the metrics' gauges show; each task is read under its own
        lock, one after the other."""
        with self._lock:
            tasks = list(self._tasks.values())
            ended = [
                {"task_id": task_id, "outcome": "input ended" if why is None else
                 f"{why.get('type')}: {why.get('message')}"}
                for task_id, why in list(self._ended.items())[-10:][::-1]
            ]  # fmt: skip
        seen = self._telemetry.last_heartbeat
        stopped = self._stopped.is_set()
        return WorkerSnapshot(
            address=self._address or "",
            dispatcher=self._dispatcher.address,
            incarnation=self._incarnation,
            uptime_s=time.monotonic() - self._started_at,
            state="stopped" if stopped else "draining" if self.draining else "serving",
            since_heartbeat=None if seen is None else time.monotonic() - seen,
            tasks=[task.status(self._telemetry.rates) for task in tasks],
            ended=ended,
            errors=self._telemetry.errors.list(),
        )

    def __enter__(self) -> WorkerServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- draining ---------------------------------------------------------------------------
    def _drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        self._draining.set()
        with self._lock:
            tasks = list(self._tasks.values())
        for task in tasks:
            task.drain()
        logger.info(
            "worker %s: draining %d tasks (at most %.1f s)", self._address, len(tasks), seconds
        )
        with contextlib.suppress(FeedlineError):  # at once: no new task comes here
            self._heartbeat(wait_s=0.0, timeout=min(2.0, seconds))
        while time.monotonic() < deadline and not self._drain_cancelled.is_set():
            with self._lock:
                left = [task for task in self._tasks.values() if not task.drained_out()]
            if not left or self._stopped.is_set():
                break
            self._drain_cancelled.wait(0.05)
        with self._lock:
            held = sum(task.buffered() for task in self._tasks.values())
        if held:
            logger.warning(
                "worker %s: drain ended with %d elements not handed out", self._address, held
            )
        self._left.set()  # no heartbeat after this one registers the worker again
        try:  # the dispatcher forgets this worker now
            self._heartbeat(wait_s=0.0, timeout=2.0, leaving=True)
        except FeedlineError as error:
            logger.warning(
                "worker %s: the dispatcher could not be told it leaves (%s); it keeps the "
                "worker until worker_timeout_ms passes",
                self._address,
                error,
            )

    # -- the dispatcher ---------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        config = self._config
        backoff = 0.05
        unreachable_since: float | None = None
        while not self._stopped.is_set() and not self._left.is_set():
            try:
                retry_after = self._heartbeat(wait_s=config.heartbeat_interval_s, timeout=10.0)
            except UnavailableError as error:
                if self._stopped.is_set():
                    return
                self._telemetry.heartbeat_failed(error)
                now = time.monotonic()
                if unreachable_since is None:
                    unreachable_since = now
                    if not _exit.exiting():
                        logger.warning(
                            "worker %s: dispatcher %s unreachable (%s); trying again %s",
                            self._address,
                            self._dispatcher.address,
                            error,
                            "until it answers"
                            if config.wait_forever
                            else f"for up to {config.dispatcher_timeout_s:.0f} s",
                        )
                elif (
                    not config.wait_forever
                    and now - unreachable_since > config.dispatcher_timeout_s
                ):
                    self._give_up(now - unreachable_since)
                    return
                self._stopped.wait(backoff)
                backoff = min(2 * backoff, 1.0)
            except FailedPreconditionError as error:
                if self._stopped.is_set():
                    return
                # The dispatcher refuses this worker for good (another took its address).
                self._error = error
                logger.error("worker %s stops: %s", self._address, error)
                threading.Thread(target=self.stop, name="feedline-worker-stop", daemon=True).start()
                return
            except Exception as error:
                if self._stopped.is_set():
                    return
                self._telemetry.heartbeat_failed(error)
                logger.warning("worker %s: heartbeat failed: %r", self._address, error)
                self._stopped.wait(1.0)
            else:
                if unreachable_since is not None:
                    logger.info(
                        "worker %s: dispatcher %s answers again after %.1f s",
                        self._address,
                        self._dispatcher.address,
                        time.monotonic() - unreachable_since,
                    )
                unreachable_since = None
                backoff = 0.05
                if retry_after:  # the dispatcher did not wait: this side does
                    self._stopped.wait(retry_after)

    def _give_up(self, seconds: float) -> None:
        """The dispatcher stayed unreachable past the bound: stop, saying why once."""
        self._error = UnavailableError(
            f"worker {self._address}: the dispatcher at {self._dispatcher.address} was "
            f"unreachable for {seconds:.0f} s (WorkerConfig.dispatcher_timeout_ms = "
            f"{self._config.dispatcher_timeout_s * 1000:.0f}); the worker stops. Set "
            "WorkerConfig(wait_forever=True) (--wait-forever) to keep trying"
        )
        logger.error("%s", self._error)
        threading.Thread(target=self.stop, name="feedline-worker-stop", daemon=True).start()

    def _heartbeat(
        self,
        *,
        wait_s: float,
        timeout: float,
        wait_for_ready: bool = False,
        leaving: bool = False,
    ) -> float:
        """One heartbeat; how long to wait before the next (the dispatcher's
        ``retry_after_ms``, 0 when it waited for news itself)."""
        with self._lock:
            current = sorted(self._tasks)
            finished = sorted(t for t, task in self._tasks.items() if task.completed())
            failed = [r for task in self._tasks.values() if (r := task.failure()) is not None]
            # What each task served, for the status pages.
            stats = [
                [t, task.served_elements, task.served_bytes] for t, task in self._tasks.items()
            ]
            # What each producer did: the dispatcher's estimate of the workers needed.
            loads = tuple(task.load() for task in self._tasks.values())
        request = WorkerHeartbeatRequest(
            self.worker_address,
            tags=tuple(self._config.worker_tags),
            current_tasks=tuple(current),
            finished_tasks=tuple(finished),
            failed_tasks=tuple(failed),
            draining=self._draining.is_set(),
            leaving=leaving,
            wait_ms=int(wait_s * 1000),
            task_stats=stats,
            task_load=loads,
            instance=self._instance,
        )
        reply, _ = self._dispatcher.call(
            "WorkerHeartbeat",
            request.to_header(),
            timeout=timeout + wait_s,
            wait_for_ready=wait_for_ready,
        )
        self._telemetry.heartbeat(stats)
        retry_after = self._apply_reply(reply)
        self._forget_unused_datasets()
        return retry_after

    def _forget_unused_datasets(self) -> None:
        """Drops the cached datasets that no task here has run for ``_DATASET_KEEP_S``."""
        now = time.monotonic()
        with self._lock:
            running = {task.fingerprint for task in self._tasks.values()}
            unused = self._dataset_unused_since
            for fingerprint in list(self._datasets):
                if fingerprint in running:
                    unused.pop(fingerprint, None)
                elif now - unused.setdefault(fingerprint, now) > _DATASET_KEEP_S:
                    del self._datasets[fingerprint]
            for fingerprint in [f for f in unused if f not in self._datasets]:
                del unused[fingerprint]

    def _apply_reply(self, header: dict[str, Any]) -> float:
        """Starts and ends the tasks the reply says; its ``retry_after_ms`` in seconds."""
        reply = WorkerHeartbeatReply.from_header(header)
        with self._reply_lock:
            if reply.incarnation != self._incarnation:
                self._new_incarnation(reply.incarnation)
            for task_id in reply.delete_tasks:
                self._end_task(task_id, reply.task_errors.get(task_id))
            for task_id in reply.lost_tasks:
                self._end_task(task_id, self._lost_report(task_id))
            for task_id in reply.dropped_tasks:
                self._end_task(task_id, _DROPPED)
            for task in reply.new_tasks:
                self._start_task(task)
        return reply.retry_after_ms / 1000

    def _new_incarnation(self, incarnation: int | None) -> None:
        """The dispatcher is a new life: what belongs to an earlier one is dropped."""
        previous, self._incarnation = self._incarnation, incarnation
        if previous is None or incarnation is None:
            return
        with self._lock:
            self._past_incarnations.add(previous)
            stale = [t for t in self._tasks if incarnation_of(t) != incarnation]
        logger.warning(
            "worker %s: the dispatcher restarted (incarnation %x, was %x); dropping the %d "
            "tasks of its earlier life",
            self._address,
            incarnation,
            previous,
            len(stale),
        )
        for task_id in stale:
            self._end_task(task_id, self._lost_report(task_id))

    def _lost_report(self, task_id: int) -> dict[str, Any]:
        return {
            "type": "FailedPreconditionError",
            "message": (
                f"task {task_id} belonged to a job of an earlier life of the dispatcher at "
                f"{self._dispatcher.address}, which restarted without a journal: the job is "
                "gone, with the elements not yet received. Iterate the dataset again to start "
                "a new job"
            ),
            "worker": self._address,
            "task_id": task_id,
        }

    def _end_task(self, task_id: int, error: dict[str, Any] | None) -> None:
        """Removes a task; its consumers hear ``error``, or, without one, the end of its input
        if it reached it, else that it was cancelled."""
        with self._lock:
            task = self._tasks.pop(task_id, None)
            if task is None:
                if task_id not in self._ended and error is not None:
                    self._remember(task_id, error)
                return
            if error is None and not task.completed():
                error = task.failure() or {
                    "type": "FailedPreconditionError",
                    "message": (
                        f"task {task_id} was cancelled: its job ended before the task's input "
                        "did (its consumers were released, or the job was collected)"
                    ),
                    "worker": self._address,
                    "task_id": task_id,
                }
            self._remember(task_id, error)
        task.stop()

    def _remember(self, task_id: int, error: dict[str, Any] | None) -> None:
        self._ended[task_id] = error
        while len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)

    def _start_task(self, definition: TaskDef) -> None:
        task_id = definition.task_id
        with self._lock:
            if (
                self._stopped.is_set()
                or self._draining.is_set()
                or task_id in self._tasks
                or task_id in self._ended
            ):
                return
            task = Task(
                definition,
                self,
                TaskBuffer(task_id, memory=self._buffer_memory),
                cache_bytes=self._config.cross_trainer_cache_size_bytes,
            )
            self._tasks[task_id] = task
            self._task_started.notify_all()
        task.start()

    def report_failure(self) -> None:
        """Tells the dispatcher at once that a task failed (the heartbeat carries it), so that
        its job ends and every consumer hears the error."""
        if self._stopped.is_set():
            return
        try:
            self._heartbeat(wait_s=0.0, timeout=5.0)
        except FeedlineError as error:  # the next heartbeat carries it again
            logger.info("worker %s: reporting a failed task: %s", self._address, error)

    def dataset(self, task: TaskDef) -> tuple[Dataset, str | None]:
        """The dataset of ``task`` and its compression (called on a task's thread)."""
        fingerprint = task.fingerprint
        with self._lock:
            cached = self._datasets.get(fingerprint) if fingerprint else None
            self._dataset_unused_since.pop(fingerprint, None)  # a task of it runs now
        if cached is not None:
            return cached
        reply, buffers = self.call_dispatcher(
            "GetDatasetDef",
            GetDatasetDefRequest(task.dataset_id).to_header(),
            f"fetching dataset {task.dataset_id} for task {task.task_id}",
        )
        cached = (cloudpickle.loads(buffers[0]), DatasetDefReply.from_header(reply).compression)
        if fingerprint:
            with self._lock:
                self._datasets[fingerprint] = cached
                while len(self._datasets) > _DATASETS_KEPT:
                    self._datasets.popitem(last=False)
        return cached

    def call_dispatcher(
        self, method: str, header: dict[str, Any], what: str
    ) -> tuple[dict[str, Any], list[memoryview]]:
        """One call to the dispatcher, tried again while it cannot be reached, for as long as
        a heartbeat would (``dispatcher_timeout_ms``, or forever with ``wait_forever``).

        Raises:
          UnavailableError: the dispatcher stayed unreachable; the message says doing ``what``.
        """
        config = self._config
        started = time.monotonic()
        try:
            return call_within(
                math.inf if config.wait_forever else config.dispatcher_timeout_s,
                lambda timeout: self._dispatcher.call(
                    method, header, timeout=timeout, wait_for_ready=True
                ),
                attempt_s=10.0,
                stopped=self._stopped,
            )
        except UnavailableError:
            raise UnavailableError(
                f"worker {self._address}: the dispatcher at {self._dispatcher.address} "
                f"was unreachable for {time.monotonic() - started:.0f} s while {what}"
            ) from None

    @property
    def draining(self) -> bool:
        """Whether the worker drains (``stop(drain_seconds=...)``)."""
        return self._draining.is_set()

    # -- consumers --------------------------------------------------------------------------
    def _get_elements(self, header: dict[str, Any], buffers: list[memoryview]) -> bytes:
        """GetElements: at most ``_MAX_WAITING_READS`` requests wait here at once (each holds a
        server thread); past that a request is answered at once, with what is ready or with
        nothing yet and ``retry_after_ms``, and its consumer waits on its side."""
        request = GetElementsRequest.from_header(header)
        with self._lock:
            may_wait = self._waiting_reads < _MAX_WAITING_READS
            if may_wait:
                self._waiting_reads += 1
        if may_wait:
            try:
                return self._serve_elements(request)
            finally:
                with self._lock:
                    self._waiting_reads -= 1
        frame = self._serve_elements(dataclasses.replace(request, wait_ms=0))
        retry_ms = int(wait_seconds(request) * 1000)
        if frame is NOTHING_YET and retry_ms:
            return encode_frame(ElementsReply(retry_after_ms=retry_ms).to_header())
        return frame

    def _serve_elements(self, request: GetElementsRequest) -> bytes:
        task_id = request.task_id
        deadline = time.monotonic() + wait_seconds(request)
        with self._lock:
            while True:
                task = self._tasks.get(task_id)
                ended = task_id in self._ended
                other_life = incarnation_of(task_id) in self._past_incarnations
                remaining = deadline - time.monotonic()
                if task is not None or ended or other_life or self._stopped.is_set():
                    break
                if self._draining.is_set() or remaining <= 0:
                    break
                # The task is on its way here (the consumer heard of it first): wait for it, so
                # that every consumer already asking is waiting at the task when its first
                # elements come, and they share them.
                self._task_started.wait(remaining)
            why = self._ended.get(task_id)
        if task is not None:
            return task.get_elements(request)
        if ended and why is _DROPPED:  # lost with this worker: its consumers go elsewhere
            reply = ElementsReply(gone=True)
        elif ended:
            reply = ElementsReply(eos=True) if why is None else ElementsReply(error=why)
        elif other_life:
            reply = ElementsReply(error=self._lost_report(task_id))
        elif self._stopped.is_set() or self._draining.is_set():
            reply = ElementsReply(gone=True)
        else:  # nothing yet: the consumer asks again
            return NOTHING_YET
        return encode_frame(reply.to_header())
