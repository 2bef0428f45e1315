"""What a ``worker`` task's server does for a ``ClusterCoordinator``: makes per-worker resources
and runs scheduled functions, one at a time.

==============  ================================================================================
CreateResource  ``{"incarnation", "id", "kind", "source"}`` + [pickled dataset or function]:
                ``kind`` ``"dataset"`` calls the function (with an ``InputContext`` of this worker
                if it takes one argument) or takes the dataset; ``"iterator"`` is ``iter()`` of
                the resource ``source``.
Run             ``{"incarnation", "closures": [[ids], ...], "budget_s"}`` + for each closure
                its pickle and this worker's element of each ``PerWorkerValues`` it refers to
                (``ids``): runs them in order and replies ``{"outcomes": [...]}``, one per
                closure: ``{"result": true, "seconds": s}`` (its result, data: ``results``, is
                the next buffer), ``{"error": report, "ps_task": i | null, "seconds": s}``, or
                ``{"skipped": true}`` (not run) for those after a closure that raised or once
                the request ran ``budget_s`` (when given).
==============  ================================================================================

A function's pushes are held (``runtime.held_pushes``): when another Run request waits, its
first pulls carry them to the ps tasks, which apply them before they read; otherwise they are
sent before the reply, so that once ``join`` returns every push was applied.

Every request names the incarnation of the server it was meant for (``Ping`` tells it): a
worker that restarted since replies ``{"restarted": true}`` and the coordinator makes its
resources again. An error of the function travels inside the reply, with the remote traceback
(``remote_errors``); only a failed RPC means that the worker is gone.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections.abc import Iterator
from typing import Any

from feedline._net.remote_errors import error_report
from feedline._net.rpc import field
from feedline.distribute.input_context import InputContext
from feedline.distribute.parameter_server import closures, results, variables
from feedline.distribute.parameter_server.runtime import Runtime, failed_ps_task, held_pushes
from feedline.errors import FailedPreconditionError, InvalidArgumentError, OutOfRangeError

__all__ = ["ClosureExecutor", "current_worker"]

_local = threading.local()


def current_worker() -> tuple[int, int] | None:
    """``(worker index, number of workers)`` while this thread runs a coordinator's function or
    makes a per-worker resource; else None."""
    return getattr(_local, "worker", None)


@contextlib.contextmanager
def _as_worker(index: int, count: int) -> Iterator[None]:
    previous = current_worker()
    _local.worker = (index, count)
    try:
        yield
    finally:
        _local.worker = previous


class ClosureExecutor:
    """The per-worker resources of one worker server and the functions it runs."""

    def __init__(self, index: int, num_workers: int, incarnation: str, address: str) -> None:
        self._index = index
        self._num_workers = num_workers
        self._incarnation = incarnation
        self._address = address
        self._resources: dict[int, Any] = {}
        self._lock = threading.Lock()  # one function at a time
        self._waiting_lock = threading.Lock()
        self._waiting = 0  # Run requests here, running or waiting to

    def handlers(self) -> dict[str, Any]:
        return {"CreateResource": self._create_resource, "Run": self._run}

    def _restarted(self, header: dict[str, Any]) -> bool:
        return field(header, "incarnation", str) != self._incarnation

    def _create_resource(
        self, header: dict[str, Any], buffers: list[memoryview]
    ) -> tuple[dict[str, Any], list[Any]]:
        if self._restarted(header):
            return {"restarted": True}, []
        ident = field(header, "id", int)
        kind = field(header, "kind", str)
        with self._lock, _as_worker(self._index, self._num_workers):
            try:
                if kind == "dataset":
                    self._resources[ident] = self._make_dataset(closures.loads(buffers[0])[0])
                elif kind == "iterator":
                    source = field(header, "source", int)
                    if source not in self._resources:
                        raise FailedPreconditionError(
                            f"per-worker dataset {source} could not be made on this worker (its "
                            "function raised: see the first error), so it has no iterator"
                        )
                    self._resources[ident] = iter(self._resources[source])
                else:
                    raise InvalidArgumentError(f"malformed request: resource kind {kind!r}")
            except Exception as error:
                return self._failure(error), []
        return {}, []

    def _make_dataset(self, source: Any) -> Any:
        if not callable(source):
            return source
        try:
            takes_context = len(inspect.signature(source).parameters) == 1
        except (TypeError, ValueError):
            takes_context = False
        if takes_context:
            return source(InputContext(self._num_workers, self._index, 1))
        return source()

    def _run(
        self, header: dict[str, Any], buffers: list[memoryview]
    ) -> tuple[dict[str, Any], list[Any]]:
        if self._restarted(header):
            return {"restarted": True}, []
        batch = field(header, "closures", list)
        budget = field(header, "budget_s", (int, float), None)
        if not all(isinstance(ids, list) for ids in batch) or len(buffers) != sum(
            len(ids) + 1 for ids in batch
        ):
            raise InvalidArgumentError(
                "malformed request: one buffer per closure and per value it refers to"
            )
        outcomes: list[dict[str, Any]] = []
        replies: list[Any] = []
        parts = iter(buffers)
        failed = False
        ran = 0.0  # seconds the functions took
        with self._waiting_lock:
            self._waiting += 1
        try:
            for ids in batch:
                data = next(parts)
                value_buffers = [next(parts) for _ in ids]
                if failed or (budget is not None and ran > budget):
                    # An earlier closure raised (the coordinator cancels this one), or the
                    # request took its time (the coordinator queues this one again).
                    outcomes.append({"skipped": True})
                    continue
                outcome, reply = self._run_one(data, ids, value_buffers)
                ran += outcome["seconds"]
                failed = "error" in outcome
                outcomes.append(outcome)
                replies += reply
        finally:
            with self._waiting_lock:
                self._waiting -= 1
        self._flush_unless_waited_for(outcomes, replies)
        return {"outcomes": outcomes}, replies

    def _flush_unless_waited_for(self, outcomes: list[dict[str, Any]], replies: list[Any]) -> None:
        """Sends the pushes the functions held (``runtime.held_pushes``) unless another
        request waits to run here (its first pull carries them); a push that fails fails the
        last function that ran. That request may be running already, so the lock is taken
        only when none waits: the reply does not wait for the next function to end."""
        if self._others_wait():
            return
        with self._lock:
            if self._others_wait():
                return
            try:
                for runtime in Runtime.every():
                    runtime.flush()
            except Exception as error:
                ran = [o for o in outcomes if "skipped" not in o]
                if ran and "result" in ran[-1]:
                    ran[-1].clear()
                    ran[-1].update(self._failure(error))
                    replies.pop()

    def _others_wait(self) -> bool:
        with self._waiting_lock:
            return self._waiting > 0

    def _run_one(
        self, data: memoryview, ids: list[Any], buffers: list[memoryview]
    ) -> tuple[dict[str, Any], list[Any]]:
        with self._lock, _as_worker(self._index, self._num_workers):
            start = time.perf_counter()
            outcome, reply = self._call(data, ids, buffers)
            outcome["seconds"] = time.perf_counter() - start
            return outcome, reply

    def _call(
        self, data: memoryview, ids: list[Any], buffers: list[memoryview]
    ) -> tuple[dict[str, Any], list[Any]]:
        """Under ``_lock``: loads the closure and runs it; its outcome and result."""
        try:
            values = {
                ident: closures.loads(buffer, self._resources)
                for ident, buffer in zip(ids, buffers, strict=True)
            }
            fn, args, kwargs = closures.ClosureUnpickler(
                bytes(data), self._resources, values
            ).load()
            with variables.step(), held_pushes():
                try:
                    result = fn(*args, **kwargs)
                except StopIteration as error:  # not to be mistaken for the caller's
                    raise OutOfRangeError(
                        "a per-worker iterator read by the function reached its end; "
                        "repeat() the per-worker dataset, or schedule fewer steps"
                    ) from error
            return {"result": True}, [results.dumps(result)]
        except Exception as error:
            return self._failure(error), []

    def _failure(self, error: BaseException) -> dict[str, Any]:
        return {
            "error": error_report(error, worker=self._address),
            "ps_task": failed_ps_task(error),
        }
