"""Mirrored models and optimizers: identical parameters on every replica, one summed update.

Modules and optimizers created under the ``scope()`` of a strategy with several local replicas
are *mirrored* (``strategy.mirror(obj)`` mirrors objects made elsewhere). Local replicas that
compute on one device (logical CPU replicas, or several replicas of one GPU) share one set of
parameters, so they are identical by construction. Inside ``strategy.run``:

* ``optimizer.zero_grad()`` clears gradients once, in the first replica; the other replicas'
  ``loss.backward()`` add to them, so the gradients are summed across replicas;
* ``optimizer.step()`` is deferred: it runs once, after every replica has run, and every replica
  sees the same update. With losses scaled by the global batch size
  (``feedline.nn.compute_average_loss``) this is exactly one step on the global batch.
* Buffers (BatchNorm's running statistics): every replica starts the step from the same
  buffers; afterwards, floating-point buffers are the mean of the replicas' values and integer
  buffers (``num_batches_tracked``) take the first replica's, as TensorFlow aggregates moving
  statistics with MEAN.

* Collectives in the step (``ReplicaContext.all_reduce``, ``all_gather``, ``merge_call``): from
  replica 0's first collective on, the replicas take turns (``_replica_group``) and each runs on
  its own gradients (the first replica's as the step found them, the others' from none),
  buffers and parameter data, swapped in at its turn. Once every replica returned, the module
  shows the first replica's parameter data (replicas that update parameters by hand must make
  the same update), buffers follow the rule above, and each gradient is the replicas' sum,
  except one that every replica set to an ``all_reduce`` result, which is summed already and is
  taken as it is.

A module with parameters made outside the scope, used inside ``run`` with several replicas, and
a mirrored optimizer stepped outside ``run``, are errors that say how to fix them.

Replicas on distinct devices (``MirroredStrategy(["cuda:0", "cuda:1"])``) each compute on their
own copy of the parameters, under the same rules (``copy_mirroring``).
"""

from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Any

import torch

from feedline.distribute import _torch_hooks, context
from feedline.errors import FailedPreconditionError, InvalidArgumentError

if TYPE_CHECKING:
    from feedline.distribute.strategy import Strategy


def install_hooks() -> None:
    """Installs the hooks that find modules and optimizers made in a scope and check modules
    used in ``run`` (the ``"mirroring"`` set of ``_torch_hooks``); once per process, and only
    once a strategy with several replicas is in use."""
    _torch_hooks.install(_HOOKS)


def _multi_replica_strategy() -> Strategy | None:
    if not context.has_strategy():
        return None
    strategy = context.get_strategy()
    return strategy if strategy.mirrors_replicas else None


def _on_parameter(module: torch.nn.Module, name: str, value: Any) -> None:
    strategy = _multi_replica_strategy()
    if strategy is not None:
        strategy._mirroring.add_module(module)


def _check_forward(module: torch.nn.Module, args: Any) -> None:
    # Most calls are of modules without parameters of their own (activations, pooling,
    # containers): their dict of parameters is looked at first, before the replica.
    parameters = module._parameters
    if not parameters or not any(p is not None for p in parameters.values()):
        return
    replica = context.current_replica()
    if replica is None or not replica.strategy.mirrors_replicas:
        return
    if not replica.strategy._mirroring.owns_module(module):
        strategy = replica.strategy
        raise FailedPreconditionError(
            f"{type(module).__name__} has parameters but was not created under the scope of "
            f"this {type(strategy).__name__} with {len(strategy.extended.local_devices)} "
            "replicas, so its replicas would not stay identical; create the model (and its "
            "optimizer) inside `with strategy.scope():`, or call strategy.mirror(model, optimizer)"
        )


def own_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """``module.parameters(recurse=False)`` as a list, read from the module's own dict: what a
    step reads of every mirrored module, without torch's generator of named members."""
    return list(dict.fromkeys(p for p in module._parameters.values() if p is not None))


def own_buffers(module: torch.nn.Module) -> list[torch.Tensor]:
    """``module.buffers(recurse=False)`` as a list (see ``own_parameters``)."""
    return list(dict.fromkeys(b for b in module._buffers.values() if b is not None))


def _on_optimizer(optimizer: torch.optim.Optimizer) -> None:
    strategy = _multi_replica_strategy()
    if strategy is not None:
        strategy._mirroring.add_optimizer(optimizer)


_HOOKS = _torch_hooks.HookSet(
    "mirroring",
    on_parameter=_on_parameter,
    on_buffer=_on_parameter,
    before_forward=_check_forward,
    on_optimizer=_on_optimizer,
)


