"""``ClusterCoordinator``: schedules functions on the workers of a ``ParameterServerStrategy``.

The coordinator (on the chief) keeps a bounded queue of scheduled functions (a
``ClosureQueue``), the per-worker datasets and iterators (a ``ResourceRegistry``) and one agent
per ``worker`` task, given both, which keeps ``agent.IN_FLIGHT`` (2) functions sent to the
worker (cloudpickled, ``closures``; the worker runs them one at a time, the next one's request
already there) and hands their outcomes back to the queue, which resolves their
``RemoteValue``. What TensorFlow documents holds:

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

import threading
import time
from collections.abc import Callable
from typing import Any

from feedline._net import exit as _exit
from feedline.distribute.parameter_server import closures
from feedline.distribute.parameter_server.agent import WorkerAgent
from feedline.distribute.parameter_server.closure_queue import Closure, ClosureQueue
from feedline.distribute.parameter_server.resources import ResourceRegistry
from feedline.distribute.parameter_server.runtime import ParameterServerUnavailableError
from feedline.distribute.parameter_server.strategy import ParameterServerStrategy
from feedline.distribute.parameter_server.values import (
    PerWorkerDataset,
    RemoteValue,
)
from feedline.errors import FeedlineError, InvalidArgumentError, UnavailableError

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

    As in TensorFlow, a strategy has one coordinator: ``ClusterCoordinator(strategy)`` again
    returns the one made first (its arguments as first given) until it is closed.

    Raises:
      InvalidArgumentError: ``strategy`` is not a ParameterServerStrategy, belongs to a
        worker (between-graph form), or its cluster has no worker tasks.
    """

    def __new__(cls, strategy: ParameterServerStrategy, **kwargs: Any) -> ClusterCoordinator:
        existing = getattr(strategy, "_cluster_coordinator", None)
        if isinstance(existing, cls) and not existing._stopping.is_set():
            return existing
        return super().__new__(cls)

    def __init__(
        self,
        strategy: ParameterServerStrategy,
        *,
        max_pending: int = MAX_PENDING,
        function_timeout: float = 3600.0,
        worker_timeout: float | None = 600.0,
    ) -> None:
        if getattr(strategy, "_cluster_coordinator", None) is self:
            return  # the strategy's coordinator, already running
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
        self._worker_timeout = worker_timeout
        self._queue = ClosureQueue(max_pending)
        self._resources = ResourceRegistry()
        self._stopping = threading.Event()  # ends the ps watch
        addresses = [spec.task_address("worker", i) for i in spec.task_indices("worker")]
        self._agents = [
            WorkerAgent(self._queue, self._resources, i, address, function_timeout, len(addresses))
            for i, address in enumerate(addresses)
        ]
        for agent in self._agents:
            agent.start()
        self._monitor = threading.Thread(
            target=self._watch_ps, name="feedline-coordinator-ps-watch", daemon=True
        )
        self._monitor.start()
        _exit.register(self, "close", _exit.CONSUMER)
        _exit.join_at_exit(self._monitor)
        strategy._cluster_coordinator = self

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
        self._queue.raise_if_error()
        data, values = closures.dumps_closure(fn, tuple(args or ()), dict(kwargs or {}))
        self._runtime.ensure_created()  # the workers pull the variables' first values
        name = getattr(fn, "__qualname__", type(fn).__name__)
        closure = Closure(name, data, values, RemoteValue(name, self._queue.raise_if_aborted))
        self._queue.put(closure)
        return closure.result

    def join(self, timeout: float | None = None) -> None:
        """Waits until every scheduled function has run.

        Raises:
          the first error a function raised since the last raise (the rest are cancelled);
          ``UnavailableError`` after a ps failure, or when ``timeout`` passes first.
        """
        if not self._queue.wait(timeout):
            raise UnavailableError(
                f"join: {self._queue.unfinished} scheduled functions did not finish within "
                f"{timeout:g} s (are the workers up?)"
            )

    def done(self) -> bool:
        """Whether every scheduled function has run; raises as ``join`` does."""
        return self._queue.done()

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
        return PerWorkerDataset(self._resources, self._resources.add("dataset", payload, 0))

    # -- the watch -----------------------------------------------------------------------------
    def _watch_workers(self) -> None:
        """Fails the cluster once functions have waited ``worker_timeout`` with every worker
        unreachable."""
        since = [a.down_since for a in self._agents if a.down_since is not None]
        if self._worker_timeout is None or len(since) < len(self._agents):
            return
        if self._queue.unfinished and time.monotonic() - max(since) > self._worker_timeout:
            self._queue.abort(
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
                        self._queue.abort(
                            ParameterServerUnavailableError(
                                f"parameter server /job:ps/task:{ps} at {address} is unavailable "
                                f"({error}); a ps failure is not recoverable: restart the cluster "
                                "and restore the last checkpoint",
                                ps,
                                address,
                            )
                        )
                        return

    def close(self) -> None:
        """Stops scheduling and closes the connections to the workers; idempotent. Closures
        still queued are not run. Called at interpreter exit for a coordinator never closed."""
        self._stop()

    def _stop(self) -> None:
        self._stopping.set()
        self._queue.stop()
        for agent in self._agents:
            agent.close()
