"""``OneDeviceStrategy``: everything on one device."""

from __future__ import annotations

from feedline.distribute._devices import ReplicaDevice, parse_devices
from feedline.distribute.strategy import Strategy, StrategyExtended, warn_if_in_cluster


class OneDeviceStrategy(Strategy):
    """One replica on ``device`` (``"cuda:0"``, ``"/gpu:0"``, ``"cpu"``).

    Example:
      >>> strategy = OneDeviceStrategy("cpu")
      >>> strategy.num_replicas_in_sync, strategy.extended.worker_devices
      (1, ('cpu:0',))
    """

    def __init__(self, device: str) -> None:
        super().__init__(StrategyExtended(parse_devices([device])))
        warn_if_in_cluster(self)

    @property
    def device(self) -> ReplicaDevice:
        return self.extended.local_devices[0]
