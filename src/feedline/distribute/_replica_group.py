"""Local replicas that hand over at collectives: ``ReplicaContext.all_reduce`` inside
``strategy.run`` with several replicas in one process.

``strategy.run`` calls its function once per local replica. A function that calls no collective
runs for each replica in turn, in the calling thread, as if no collective existed. The first
time replica 0 calls one (``all_reduce``, ``all_gather``, ``merge_call``), the run becomes a
*hand-over*: each other replica gets a thread, but only one replica runs at a time, in replica
order, and the turn passes at collectives. A replica that arrives at a collective puts down its
value, hands the turn to the next replica and waits; the last one to arrive combines every
replica's value, and the replicas resume in order, each with its own result. Between turns the
mirrored models' per-replica state (gradients, buffers, parameter data) is swapped out and in
(``ReplicaStates``), so each replica computes on its own values only.

Two replicas that each call ``all_reduce`` once::

    turn   replica 0 (the caller's thread)      replica 1 (a thread started at turn 2)
    1      runs to all_reduce, hands over
    2                                           runs to all_reduce: the last, combines
    3      resumes with the sum, returns
    4                                           resumes with the sum, returns

Every replica must call the same collectives, in the same order, with the same reduce op and
structure; anything else is a ``FailedPreconditionError`` naming both calls, raised in every
replica instead of a hang. An exception in one replica ends the run: the replicas waiting at a
collective are unwound (their collective raises ``ReplicaAborted``, which ``except Exception``
does not catch) and ``run`` raises the original exception, its traceback intact.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import optree
import torch

from feedline.errors import FailedPreconditionError

# How often a waiting replica checks that the replica holding the turn is still alive.
_POLL_SECONDS = 1.0
# How long a failed run waits for the other replicas' threads to unwind.
_JOIN_SECONDS = 30.0


# Where the caller's autocast reaches the replicas' threads.
_AUTOCAST_DEVICES = ("cpu", "cuda")
# A run that calls no collective never waits: its group has no condition of its own.
_NO_CONDITION = threading.Condition()


class ReplicaAborted(BaseException):
    """Raised in a replica waiting at a collective when another replica failed: unwinds the
    replica's function. ``run`` raises the other replica's exception instead."""


class ReplicaStates(Protocol):
    """What a hand-over needs from the mirrored models (``mirroring.Mirroring``)."""

    def before_replica(self, local_replica: int) -> None: ...

    def after_replica(self, local_replica: int) -> None: ...

    def begin_isolation(self) -> None: ...

    def suspend_replica(self, local_replica: int) -> None: ...

    def resume_replica(self, local_replica: int) -> None: ...

    def start_isolated_replica(self, local_replica: int) -> None: ...

    def end_isolation(self, reduced: set[int]) -> None: ...

    def abort_isolation(self) -> None: ...


@dataclasses.dataclass(frozen=True, eq=False)
class Collective:
    """One replica's call of a collective.

    Attributes:
      name: the method, e.g. ``"all_reduce"``.
      key: what every replica must pass alike (the reduce op, the axis, the merge function).
      value: this replica's value.
      combine: every local replica's value, in replica order -> each replica's result.
      reduces: whether the results are sums or means over replicas (a gradient that is one is
        used by a mirrored optimizer as it is, not summed again).
    """

    name: str
    key: Any
    value: Any
    combine: Callable[[list[Any]], list[Any]]
    reduces: bool = False

    def agrees_with(self, other: Collective) -> bool:
        if self.name != other.name or self.key != other.key:
            return False
        if self.name == "merge_call":
            return True
        return optree.tree_structure(self.value, none_is_leaf=True) == optree.tree_structure(
            other.value, none_is_leaf=True
        )

    def describe(self) -> str:
        if self.name == "merge_call":
            return f"merge_call({getattr(self.key, '__qualname__', self.key)})"
        shape = optree.tree_structure(self.value, none_is_leaf=True)
        return f"{self.name}({self.key!r}, {shape})"


class ReplicaGroup:
    """One ``strategy.run`` over ``num_local`` replicas (see the module docstring).

    Args:
      num_local: the local replicas.
      call: runs the user's function as replica ``local`` of this group, in its replica scope.
      states: the mirrored models' per-replica state, or None where nothing is mirrored.
    """

    def __init__(
        self,
        num_local: int,
        call: Callable[[ReplicaGroup, int], Any],
        states: ReplicaStates | None,
    ) -> None:
        self._n = num_local
        self._call = call
        self._states = states
        # made when replica 0 first calls a collective: a run without collectives needs neither
        self._cond: threading.Condition = _NO_CONDITION
        self._context: contextvars.Context | None = None
        self._threaded = False
        self._turn: int | None = 0
        self._threads: dict[int, threading.Thread] = {}
        self._done = [False] * num_local
        self._results: list[Any] = [None] * num_local
        self._calls = [0] * num_local
        self._pending: dict[int, Collective] = {}
        self._outcome: dict[int, Any] = {}
        self._reduced: list[Any] = []  # results of reducing collectives, kept alive for their ids
        self._error: BaseException | None = None
        self._grad_enabled = torch.is_grad_enabled()
        self._inference = torch.is_inference_mode_enabled()
        self._autocast = [
            (device, torch.get_autocast_dtype(device))
            for device in _AUTOCAST_DEVICES
            if torch.is_autocast_enabled(device)
        ]

    # -- the caller's thread ---------------------------------------------------------------
    def run(self) -> list[Any]:
        """Runs every replica; returns their results in replica order."""
        for local in range(self._n):
            if self._states is not None:
                self._states.before_replica(local)
            try:
                result = self._call(self, local)
            except ReplicaAborted:
                self._stop()
                assert self._error is not None
                raise self._error from None
            except BaseException as error:
                if self._threaded:
                    with self._cond:
                        self._fail(error, local)
                    self._stop()
                raise
            if self._threaded:  # replica 0 called a collective: the others run in threads
                self._finish_threaded(local, result)
                return self._results
            if self._states is not None:
                self._states.after_replica(local)
            self._results[local] = result
        return self._results

    def _finish_threaded(self, local: int, result: Any) -> None:
        with self._cond:
            if not self._finish(local, result):
                error = self._error
            else:
                error = self._wait(lambda: all(self._done))
        if error is not None:
            self._stop()
            raise error
        for thread in self._threads.values():
            thread.join(_JOIN_SECONDS)
        if self._states is not None:
            self._states.end_isolation({id(t) for t in self._reduced})

    def _stop(self) -> None:
        """After a failure: lets every waiting replica unwind, and puts the step's state back."""
        with self._cond:
            self._cond.notify_all()
        for thread in self._threads.values():
            thread.join(_JOIN_SECONDS)
        if self._states is not None and self._threaded:
            self._states.abort_isolation()

    # -- collectives -----------------------------------------------------------------------
    def collective(self, local: int, request: Collective) -> Any:
        """Replica ``local``'s call of a collective; returns its result."""
        if self._n == 1:
            return self._keep(request, request.combine([request.value]))[0]
        if not self._threaded:  # the caller's thread is the only one yet
            if local != 0:
                earlier = "replica 0" if local == 1 else f"replicas 0 to {local - 1}"
                raise FailedPreconditionError(
                    f"replica {local} called {request.describe()}, but {earlier} returned "
                    "without calling it: every replica must call the same collectives in "
                    "the same order"
                )
            self._cond = threading.Condition()
            self._context = contextvars.copy_context()
            self._threaded = True
            if self._states is not None:
                self._states.begin_isolation()
        with self._cond:
            if self._error is not None:
                raise ReplicaAborted
            self._check_arrival(local, request)
            self._calls[local] += 1
            self._pending[local] = request
            if local == self._n - 1:
                values = [self._pending[r].value for r in range(self._n)]
                self._pending = {}
                try:
                    self._outcome = dict(enumerate(self._keep(request, request.combine(values))))
                except BaseException as error:
                    self._fail(error, local)
                    raise
            if self._states is not None:
                self._states.suspend_replica(local)
            self._pass_turn(local)
            if self._wait(lambda: self._turn == local) is not None:
                raise ReplicaAborted
            if self._states is not None:
                self._states.resume_replica(local)
            return self._outcome.pop(local)

    def _keep(self, request: Collective, results: list[Any]) -> list[Any]:
        """Remembers the results of a reducing collective (``end_isolation`` asks for them)."""
        if request.reduces:
            tree: Any = results
            self._reduced.extend(optree.tree_leaves(tree, none_is_leaf=True))
        return results

    def _check_arrival(self, local: int, request: Collective) -> None:
        index = self._calls[local] + 1
        finished = [r for r in range(self._n) if self._done[r]]
        if finished:
            other = finished[0]
            self._mismatch(
                local,
                f"replica {local} called {request.describe()} (its collective #{index}), but "
                f"replica {other} returned after {self._calls[other]} collectives",
            )
        if self._pending:
            other = min(self._pending)
            first = self._pending[other]
            if not first.agrees_with(request):
                self._mismatch(
                    local,
                    f"replica {other} called {first.describe()} as its collective #{index}, but "
                    f"replica {local} called {request.describe()}",
                )

    def _mismatch(self, local: int, message: str) -> None:
        error = FailedPreconditionError(
            f"{message}: every replica must call the same collectives in the same order, with "
            "the same reduce op and structure"
        )
        self._fail(error, local)
        raise error

    # -- turns -----------------------------------------------------------------------------
    def _pass_turn(self, local: int) -> None:
        """Gives the turn to the next replica still running (starting its thread the first
        time), or to nobody once every replica returned."""
        following = [(local + k) % self._n for k in range(1, self._n + 1)]
        upcoming = [r for r in following if not self._done[r]]
        self._turn = upcoming[0] if upcoming else None
        if self._turn is not None and self._turn != 0 and self._turn not in self._threads:
            assert self._context is not None
            thread = threading.Thread(
                target=self._context.copy().run,
                args=(self._replica_thread, self._turn),
                name=f"feedline-replica-{self._turn}",
                daemon=True,
            )
            self._threads[self._turn] = thread
            thread.start()
        self._cond.notify_all()

    def _wait(self, ready: Callable[[], bool]) -> BaseException | None:
        """Waits (the lock held) until ``ready()`` or a failure; returns the failure. Checks
        every second that the replica holding the turn is alive, so a wait cannot outlive it."""
        while not ready() and self._error is None:
            self._cond.wait(_POLL_SECONDS)
            holder = self._threads.get(self._turn) if self._turn is not None else None
            if holder is not None and not holder.is_alive() and not ready():
                self._fail(
                    FailedPreconditionError(
                        f"replica {self._turn}'s thread ended without returning or raising"
                    ),
                    self._turn,
                )
        return self._error

    def _finish(self, local: int, result: Any) -> bool:
        """Replica ``local`` returned (the lock held); False if that breaks the collectives."""
        if self._pending:
            other = min(self._pending)
            error = FailedPreconditionError(
                f"replica {local} returned after {self._calls[local]} collectives, but replica "
                f"{other} waits in {self._pending[other].describe()} (its collective "
                f"#{self._calls[other]}): every replica must call the same collectives in the "
                "same order"
            )
            self._fail(error, local)
            return False
        if self._states is not None:
            self._states.after_replica(local)
            self._states.suspend_replica(local)
        self._results[local] = result
        self._done[local] = True
        self._pass_turn(local)
        return True

    def _fail(self, error: BaseException, local: int | None) -> None:
        """Records the run's first failure (the lock held) and wakes every replica."""
        if self._error is None:
            if local is not None:
                error.add_note(f"(raised in replica {local} of strategy.run)")
            self._error = error
        self._turn = None
        self._cond.notify_all()

    # -- the other replicas' threads -------------------------------------------------------
    def _replica_thread(self, local: int) -> None:
        with self._cond:
            if self._wait(lambda: self._turn == local) is not None:
                return
        try:
            with self._torch_modes():
                if self._states is not None:
                    self._states.start_isolated_replica(local)
                result = self._call(self, local)
        except ReplicaAborted:
            return
        except BaseException as error:
            with self._cond:
                self._fail(error, local)
            return
        with self._cond:
            self._finish(local, result)

    @contextlib.contextmanager
    def _torch_modes(self) -> Iterator[None]:
        """The caller's autograd and autocast modes, which torch keeps per thread."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode(self._inference))
            stack.enter_context(torch.set_grad_enabled(self._grad_enabled))
            for device, dtype in self._autocast:
                stack.enter_context(torch.autocast(device, dtype=dtype))
            yield