class Mirroring:
    """The mirrored modules and optimizers of one strategy, and the step they take together."""

    #: Whether the local replicas compute on the module's own tensors, so on one device
    #: (``copy_mirroring.CopyMirroring`` gives each replica a copy instead).
    shares_parameters = True

    def __init__(self, strategy: Strategy) -> None:
        devices = {d.torch_device for d in strategy.extended.local_devices}
        if self.shares_parameters and len(devices) > 1:
            raise InvalidArgumentError(
                f"{type(strategy).__name__} cannot mirror a model over several devices of one "
                f"process ({sorted(map(str, devices))}): run one process per GPU, or use logical "
                "replicas of one device; MirroredStrategy mirrors over the devices of one process"
            )
        self._strategy_ref = weakref.ref(strategy)
        self._modules: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._pending: list[torch.optim.Optimizer] = []
        self._buffer_snapshot: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._buffer_results: list[list[torch.Tensor]] = []
        # replicas handing over at collectives: the mirrored tensors (parameters first), each
        # suspended replica's (data, gradient) per tensor, and the replica whose are in place
        self._isolating = False
        self._isolated: list[torch.Tensor] = []
        self._isolated_params = 0
        self._held: dict[int, list[tuple[torch.Tensor, torch.Tensor | None]]] = {}
        self._in_place = 0

    # -- membership ------------------------------------------------------------------------
    def add_module(self, module: torch.nn.Module) -> None:
        self._modules.add(module)

    def owns_module(self, module: torch.nn.Module) -> bool:
        return module in self._modules

    def mirror(self, obj: Any) -> Any:
        """Mirrors ``obj`` (a module with all its submodules, or an optimizer); returns it."""
        if isinstance(obj, torch.nn.Module):
            for module in obj.modules():
                self.add_module(module)
        elif isinstance(obj, torch.optim.Optimizer):
            self.add_optimizer(obj)
        else:
            raise TypeError(f"mirror expects a torch module or optimizer, got {type(obj).__name__}")
        return obj

    def _mirrored_tensors(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The mirrored modules' parameters and buffers, each tensor once."""
        seen: set[int] = set()
        params: list[torch.Tensor] = []
        buffers: list[torch.Tensor] = []
        for module in list(self._modules):
            for found, tensors in (
                (own_parameters(module), params),
                (own_buffers(module), buffers),
            ):
                for tensor in found:
                    if id(tensor) not in seen:
                        seen.add(id(tensor))
                        tensors.append(tensor)
        return params, buffers

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        if optimizer in self._optimizers:
            return
        self._optimizers.add(optimizer)
        step, zero_grad = optimizer.step, optimizer.zero_grad
        mirroring = weakref.ref(self)

        def mirrored_step(closure: Any = None) -> Any:
            owner = mirroring()
            if owner is None:
                return step(closure)
            return owner._step(optimizer, step, closure)

        def mirrored_zero_grad(set_to_none: bool = True) -> None:
            replica = context.current_replica()
            if replica is None or replica.local_replica_id == 0:
                zero_grad(set_to_none=set_to_none)

        optimizer.step = mirrored_step  # type: ignore[method-assign]
        optimizer.zero_grad = mirrored_zero_grad  # type: ignore[method-assign]
        optimizer._feedline_step = step  # type: ignore[attr-defined]

    # -- the synchronized step -------------------------------------------------------------
    def _step(self, optimizer: torch.optim.Optimizer, step: Any, closure: Any) -> Any:
        replica = context.current_replica()
        strategy = self._strategy_ref()
        if replica is None or strategy is None or replica.strategy is not strategy:
            raise FailedPreconditionError(
                "this optimizer is mirrored over the replicas of a strategy: call "
                "optimizer.step() inside the function you pass to strategy.run, where the "
                "replicas' gradients are summed and one update is applied to all of them"
            )
        if closure is not None:
            raise InvalidArgumentError("a mirrored optimizer's step takes no closure")
        if replica.local_replica_id == 0:
            self._pending.append(optimizer)
        return None

    def before_replica(self, local_replica: int) -> None:
        """Every replica starts from the buffers the step started with."""
        buffers = [b for m in list(self._modules) for b in own_buffers(m)]
        if not buffers:
            self._buffer_snapshot = None
            return
        if local_replica == 0:
            self._buffer_snapshot = [(b, b.detach().clone()) for b in buffers]
            self._buffer_results = []
        elif self._buffer_snapshot is not None:
            with torch.no_grad():
                for buffer, start in self._buffer_snapshot:
                    buffer.copy_(start)

    def after_replica(self, local_replica: int) -> None:
        if self._buffer_snapshot is not None:
            self._buffer_results.append([b.detach().clone() for b, _ in self._buffer_snapshot])

    def abort_run(self) -> None:
        """A replica raised: drop the deferred steps and put the buffers back as the step
        found them, so that the failed step leaves no trace."""
        self._pending = []
        if self._buffer_snapshot is not None:
            with torch.no_grad():
                for buffer, start in self._buffer_snapshot:
                    buffer.copy_(start)
        self._buffer_snapshot = None
        self._buffer_results = []

    # -- replicas handing over at collectives (``_replica_group``) --------------------------
    def begin_isolation(self) -> None:
        """Replica 0 reached a collective: until ``end_isolation`` every replica keeps its own
        gradients, buffers and parameter data, swapped in while it runs."""
        params, buffers = self._mirrored_tensors()
        self._isolating = True
        self._isolated = params + buffers
        self._isolated_params = len(params)
        self._held = {}
        self._in_place = 0

    def suspend_replica(self, local_replica: int) -> None:
        """Keeps the running replica's tensors aside (at a collective, or once it returned)."""
        self._held[local_replica] = [
            (t.data, t.grad if k < self._isolated_params else None)
            for k, t in enumerate(self._isolated)
        ]

    def resume_replica(self, local_replica: int) -> None:
        """Puts a suspended replica's tensors back in place."""
        for k, (tensor, (data, grad)) in enumerate(
            zip(self._isolated, self._held.pop(local_replica), strict=True)
        ):
            if k < self._isolated_params:
                tensor.grad = None
                tensor.data = data
                tensor.grad = grad
            else:
                tensor.data = data
        self._in_place = local_replica

    def start_isolated_replica(self, local_replica: int) -> None:
        """A replica after the first starts on tensors of its own, without gradients, then as
        ``before_replica`` starts it (the buffers the step started with)."""
        if self.shares_parameters:  # a copy-mirrored replica's own copies are swapped in below
            for k, tensor in enumerate(self._isolated):
                if k < self._isolated_params:
                    tensor.grad = None
                tensor.data = tensor.data.clone()
        self._in_place = local_replica
        self.before_replica(local_replica)

    def end_isolation(self, reduced: set[int]) -> None:
        """Every replica returned: shows the first replica's tensors again, with the
        replicas' gradients combined (``_fold_gradients``). A gradient that every replica holds
        as the result of a reducing collective (``id`` in ``reduced``) is combined already:
        the first replica's is kept, the others dropped."""
        count = len(self._held)
        grads = [[grad for _, grad in self._held[r][: self._isolated_params]] for r in range(count)]
        for k in range(self._isolated_params):
            column = [replica[k] for replica in grads]
            if all(g is not None and id(g) in reduced for g in column):
                for replica in grads[1:]:
                    replica[k] = None
        self.resume_replica(0)
        self._fold_gradients(grads)
        self._stop_isolation()

    def abort_isolation(self) -> None:
        """A replica failed: shows the first replica's tensors again; ``abort_run`` follows."""
        if self._isolating and self._in_place != 0 and 0 in self._held:
            self.resume_replica(0)
        self._stop_isolation()

    def _stop_isolation(self) -> None:
        self._isolating = False
        self._isolated = []
        self._held = {}
        self._in_place = 0

    def _fold_gradients(self, grads: list[list[torch.Tensor | None]]) -> None:
        """Each parameter's gradient becomes the sum of the replicas' (``grads[replica][k]``
        for parameter ``k``), as shared gradients accumulate without a hand-over."""
        with torch.no_grad():
            for k, param in enumerate(self._isolated[: self._isolated_params]):
                present = [grad for replica in grads if (grad := replica[k]) is not None]
                if not present:
                    param.grad = None
                elif len(present) == 1:
                    param.grad = present[0]
                else:
                    param.grad = functools.reduce(torch.add, present)

    def offer_results(self, results: list[Any]) -> None:
        """The replicas' results of a run, just before ``after_run``; a mirroring that sums
        over workers sends scalar results along with the gradients."""

    def summed_in_run(self, parts: list[torch.Tensor]) -> torch.Tensor | None:
        """The sum over all replicas of ``parts`` where the last run summed them already
        (``offer_results``), else None."""
        return None

    def after_run(self) -> None:
        """The replicas have run: average the buffers, then take the deferred steps once."""
        if self._buffer_snapshot is not None and self._buffer_results:
            with torch.no_grad():
                for i, (buffer, _) in enumerate(self._buffer_snapshot):
                    values = [result[i] for result in self._buffer_results]
                    if buffer.is_floating_point():
                        buffer.copy_(torch.stack(values).mean(dim=0))
                    else:
                        buffer.copy_(values[0])
            self._buffer_snapshot = None
            self._buffer_results = []
        pending, self._pending = self._pending, []
        for optimizer in pending:
            optimizer._feedline_step()  # type: ignore[attr-defined]
