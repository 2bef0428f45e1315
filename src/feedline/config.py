"""``feedline.config``: the devices replicas can live on (``tf.config``).

Physical devices are the CPU and every CUDA GPU. Logical devices are what strategies place
replicas on: one per GPU, and on the CPU one, or as many as configured with
``set_logical_device_configuration``, as TensorFlow's virtual CPU devices. ``MirroredStrategy()``
without devices takes every logical GPU, or every logical CPU where there is no GPU. As in
TensorFlow, the configuration is fixed once the first strategy is built.

Example (the guide's set-up; in a fresh process, before any strategy):
  >>> import feedline as tf
  >>> physical_devices = tf.config.list_physical_devices("CPU")
  >>> tf.config.set_logical_device_configuration(
  ...     physical_devices[0], [tf.config.LogicalDeviceConfiguration() for _ in range(2)])
  >>> tf.config.list_logical_devices("CPU")  # doctest: +NORMALIZE_WHITESPACE
  [LogicalDevice(name='/device:CPU:0', device_type='CPU'),
   LogicalDevice(name='/device:CPU:1', device_type='CPU')]

torch is imported only where GPUs are looked for; ``import feedline.config`` does not import it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import NamedTuple

from feedline import _porting
from feedline.errors import InvalidArgumentError

__all__ = [
    "LogicalDevice",
    "LogicalDeviceConfiguration",
    "PhysicalDevice",
    "get_logical_device_configuration",
    "list_logical_devices",
    "list_physical_devices",
    "set_logical_device_configuration",
]

_DEVICE_TYPES = ("CPU", "GPU")


class PhysicalDevice(NamedTuple):
    """A device of this machine, e.g. ``PhysicalDevice(name='/physical_device:CPU:0',
    device_type='CPU')``."""

    name: str
    device_type: str


class LogicalDevice(NamedTuple):
    """A device replicas are placed on, e.g. ``LogicalDevice(name='/device:CPU:1',
    device_type='CPU')``; its ``name`` is accepted wherever a strategy takes a device."""

    name: str
    device_type: str


class LogicalDeviceConfiguration(NamedTuple):
    """One logical device to make of a physical device.

    Attributes:
      memory_limit: TensorFlow's GPU memory cap in MB; feedline has none (see
        ``set_logical_device_configuration``).
      experimental_priority: accepted for compatibility; it must be None.
      experimental_device_ordinal: accepted for compatibility; it must be None.
    """

    memory_limit: int | None = None
    experimental_priority: int | None = None
    experimental_device_ordinal: int | None = None


class _DeviceConfiguration:
    """The process's logical device configuration; fixed once the first strategy is built."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.logical: dict[PhysicalDevice, tuple[LogicalDeviceConfiguration, ...]] = {}
        self.initialized = False


_configuration = _DeviceConfiguration()


def _device_type(device_type: str | None) -> str | None:
    if device_type is None:
        return None
    if not isinstance(device_type, str) or device_type.upper() not in _DEVICE_TYPES:
        raise InvalidArgumentError(
            f"device_type must be 'CPU', 'GPU' or None (every type), got {device_type!r}"
        )
    return device_type.upper()


def _num_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def list_physical_devices(device_type: str | None = None) -> list[PhysicalDevice]:
    """The machine's devices: the CPU, then every CUDA GPU (``device_type`` "CPU", "GPU" or
    None for both).

    Example:
      >>> list_physical_devices("CPU")
      [PhysicalDevice(name='/physical_device:CPU:0', device_type='CPU')]
    """
    kind = _device_type(device_type)
    devices = []
    if kind in (None, "CPU"):
        devices.append(PhysicalDevice("/physical_device:CPU:0", "CPU"))
    if kind in (None, "GPU"):
        devices += [PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(_num_gpus())]
    return devices


