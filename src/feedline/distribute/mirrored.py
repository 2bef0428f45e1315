"""``MirroredStrategy``: several replicas in one process, stepping in sync."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from feedline.distribute._devices import default_devices, parse_devices
from feedline.distribute.copy_mirroring import CopyMirroring, ReductionToOneDevice
from feedline.distribute.mirroring import Mirroring
from feedline.distribute.strategy import Strategy, StrategyExtended, warn_if_in_cluster


class MirroredStrategy(Strategy):
    """Synchronous replicas on several devices of one process.

    ``devices=None`` means every CUDA GPU, or where there is none every logical CPU of
    ``feedline.config.list_logical_devices("CPU")`` (one unless configured). Logical CPU
    replicas (``["cpu:0", "cpu:1"]``) compute on the one CPU, as TensorFlow's virtual CPU devices
    do; they are how multi-replica code is tested without GPUs.

    Models made under ``scope()`` are mirrored (``mirroring``). Replicas on one device share the
    module's parameters; replicas on distinct devices each compute on their own copy, their
    gradients are summed on one device and every copy gets the same update (``copy_mirroring``;
    the model itself, the primary copy, sits on the first device).

    Args:
      devices: the replicas' devices, e.g. ``["cuda:0", "cuda:1"]`` or ``["cpu:0", "cpu:1"]``.
      cross_device_ops: how gradients are reduced across per-replica copies: a
        ``ReductionToOneDevice``, which also gives each replica its own copy where replicas
        share a device; None keeps copies only where the replicas' devices differ.

    Example:
      >>> strategy = MirroredStrategy(["cpu:0", "cpu:1"])
      >>> strategy.num_replicas_in_sync
      2
    """

    def __init__(
        self,
        devices: Sequence[str] | None = None,
        cross_device_ops: ReductionToOneDevice | None = None,
    ) -> None:
        if cross_device_ops is not None and not isinstance(cross_device_ops, ReductionToOneDevice):
            raise TypeError(
                "cross_device_ops must be a feedline.distribute.ReductionToOneDevice or None, got "
                f"{type(cross_device_ops).__name__}; HierarchicalCopyAllReduce and NcclAllReduce "
                "are not offered: use ReductionToOneDevice(), or None for the default"
            )
        parsed = default_devices() if devices is None else parse_devices(list(devices))
        self._cross_device_ops = cross_device_ops
        super().__init__(StrategyExtended(parsed))
        warn_if_in_cluster(self)

    @functools.cached_property
    def _mirroring(self) -> Mirroring:
        devices = {d.torch_device for d in self.extended.local_devices}
        if self._cross_device_ops is None and len(devices) == 1:
            return Mirroring(self)
        return CopyMirroring(self, self._cross_device_ops or ReductionToOneDevice())
