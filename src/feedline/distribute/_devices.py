"""Device names: PyTorch and TensorFlow spellings of the devices replicas live on.

``"cuda:0"``, ``"/gpu:0"``, ``"GPU:0"`` and ``"/job:localhost/replica:0/task:0/device:GPU:0"`` all
name CUDA device 0. ``"cpu:0"``, ``"/cpu:1"``, ``"CPU:2"`` name *logical* CPU replicas: several
replicas computing on the one CPU, as TensorFlow's virtual CPU devices do.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from feedline import config
from feedline.errors import InvalidArgumentError

_PATTERN = re.compile(
    r"^(?:/job:[^/]+(?:/replica:\d+)?(?:/task:\d+)?)?/?(?:device:)?(?P<kind>cpu|gpu|cuda)"
    r"(?::(?P<index>\d+))?$",
    re.IGNORECASE,
)


@dataclasses.dataclass(frozen=True, order=True)
class ReplicaDevice:
    """Where one replica computes: ``kind`` "cpu" (a logical replica) or "cuda", and an index."""

    kind: str
    index: int

    @classmethod
    def parse(
        cls, name: str | torch.device | config.LogicalDevice | ReplicaDevice
    ) -> ReplicaDevice:
        """A device from its PyTorch or TensorFlow name, or a ``feedline.config.LogicalDevice``."""
        if isinstance(name, ReplicaDevice):
            return name
        if isinstance(name, config.LogicalDevice):
            name = name.name
        if isinstance(name, torch.device):
            name = str(name)
        if not isinstance(name, str):
            raise InvalidArgumentError(
                f"a device is a string such as 'cuda:0' or 'cpu:1', got {name!r}"
            )
        match = _PATTERN.match(name.strip())
        if match is None:
            raise InvalidArgumentError(
                f"unknown device {name!r}; use 'cuda:N', '/gpu:N', 'GPU:N' or logical CPU "
                "replicas 'cpu:N', '/cpu:N'"
            )
        kind = "cpu" if match["kind"].lower() == "cpu" else "cuda"
        return cls(kind, int(match["index"] or 0))

    @property
    def torch_device(self) -> torch.device:
        """The PyTorch device: logical CPU replicas all compute on ``cpu``."""
        return torch.device("cpu") if self.kind == "cpu" else torch.device("cuda", self.index)

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}"


def parse_devices(devices: list[str] | tuple[str, ...]) -> tuple[ReplicaDevice, ...]:
    """Parsed devices; an empty list or a repeated device is an error."""
    parsed = tuple(ReplicaDevice.parse(d) for d in devices)
    if not parsed:
        raise InvalidArgumentError("a strategy needs at least one device")
    if len(set(parsed)) != len(parsed):
        raise InvalidArgumentError(f"devices repeat: {[str(d) for d in parsed]}")
    cuda = [d for d in parsed if d.kind == "cuda"]
    if cuda and not torch.cuda.is_available():
        raise InvalidArgumentError(
            f"devices {[str(d) for d in cuda]} need CUDA, which this machine does not have; "
            "use logical CPU replicas such as ['cpu:0', 'cpu:1']"
        )
    if cuda and max(d.index for d in cuda) >= torch.cuda.device_count():
        raise InvalidArgumentError(
            f"devices {[str(d) for d in cuda]}: this machine has {torch.cuda.device_count()} GPUs"
        )
    return parsed


def default_devices() -> tuple[ReplicaDevice, ...]:
    """Every logical GPU, or every logical CPU where there is none (``feedline.config``): one
    CPU replica, or as many as ``set_logical_device_configuration`` made."""
    devices = config.list_logical_devices("GPU") or config.list_logical_devices("CPU")
    return tuple(ReplicaDevice.parse(device) for device in devices)