def list_logical_devices(device_type: str | None = None) -> list[LogicalDevice]:
    """The devices strategies place replicas on: as many logical CPUs as configured (one by
    default), and one logical GPU per GPU, e.g. ``[LogicalDevice(name='/device:CPU:0',
    device_type='CPU')]`` where nothing is configured.
    """
    devices: list[LogicalDevice] = []
    for physical in list_physical_devices(device_type):
        kind = physical.device_type
        count = len(_configuration.logical.get(physical, (None,)))
        first = sum(1 for d in devices if d.device_type == kind)
        devices += [LogicalDevice(f"/device:{kind}:{first + i}", kind) for i in range(count)]
    return devices


def get_logical_device_configuration(
    device: PhysicalDevice,
) -> list[LogicalDeviceConfiguration] | None:
    """The logical devices configured for ``device``, or None where none were."""
    _check_physical(device)
    configured = _configuration.logical.get(device)
    return None if configured is None else list(configured)


def set_logical_device_configuration(
    device: PhysicalDevice, logical_devices: Sequence[LogicalDeviceConfiguration] | None
) -> None:
    """Makes ``len(logical_devices)`` logical devices of the physical ``device``.

    On the CPU, each is a logical replica that computes on the one CPU, as TensorFlow's virtual
    CPU devices do; this is how multi-replica code runs on a machine without GPUs. A GPU takes
    exactly one configuration without ``memory_limit``: PyTorch cannot split a GPU into logical
    devices (``torch.cuda.set_per_process_memory_fraction`` caps its memory). ``None`` removes
    the configuration.

    Raises:
      RuntimeError: a strategy was already built and the configuration differs from the current
        one (TensorFlow's rule: "Virtual devices cannot be modified after being initialized").
      InvalidArgumentError: ``device`` is not one of ``list_physical_devices()``, or a
        configuration is not supported.
    """
    _check_physical(device)
    if logical_devices is not None:
        logical_devices = tuple(logical_devices)
        _check_configurations(device, logical_devices)
    with _configuration.lock:
        if _configuration.logical.get(device) == logical_devices:
            return
        if _configuration.initialized:
            raise RuntimeError(
                "Virtual devices cannot be modified after being initialized: a strategy was "
                "already built in this process; configure logical devices before building one"
            )
        if logical_devices is None:
            _configuration.logical.pop(device, None)
        else:
            _configuration.logical[device] = logical_devices


def _check_physical(device: PhysicalDevice) -> None:
    if not isinstance(device, PhysicalDevice):
        raise InvalidArgumentError(
            "device must be a PhysicalDevice from feedline.config.list_physical_devices(), got "
            f"{device!r}"
        )
    if device not in list_physical_devices(device.device_type):
        raise InvalidArgumentError(
            f"{device.name} is not a device of this machine: {list_physical_devices()}"
        )


def _check_configurations(
    device: PhysicalDevice, logical_devices: tuple[LogicalDeviceConfiguration, ...]
) -> None:
    if not logical_devices:
        raise InvalidArgumentError(
            f"{device.name} needs at least one LogicalDeviceConfiguration (None removes them)"
        )
    for config in logical_devices:
        if not isinstance(config, LogicalDeviceConfiguration):
            raise InvalidArgumentError(
                f"logical devices are LogicalDeviceConfiguration() values, got {config!r}"
            )
        if config.experimental_priority is not None or config.experimental_device_ordinal not in (
            None,
            0,
        ):
            raise InvalidArgumentError(
                "experimental_priority and experimental_device_ordinal are not supported; "
                f"leave them None, got {config!r}"
            )
        if config.memory_limit is not None:
            raise InvalidArgumentError(
                f"{device.name}: memory_limit is not supported; PyTorch caps a GPU's memory "
                "with torch.cuda.set_per_process_memory_fraction, and CPU replicas have no limit"
            )
    if device.device_type == "GPU" and len(logical_devices) > 1:
        raise InvalidArgumentError(
            f"{device.name}: a GPU cannot be split into {len(logical_devices)} logical devices "
            "in PyTorch; use one per GPU, or logical CPU replicas for tests without GPUs"
        )


def _mark_initialized() -> None:
    """Fixes the configuration: called when a strategy is built."""
    with _configuration.lock:
        _configuration.initialized = True


__getattr__, __dir__ = _porting.lazy_attributes(__name__, {})
