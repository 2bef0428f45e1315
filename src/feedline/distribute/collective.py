"""Collectives across worker processes, on ``torch.distributed``.

``Collective`` joins (or adopts) the default process group of one synchronous cluster and offers
the few collectives strategies need: sums, variable-size gathers, broadcasts and the end-of-data
agreement. gloo carries CPU tensors, NCCL CUDA tensors; feedline adds no transport of its own.

Nothing waits for ever: every collective honours the group's timeout, and a collective that
fails (a peer died, stalled past the timeout or could not be reached) raises ``UnavailableError``
naming the workers that stopped answering. Each process keeps a heartbeat key in the group's
store (one write a second, from a daemon thread) so that a survivor can tell a dead peer from a
slow one. A worker that fails on its own (an exception in ``watch_preemption_scope``) can
leave its error there too, so that the others' errors say what happened to it.

There is one synchronous cluster per process, as there is one default process group:
``active()`` returns the ``Collective`` of the strategy made last (None outside a cluster), so
that checkpoints and fault-tolerance helpers reach the cluster their process belongs to.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from feedline.errors import FailedPreconditionError, UnavailableError

T = TypeVar("T")

DEFAULT_TIMEOUT_SECONDS = 300.0
"""How long a collective (the end-of-data agreement included) waits for the slowest worker by
default: well below torch's 30 minutes, so that a stalled peer surfaces as an error."""

_HEARTBEAT_SECONDS = 1.0
_STALE_SECONDS = 5.0
_STORE_SECONDS = 2.0  # a heartbeat write never blocks longer than this
_DRAIN_SECONDS = 0.2  # at exit, for the backend's threads to let go of the last collective

_active: Collective | None = None


def active() -> Collective | None:
    """The collective of the synchronous cluster this process is a worker of, or None."""
    return _active


def _activate(collective: Collective | None) -> None:
    """Makes ``collective`` the one ``active()`` returns (a strategy's, when it forms)."""
    global _active
    _active = collective


_MEET_POLL_SECONDS = 0.02


def _meeting_generation(store: dist.Store, rank: int, world_size: int, timeout_s: float) -> int:
    """Which start of the group this is, the same number on every worker of it.

    torchrun's agents keep one store across every round of their rendezvous, so each start of
    the workers must meet under keys of its own. An agent's restart count does not name the
    start: an agent that joined in a later round counts fewer restarts than one that was there
    before. So rank 0 of this start takes the next number of the store's counter, and tells
    each other rank in answer to a question that carries a token only that rank knows (a
    worker of an earlier start, long gone, left its own): every worker of this start, and
    only they, learn the same number. Bounded by ``timeout_s``.

    Raises:
      UnavailableError: the other workers (or rank 0) did not answer within ``timeout_s``.
    """
    prefix = f"feedline/{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}/meet"
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        generation = int(store.add(f"{prefix}/generation", 1))
        answered: dict[int, str] = {}
        waiting = set(range(1, world_size))
        while waiting:
            for peer in sorted(waiting):
                question = f"{prefix}/ask/{peer}"
                if store.check([question]):
                    token = store.get(question).decode()
                    if answered.get(peer) != token:
                        store.set(f"{prefix}/answer/{peer}", f"{token}:{generation}")
                        answered[peer] = token
                if store.check([f"{prefix}/{generation}/heard/{peer}"]):
                    waiting.discard(peer)
            if waiting and time.monotonic() > deadline:
                raise UnavailableError(
                    f"worker 0 of {world_size}: workers {sorted(waiting)} of this start of the "
                    f"group did not come to torchrun's store within {timeout_s:g} s"
                )
            time.sleep(_MEET_POLL_SECONDS if waiting else 0)
        return generation
    token = uuid.uuid4().hex
    store.set(f"{prefix}/ask/{rank}", token)
    answer = f"{prefix}/answer/{rank}"
    while True:
        if store.check([answer]):
            mine, _, told = store.get(answer).decode().partition(":")
            if mine == token:
                store.set(f"{prefix}/{told}/heard/{rank}", "1")
                return int(told)
        if time.monotonic() > deadline:
            raise UnavailableError(
                f"worker {rank} of {world_size}: worker 0 of this start of the group did not "
                f"answer in torchrun's store within {timeout_s:g} s"
            )
        time.sleep(_MEET_POLL_SECONDS)


