"""Elastic membership: workers that survive a peer's loss keep their process and their state.

With an ``ElasticClusterResolver``, ``MultiWorkerMirroredStrategy`` forms its process group
from whoever meets in a *membership store* (a ``torch.distributed.TCPStore`` that outlives the
workers: ``feedline membership-store``), not from a fixed cluster. The group has a *generation*
number. When it changes, the workers that remain keep their model and optimizer in memory:

* a collective that fails (gloo raises as soon as a peer's connection closes; the group's
  timeout bounds the rest) raises ``MembershipChangedError`` at once, and this worker tears
  its group down, so that every peer waiting on it fails as fast;
* a new worker asks to join in the store; worker 0 sees the request at the start of a
  ``strategy.run`` and a small all-reduce (started one step, answered the next) tells every
  worker at the same step, where ``strategy.run`` raises ``MembershipChangedError`` before the
  step runs;
* ``strategy.reform()`` meets the others in the next generation's *round*: each arrival takes
  a number; the round closes (every participant may close it, the store's ``compare_set``
  decides once) when ``min_workers`` are there and no one arrived for ``settle_seconds``, or
  ``max_workers`` are there. Ranks go by committed steps, most first, then arrival, so rank 0
  is a worker with the most committed steps; once every member says in the store that it is
  ready (a member lost meanwhile, by its heartbeat, makes the others meet again in a new
  round), a new gloo group forms on the store under the generation's prefix;
* rank 0 then gives every worker its committed step count, and at the next ``strategy.run``
  its parameters, buffers and optimizer state: a step applied by some workers and not by
  others is resolved in the same way everywhere, and at most the step in flight is lost.

A step *commits* on a worker when the all-reduce of its gradients succeeded there and its
optimizer applied the update (``strategy.run`` returned). A worker that arrives later than the
round's close waits for the next round; a joiner arriving while the group trains asks for one.

The store keeps a *lineage*: a random id made by the first worker that reaches it. A worker
given another lineage (``lineage=``, say the id of the checkpoint it restored), or one that
trained in a group of another lineage, is refused with ``FailedPreconditionError``. Every wait
is bounded: fewer than ``min_workers`` within ``timeout_seconds`` raise ``UnavailableError``.

Launch: start ``feedline membership-store --port 29400`` once (a small process that must live
as long as the job), then every worker with ``FEEDLINE_ELASTIC_STORE=host:29400`` (or the
address given to the resolver), started and restarted by anything (a pod, a Slurm step, a
shell loop): no torchrun agent is needed, and none must restart the survivors.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import io
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from feedline.distribute import collective as collectives
from feedline.distribute.cluster_resolver import ClusterResolver, ClusterSpec
from feedline.distribute.global_batches import GlobalBatches as GlobalBatches  # the input
from feedline.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    MembershipChangedError,
    UnavailableError,
)

T = TypeVar("T")

logger = logging.getLogger(__name__)

STORE_ENV = "FEEDLINE_ELASTIC_STORE"
"""The environment variable that gives the membership store's ``host:port``."""

_POLL_SECONDS = 0.005
_WAIT_SLICE = datetime.timedelta(milliseconds=100)  # how often a wait looks for a broken group
_BEAT_SECONDS = 0.25
# A peer whose heartbeat has not moved for this long, while a collective waits for it, is lost.
# gloo notices a peer's death only if the peer dies during a collective: one that dies between
# two (in the training loop's own work) leaves the next collective waiting until its timeout.
_SILENT_SECONDS = 3.0
_NO_STATE = -1  # the committed steps a worker offers before it has a model (a joiner)


@dataclasses.dataclass(frozen=True)
class Member:
    """One worker of a generation.

    Attributes:
      id: the worker's id (random, one per process).
      host: its host name.
      committed: the steps it had committed when it arrived; -1 for a worker without state.
      arrival: its number in the round.
    """

    id: str
    host: str
    committed: int
    arrival: int


