"""What a dispatcher or worker counts for its status page and its Prometheus metrics.

Each server owns one telemetry object (``DispatcherTelemetry``, ``WorkerTelemetry``) and, when it
has a ``status_port``, a ``prometheus_client.CollectorRegistry`` of its own (several servers live
in one process in tests). Without a status port nothing is counted on the data path: the calls
below return at once. What is always kept is cheap and bounded: the last ``_ERRORS_KEPT`` errors
and each running task's served counts with their rates (for the pages).

Metrics (``feedline_`` prefix; the gauges are read from a snapshot when scraped):

==========================================  =========  ======================================
dispatcher_request_duration_seconds         histogram  RPC handling time, by ``method``; the
                                                        heartbeats include their long poll
dispatcher_request_errors_total             counter    RPCs that raised, by ``method``, ``type``
dispatcher_heartbeats_missed_total          counter    workers dropped / consumers released
                                                        for missed heartbeats, by ``kind``
dispatcher_job_failures_total               counter    jobs ended by a task's error, by ``type``
                                                        (not those its consumers left first)
dispatcher_workers, _datasets, _consumers   gauge      registered workers, datasets, consumers
dispatcher_desired_workers                  gauge      workers the running jobs need
                                                        (``dispatcher.demand``; 0: none runs)
dispatcher_jobs, dispatcher_tasks           gauge      by ``state``
dispatcher_save_streams                     gauge      streams of each ``distributed_save``, by
                                                        ``path`` and ``state`` (done, writing,
                                                        waiting)
dispatcher_save_chunks, _elements, _bytes   gauge      what its workers committed, by ``path``
worker_elements_served_total                counter    elements handed to consumers
worker_bytes_served_total                   counter    their bytes (array bytes, uncompressed)
worker_get_elements_duration_seconds        histogram  GetElements handling time (with its wait)
worker_request_errors_total                 counter    GetElements calls that raised, by ``type``
worker_task_failures_total                  counter    tasks failed, by the error's ``type``
worker_heartbeat_failures_total             counter    heartbeats to the dispatcher that failed
worker_tasks, worker_buffered_elements,     gauge      running tasks and what their buffers
worker_buffered_bytes, worker_buffer_fill               hold; fill: the fullest buffer, 0..1
worker_seconds_since_heartbeat              gauge      since the last answered heartbeat
worker_trainer_position                     gauge      in a cross-trainer job, each trainer's
                                                        position in a task's stream, by
                                                        ``task`` and ``trainer``
worker_trainer_cache_bytes                  gauge      what the tasks' cross-trainer caches
                                                        hold, by ``where`` (memory, disk)
==========================================  =========  ======================================
"""

from __future__ import annotations

import collections
import datetime
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from feedline.service.status.text import printable

__all__ = ["DispatcherTelemetry", "RateTracker", "WorkerTelemetry"]

Handler = Callable[[dict[str, Any], list[memoryview]], Any]

# Request latency buckets (seconds): GetElements replies take from ~0.1 ms (a buffered element)
# to the 1 s a request waits for elements; heartbeats wait up to 2 s.
_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0,
)  # fmt: skip
_ERRORS_KEPT = 20
# A task that has not reported for this long counts as serving nothing.
_STALE_S = 5.0
# Rates are measured over at least this long.
_RATE_WINDOW_S = 1.0


