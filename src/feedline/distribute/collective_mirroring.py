"""Mirrored models and optimizers across worker processes (``MultiWorkerMirroredStrategy``).

Everything ``Mirroring`` does for the replicas of one process holds, and across processes:

* **Identical parameters.** Before the first ``strategy.run`` that uses them, the parameters and
  buffers of every module made under the scope are broadcast from the chief, so every worker
  starts from the chief's initialisation (or restored checkpoint).
* **Gradients summed over all replicas of all workers, overlapped with backward.** Parameters
  are grouped into buckets (``CommunicationOptions.bytes_per_pack``, 25 MiB by default), in
  reverse order of creation, roughly the order backward produces gradients, as DDP's reducer
  does. During the backward of the last local replica, a bucket whose gradients are all
  accumulated starts its all-reduce at once, while backward goes on with the rest; buckets
  always start in the same order on every worker. Once every replica has run, the remaining
  buckets start, and the deferred ``optimizer.step()`` runs: one identical update everywhere.
* **Gradients as views into the buckets** (DDP's ``gradient_as_bucket_view``): each bucket is
  one flat tensor made once, and after a step every summed gradient is a view into it, so the
  all-reduce works in place. A gradient cleared with ``zero_grad(set_to_none=False)`` is
  accumulated into in place by the next backward and needs no copy at all; one cleared to
  ``None`` (the default) is copied into its bucket once when the bucket starts. As with DDP,
  a ``.grad`` kept from one step holds the next step's sums once that step ran: clone it to
  keep it.
* **Buffers** follow the Mirrored rule across workers: floating-point buffers are averaged over
  all replicas, integer buffers take the chief's first replica's value.

Rules, as for DDP: every worker creates the same modules under the scope, in the same order;
each replica calls ``backward`` at most once per step; a run that calls ``backward`` also calls
``optimizer.step()`` (gradient accumulation across runs is not supported across workers);
gradients are not to be changed in place between ``backward`` and the end of
``strategy.run``: their buckets are being summed then, and the update takes those sums.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from typing import TYPE_CHECKING, Any

import torch

from feedline.distribute.collective import Collective
from feedline.distribute.elastic import ElasticCollective, take_state
from feedline.distribute.mirroring import Mirroring, own_buffers, own_parameters
from feedline.errors import FailedPreconditionError

if TYPE_CHECKING:
    import torch.distributed as dist

    from feedline.distribute.strategy import Strategy

DEFAULT_BUCKET_BYTES = 25 << 20


@dataclasses.dataclass(eq=False)
class _Bucket:
    """Parameters whose gradients travel in one all-reduce."""

    params: list[torch.nn.Parameter]
    waiting: int = 0  # gradients not yet accumulated in this step
    #: the last bucket also carries the sum of the run's scalar results and its flag
    carries_result: bool = False
    flat: torch.Tensor | None = None  # gradients, a presence flag per parameter, the result
    views: list[torch.Tensor] = dataclasses.field(default_factory=list)  # of flat, per param
    #: the presence flags in ``flat`` (1 where a worker had the parameter's gradient)
    flags: torch.Tensor | None = None
    work: dist.Work | None = None

    def reset(self) -> None:
        if self.work is not None:  # a step that failed left it unfinished: start a fresh one
            self.flat, self.views, self.flags = None, [], None
        self.waiting = len(self.params)
        self.work = None

    def storage(self) -> torch.Tensor:
        """The bucket's flat tensor, made once: each parameter's gradient is a view into it."""
        if self.flat is None:
            first = self.params[0]
            total = sum(p.numel() for p in self.params) + len(self.params)
            total += 2 if self.carries_result else 0
            self.flat = torch.zeros(total, dtype=first.dtype, device=first.device)
            offset = 0
            for param in self.params:
                n = param.numel()
                self.views.append(self.flat[offset : offset + n].view_as(param))
                offset += n
            self.flags = self.flat[offset : offset + len(self.params)]
        return self.flat


class CollectiveMirroring(Mirroring):
    """The mirrored modules and optimizers of a multi-worker strategy."""

    def __init__(self, strategy: Strategy, collective: Collective, bucket_bytes: int) -> None:
        super().__init__(strategy)
        self._collective = collective
        self._bucket_bytes = bucket_bytes or DEFAULT_BUCKET_BYTES
        self._num_local = len(strategy.extended.local_devices)
        self._order: list[weakref.ref[torch.nn.Module]] = []
        self._optimizer_order: list[weakref.ref[torch.optim.Optimizer]] = []
        self._elastic = collective if isinstance(collective, ElasticCollective) else None
        self._synced: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._buckets: list[_Bucket] = []
        self._bucket_of: dict[int, _Bucket] = {}
        self._bucket_key: tuple[tuple[int, torch.dtype, torch.device], ...] = ()
        self._hooks: list[Any] = []
        self._armed = False
        self._launched = 0  # buckets started this step, always a prefix of self._buckets
        self._late_gradient: str | None = None
        self._reduced: set[int] = set()  # gradients summed over all replicas already
        # A run's scalar results (the per-replica loss) ride in the last bucket: the offer
        # (the replicas' values, their versions, their local sum), then the sum over all
        # workers that reduce takes instead of an all-reduce of its own.
        self._offer: tuple[list[torch.Tensor], list[int], torch.Tensor] | None = None
        self._summed: tuple[list[torch.Tensor], list[int], torch.Tensor] | None = None
        self._summed_taken = False
        self._defer_last = False  # hold the last bucket until the run's results are known
        self._offered = False  # the last run returned scalars that could ride along
        self._results_unused = False  # results rode along and reduce did not take them

    def add_module(self, module: torch.nn.Module) -> None:
        if not self.owns_module(module):
            self._order.append(weakref.ref(module))
        super().add_module(module)

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        if optimizer not in self._optimizers:
            self._optimizer_order.append(weakref.ref(optimizer))
        super().add_optimizer(optimizer)

    def forget_synced(self) -> None:
        """After an elastic group re-formed: the next run gives every worker rank 0's
        parameters and buffers again (and, in ``before_replica``, its optimizer state)."""
        self._synced = weakref.WeakSet()

    def _optimizers_in_order(self) -> list[torch.optim.Optimizer]:
        alive = [ref() for ref in self._optimizer_order]
        return [o for o in alive if o is not None]

    def _modules_in_order(self) -> list[torch.nn.Module]:
        alive = [ref() for ref in self._order]
        self._order = [ref for ref, m in zip(self._order, alive, strict=True) if m is not None]
        return [m for m in alive if m is not None]

    # -- the step --------------------------------------------------------------------------
    def before_replica(self, local_replica: int) -> None:
        if local_replica == 0:
            modules = self._modules_in_order()
            if self._elastic is not None and self._elastic.needs_state:
                take_state(self._elastic, self._optimizers_in_order())
            self._broadcast_new(modules)
            self._prepare_buckets(modules)
        super().before_replica(local_replica)
        # overlap needs the gradients accumulated in one .grad; a hand-over keeps them apart
        self._armed = local_replica == self._num_local - 1 and not self._isolating

    def abort_run(self) -> None:
        self._armed = False
        self._reduced = set()
        self._offer = None
        super().abort_run()

    def end_isolation(self, reduced: set[int]) -> None:
        """After a hand-over, a gradient that is an ``all_reduce`` result is the same on every
        worker: the chief's alone goes into its bucket's sum, so it is not summed again."""
        self._reduced = reduced
        super().end_isolation(reduced)

    def after_run(self) -> None:
        self._armed = False
        updates = bool(self._pending)
        if self._pending or self._launched:
            if not self._pending:
                self._finish_buckets()
                raise FailedPreconditionError(
                    "backward ran in strategy.run but no mirrored optimizer stepped: under "
                    "MultiWorkerMirroredStrategy each run that computes gradients must call "
                    "optimizer.step() (gradient accumulation across runs is not supported)"
                )
            self._finish_buckets()
        super().after_run()
        if updates and self._elastic is not None:
            self._elastic.note_commit()
        self._sync_buffers()

    # -- the run's results -----------------------------------------------------------------
    def offer_results(self, results: list[Any]) -> None:
        """Scalar tensors returned by every local replica (a per-replica loss) have their
        local sum sent with the last gradient bucket, so that ``strategy.reduce`` of them
        needs no all-reduce of its own (``summed_in_run``)."""
        if not (self._pending or self._launched) or not self._buckets:
            return
        last = self._buckets[-1].params[0]
        if not all(
            isinstance(r, torch.Tensor)
            and r.dim() == 0
            and r.dtype == last.dtype
            and r.device == last.device
            for r in results
        ):
            return
        self._offered = True
        parts = list(results)
        local = functools.reduce(torch.add, parts).detach()
        self._offer = (parts, [p._version for p in parts], local)

    def summed_in_run(self, parts: list[torch.Tensor]) -> torch.Tensor | None:
        """The sum over all replicas of ``parts`` if they are the last run's results, unchanged,
        and rode with the gradients; else None (``reduce`` all-reduces them itself)."""
        if self._summed is None:
            return None
        stored, versions, total = self._summed
        if len(parts) != len(stored) or not all(
            p is q and p._version == v for p, q, v in zip(parts, stored, versions, strict=True)
        ):
            return None
        self._summed_taken = True
        return total.clone()

    # -- parameters ------------------------------------------------------------------------
    def _broadcast_new(self, modules: list[torch.nn.Module]) -> None:
        """Gives modules not yet seen the chief's parameters and buffers."""
        fresh = [m for m in modules if m not in self._synced]
        if not fresh:
            return
        tensors = [t.data for m in fresh for t in (*own_parameters(m), *own_buffers(m))]
        self._collective.broadcast(tensors, src=0)
        for module in fresh:
            self._synced.add(module)

    def _prepare_buckets(self, modules: list[torch.nn.Module]) -> None:
        """(Re)builds the buckets when the set of trainable parameters, or the dtype or device
        of one (``model.half()``), changed."""
        seen: set[int] = set()
        params: list[torch.nn.Parameter] = []
        for module in modules:
            for param in own_parameters(module):
                if param.requires_grad and id(param) not in seen:
                    seen.add(id(param))
                    params.append(param)
        key = tuple((id(p), p.dtype, p.device) for p in params)
        if key != self._bucket_key:
            self._build_buckets(params)
            self._bucket_key = key
        for bucket in self._buckets:
            bucket.reset()
        self._launched = 0
        self._reduced = set()
        self._late_gradient = None
        if self._summed is not None and not self._summed_taken:
            self._results_unused = True
        # the last bucket waits for the results only where they were worth sending last time
        self._defer_last = self._offered and not self._results_unused
        self._offer, self._summed, self._summed_taken, self._offered = None, None, False, False

    def _build_buckets(self, params: list[torch.nn.Parameter]) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._offered = self._results_unused = False
        self._buckets, self._bucket_of = [], {}
        current: list[torch.nn.Parameter] = []
        size = 0
        for param in reversed(params):
            nbytes = param.numel() * param.element_size()
            kind = (param.dtype, param.device)
            if current and (
                size + nbytes > self._bucket_bytes or (current[0].dtype, current[0].device) != kind
            ):
                self._buckets.append(_Bucket(current))
                current, size = [], 0
            current.append(param)
            size += nbytes
        if current:
            self._buckets.append(_Bucket(current))
        if self._buckets:
            self._buckets[-1].carries_result = True
        for bucket in self._buckets:
            for param in bucket.params:
                self._bucket_of[id(param)] = bucket
                self._hooks.append(param.register_post_accumulate_grad_hook(self._on_gradient))

    # -- gradients -------------------------------------------------------------------------
    def _on_gradient(self, param: torch.Tensor) -> None:
        """A parameter's gradient is accumulated; start the buckets that are now complete."""
        if not self._armed:
            return
        bucket = self._bucket_of.get(id(param))
        if bucket is None:
            return
        if bucket.work is not None:
            self._late_gradient = (
                f"a gradient of a {tuple(param.shape)} parameter arrived after its bucket was "
                "sent: call backward at most once per replica in each strategy.run"
            )
            return
        bucket.waiting -= 1
        ready = len(self._buckets) - (1 if self._defer_last else 0)
        while self._launched < ready and self._buckets[self._launched].waiting <= 0:
            self._launch(self._buckets[self._launched])
            self._launched += 1

    def _launch(self, bucket: _Bucket) -> None:
        """Starts the all-reduce of a bucket's flat tensor. A gradient that is already its view
        there (the sum of the last step, accumulated into in place) needs no copy."""
        flat = bucket.storage()
        present = []
        with torch.no_grad():
            for param, view in zip(bucket.params, bucket.views, strict=True):
                grad = param.grad
                if grad is not None and id(grad) in self._reduced and self._collective.rank != 0:
                    grad = None
                present.append(0.0 if grad is None else 1.0)
                if grad is None:
                    view.zero_()
                elif not _is_view(grad, view):
                    view.copy_(grad)
            assert bucket.flags is not None
            bucket.flags.copy_(torch.tensor(present, dtype=flat.dtype))
            if bucket.carries_result:
                offer = self._offer
                flat[-2] = 0.0 if offer is None else offer[2]
                flat[-1] = 0.0 if offer is None else 1.0
        bucket.work = self._collective.all_reduce_async(flat)

    def _finish_buckets(self) -> None:
        """Starts the buckets not started yet, in order; each summed gradient becomes its
        parameter's ``.grad``, a view into the bucket (as DDP's ``gradient_as_bucket_view``):
        the next backward accumulates into it in place."""
        while self._launched < len(self._buckets):
            self._launch(self._buckets[self._launched])
            self._launched += 1
        for bucket in self._buckets:
            assert bucket.work is not None and bucket.flat is not None
            assert bucket.flags is not None
            self._collective.wait(bucket.work)
            bucket.work = None
            present = bucket.flags.tolist()
            offer = self._offer if bucket.carries_result else None
            # every worker offered its results: reduce finds their sum here
            if offer is not None and int(bucket.flat[-1].item()) == self._collective.world_size:
                self._summed = (offer[0], offer[1], bucket.flat[-2].clone())
            for param, view, has in zip(bucket.params, bucket.views, present, strict=True):
                if has <= 0:
                    param.grad = None
                elif not _is_view(param.grad, view):
                    param.grad = view
            bucket.reset()
        self._launched = 0
        self._reduced = set()
        if self._late_gradient is not None:
            message, self._late_gradient = self._late_gradient, None
            raise FailedPreconditionError(message)

    # -- buffers ---------------------------------------------------------------------------
    def _sync_buffers(self) -> None:
        """Floating-point buffers: the mean over workers; integer buffers: the chief's."""
        buffers = [b for m in self._modules_in_order() for b in own_buffers(m)]
        if not buffers:
            return
        floating = [b for b in buffers if b.is_floating_point()]
        if floating:
            flat = torch.cat([b.detach().reshape(-1).to(torch.float64) for b in floating])
            mean = self._collective.all_reduce_sum(flat) / self._collective.world_size
            offset = 0
            with torch.no_grad():
                for buffer in floating:
                    n = buffer.numel()
                    buffer.copy_(mean[offset : offset + n].view_as(buffer))
                    offset += n
        integer = [b for b in buffers if not b.is_floating_point()]
        if integer:
            self._collective.broadcast(integer, src=0)


def _is_view(grad: torch.Tensor | None, view: torch.Tensor) -> bool:
    """Whether ``grad`` is ``view`` itself, or the same elements of the same storage."""
    return grad is not None and (
        grad is view
        or (
            grad.data_ptr() == view.data_ptr()
            and grad.shape == view.shape
            and grad.stride() == view.stride()
        )
    )