class Collective:
    """The default process group of a synchronous cluster, as one worker of it sees it.

    Args:
      rank: this worker's rank (chief 0, then workers in order).
      world_size: the number of workers stepping together.
      host, port: the rendezvous address (the chief's, else worker 0's).
      backend: ``"gloo"`` or ``"nccl"``.
      timeout_seconds: how long a rendezvous or collective may wait.
      addresses: each rank's address as the cluster describes it, for error messages.
      use_env: rendezvous through torchrun's environment (``env://``, its agent's store).
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        host: str,
        port: int,
        backend: str,
        timeout_seconds: float,
        addresses: Sequence[str] = (),
        use_env: bool = False,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.timeout_seconds = timeout_seconds
        self._rendezvous = f"{host}:{port}"
        self._addresses = list(addresses) or [f"rank {r}" for r in range(world_size)]
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )
        self._broken: UnavailableError | None = None
        timeout = datetime.timedelta(seconds=timeout_seconds)
        self._adopted = dist.is_initialized()
        # The keys of this start of the group in the rendezvous store: rank 0 hosts a new store
        # for each start, except torchrun's agent store, which outlives the starts (below; a
        # group the program made itself keeps its agent's restart count).
        self._generation = (
            os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") if self._adopted else "0"
        )
        if self._adopted:
            self._adopt()
        else:
            init_method = "env://" if use_env else f"tcp://{host}:{port}"
            try:
                if use_env and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
                    # torchrun's agent keeps one store across the restarts of its workers:
                    # each start meets under its own keys, never an earlier start's.
                    agent_store = dist.TCPStore(
                        host, port, world_size, is_master=False, timeout=timeout
                    )
                    self._generation = str(
                        _meeting_generation(agent_store, rank, world_size, timeout_seconds)
                    )
                    dist.init_process_group(
                        backend,
                        store=dist.PrefixStore(f"feedline/{self._generation}/", agent_store),
                        rank=rank, world_size=world_size, timeout=timeout,
                    )  # fmt: skip
                else:
                    dist.init_process_group(
                        backend, init_method=init_method, rank=rank, world_size=world_size,
                        timeout=timeout,
                    )  # fmt: skip
            except (RuntimeError, ValueError, OSError) as error:
                raise UnavailableError(
                    f"worker {rank} of {world_size} could not join the others at the rendezvous "
                    f"address {self._rendezvous} within {timeout_seconds:g} s (cluster: "
                    f"{self._describe_all()}): {error}"
                ) from error
        self._store = self._heartbeat_store(host, port, use_env)
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None
        if self._store is not None and world_size > 1:
            self._beater = threading.Thread(
                target=self._beat, name=f"feedline-heartbeat-{rank}", daemon=True
            )
            self._beater.start()
        atexit.register(self.close)
        global _active
        _active = self

    def _adopt(self) -> None:
        """Uses a process group the program made itself, if it matches the cluster."""
        if dist.get_world_size() != self.world_size or dist.get_rank() != self.rank:
            raise FailedPreconditionError(
                f"a torch.distributed process group already exists with rank "
                f"{dist.get_rank()} of {dist.get_world_size()}, but the cluster resolver says "
                f"rank {self.rank} of {self.world_size}; initialise it with the same cluster, or "
                "let the strategy initialise it"
            )
        self.backend = str(dist.get_backend())

    # -- heartbeats ------------------------------------------------------------------------
    def _heartbeat_store(self, host: str, port: int, use_env: bool) -> dist.Store | None:
        try:
            store = dist.TCPStore(
                host, port, is_master=False, timeout=datetime.timedelta(seconds=_STORE_SECONDS),
                wait_for_workers=False,
            )  # fmt: skip
        except (RuntimeError, ValueError, OSError):
            return None  # heartbeats only sharpen error messages; training does not need them
        return dist.PrefixStore(f"feedline/heartbeat/{self._generation}/", store)

    def _beat(self) -> None:
        store = self._store
        assert store is not None
        while True:  # the first beat at once: a worker lost in its first second is told too
            try:
                store.set(str(self.rank), repr(time.time()))
            except Exception:  # the store's host is gone; the next collective reports it
                return
            if self._stop.wait(_HEARTBEAT_SECONDS):
                return

    def _silent_peers(self) -> list[int] | None:
        """Ranks whose heartbeat stopped, or None when the store itself cannot be reached
        (its host, rank 0, is gone)."""
        if self._store is None:
            return []
        now = time.time()
        silent = []
        try:
            self._store.set_timeout(datetime.timedelta(seconds=2))
            for peer in range(self.world_size):
                if peer == self.rank:
                    continue
                if not self._store.check([str(peer)]):
                    continue  # it never beat (an early failure): say nothing of it
                if now - float(self._store.get(str(peer)).decode()) > _STALE_SECONDS:
                    silent.append(peer)
        except (RuntimeError, OSError, ValueError):
            return None
        return silent

    # -- errors ----------------------------------------------------------------------------
    def _describe(self, rank: int) -> str:
        return f"worker {rank} ({self._addresses[rank]})"

    def _describe_all(self) -> str:
        return ", ".join(self._describe(r) for r in range(self.world_size))

    def report_error(self, message: str) -> None:
        """Leaves ``message`` (this worker's own failure) where the others' errors will read it."""
        if self._store is None:
            return
        try:
            self._store.set(f"error/{self.rank}", message)
        except (RuntimeError, OSError, ValueError):
            return  # the store's host is gone; the others see that this worker stopped

    def _reported_errors(self) -> list[str]:
        """What peers reported of their own failures (``report_error``)."""
        if self._store is None:
            return []
        found = []
        try:
            for peer in range(self.world_size):
                key = f"error/{peer}"
                if peer != self.rank and self._store.check([key]):
                    found.append(f"{self._describe(peer)} failed: {self._store.get(key).decode()}")
        except (RuntimeError, OSError, ValueError):
            return found
        return found

    def _failure(self, what: str, error: BaseException) -> UnavailableError:
        time.sleep(min(_STALE_SECONDS + _HEARTBEAT_SECONDS, self.timeout_seconds / 2))
        reported = self._reported_errors()
        silent = self._silent_peers()
        if silent is None:
            who = f"the rendezvous host {self._describe(0)} is unreachable: it has probably stopped"
        elif silent:
            who = "stopped answering: " + ", ".join(self._describe(r) for r in silent)
        else:
            who = (
                "no peer's process stopped; one stalled past the timeout of "
                f"{self.timeout_seconds:g} s or lost its connection (cluster: "
                f"{self._describe_all()})"
            )
        if reported:
            who = "; ".join(reported) + f" ({who})"
        return UnavailableError(
            f"worker {self.rank}: {what} across {self.world_size} workers failed; {who}. "
            f"Cause: {error}"
        )

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        if self._broken is not None:
            raise self._broken
        try:
            return fn()
        except (RuntimeError, OSError) as error:  # DistBackendError and DistNetworkError
            self._broken = self._failure(what, error)
            raise self._broken from error

    # -- collectives -----------------------------------------------------------------------
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The elementwise sum over workers (a new tensor on ``tensor``'s device)."""
        work = tensor.detach().to(self.device, copy=True)
        self._call("an all-reduce", lambda: dist.all_reduce(work))
        return work.to(tensor.device)

    def all_reduce_async(self, tensor: torch.Tensor) -> dist.Work:
        """Starts summing ``tensor`` in place over workers; ``wait(work)`` finishes it."""
        return self._call("an all-reduce", lambda: dist.all_reduce(tensor, async_op=True))

    def wait(self, work: dist.Work) -> None:
        self._call("an all-reduce", work.wait)

    def agree(self, local_has_data: bool) -> bool:
        """Whether any worker still has data: one small all-reduce, the same answer everywhere."""
        flag = torch.tensor([1 if local_has_data else 0], dtype=torch.int32, device=self.device)
        self._call("the end-of-data agreement", lambda: dist.all_reduce(flag))
        return bool(flag.item())

    def agree_any(self, flags: Sequence[bool], what: str) -> tuple[bool, ...]:
        """For each flag, whether any worker set it: one small all-reduce."""
        counts = self.flags_tensor(flags)
        self._call(what, lambda: dist.all_reduce(counts))
        return tuple(bool(c) for c in counts.tolist())

    def start_agree_any(self, flags: Sequence[bool], what: str) -> Callable[[], tuple[bool, ...]]:
        """``agree_any`` in the background: returns the function that waits for the answer."""
        counts = self.flags_tensor(flags)
        work = self._call(what, lambda: dist.all_reduce(counts, async_op=True))

        def answer() -> tuple[bool, ...]:
            self._call(what, work.wait)
            return tuple(bool(c) for c in counts.tolist())

        return answer

    def flags_tensor(self, flags: Sequence[bool]) -> torch.Tensor:
        return torch.tensor([int(bool(f)) for f in flags], dtype=torch.int32, device=self.device)

    def all_gather_object(self, obj: Any, what: str = "an all-gather of objects") -> list[Any]:
        """Every worker's picklable ``obj``, in rank order."""
        gathered: list[Any] = [None] * self.world_size
        self._call(what, lambda: dist.all_gather_object(gathered, obj))
        return gathered

    def broadcast_object(self, obj: Any, src: int = 0, what: str = "a broadcast") -> Any:
        """Rank ``src``'s picklable ``obj`` on every worker (the others' ``obj`` is ignored)."""
        box = [obj]
        self._call(what, lambda: dist.broadcast_object_list(box, src))
        return box[0]

    def broadcast(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        """Copies ``tensors`` from rank ``src`` into every worker's tensors, in place."""
        for tensor in tensors:
            if tensor.device == self.device:
                self._call("a broadcast", functools.partial(dist.broadcast, tensor, src))
            else:
                staged = tensor.detach().to(self.device)
                self._call("a broadcast", functools.partial(dist.broadcast, staged, src))
                with torch.no_grad():
                    tensor.copy_(staged)

    def all_gather(self, tensor: torch.Tensor, axis: int) -> torch.Tensor:
        """Every worker's ``tensor`` concatenated along ``axis`` in rank order; sizes along
        ``axis`` may differ (empty batches included)."""
        local = tensor.detach().to(self.device)
        size = torch.tensor([local.shape[axis]], dtype=torch.int64, device=self.device)
        sizes = [torch.zeros_like(size) for _ in range(self.world_size)]
        self._call("an all-gather", lambda: dist.all_gather(sizes, size))
        counts = [int(s.item()) for s in sizes]
        longest = max(counts)
        pad = list(local.shape)
        pad[axis] = longest - local.shape[axis]
        padded = torch.cat([local, local.new_zeros(pad)], dim=axis).contiguous()
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        self._call("an all-gather", lambda: dist.all_gather(parts, padded))
        trimmed = [p.narrow(axis, 0, n) for p, n in zip(parts, counts, strict=True)]
        return torch.cat(trimmed, dim=axis).to(tensor.device)

    def barrier(self) -> None:
        self._call("a barrier", lambda: dist.barrier())

    def close(self) -> None:
        """Stops the heartbeat and destroys the process group if this object made it (at exit
        too: a store or a gloo pair torn down during interpreter shutdown aborts the process)."""
        global _active
        atexit.unregister(self.close)
        if _active is self:
            _active = None
        if dist.is_initialized() and self.world_size > 1:
            # A gloo thread lets go of a collective's tensors just after the collective
            # completes. If that happens once the interpreter is finalizing (the program's last
            # collective, then its end), releasing a tensor made in Python cannot take the GIL
            # and the process aborts ("terminate called without an active exception"). Give
            # those threads the moment they need while Python is whole.
            time.sleep(_DRAIN_SECONDS)
        self._stop.set()
        if self._beater is not None:
            # The thread must be out of the store's C++ code before the interpreter ends.
            self._beater.join(timeout=5 * _STORE_SECONDS)
        self._store = None
        if not self._adopted and dist.is_initialized():
            dist.destroy_process_group()