class RecentErrors:
    """The last ``_ERRORS_KEPT`` errors, with their UTC time; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: collections.deque[tuple[str, str]] = collections.deque(maxlen=_ERRORS_KEPT)

    def add(self, text: str) -> None:
        when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        with self._lock:
            self._errors.append((when, text))

    def list(self) -> list[tuple[str, str]]:
        """``(time, text)`` pairs, newest first."""
        with self._lock:
            return list(reversed(self._errors))


class RateTracker:
    """Elements and bytes served per task, as reported now and then, and their rates."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # task id -> [elements, bytes, reported at, base elements, base bytes, base time,
        #             elements/s, bytes/s]
        self._tasks: dict[int, list[float]] = {}

    def report(self, task_id: int, elements: int, nbytes: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            entry = self._tasks.get(task_id)
            if entry is None:
                self._tasks[task_id] = [elements, nbytes, now, elements, nbytes, now, 0.0, 0.0]
                return
            entry[0:3] = [elements, nbytes, now]
            if now - entry[5] >= _RATE_WINDOW_S:
                elapsed = now - entry[5]
                entry[6] = max(0.0, (elements - entry[3]) / elapsed)
                entry[7] = max(0.0, (nbytes - entry[4]) / elapsed)
                entry[3:6] = [elements, nbytes, now]

    def get(self, task_id: int, now: float | None = None) -> tuple[int, int, float, float]:
        """``(elements, bytes, elements/s, bytes/s)`` of ``task_id`` (zeros if unknown; the
        rates are 0 once it stopped reporting)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            entry = self._tasks.get(task_id)
        if entry is None:
            return 0, 0, 0.0, 0.0
        fresh = now - entry[2] < _STALE_S
        return int(entry[0]), int(entry[1]), entry[6] if fresh else 0.0, entry[7] if fresh else 0.0

    def known(self) -> list[int]:
        """The tasks reported, sorted."""
        with self._lock:
            return sorted(self._tasks)

    def keep_only(self, task_ids: Iterable[int]) -> None:
        """Forgets the tasks not in ``task_ids``."""
        keep = set(task_ids)
        with self._lock:
            for task_id in [t for t in self._tasks if t not in keep]:
                del self._tasks[task_id]


class _Gauges(Collector):
    """Gauges computed when scraped, from ``gauges()``: ``(name, help, {labels: value})``."""

    def __init__(
        self,
        gauges: Callable[[], Iterable[tuple[str, str, Mapping[tuple[str, ...], float]]]],
        label_names: Mapping[str, tuple[str, ...]],
    ) -> None:
        self._gauges = gauges
        self._label_names = label_names

    def describe(self) -> list[Metric]:
        """Nothing: the gauges are read only when scraped (never at registration)."""
        return []

    def collect(self) -> Iterator[Metric]:
        for name, documentation, values in self._gauges():
            labels = self._label_names.get(name, ())
            family = GaugeMetricFamily(name, documentation, labels=labels)
            for label_values, value in values.items():
                family.add_metric(list(label_values), value)
            yield family


class _Telemetry:
    """What both servers count: errors by type, the registry, recent errors."""

    prefix = ""

    def __init__(self, enabled: bool) -> None:
        self.errors = RecentErrors()
        self.rates = RateTracker()
        self.registry: CollectorRegistry | None = CollectorRegistry() if enabled else None

    @property
    def enabled(self) -> bool:
        return self.registry is not None

    def exposition(self) -> bytes:
        """The metrics in the Prometheus text format."""
        return b"" if self.registry is None else generate_latest(self.registry)

    def _timed(self, method: str, handler: Handler, histogram: Any, errors: Any) -> Handler:
        observe = histogram.labels(method).observe if method else histogram.observe

        def timed(header: dict[str, Any], buffers: list[memoryview]) -> Any:
            start = time.perf_counter()
            try:
                return handler(header, buffers)
            except Exception as error:
                labels = (method, type(error).__name__) if method else (type(error).__name__,)
                errors.labels(*labels).inc()
                raise
            finally:
                observe(time.perf_counter() - start)

        return timed


class DispatcherTelemetry(_Telemetry):
    """The dispatcher's counters; ``snapshot`` gives the gauges' values when scraped.

    Args:
      enabled: collect Prometheus metrics (the dispatcher has a status port).
      snapshot: what the status page shows (``_status_page.DispatcherSnapshot``), taken under the
        dispatcher's lock.
    """

    def __init__(self, enabled: bool, snapshot: Callable[[], Any]) -> None:
        super().__init__(enabled)
        if self.registry is None:
            return
        registry = self.registry
        self._latency = Histogram(
            "feedline_dispatcher_request_duration_seconds",
            "Time the dispatcher took to handle an RPC (heartbeats include their long poll).",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._request_errors = Counter(
            "feedline_dispatcher_request_errors",
            "RPCs to the dispatcher that raised, by method and error type.",
            ["method", "type"],
            registry=registry,
        )
        self._missed = Counter(
            "feedline_dispatcher_heartbeats_missed",
            "Workers dropped and consumers released because they missed heartbeats.",
            ["kind"],
            registry=registry,
        )
        self._job_failures = Counter(
            "feedline_dispatcher_job_failures",
            "Jobs ended by a task's error, by the error's type.",
            ["type"],
            registry=registry,
        )
        for kind in ("worker", "consumer"):
            self._missed.labels(kind)
        self._snapshot = snapshot
        labels = {
            "feedline_dispatcher_jobs": ("state",),
            "feedline_dispatcher_tasks": ("state",),
            "feedline_dispatcher_save_streams": ("path", "state"),
            "feedline_dispatcher_save_chunks": ("path",),
            "feedline_dispatcher_save_elements": ("path",),
            "feedline_dispatcher_save_bytes": ("path",),
        }
        registry.register(_Gauges(self._gauges, labels))

    def instrument(self, handlers: dict[str, Handler]) -> dict[str, Handler]:
        """``handlers``, each timed and its errors counted (unchanged when not enabled)."""
        if self.registry is None:
            return handlers
        return {
            name: self._timed(name, handler, self._latency, self._request_errors)
            for name, handler in handlers.items()
        }

    def heartbeat_missed(self, kind: str, who: Any) -> None:
        """A worker (``kind="worker"``) or consumer missed its heartbeats."""
        self.errors.add(f"{kind} {who} missed its heartbeats")
        if self.registry is not None:
            self._missed.labels(kind).inc()

    def job_failed(self, job_id: int, error: Mapping[str, Any]) -> None:
        """A job ended with ``error`` (``{"type", "message", "worker", "task_id"}``)."""
        self.errors.add(
            f"job {job_id} failed: task {error.get('task_id')} on worker {error.get('worker')} "
            f"raised {error.get('type')}: {error.get('message')}"
        )
        if self.registry is not None:
            self._job_failures.labels(printable(error.get("type") or "unknown", 200)).inc()

    def worker_report(self, stats: Any, issued: Callable[[int], bool]) -> None:
        """A worker's ``task_stats``: ``[[task_id, elements, bytes], ...]`` (malformed entries
        are ignored: they only feed the status page). Only tasks for which ``issued`` is true
        (the dispatcher gave them to this worker) are kept: an id the dispatcher never issued
        costs it nothing."""
        if not isinstance(stats, list):
            return
        now = time.monotonic()
        for entry in stats:
            if (
                isinstance(entry, list)
                and len(entry) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) for v in entry)
                and issued(entry[0])
            ):
                self.rates.report(entry[0], entry[1], entry[2], now)

    def _gauges(self) -> Iterator[tuple[str, str, dict[tuple[str, ...], float]]]:
        snap = self._snapshot()
        yield "feedline_dispatcher_workers", "Registered workers.", {(): len(snap.workers)}
        yield (
            "feedline_dispatcher_desired_workers",
            "Workers the running jobs need, estimated from the consumers' wait for input and "
            "the workers' busy time (0: no job runs).",
            {(): snap.desired_workers},
        )
        yield "feedline_dispatcher_datasets", "Registered datasets.", {(): len(snap.datasets)}
        active = sum(1 for c in snap.consumers if not c["released"])
        yield "feedline_dispatcher_consumers", "Consumers of the jobs.", {(): active}
        jobs = collections.Counter({"running": 0, "finished": 0, "failed": 0})
        tasks = collections.Counter({"running": 0, "done": 0, "lost": 0})
        for job in snap.jobs:
            jobs[job["state"]] += 1
            for state in ("running", "done", "lost"):
                tasks[state] += job["tasks"][state]
        yield "feedline_dispatcher_jobs", "Jobs, by state.", {(k,): v for k, v in jobs.items()}
        yield "feedline_dispatcher_tasks", "Tasks, by state.", {(k,): v for k, v in tasks.items()}
        streams: dict[tuple[str, ...], float] = {}
        for save in snap.saves:
            waiting = save.streams - save.streams_done - save.writing
            for state, count in (("done", save.streams_done), ("writing", save.writing)):
                streams[(save.path, state)] = count
            streams[(save.path, "waiting")] = waiting
        yield (
            "feedline_dispatcher_save_streams",
            "Streams of each distributed_save, by path and state.",
            streams,
        )
        for name, what in (("chunks", "Chunks"), ("elements", "Elements"), ("nbytes", "Bytes")):
            yield (
                f"feedline_dispatcher_save_{name.removeprefix('n')}",
                f"{what} each distributed_save's workers committed, by path.",
                {(save.path,): getattr(save, name) for save in snap.saves},
            )


class WorkerTelemetry(_Telemetry):
    """A worker's counters; ``snapshot`` gives the gauges' values when scraped.

    Args:
      enabled: collect Prometheus metrics (the worker has a status port).
      snapshot: what the status page shows (``_status_page.WorkerSnapshot``).
    """

    def __init__(self, enabled: bool, snapshot: Callable[[], Any]) -> None:
        super().__init__(enabled)
        self.last_heartbeat: float | None = None  # time.monotonic() of the last answered one
        if self.registry is None:
            return
        registry = self.registry
        self._elements = Counter(
            "feedline_worker_elements_served", "Elements handed to consumers.", registry=registry
        )
        self._bytes = Counter(
            "feedline_worker_bytes_served",
            "Bytes of the elements handed to consumers (their arrays, before compression).",
            registry=registry,
        )
        self._latency = Histogram(
            "feedline_worker_get_elements_duration_seconds",
            "Time the worker took to answer GetElements (including its wait for elements).",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._request_errors = Counter(
            "feedline_worker_request_errors",
            "GetElements calls that raised, by error type.",
            ["type"],
            registry=registry,
        )
        self._task_failures = Counter(
            "feedline_worker_task_failures",
            "Tasks failed on this worker, by the error's type.",
            ["type"],
            registry=registry,
        )
        self._heartbeat_failures = Counter(
            "feedline_worker_heartbeat_failures",
            "Heartbeats to the dispatcher that failed, by error type.",
            ["type"],
            registry=registry,
        )
        self._snapshot = snapshot
        labels = {
            "feedline_worker_trainer_position": ("task", "trainer"),
            "feedline_worker_trainer_cache_bytes": ("where",),
        }
        registry.register(_Gauges(self._gauges, labels))

    def instrument(self, handler: Handler) -> Handler:
        """``handler`` (GetElements) timed and its errors counted (unchanged when not enabled)."""
        if self.registry is None:
            return handler
        return self._timed("", handler, self._latency, self._request_errors)

    def served(self, elements: int, nbytes: int) -> None:
        """``elements`` of ``nbytes`` went to a consumer."""
        if self.registry is not None:
            self._elements.inc(elements)
            self._bytes.inc(nbytes)

    def task_failed(self, task_id: int, report: Mapping[str, Any]) -> None:
        """Task ``task_id`` failed with ``report`` (``{"type", "message", ...}``)."""
        self.errors.add(f"task {task_id} failed: {report.get('type')}: {report.get('message')}")
        if self.registry is not None:
            self._task_failures.labels(printable(report.get("type") or "unknown", 200)).inc()

    def heartbeat(self, stats: list[list[int]]) -> None:
        """A heartbeat was answered; ``stats`` is what it reported of the tasks."""
        now = time.monotonic()
        self.last_heartbeat = now
        for task_id, elements, nbytes in stats:
            self.rates.report(task_id, elements, nbytes, now)
        self.rates.keep_only(task_id for task_id, _, _ in stats)

    def heartbeat_failed(self, error: BaseException) -> None:
        """A heartbeat to the dispatcher failed with ``error``."""
        self.errors.add(f"heartbeat to the dispatcher failed: {type(error).__name__}: {error}")
        if self.registry is not None:
            self._heartbeat_failures.labels(type(error).__name__).inc()

    def _gauges(self) -> Iterator[tuple[str, str, dict[tuple[str, ...], float]]]:
        snap = self._snapshot()
        tasks = [t for t in snap.tasks if t["state"] == "running"]
        yield "feedline_worker_tasks", "Tasks running on this worker.", {(): len(tasks)}
        yield (
            "feedline_worker_buffered_elements",
            "Elements in the tasks' buffers.",
            {(): sum(t["buffered"] for t in snap.tasks)},
        )
        yield (
            "feedline_worker_buffered_bytes",
            "Bytes in the tasks' buffers.",
            {(): sum(t["buffered_bytes"] for t in snap.tasks)},
        )
        yield (
            "feedline_worker_buffer_fill",
            "How full the fullest task buffer is, from 0 to 1 (of its element or byte bound).",
            {(): max((t["fill"] for t in snap.tasks), default=0.0)},
        )
        caches = [(t["task_id"], t["trainer_cache"]) for t in snap.tasks if "trainer_cache" in t]
        yield (
            "feedline_worker_trainer_position",
            "In a cross-trainer job: the elements of a task's stream before each trainer's next.",
            {
                (str(task_id), printable(trainer, 200)): float(position)
                for task_id, cache in caches
                for trainer, position in cache["trainers"].items()
            },
        )
        yield (
            "feedline_worker_trainer_cache_bytes",
            "Bytes the tasks' cross-trainer caches hold, in memory and spilled to disk.",
            {
                ("memory",): float(sum(cache["memory_bytes"] for _, cache in caches)),
                ("disk",): float(sum(cache["spilled_bytes"] for _, cache in caches)),
            },
        )
        since = snap.since_heartbeat
        yield (
            "feedline_worker_seconds_since_heartbeat",
            "Seconds since the dispatcher last answered a heartbeat (-1: never).",
            {(): -1.0 if since is None else since},
        )
