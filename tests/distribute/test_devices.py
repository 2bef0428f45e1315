"""Tests of feedline/distribute/_devices.py."""

from __future__ import annotations

import pytest
import torch

from feedline import config
from feedline.distribute import MirroredStrategy
from feedline.distribute._devices import ReplicaDevice, default_devices, parse_devices
from feedline.errors import InvalidArgumentError


@pytest.mark.parametrize(
    ("name", "kind", "index"),
    [
        ("cuda:0", "cuda", 0),
        ("/gpu:1", "cuda", 1),
        ("GPU:2", "cuda", 2),
        ("/job:localhost/replica:0/task:0/device:GPU:3", "cuda", 3),
        ("cpu:0", "cpu", 0),
        ("/cpu:1", "cpu", 1),
        ("CPU:2", "cpu", 2),
        ("/device:CPU:4", "cpu", 4),
        ("cpu", "cpu", 0),
    ],
)
def test_pytorch_and_tensorflow_spellings(name: str, kind: str, index: int) -> None:
    device = ReplicaDevice.parse(name)
    assert (device.kind, device.index) == (kind, index)


def test_logical_cpu_replicas_compute_on_the_cpu() -> None:
    assert ReplicaDevice.parse("/cpu:3").torch_device == torch.device("cpu")
    assert str(ReplicaDevice.parse("/cpu:3")) == "cpu:3"


def test_bad_devices() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown device 'tpu:0'"):
        ReplicaDevice.parse("tpu:0")
    with pytest.raises(InvalidArgumentError, match="repeat"):
        parse_devices(["cpu:0", "/cpu:0"])
    with pytest.raises(InvalidArgumentError, match="at least one device"):
        parse_devices([])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_without_cuda() -> None:
    assert default_devices() == (ReplicaDevice("cpu", 0),)
    with pytest.raises(InvalidArgumentError, match="need CUDA"):
        parse_devices(["cuda:0"])


@pytest.fixture
def fresh_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device configuration as in a new process: nothing set, no strategy built yet."""
    monkeypatch.setattr(config, "_configuration", config._DeviceConfiguration())


def test_logical_devices_parse_as_replica_devices() -> None:
    device = config.LogicalDevice(name="/device:CPU:1", device_type="CPU")
    assert ReplicaDevice.parse(device) == ReplicaDevice("cpu", 1)
    assert parse_devices(config.list_logical_devices("CPU")) == (ReplicaDevice("cpu", 0),)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
@pytest.mark.usefixtures("fresh_config")
def test_default_devices_are_the_configured_logical_cpus() -> None:
    cpu = config.list_physical_devices("CPU")[0]
    config.set_logical_device_configuration(cpu, [config.LogicalDeviceConfiguration()] * 3)
    assert default_devices() == tuple(ReplicaDevice("cpu", i) for i in range(3))
    strategy = MirroredStrategy()
    assert strategy.extended.worker_devices == ("cpu:0", "cpu:1", "cpu:2")
    assert strategy.num_replicas_in_sync == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.usefixtures("fresh_config")
def test_default_devices_are_every_gpu_even_with_logical_cpus() -> None:
    cpu = config.list_physical_devices("CPU")[0]
    config.set_logical_device_configuration(cpu, [config.LogicalDeviceConfiguration()] * 2)
    expected = tuple(ReplicaDevice("cuda", i) for i in range(torch.cuda.device_count()))
    assert default_devices() == expected