@dataclasses.dataclass(frozen=True)
class Generation:
    """A process group of an elastic job, as one worker of it sees it.

    Attributes:
      number: the generation (1 for the first group).
      members: the workers in rank order.
      rank: this worker's rank.
      lineage: the job's lineage id.
    """

    number: int
    members: tuple[Member, ...]
    rank: int
    lineage: str

    @property
    def world_size(self) -> int:
        return len(self.members)

    @property
    def running(self) -> bool:
        """Whether a member has state to give (the group trained before)."""
        return any(m.committed != _NO_STATE for m in self.members)


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)``.

    Raises:
      InvalidArgumentError: not ``host:port`` with a port number.
    """
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidArgumentError(
            f"the membership store's address must be host:port, got {address!r} (set "
            f"{STORE_ENV} or pass store_address)"
        )
    return host, int(port)


def serve_membership_store(host: str, port: int) -> dist.TCPStore:
    """Starts the membership store at ``host:port`` in this process (0: any free port; the
    store's ``port`` says which). It serves until the returned store is dropped."""
    return dist.TCPStore(host, port, is_master=True, wait_for_workers=False, use_libuv=True)


class ElasticClusterResolver(ClusterResolver):
    """A cluster whose workers are whoever meets in a membership store, and may change.

    Args:
      store_address: ``host:port`` of the membership store; None reads ``FEEDLINE_ELASTIC_STORE``.
      min_workers: the fewest workers that may train; a group that falls below it waits up to
        ``timeout_seconds`` for others, then fails.
      max_workers: the most workers in a group; None: no limit.
      settle_seconds: a round closes once no worker arrived for this long (with at least
        ``min_workers``): the window in which survivors of one loss meet.
      timeout_seconds: the bound on every wait of a round, and on each collective.
      lineage: the run this worker's state belongs to; None takes the store's (a fresh worker).
      job_name: the store's namespace; several jobs may share one store.

    Raises:
      InvalidArgumentError: a bad address or bounds.
    """

    def __init__(
        self,
        store_address: str | None = None,
        *,
        min_workers: int = 1,
        max_workers: int | None = None,
        settle_seconds: float = 0.3,
        timeout_seconds: float = 60.0,
        lineage: str | None = None,
        job_name: str = "default",
    ) -> None:
        super().__init__()
        address = store_address or os.environ.get(STORE_ENV, "")
        self.store_host, self.store_port = parse_address(address)
        if min_workers < 1 or (max_workers is not None and max_workers < min_workers):
            raise InvalidArgumentError(
                f"need 1 <= min_workers <= max_workers, got min_workers={min_workers}, "
                f"max_workers={max_workers}"
            )
        if not settle_seconds >= 0 or not timeout_seconds > 0:
            raise InvalidArgumentError(
                f"settle_seconds must be >= 0 and timeout_seconds > 0, got {settle_seconds} "
                f"and {timeout_seconds}"
            )
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.settle_seconds = float(settle_seconds)
        self.timeout_seconds = float(timeout_seconds)
        self.lineage = lineage
        self.job_name = job_name
        self._generation: Generation | None = None

    def set_generation(self, generation: Generation) -> None:
        """Called by the strategy after each round: the cluster is its members."""
        self._generation = generation
        self.task_type = "worker"
        self.task_id = generation.rank

    def cluster_spec(self) -> ClusterSpec:
        if self._generation is None:
            return ClusterSpec({})
        return ClusterSpec(
            {"worker": [f"{m.host}:{self.store_port}" for m in self._generation.members]}
        )

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        address = f"{self.store_host}:{self.store_port}"
        return f"{rpc_layer}://{address}" if rpc_layer else address


class Rounds:
    """The membership protocol in the store (see the module docstring).

    Args:
      resolver: the bounds and the store's address.
    """

    def __init__(self, resolver: ElasticClusterResolver) -> None:
        self._resolver = resolver
        timeout = datetime.timedelta(seconds=resolver.timeout_seconds)
        try:
            self.raw = dist.TCPStore(
                resolver.store_host, resolver.store_port, is_master=False, timeout=timeout,
                wait_for_workers=False, use_libuv=True,
            )  # fmt: skip
        except (RuntimeError, OSError) as error:
            raise UnavailableError(
                f"the membership store at {resolver.master()} cannot be reached within "
                f"{resolver.timeout_seconds:g} s; start it with `feedline membership-store "
                f"--port {resolver.store_port}`: {error}"
            ) from error
        self.store = dist.PrefixStore(f"feedline/elastic/{resolver.job_name}/", self.raw)
        self.id = uuid.uuid4().hex[:12]
        # the heartbeat has a connection of its own, so that it never waits behind a round
        self._beat_store = dist.PrefixStore(
            f"feedline/elastic/{resolver.job_name}/",
            dist.TCPStore(
                resolver.store_host, resolver.store_port, is_master=False,
                timeout=datetime.timedelta(seconds=2), wait_for_workers=False, use_libuv=True,
            ),
        )  # fmt: skip
        self._stop = threading.Event()
        self._beater = threading.Thread(
            target=self._beat, name=f"feedline-elastic-heartbeat-{self.id}", daemon=True
        )
        self._beater.start()
        self._seen: dict[str, tuple[bytes, float]] = {}
        self.host = socket.gethostname()
        self.lineage = resolver.lineage

    def _beat(self) -> None:
        while not self._stop.is_set():
            try:
                self._beat_store.add(f"beat/{self.id}", 1)
            except (RuntimeError, OSError):  # the store is gone: the next round says so
                return
            self._stop.wait(_BEAT_SECONDS)

    def stop(self) -> None:
        self._stop.set()
        self._beater.join(timeout=5)

    def silent(self, members: tuple[Member, ...]) -> list[Member]:
        """The members whose heartbeat has not moved for ``_SILENT_SECONDS``."""
        others = [m for m in members if m.id != self.id]
        if not others:
            return []
        values = self.store.multi_get([f"beat/{m.id}" for m in others])
        now = time.monotonic()
        lost = []
        for member, value in zip(others, values, strict=True):
            last = self._seen.get(member.id)
            if last is None or last[0] != value:
                self._seen[member.id] = (value, now)
            elif now - last[1] > _SILENT_SECONDS:
                lost.append(member)
        return lost

    def current(self) -> int:
        """The last generation formed (0: none yet)."""
        return int(self.store.get("gen")) if self.store.check(["gen"]) else 0

    def join_requested(self, generation: int) -> bool:
        return bool(self.store.check([f"join/{generation}"]))

    def meet(self, previous: Generation | None, committed: int) -> Generation:
        """Takes part in rounds until one admits this worker; returns its generation.

        Raises:
          FailedPreconditionError: the store's lineage is not this worker's.
          UnavailableError: fewer than ``min_workers`` met within ``timeout_seconds``.
        """
        self._check_lineage()
        deadline = time.monotonic() + self._resolver.timeout_seconds
        number = max(self.current(), previous.number if previous else 0) + 1
        while True:
            if number > 1 and (previous is None or previous.number != number - 1):
                self.store.set(f"join/{number - 1}", self.id)  # ask that group to come
            generation = self._round(number, committed, deadline)
            if generation is not None:
                return generation
            number += 1

    def _check_lineage(self) -> None:
        stored = self.store.compare_set("lineage", "", self.lineage or uuid.uuid4().hex).decode()
        if self.lineage is not None and stored != self.lineage:
            raise FailedPreconditionError(
                f"this worker's state belongs to run {self.lineage}, but the job at the "
                f"membership store {self._resolver.master()} is run {stored}: a worker may "
                "only rejoin the run its state came from (start it afresh, without lineage=, "
                "to receive the job's state)"
            )
        self.lineage = stored

    def _round(self, number: int, committed: int, deadline: float) -> Generation | None:
        prefix = f"round/{number}/"
        arrival = int(self.store.add(prefix + "arrivals", 1))
        self.store.set(
            f"{prefix}arrival/{arrival}",
            json.dumps({"id": self.id, "host": self.host, "committed": committed}),
        )
        closed = self._wait_close(prefix, number, deadline)
        if arrival not in closed:
            return None
        members = []
        for index in closed:
            record = json.loads(self.store.get(f"{prefix}arrival/{index}"))
            members.append(Member(record["id"], record["host"], record["committed"], index))
        members.sort(key=lambda m: (-m.committed, m.arrival))
        self.store.set("gen", str(number))
        rank = [m.id for m in members].index(self.id)
        assert self.lineage is not None
        return Generation(number, tuple(members), rank, self.lineage)

    def _wait_close(self, prefix: str, number: int, deadline: float) -> list[int]:
        resolver = self._resolver
        seen, changed = 0, time.monotonic()
        while True:
            if self.store.check([prefix + "members"]):
                return list(json.loads(self.store.get(prefix + "members")))
            count = int(self.store.add(prefix + "arrivals", 0))
            now = time.monotonic()
            if count != seen:
                seen, changed = count, now
            enough = count >= resolver.min_workers
            full = resolver.max_workers is not None and count >= resolver.max_workers
            if enough and (full or now - changed >= resolver.settle_seconds):
                proposal = json.dumps(list(range(1, count + 1)))
                return list(json.loads(self.store.compare_set(prefix + "members", "", proposal)))
            if now > deadline:
                raise UnavailableError(
                    f"generation {number} of the elastic job at {resolver.master()}: "
                    f"{count} worker(s) met within {resolver.timeout_seconds:g} s, fewer than "
                    f"min_workers={resolver.min_workers}; start more workers, or lower "
                    "min_workers"
                )
            time.sleep(_POLL_SECONDS)


class ElasticCollective(collectives.Collective):
    """The collective of an elastic strategy: its process group is re-formed, not restarted.

    The group is a ``ProcessGroupGloo`` of its own (not torch's default group), so that a
    group whose collectives are stuck on a lost peer can be left behind at once: its threads
    end with its timeout, while the next generation's group already works. Every wait polls
    the store's ``broken/<generation>`` key (set by the first worker whose collective failed),
    so that a worker waiting on a live peer that itself waits on the lost one stops too.

    Args:
      resolver: the job's ``ElasticClusterResolver``.
      backend: ``"gloo"`` (the only one supported here).
      device: where the backend's tensors live.

    Attributes:
      committed: the steps (updates applied by a mirrored optimizer) committed here.
      step: the training loop's step count that rank 0 gave at the last round.
      generation: the current ``Generation``.
    """

    def __init__(self, resolver: ElasticClusterResolver, backend: str, device: torch.device):
        if backend != "gloo":
            raise InvalidArgumentError(
                f"an elastic MultiWorkerMirroredStrategy runs on gloo, got {backend!r}: use "
                "CommunicationImplementation.RING, or CPU replicas"
            )
        # The fields of Collective, without its fixed-cluster rendezvous.
        self.rank = 0
        self.world_size = 1
        self.backend = backend
        self.timeout_seconds = resolver.timeout_seconds
        self._rendezvous = resolver.master()
        self._addresses: list[str] = []
        self.device = device
        self._broken: UnavailableError | None = None
        self._adopted = True  # torch's default group is never this one's
        self._store: dist.Store | None = None
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None
        self._resolver = resolver
        self._rounds = Rounds(resolver)
        self._group: Any = None
        self._left_behind: list[Any] = []  # broken groups, alive until their threads end
        self.committed = 0
        self.has_state = False
        self.needs_state = False
        self.step = 0
        self._check: Callable[[], tuple[bool, ...]] | None = None
        self.on_reform: list[Callable[[Generation], None]] = []
        atexit.register(self.close)
        _warm_up()
        self.generation = self._form(None, step=0)
        collectives._activate(self)

    # -- rounds ----------------------------------------------------------------------------
    def _form(self, previous: Generation | None, step: int) -> Generation:
        offered = self.committed if self.has_state else _NO_STATE
        generation = self._rounds.meet(previous, offered)
        self.rank, self.world_size = generation.rank, generation.world_size
        self._addresses = [f"{m.host} ({m.id})" for m in generation.members]
        self._broken = None
        self._check = None
        self.generation = generation
        self._resolver.set_generation(generation)
        try:
            broken = self._wait_ready(generation)
            if broken is None:
                self._group = dist.ProcessGroupGloo(
                    dist.PrefixStore(f"group/{generation.number}/", self._rounds.store),
                    self.rank,
                    self.world_size,
                    datetime.timedelta(seconds=self.timeout_seconds),
                )
        except (RuntimeError, ValueError, OSError) as error:
            raise UnavailableError(
                f"worker {self.rank} of generation {generation.number} could not form the "
                f"process group with {self._addresses}: {error}"
            ) from error
        if broken is not None:  # a member is gone before the group formed: meet again
            logger.warning(
                "worker %d: generation %d broke while it formed (%s); meeting again",
                self.rank, generation.number, broken,
            )  # fmt: skip
            return self._form(generation, step)
        if generation.running:
            # rank 0 has the most committed steps: everyone takes its count now, its
            # parameters and optimizer state at the next strategy.run
            self.committed, self.step = self.broadcast_object(
                (self.committed, step), 0, "giving the committed steps"
            )
            self.has_state = True
            self.needs_state = True
        else:
            self.step = step
        return generation

    def _wait_ready(self, generation: Generation) -> str | None:
        """Says that this worker is ready to form ``generation``'s group and waits until every
        member did; why the generation is broken if a member was lost meanwhile
        (``_broken_why``), None once all are ready.

        Raises:
          RuntimeError: not all ready within ``timeout_seconds``.
        """
        store = self._rounds.store
        prefix = f"ready/{generation.number}/"
        store.set(f"{prefix}{self.rank}", self._rounds.id)
        keys = [f"{prefix}{rank}" for rank in range(generation.world_size)]
        deadline = time.monotonic() + self.timeout_seconds
        while not store.check(keys):
            why = self._broken_why(generation)
            if why is not None:
                store.set(f"broken/{generation.number}", self._rounds.id)
                return why
            if time.monotonic() > deadline:
                raise RuntimeError(f"not every member was ready within {self.timeout_seconds:g} s")
            time.sleep(_WAIT_SLICE.total_seconds())
        return None

    def _broken_why(self, generation: Generation) -> str | None:
        """Why ``generation`` is broken (another worker said so in the store, or a member's
        heartbeat is silent), or None."""
        if self._rounds.store.check([f"broken/{generation.number}"]):
            return f"another worker found generation {generation.number} broken"
        lost = self._rounds.silent(generation.members)
        if lost:
            return f"no heartbeat for {_SILENT_SECONDS:g} s from " + ", ".join(
                f"{m.host} ({m.id})" for m in lost
            )
        return None

    def reform(self, step: int) -> Generation:
        """Meets the workers that remain (and joiners) in the next generation.

        Args:
          step: the training loop's committed steps on this worker (rank 0's count is taken
            by every worker: ``self.step`` after the call).
        """
        self._leave()
        generation = self._form(self.generation, step)
        for callback in self.on_reform:
            callback(generation)
        return generation

    def _leave(self) -> None:
        if self._group is not None:
            self._left_behind.append(self._group)
            self._group = None

    def note_commit(self) -> None:
        """A step committed on this worker (its optimizer applied the update)."""
        self.committed += 1
        self.has_state = True

    @property
    def joined_running(self) -> bool:
        """Whether this worker joined a group that trained before and has not yet received
        its state (it restores nothing of its own: the state comes from rank 0)."""
        return self.needs_state and self.generation.members[self.rank].committed == _NO_STATE

    def boundary(self) -> None:
        """At the start of each ``strategy.run``: raises ``MembershipChangedError`` when the
        check started one run ago says a worker asked to join; starts the next check."""
        self.has_state = True  # from the first run on, this worker has a model to give
        if self._check is not None:
            check, self._check = self._check, None
            if check()[0]:
                raise MembershipChangedError(
                    f"worker {self.rank}: a worker asked to join generation "
                    f"{self.generation.number}; call strategy.reform() and run the step",
                    generation=self.generation.number,
                    reason="join",
                )
        asked = self.rank == 0 and self._rounds.join_requested(self.generation.number)
        self._check = self.start_agree_any([asked], "the membership check")

    # -- failures --------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T]) -> T:
        if self._broken is not None:
            raise self._broken
        try:
            return fn()
        except (RuntimeError, OSError) as error:
            self._broken = MembershipChangedError(
                f"worker {self.rank}: {what} across the {self.world_size} workers of "
                f"generation {self.generation.number} failed (a peer was lost or stalled past "
                f"{self.timeout_seconds:g} s); call strategy.reform() and run the step. "
                f"Cause: {error}",
                generation=self.generation.number,
                reason="peer_lost",
            )
            with contextlib.suppress(RuntimeError, OSError):  # the store may be gone too
                self._rounds.store.set(f"broken/{self.generation.number}", self._rounds.id)
            self._leave()
            raise self._broken from error

    def _finish(self, work: Any) -> None:
        """Waits for ``work``, a slice at a time, and stops once the group is broken."""
        deadline = time.monotonic() + self.timeout_seconds
        while True:
            try:
                work.wait(_WAIT_SLICE)
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
            why = self._broken_why(self.generation)
            if why is not None:
                raise RuntimeError(why)

    def _run(self, what: str, start: Callable[[dist.ProcessGroup], Any]) -> None:
        group = self._group
        if group is None:
            raise self._broken or UnavailableError("the elastic group is not formed")
        self._call(what, lambda: self._finish(start(group)))

    # -- collectives on the group ----------------------------------------------------------
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        work = tensor.detach().to(self.device, copy=True)
        self._run("an all-reduce", lambda g: g.allreduce([work]))
        return work.to(tensor.device)

    def all_reduce_async(self, tensor: torch.Tensor) -> Any:
        group = self._group
        if group is None:
            raise self._broken or UnavailableError("the elastic group is not formed")
        return self._call("an all-reduce", lambda: group.allreduce([tensor]))

    def wait(self, work: Any) -> None:
        self._call("an all-reduce", lambda: self._finish(work))

    def agree(self, local_has_data: bool) -> bool:
        flag = torch.tensor([1 if local_has_data else 0], dtype=torch.int32)
        self._run("the end-of-data agreement", lambda g: g.allreduce([flag]))
        return bool(flag.item())

    def agree_any(self, flags: Any, what: str) -> tuple[bool, ...]:
        counts = self.flags_tensor(flags)
        self._run(what, lambda g: g.allreduce([counts]))
        return tuple(bool(c) for c in counts.tolist())

    def start_agree_any(self, flags: Any, what: str) -> Callable[[], tuple[bool, ...]]:
        counts = self.flags_tensor(flags)
        work = self.all_reduce_async(counts)

        def answer() -> tuple[bool, ...]:
            self._call(what, lambda: self._finish(work))
            return tuple(bool(c) for c in counts.tolist())

        return answer

    def broadcast(self, tensors: Any, src: int = 0) -> None:
        """Rank ``src``'s ``tensors`` into every worker's, one broadcast per dtype."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for tensor in tensors:
            by_dtype.setdefault(tensor.dtype, []).append(tensor)
        for group in by_dtype.values():
            flat = torch.cat([t.detach().reshape(-1).to(self.device) for t in group])
            self._run("a broadcast", lambda g, f=flat: g.broadcast(f, src))  # type: ignore[misc]
            offset = 0
            with torch.no_grad():
                for tensor in group:
                    n = tensor.numel()
                    tensor.copy_(flat[offset : offset + n].view_as(tensor))
                    offset += n

    def broadcast_object(self, obj: Any, src: int = 0, what: str = "a broadcast") -> Any:
        data = _to_bytes(obj) if self.rank == src else torch.empty(0, dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64)
        self._run(what, lambda g: g.broadcast(size, src))
        if self.rank != src:
            data = torch.empty(int(size.item()), dtype=torch.uint8)
        self._run(what, lambda g: g.broadcast(data, src))
        return obj if self.rank == src else _from_bytes(data)

    def all_gather_object(self, obj: Any, what: str = "an all-gather of objects") -> list[Any]:
        parts = self._gather_padded(_to_bytes(obj), what)
        return [_from_bytes(p) for p in parts]

    def all_gather(self, tensor: torch.Tensor, axis: int) -> torch.Tensor:
        local = tensor.detach().to(self.device).movedim(axis, 0).contiguous()
        shape = local.shape[1:]
        flat = local.reshape(-1)
        parts = self._gather_padded(flat, "an all-gather")
        pieces = [p.reshape(-1, *shape) for p in parts]
        return torch.cat(pieces, dim=0).movedim(0, axis).to(tensor.device)

    def _gather_padded(self, flat: torch.Tensor, what: str) -> list[torch.Tensor]:
        size = torch.tensor([flat.numel()], dtype=torch.int64)
        sizes = [torch.zeros_like(size) for _ in range(self.world_size)]
        self._run(what, lambda g: g.allgather([sizes], [size]))
        counts = [int(s.item()) for s in sizes]
        padded = torch.cat([flat, flat.new_zeros(max(counts) - flat.numel())])
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        self._run(what, lambda g: g.allgather([parts], [padded]))
        return [p[:n] for p, n in zip(parts, counts, strict=True)]

    def barrier(self) -> None:
        self.agree_any([False], "a barrier")

    def close(self) -> None:
        """Leaves the group and stops the heartbeat (at exit too)."""
        atexit.unregister(self.close)
        if collectives.active() is self:
            collectives._activate(None)
        self._leave()
        self._rounds.stop()


def _warm_up() -> None:
    """Runs what torch loads on first use (autograd's engine, the optimizers' lazy imports:
    seconds on a busy machine) before this worker joins, so that a joiner does not keep the
    group waiting while its first step loads them."""
    param = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.Adam([param], lr=0.0)
    (param * 2).sum().backward()
    optimizer.step()


def _to_bytes(obj: Any) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _from_bytes(data: torch.Tensor) -> Any:
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)


def active() -> ElasticCollective | None:
    """The elastic collective of this process's strategy, or None (a fixed cluster)."""
    collective = collectives.active()
    return collective if isinstance(collective, ElasticCollective) else None


def run_step(
    elastic: ElasticCollective,
    steps_done: int,
    step: Callable[[], T],
    on_abort: Callable[[], None] = lambda: None,
) -> tuple[T | None, int]:
    """Runs one training step ``step()`` that may meet membership changes.

    On a ``MembershipChangedError`` the group re-forms; the step runs again (after
    ``on_abort()``: its input is given back) unless the group committed it (the worker with
    the most committed steps had applied its update, to which this worker's input contributed).

    Args:
      elastic: the strategy's elastic collective.
      steps_done: the loop's steps before this one.
      step: the training step.
      on_abort: called before the step runs again.

    Returns:
      ``step``'s result (None when the group committed the step without this worker's result)
      and the loop's step count after the step.
    """
    while True:
        before = elastic.committed
        try:
            return step(), steps_done + 1
        except MembershipChangedError:
            mine = steps_done + (1 if elastic.committed > before else 0)
            elastic.reform(mine)
            if elastic.step > steps_done:
                return None, elastic.step
            on_abort()
            steps_done = elastic.step


def take_state(collective: ElasticCollective, optimizers: list[Any]) -> None:
    """After a round: every worker takes rank 0's optimizer state (the parameters follow by
    the strategy's broadcast of modules it has not synchronised)."""
    states = [opt.state_dict() for opt in optimizers] if collective.rank == 0 else None
    states = collective.broadcast_object(states, 0, "giving the optimizer state")
    if collective.rank != 0:
        for optimizer, state in zip(optimizers, states, strict=True):
            optimizer.load_state_dict(state)
    collective.needs_state = False
