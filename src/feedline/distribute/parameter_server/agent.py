"""``WorkerAgent``: the coordinator's threads for one ``worker`` task.

It takes scheduled functions from the coordinator's ``ClosureQueue``, makes the worker's
per-worker datasets and iterators first (again after the worker restarted: every request names
the incarnation it was meant for), sends the function, and hands its outcome back to the queue
(which resolves its ``RemoteValue``). It keeps ``IN_FLIGHT`` requests sent to the worker, which
runs their functions one at a time: the next request waits on the worker while the current one
runs. A request carries one function, or several queued short ones (up to ``MAX_BATCH``, about
``BATCH_S`` of the worker's time at what its functions took lately, and no more than the
worker's share of those queued): one round trip for all. The worker runs none after one that
raised (those are cancelled, as queued ones are), nor any once the request ran ``BATCH_S``
(those go back to the front of the queue, for any worker). A call that fails means the worker
is gone: its functions (and those of the other request in flight) go back to the front of the
queue, and the agent tries the worker every ``RETRY_S`` on a fresh channel until it answers
again. A call's deadline is ``function_timeout`` for each
function ahead of it on the worker, its own included.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from feedline._net import exit as _exit
from feedline._net import rpc as _rpc
from feedline._net.remote_errors import error_from_report
from feedline.distribute.parameter_server import closures, results
from feedline.distribute.parameter_server.closure_queue import Closure, ClosureQueue
from feedline.distribute.parameter_server.protocol import SERVICE_NAME
from feedline.distribute.parameter_server.resources import ResourceRegistry
from feedline.distribute.parameter_server.runtime import ParameterServerUnavailableError
from feedline.errors import InvalidArgumentError, UnavailableError

__all__ = ["BATCH_S", "IN_FLIGHT", "MAX_BATCH", "RETRY_S", "WorkerAgent"]

#: How often an unreachable worker is tried.
RETRY_S = 0.2
#: How many requests one worker is sent at a time. It runs them one after the other; the
#: next one waits on the worker, so no round trip to the coordinator separates them.
IN_FLIGHT = 2
#: How long a lane waits for a function before it makes the worker's new resources.
_IDLE_S = 0.1
#: Queued functions that one request may carry, and about how many seconds of the worker's
#: time: short functions travel several to a request (one round trip, one frame, for all),
#: long ones (a training step) one at a time, so that no worker takes work another could run.
MAX_BATCH = 64
BATCH_S = 0.002


class WorkerAgent:
    """Sends one worker its functions, ``IN_FLIGHT`` at a time, and follows it through
    restarts.

    Each of its ``IN_FLIGHT`` threads (lanes) takes a function from ``queue`` and sends it; the
    worker runs them one at a time, so while one runs the next one's request is already there.
    Until the worker has answered (at first, and after it was lost) only one lane takes a
    function to try it with, so the others leave theirs in the queue for other workers.
    Connecting and making resources happen under one lock, once for all lanes.

    Args:
      queue: the coordinator's scheduled functions.
      resources: the per-worker datasets and iterators to make on the worker.
      index: the worker's task index.
      address: the worker's address.
      function_timeout: seconds one function may run on the worker before it counts as lost.
      peers: how many workers take from ``queue``: a request carries at most this share of
        the functions queued.
    """

    def __init__(
        self,
        queue: ClosureQueue,
        resources: ResourceRegistry,
        index: int,
        address: str,
        function_timeout: float,
        peers: int = 1,
    ) -> None:
        self._queue = queue
        self._peers = peers
        self._resources = resources
        self.index = index
        self.address = address
        self._function_timeout = function_timeout
        self._closed = threading.Event()  # set by close: the lanes end
        self._token = _rpc.resolve_token(None)
        # Under _setup: the client, the worker's incarnation, the resources made on it, and
        # whether a lane is waiting for the worker to come back.
        self._setup = threading.Lock()
        self._client = _rpc.RpcClient(address, SERVICE_NAME, self._token)
        self._incarnation: str | None = None
        self._created: set[int] = set()
        self._recovering = False
        self._known = threading.Event()  # set while the incarnation is known
        self._probe = threading.Lock()  # held by the lane that tries an unknown worker
        self._sent_lock = threading.Lock()
        self._sent = 0  # functions sent and not yet answered
        self._seconds: float | None = None  # how long a function ran on the worker, lately
        #: Since when (``time.monotonic()``) the worker has not answered; None while it does.
        self.down_since: float | None = None
        self._lanes = [
            threading.Thread(
                target=self._serve, name=f"feedline-coordinator-worker-{index}-{lane}", daemon=True
            )
            for lane in range(IN_FLIGHT)
        ]

    def start(self) -> None:
        """Starts the lanes (joined at exit once the coordinator closed, as every thread that
        calls servers: ``_net.exit``)."""
        for lane in self._lanes:
            lane.start()
            _exit.join_at_exit(lane)

    def close(self) -> None:
        """Ends the lanes and closes the connection to the worker; idempotent."""
        self._closed.set()
        self._client.close()

    def _serve(self) -> None:
        while not self._closed.is_set():
            if self._known.is_set():
                self._serve_one()
            elif not self._recovering and self._probe.acquire(blocking=False):
                try:
                    self._serve_one()
                finally:
                    self._probe.release()
            else:
                self._known.wait(RETRY_S)

    def _serve_one(self) -> None:
        """Takes functions (or waits a little for one), sends them and resolves their
        values."""
        batch = self._queue.take_batch(self._batch_limit(), timeout=_IDLE_S, share=self._peers)
        client = self._client
        try:
            if not batch:
                with self._setup:
                    if self._incarnation is not None:
                        self._make_resources()
                return
            with self._setup:
                client, incarnation = self._prepare()
            outcomes = self._execute(batch, client, incarnation)
        except UnavailableError:
            for closure in reversed(batch):  # back to the front, in their order
                self._queue.requeue(closure)
            self._recover(client)
            return
        except Exception as error:  # a per-worker dataset that cannot be made
            if self._closed.is_set():  # stopped: its channel was closed
                for closure in reversed(batch):
                    self._queue.requeue(closure)
                return
            if not batch:
                self._queue.report(error)
                return
            outcomes = [(False, error, None)]
        for closure, outcome in zip(batch, outcomes, strict=False):
            self._settle(closure, outcome)
        rest = batch[len(outcomes) :]  # not run
        if not outcomes or outcomes[-1][0]:  # the request took its time: to the front
            for closure in reversed(rest):
                self._queue.requeue(closure)
        else:  # after one that failed
            for closure in rest:
                self._queue.cancel(closure, outcomes[-1][1])

    def _batch_limit(self) -> int:
        """How many queued functions the next request may carry: about ``BATCH_S`` of the
        worker's time at the seconds its functions took lately; one until it has run some."""
        seconds = self._seconds
        if seconds is None:
            return 1
        return max(1, min(MAX_BATCH, int(BATCH_S / max(seconds, 1e-6))))

    def _settle(self, closure: Closure, outcome: tuple[bool, Any, int | None]) -> None:
        """Hands the queue what became of ``closure``: its value, or its error (a ps that
        failed under it fails the whole queue)."""
        ok, value, ps_task = outcome
        if ok:
            self._queue.finish(closure, value)
        elif ps_task is not None:
            error = ParameterServerUnavailableError(str(value), ps_task)
            error.__cause__ = value
            self._queue.abort(error, closure)
        else:
            self._queue.fail(closure, value)

    @staticmethod
    def _ping(client: _rpc.RpcClient) -> str | None:
        """The incarnation of the worker behind ``client``; ``UnavailableError`` if it does not
        answer within a second."""
        header, _ = client.call("Ping", {}, timeout=1.0)
        return header.get("incarnation")

    def _connected(self, incarnation: str | None) -> None:
        """Under ``_setup``: the worker answered; a new incarnation (a restarted worker) has
        none of its resources."""
        if incarnation != self._incarnation:
            self._created.clear()
        self._set_incarnation(incarnation)

    def _set_incarnation(self, incarnation: str | None) -> None:
        self._incarnation = incarnation
        if incarnation is None:
            self._known.clear()
        else:
            self._known.set()

    def _prepare(self) -> tuple[_rpc.RpcClient, str | None]:
        """Under ``_setup``: connects if not yet connected and makes the missing resources;
        the client and the worker's incarnation to send a function with."""
        if self._recovering:
            raise UnavailableError(f"worker {self.index} is not answering")
        if self._incarnation is None:  # not up yet: the function goes back to the queue
            self._connected(self._ping(self._client))
        self._make_resources()
        return self._client, self._incarnation

    def _make_resources(self) -> None:
        for resource in self._resources.missing(self._created):
            header, _ = self._client.upload(
                "CreateResource",
                {
                    "incarnation": self._incarnation,
                    "id": resource.ident,
                    "kind": resource.kind,
                    "source": resource.source,
                },
                [resource.payload] if resource.payload else [],
                timeout=self._function_timeout,
            )
            if header.get("restarted"):
                raise UnavailableError(f"worker {self.index} restarted")
            self._created.add(resource.ident)  # made, or failed: reported once, not retried
            if "error" in header:
                raise self._error_of(header["error"])

    def _execute(
        self, batch: list[Closure], client: _rpc.RpcClient, incarnation: str | None
    ) -> list[tuple[bool, Any, int | None]]:
        """Runs ``batch`` on the worker: the outcome of each closure it ran, in order (those
        after one that raised did not run and have none)."""
        ids = [list(closure.values) for closure in batch]
        buffers: list[Any] = []
        for closure, closure_ids in zip(batch, ids, strict=True):
            buffers.append(closure.data)
            buffers += [
                closures.dumps_value(closure.values[i].values[self.index]) for i in closure_ids
            ]
        with self._sent_lock:
            self._sent += len(batch)
            ahead = self._sent  # the worker runs the functions before these first
        try:
            header, replies = client.upload(
                "Run",
                {"incarnation": incarnation, "closures": ids, "budget_s": BATCH_S},
                buffers,
                timeout=self._function_timeout * ahead,
            )
        except Exception as error:
            if client is not self._client:  # another lane found the worker lost: closed
                raise UnavailableError(f"worker {self.index} was lost") from error
            raise
        finally:
            with self._sent_lock:
                self._sent -= len(batch)
        if header.get("restarted"):
            raise UnavailableError(f"worker {self.index} restarted")
        reported = header.get("outcomes")
        if not isinstance(reported, list) or len(reported) != len(batch):
            malformed = InvalidArgumentError("the worker's reply does not answer each function")
            return [(False, malformed, None)]
        outcomes: list[tuple[bool, Any, int | None]] = []
        results_left = iter(replies)
        took = []
        for item in reported:
            if not isinstance(item, dict) or item.get("skipped"):
                break
            if isinstance(item.get("seconds"), float | int):
                took.append(float(item["seconds"]))
            outcomes.append(self._outcome(item, results_left))
            if not outcomes[-1][0]:
                break
        if took:
            self._note_seconds(sum(took) / len(took))
        return outcomes

    def _outcome(
        self, item: dict[str, Any], results_left: Iterator[memoryview]
    ) -> tuple[bool, Any, int | None]:
        """One function's outcome from the worker's reply (its result the next buffer)."""
        if "error" in item:
            return False, self._error_of(item["error"]), item.get("ps_task")
        result = next(results_left, None)
        if result is None:
            return False, InvalidArgumentError("the worker's reply carries no result"), None
        try:  # data only (``results``): a worker's reply never runs code here
            return True, results.loads(result), None
        except InvalidArgumentError as error:
            return False, error, None

    def _note_seconds(self, seconds: float) -> None:
        """Follows how long the worker's functions take (a moving average)."""
        previous = self._seconds
        self._seconds = seconds if previous is None else 0.7 * previous + 0.3 * seconds

    def _error_of(self, report: dict[str, Any]) -> BaseException:
        """The error a function raised on this worker, with the worker's traceback as a note."""
        error = error_from_report({k: v for k, v in report.items() if k != "traceback"})
        error.__notes__ = [
            f"raised on worker {self.index} ({self.address}); the remote traceback:\n"
            f"{str(report.get('traceback', '')).rstrip()}"
        ]
        return error

    def _recover(self, failed: _rpc.RpcClient) -> None:
        """After a call on ``failed`` found the worker gone: waits until it is back, unless
        another lane already does (or brought it back on a new client)."""
        with self._setup:
            if self._client is not failed or self._recovering:
                return
            self._recovering = True
            self._set_incarnation(None)
            self.down_since = time.monotonic()
        try:
            self._wait_until_back()
        finally:  # back, or the coordinator stopped
            with self._setup:
                self._recovering = False

    def _wait_until_back(self) -> None:
        """Tries the worker every ``RETRY_S`` (on a fresh channel, free of gRPC's reconnect
        backoff) until it answers; then its resources are made again."""
        while not self._closed.is_set():
            if self._queue.aborted:
                self._closed.wait(RETRY_S)
                continue
            client = _rpc.RpcClient(self.address, SERVICE_NAME, self._token)
            try:
                incarnation = self._ping(client)
            except UnavailableError:
                client.close()
                self._closed.wait(RETRY_S)
                continue
            with self._setup:
                old, self._client = self._client, client
                self._connected(incarnation)
                self._recovering = False
                self.down_since = None
            old.close()  # after the swap: a lane whose call it ends sees it was replaced
            return
