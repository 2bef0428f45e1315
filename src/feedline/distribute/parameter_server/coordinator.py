"""``ClusterCoordinator``: schedules functions on the workers of a ``ParameterServerStrategy``.

The coordinator (on the chief) keeps a bounded queue of scheduled functions and one agent per
``worker`` task, which keeps ``agent.IN_FLIGHT`` (2) functions sent to the worker (cloudpickled,
``closures``; the worker runs them one at a time, the next one's request already there) and
resolves their ``RemoteValue``. What TensorFlow documents holds:

* ``schedule`` returns at once unless the queue holds ``max_pending`` functions (TensorFlow's
  256 * 1024), then waits for room;
* a function runs at least once: when its worker dies (the call fails), it goes back to the
  front of the queue and another worker runs it; the dead worker is tried again every 0.2 s,
  and when it returns its per-worker datasets and iterators are made anew;
* an error raised by a function is raised, with the worker's traceback as a note, by its
  ``RemoteValue`` and by the next ``schedule``, ``join`` or ``done`` (once; the functions still
  queued then are cancelled);
* a ps failure is not recoverable: once a ps does not answer (the coordinator pings every ps
  each second, and workers report failed calls to one), ``schedule``, ``join``, ``done`` and
  every pending ``fetch`` raise ``ParameterServerUnavailableError`` (an ``UnavailableError``)
  naming it; restart the cluster and restore the last checkpoint.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from feedline._net import exit as _exit
from feedline.distribute.parameter_server import closures
from feedline.distribute.parameter_server.agent import Closure, Resource, WorkerAgent
from feedline.distribute.parameter_server.runtime import ParameterServerUnavailableError
from feedline.distribute.parameter_server.strategy import ParameterServerStrategy
from feedline.distribute.parameter_server.values import (
    PerWorkerDataset,
    RemoteValue,
)
from feedline.errors import (
    FailedPreconditionError,
    FeedlineError,
    InvalidArgumentError,
    UnavailableError,
)

__all__ = ["ClusterCoordinator"]

#: TensorFlow's bound on scheduled functions not yet running.
MAX_PENDING = 256 * 1024
_PING_S = 1.0


class ClusterCoordinator:
    """Runs functions on the workers of ``strategy`` (TF's ``coordinator.ClusterCoordinator``).

    Args:
      strategy: a ``ParameterServerStrategy`` of the chief (or of a process without a task).
      max_pending: how many scheduled functions may wait before ``schedule`` blocks.
      function_timeout: seconds one function may run on a worker before the worker counts as
        lost (and the function is run elsewhere).
      worker_timeout: seconds that functions may wait while no worker is reachable; then
        every wait raises ``UnavailableError`` naming the workers. None waits for them forever
        (as TensorFlow does, for a cluster manager that restarts them).

    Raises:
      InvalidArgumentError: ``strategy`` is not a ParameterServerStrategy, belongs to a
        worker (between-graph form), or its cluster has no worker tasks.
    """

    def __init__(
        self,
        strategy: ParameterServerStrategy,
        *,
        max_pending: int = MAX_PENDING,
        function_timeout: float = 3600.0,
        worker_timeout: float | None = 600.0,
    ) -> None:
        if not isinstance(strategy, ParameterServerStrategy):
            raise InvalidArgumentError(
                f"ClusterCoordinator needs a ParameterServerStrategy, got {type(strategy).__name__}"
            )
        resolver = strategy.cluster_resolver
        if resolver.task_type == "worker":
            raise InvalidArgumentError(
                f"this process is worker {resolver.task_id}: in the between-graph form each "
                "worker trains itself with strategy.run; a ClusterCoordinator runs on the chief"
            )
        spec = resolver.cluster_spec()
        if "worker" not in spec.jobs or not spec.num_tasks("worker"):
            raise InvalidArgumentError(
                f"the cluster {spec.as_dict()} has no 'worker' tasks for the coordinator to use"
            )
        self.strategy = strategy
        self._runtime = strategy._ps_placer.runtime
        self._max_pending = max_pending
        self._function_timeout = function_timeout
        self._worker_timeout = worker_timeout
        self._cond = threading.Condition()
        self._queue: collections.deque[Closure] = collections.deque()
        self._running = 0
        self._error: BaseException | None = None
        self._cluster_error: BaseException | None = None
        self._resources: list[Resource] = []
        self._next_id = 1
        self._stopping = threading.Event()
        addresses = [spec.task_address("worker", i) for i in spec.task_indices("worker")]
        self._agents = [WorkerAgent(self, i, address) for i, address in enumerate(addresses)]
        for agent in self._agents:
            agent.start()
        self._monitor = threading.Thread(
            target=self._watch_ps, name="feedline-coordinator-ps-watch", daemon=True
        )
        self._monitor.start()
        _exit.register(self, "close", _exit.CONSUMER)

    # -- the public API ----------------------------------------------------------------------
    def schedule(
        self, fn: Callable[..., Any], args: tuple | list | None = None, kwargs: dict | None = None
    ) -> RemoteValue:
        """Queues ``fn(*args, **kwargs)`` to run on some worker; returns its ``RemoteValue``.

        Raises:
          an earlier function's error (once); ``UnavailableError`` after a ps failure;
          ``InvalidArgumentError`` when ``fn`` or its arguments do not pickle (naming what).
        """
        if not callable(fn):
            raise TypeError(f"schedule expects a callable, got {type(fn).__name__}")
        self._raise_errors()
        data, values = closures.dumps_closure(fn, tuple(args or ()), dict(kwargs or {}))
        self._runtime.ensure_created()  # the workers pull the variables' first values
        name = getattr(fn, "__qualname__", type(fn).__name__)
        closure = Closure(name, data, values, RemoteValue(self, name))
        with self._cond:
            while len(self._queue) >= self._max_pending:
                self._cond.wait(0.1)
                self._raise_errors()
                if self._stopping.is_set():
                    raise FailedPreconditionError("the coordinator stopped; nothing was scheduled")
            self._queue.append(closure)
            self._cond.notify_all()
        return closure.result

    def join(self, timeout: float | None = None) -> None:
        """Waits until every scheduled function has run.

        Raises:
          the first error a function raised since the last raise (the rest are cancelled);
          ``UnavailableError`` after a ps failure, or when ``timeout`` passes first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._raise_errors()
                if not self._queue and not self._running:
                    return
                if deadline is not None and time.monotonic() > deadline:
                    raise UnavailableError(
                        f"join: {len(self._queue) + self._running} scheduled functions did "
                        f"not finish within {timeout:g} s (are the workers up?)"
                    )
                self._cond.wait(0.1)

    def done(self) -> bool:
        """Whether every scheduled function has run; raises as ``join`` does."""
        with self._cond:
            self._raise_errors()
            return not self._queue and not self._running

    def fetch(self, values: Any) -> Any:
        """``values`` with every ``RemoteValue`` in it (lists, tuples, dicts) fetched."""
        if isinstance(values, RemoteValue):
            return values.fetch()
        if isinstance(values, list | tuple):
            return type(values)(self.fetch(v) for v in values)
        if isinstance(values, dict):
            return {k: self.fetch(v) for k, v in values.items()}
        return values

    def create_per_worker_dataset(self, dataset_fn: Any) -> PerWorkerDataset:
        """A dataset on every worker: ``dataset_fn()`` (or ``dataset_fn(input_context)``, with
        this worker's input pipeline), run on each worker, or a dataset sent to each.

        Raises:
          InvalidArgumentError: it does not pickle (naming what).
        """
        payload, _ = closures.dumps_closure(dataset_fn, (), {})
        self._runtime.ensure_created()
        return PerWorkerDataset(self, self._add_resource("dataset", payload, 0))

    # -- resources -----------------------------------------------------------------------------
    def _add_resource(self, kind: str, payload: bytes, source: int) -> int:
        with self._cond:
            ident = self._next_id
            self._next_id += 1
            self._resources.append(Resource(ident, kind, payload, source))
            self._cond.notify_all()
        return ident

    def _add_iterator(self, dataset: int) -> int:
        return self._add_resource("iterator", b"", dataset)

    # -- errors --------------------------------------------------------------------------------
    def _raise_cluster_error(self) -> None:
        if self._cluster_error is not None:
            raise self._cluster_error

    def _raise_errors(self) -> None:
        self._raise_cluster_error()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _fail_cluster(self, error: BaseException) -> None:
        with self._cond:
            if self._cluster_error is None:
                self._cluster_error = error
            pending, self._queue = list(self._queue), collections.deque()
            self._cond.notify_all()
        for closure in pending:
            closure.result._fail(error)

    def _watch_workers(self) -> None:
        """Fails the cluster once functions have waited ``worker_timeout`` with every worker
        unreachable."""
        since = [agent.down_since for agent in self._agents]
        if self._worker_timeout is None or None in since or not (self._queue or self._running):
            return
        if time.monotonic() - max(since) > self._worker_timeout:  # type: ignore[type-var]
            self._fail_cluster(
                UnavailableError(
                    f"no worker answered for {self._worker_timeout:g} s "
                    f"({', '.join(a.address for a in self._agents)}) while functions waited; "
                    "start the workers (`feedline server`), or raise worker_timeout"
                )
            )

    def _watch_ps(self) -> None:
        misses = [0] * len(self._runtime.cluster.addresses)
        while not self._stopping.wait(_PING_S):
            self._watch_workers()
            for ps, address in enumerate(self._runtime.cluster.addresses):
                if not self._runtime._answered[ps]:
                    continue  # not up yet: calls wait for it (connect_timeout)
                try:
                    self._runtime.ping(ps, timeout=2.0)
                    misses[ps] = 0
                except FeedlineError as error:  # unreachable, or its channel just replaced
                    misses[ps] += 1
                    if misses[ps] >= 2:
                        self._fail_cluster(
                            ParameterServerUnavailableError(
                                f"parameter server /job:ps/task:{ps} at {address} is unavailable "
                                f"({error}); a ps failure is not recoverable: restart the cluster "
                                "and restore the last checkpoint",
                                ps,
                                address,
                            )
                        )
                        return

    # -- the agents' side ------------------------------------------------------------------------
    def _take(self) -> Closure | None:
        with self._cond:
            if not self._queue or self._cluster_error is not None:
                self._cond.wait(0.1)
            if not self._queue or self._cluster_error is not None:
                return None
            self._running += 1
            return self._queue.popleft()

    def _requeue(self, closure: Closure) -> None:
        with self._cond:
            self._running -= 1
            if self._cluster_error is not None:
                closure.result._fail(self._cluster_error)
            else:
                self._queue.appendleft(closure)
            self._cond.notify_all()

    def _finish(self, closure: Closure, outcome: tuple[bool, Any, int | None]) -> None:
        ok, value, ps_task = outcome
        if ok:
            closure.result._set(value)
        elif ps_task is not None:
            error = ParameterServerUnavailableError(str(value), ps_task)
            error.__cause__ = value
            closure.result._fail(error)
            self._fail_cluster(error)
        else:
            closure.result._fail(value)
            cancelled = FailedPreconditionError(
                f"cancelled: an earlier scheduled function failed ({type(value).__name__}: "
                f"{value}); schedule it again"
            )
            with self._cond:
                if self._error is None:
                    self._error = value
                pending, self._queue = list(self._queue), collections.deque()
            for other in pending:
                other.result._fail(cancelled)
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    def close(self) -> None:
        """Stops scheduling and closes the connections to the workers; idempotent. Closures
        still queued are not run. Called at interpreter exit for a coordinator never closed."""
        self._stop()

    def _stop(self) -> None:
        self._stopping.set()
        for agent in self._agents:
            agent.close()
