"""Mirrored models and optimizers as per-replica copies (``MirroredStrategy`` over devices).

Replicas on distinct devices (``MirroredStrategy(["cuda:0", "cuda:1"])``) cannot share one set of
parameters, so each replica computes on its own copy; ``cross_device_ops=ReductionToOneDevice()``
asks for copies even where replicas share a device (logical CPU replicas). ``Mirroring``'s
rules hold unchanged: ``optimizer.zero_grad()`` clears once per step (in the first replica),
``optimizer.step()`` is deferred until every replica has run, floating-point buffers end as the
replicas' mean and integer buffers take the first replica's value. On top of them:

* the module's own tensors are the *primary* copy, the first replica's. The module shows it
  outside ``strategy.run`` (evaluation, ``state_dict``, checkpoints), and the optimizer and its
  state live with it, so it must sit on the first replica's device;
* at the start of every run the primary's parameters and buffers are copied to the other
  replicas' copies, so whatever changed the primary since (the last update, a restored
  checkpoint) reaches every replica;
* while replica ``i`` runs, each parameter's ``.data`` is replica ``i``'s copy and its ``.grad``
  replica ``i``'s own gradient; afterwards the module shows the primary again;
* once every replica has run, the gradients are summed on one device into the primary's
  ``.grad`` and the deferred steps update the primary.

One step of two replicas on ``cuda:0`` and ``cuda:1``, parameters ``w``::

                      primary (cuda:0)             copy of replica 1 (cuda:1)
    start of the run  w                            w (copied from the primary)
    replica 0 runs    w.grad = g0                  -
    replica 1 runs    -                            w.grad = g1
    after the run     w.grad = g0 + g1; step: w'   w (copied again at the next run)

Parameters of lazy modules (``torch.nn.LazyLinear``) must be materialized before the first run:
call the model once on a batch. Modules must update their buffers in place, as BatchNorm does.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import TYPE_CHECKING

import torch

from feedline.distribute._devices import ReplicaDevice, parse_devices
from feedline.distribute.mirroring import Mirroring
from feedline.errors import FailedPreconditionError

if TYPE_CHECKING:
    from feedline.distribute.strategy import Strategy


@dataclasses.dataclass(frozen=True)
class ReductionToOneDevice:
    """Sums the replicas' gradients on one device, whose result every replica's copy then gets
    (``tf.distribute.ReductionToOneDevice``), for ``MirroredStrategy(cross_device_ops=...)``.

    Passing it gives every replica its own copy of the parameters even where replicas share a
    device (logical CPU replicas); without it, ``MirroredStrategy`` keeps copies only where its
    replicas' devices differ.

    Args:
      reduce_to_device: where the gradients are summed, e.g. ``"cpu"`` or ``"cuda:0"``; None
        means the first replica's device, where the primary copy and the optimizer live.

    Example:
      >>> from feedline.distribute import MirroredStrategy
      >>> strategy = MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=ReductionToOneDevice())
      >>> strategy.num_replicas_in_sync
      2
    """

    reduce_to_device: str | None = None

    def __post_init__(self) -> None:
        if self.reduce_to_device is not None:
            parse_devices([self.reduce_to_device])  # an unknown or absent device is an error here


class CopyMirroring(Mirroring):
    """The mirrored modules and optimizers of a strategy whose replicas hold their own copies."""

    shares_parameters = False

    def __init__(self, strategy: Strategy, cross_device_ops: ReductionToOneDevice) -> None:
        super().__init__(strategy)
        self._devices = [d.torch_device for d in strategy.extended.local_devices]
        reduce_to = cross_device_ops.reduce_to_device
        self._reduce_device = (
            None if reduce_to is None else ReplicaDevice.parse(reduce_to).torch_device
        )
        # id(tensor) -> (the tensor, its copies for replicas 1, 2, ...); kept across runs
        self._copies: dict[int, tuple[weakref.ref[torch.Tensor], list[torch.Tensor]]] = {}
        # the current run: parameters then buffers, their primary data, the replicas' copies
        self._params: list[torch.Tensor] = []
        self._tensors: list[torch.Tensor] = []
        self._primary: list[torch.Tensor] = []
        self._replica_tensors: list[list[torch.Tensor]] = []
        self._primary_grads: list[torch.Tensor | None] = []
        self._replica_grads: list[list[torch.Tensor | None]] = []
        self._swapped = False

    # -- the step --------------------------------------------------------------------------
    def before_replica(self, local_replica: int) -> None:
        if local_replica == 0:
            if self._swapped:  # an earlier run stopped with an error inside a replica
                self._show_primary()
            self._start_run()
            return
        if local_replica == 1:
            self._primary_grads = [p.grad for p in self._params]
            self._swapped = True
        for k, (tensor, data) in enumerate(
            zip(self._tensors, self._replica_tensors[local_replica - 1], strict=True)
        ):
            if k < len(self._params):
                tensor.grad = None
            tensor.data = data

    def after_replica(self, local_replica: int) -> None:
        if local_replica > 0:
            self._replica_grads.append([p.grad for p in self._params])

    def abort_run(self) -> None:
        if self._swapped:
            self._show_primary()
        self._replica_grads = []
        super().abort_run()

    def after_run(self) -> None:
        """Shows the primary again, sums the gradients into it, averages the buffers, then
        takes the deferred steps on the primary."""
        if self._swapped:
            self._show_primary()
            self._sum_gradients()
            self._average_buffers()
        self._replica_grads = []
        super().after_run()  # the deferred steps (buffers are not snapshot in this mode)

    def _fold_gradients(self, grads: list[list[torch.Tensor | None]]) -> None:
        """After a hand-over: the first replica's gradients are the primary's, the others' are
        summed into them by ``after_run``."""
        self._primary_grads = list(grads[0])
        self._replica_grads = [list(g) for g in grads[1:]]

    # -- copies ----------------------------------------------------------------------------
    def _start_run(self) -> None:
        """Finds the mirrored tensors and copies the primary's values to every replica's copy."""
        params, buffers = self._mirrored_tensors()
        if any(torch.nn.parameter.is_lazy(t) for t in params + buffers):
            raise FailedPreconditionError(
                "the mirrored model has parameters that are not materialized yet, but every "
                "replica needs its own copy of them before strategy.run: call the model once "
                "on a batch first"
            )
        self._params, self._tensors = params, params + buffers
        self._primary = [t.data for t in self._tensors]
        self._check_primary_device()
        copies: dict[int, tuple[weakref.ref[torch.Tensor], list[torch.Tensor]]] = {}
        for tensor, data in zip(self._tensors, self._primary, strict=True):
            entry = self._copies.get(id(tensor))
            if entry is None or entry[0]() is not tensor or not _fits(entry[1][0], data):
                entry = (
                    weakref.ref(tensor),
                    [torch.empty_like(data, device=device) for device in self._devices[1:]],
                )
            copies[id(tensor)] = entry
        self._copies = copies
        self._replica_tensors = [
            [copies[id(t)][1][i] for t in self._tensors] for i in range(len(self._devices) - 1)
        ]
        with torch.no_grad():
            for device, targets in zip(self._devices[1:], self._replica_tensors, strict=True):
                for target, source in zip(targets, self._primary, strict=True):
                    target.copy_(source, non_blocking=device.type == "cuda")
        self._replica_grads = []

    def _check_primary_device(self) -> None:
        first = self._devices[0]
        elsewhere = sorted({str(d.device) for d in self._primary if d.device != first})
        if elsewhere:
            raise FailedPreconditionError(
                f"the mirrored model has tensors on {elsewhere}, but its primary copy (the "
                f"module itself, with the optimizer's state) must sit on the first replica's "
                f"device {first}; move the model there (model.to({str(first)!r})) before the "
                "optimizer is created or restored: the other replicas get copies on their devices"
            )

    def _show_primary(self) -> None:
        """Points every mirrored tensor back at the primary, with the primary's gradient."""
        for k, (tensor, data) in enumerate(zip(self._tensors, self._primary, strict=True)):
            if k < len(self._params):
                tensor.grad = None
            tensor.data = data
        for param, grad in zip(self._params, self._primary_grads, strict=True):
            param.grad = grad
        self._primary_grads = []
        self._swapped = False

    # -- reduction -------------------------------------------------------------------------
    def _sum_gradients(self) -> None:
        """The primary's gradient plus every other replica's, summed on the reduce device."""
        with torch.no_grad():
            for k, param in enumerate(self._params):
                grads = [grad for g in self._replica_grads if (grad := g[k]) is not None]
                if not grads:
                    continue
                device = self._reduce_device or param.device
                primary = param.grad
                total = None if primary is None else _move(primary, device)
                for grad in grads:
                    grad = _move(grad, device)
                    total = grad if total is None else total.add_(grad)
                assert total is not None
                if total is primary:
                    continue
                if primary is None:
                    param.grad = _move(total, param.device)
                else:
                    primary.copy_(total, non_blocking=primary.device.type == "cuda")

    def _average_buffers(self) -> None:
        """Floating-point buffers: the replicas' mean; integer buffers keep the primary's."""
        with torch.no_grad():
            for k in range(len(self._params), len(self._tensors)):
                primary = self._primary[k]
                if not primary.is_floating_point():
                    continue
                values = [primary] + [_move(r[k], primary.device) for r in self._replica_tensors]
                primary.copy_(torch.stack(values).mean(dim=0))


def _fits(copy: torch.Tensor, data: torch.Tensor) -> bool:
    return copy.shape == data.shape and copy.dtype == data.dtype and copy.stride() == data.stride()


def _move(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``; asynchronous where the copy lands on a GPU (a copy to the CPU
    waits, so that the CPU never reads it early)."""
    return tensor.to(device, non_blocking=device.type == "cuda")
