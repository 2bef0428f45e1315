"""Tests of feedline/config.py: physical and logical devices, as the seeds set them up."""

from __future__ import annotations

import doctest
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import feedline.distribute as fdist
from feedline import config
from feedline.errors import InvalidArgumentError

PORTING = pathlib.Path(__file__).resolve().parents[1] / "docs" / "porting.md"


@pytest.fixture(autouse=True)
def fresh_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device configuration as in a new process: nothing set, no strategy built yet."""
    monkeypatch.setattr(config, "_configuration", config._DeviceConfiguration())


def cpu() -> config.PhysicalDevice:
    return config.list_physical_devices("CPU")[0]


def test_physical_devices() -> None:
    assert config.list_physical_devices("CPU") == [
        config.PhysicalDevice(name="/physical_device:CPU:0", device_type="CPU")
    ]
    gpus = [
        config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU")
        for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0)
    ]
    assert config.list_physical_devices("gpu") == gpus
    assert config.list_physical_devices() == [cpu(), *gpus]
    with pytest.raises(InvalidArgumentError, match="device_type must be 'CPU', 'GPU'"):
        config.list_physical_devices("TPU")


def test_one_logical_cpu_without_configuration() -> None:
    assert config.list_logical_devices("CPU") == [
        config.LogicalDevice(name="/device:CPU:0", device_type="CPU")
    ]
    assert config.get_logical_device_configuration(cpu()) is None
    assert repr(config.list_logical_devices("CPU")[0]) == (
        "LogicalDevice(name='/device:CPU:0', device_type='CPU')"
    )


def test_virtual_cpus_become_logical_devices_and_default_replicas() -> None:
    configs = [config.LogicalDeviceConfiguration() for _ in range(2)]
    config.set_logical_device_configuration(cpu(), configs)
    assert config.get_logical_device_configuration(cpu()) == configs
    assert [d.name for d in config.list_logical_devices("CPU")] == [
        "/device:CPU:0",
        "/device:CPU:1",
    ]
    if not torch.cuda.is_available():
        strategy = fdist.MirroredStrategy()
        assert strategy.extended.worker_devices == ("cpu:0", "cpu:1")
        result = strategy.run(lambda: fdist.get_replica_context().replica_id_in_sync_group)
        assert strategy.experimental_local_results(result) == (0, 1)


def test_logical_devices_name_a_strategy_s_devices() -> None:
    config.set_logical_device_configuration(cpu(), [config.LogicalDeviceConfiguration()] * 3)
    devices = config.list_logical_devices("CPU")
    strategy = fdist.MirroredStrategy([d.name for d in devices])
    assert strategy.num_replicas_in_sync == 3
    assert fdist.MirroredStrategy(devices).extended.worker_devices == ("cpu:0", "cpu:1", "cpu:2")


def test_the_configuration_is_fixed_once_a_strategy_is_built() -> None:
    two = [config.LogicalDeviceConfiguration()] * 2
    config.set_logical_device_configuration(cpu(), two)
    fdist.get_strategy()  # the default strategy fixes nothing
    config.set_logical_device_configuration(cpu(), [config.LogicalDeviceConfiguration()] * 3)
    config.set_logical_device_configuration(cpu(), two)
    fdist.OneDeviceStrategy("cpu")
    with pytest.raises(RuntimeError, match="Virtual devices cannot be modified after being"):
        config.set_logical_device_configuration(cpu(), [config.LogicalDeviceConfiguration()])
    with pytest.raises(RuntimeError, match="Virtual devices cannot be modified"):
        config.set_logical_device_configuration(cpu(), None)
    config.set_logical_device_configuration(cpu(), list(two))  # the same again is allowed
    assert len(config.list_logical_devices("CPU")) == 2


def test_none_removes_the_configuration() -> None:
    config.set_logical_device_configuration(cpu(), [config.LogicalDeviceConfiguration()] * 2)
    config.set_logical_device_configuration(cpu(), None)
    assert config.get_logical_device_configuration(cpu()) is None
    assert len(config.list_logical_devices("CPU")) == 1


@pytest.mark.parametrize(
    ("device", "logical", "match"),
    [
        ("/physical_device:CPU:0", [config.LogicalDeviceConfiguration()], "PhysicalDevice from"),
        (
            config.PhysicalDevice("/physical_device:CPU:7", "CPU"),
            [config.LogicalDeviceConfiguration()],
            "not a device of this machine",
        ),
        (None, [], "at least one LogicalDeviceConfiguration"),
        (None, [{}], "LogicalDeviceConfiguration\\(\\) values"),
        (None, [config.LogicalDeviceConfiguration(memory_limit=1024)], "memory_limit"),
        (None, [config.LogicalDeviceConfiguration(experimental_priority=1)], "priority"),
    ],
)
def test_bad_configurations(device: object, logical: list, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        config.set_logical_device_configuration(device or cpu(), logical)
    assert config.get_logical_device_configuration(cpu()) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_is_one_logical_device() -> None:
    gpu = config.list_physical_devices("GPU")[0]
    with pytest.raises(InvalidArgumentError, match="cannot be split"):
        config.set_logical_device_configuration(gpu, [config.LogicalDeviceConfiguration()] * 2)
    config.set_logical_device_configuration(gpu, [config.LogicalDeviceConfiguration()])
    assert config.list_logical_devices("GPU")[0] == config.LogicalDevice("/device:GPU:0", "GPU")


def test_porting_hints_and_normal_errors() -> None:
    with pytest.raises(AttributeError, match="set_memory_growth has no counterpart"):
        config.experimental  # noqa: B018
    with pytest.raises(AttributeError, match="CUDA_VISIBLE_DEVICES"):
        config.set_visible_devices  # noqa: B018
    with pytest.raises(AttributeError, match=r"^module 'feedline.config' has no attribute 'lst'$"):
        config.lst  # noqa: B018


def test_doctests() -> None:
    results = doctest.testmod(config)
    assert results.attempted >= 3 and results.failed == 0


def test_the_guide_s_set_up_ports_as_written() -> None:
    """The block of docs/porting.md, run in a new process as the guide runs it."""
    blocks = re.findall(r"```python fresh-process\n(.*?)```", PORTING.read_text(), re.DOTALL)
    assert len(blocks) == 1
    code = blocks[0] + (
        "\ntry:\n"
        "    tf.config.set_logical_device_configuration(\n"
        "        physical_devices[0], [tf.config.LogicalDeviceConfiguration()])\n"
        "except RuntimeError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:3] == [
        "Available devices:",
        "0) LogicalDevice(name='/device:CPU:0', device_type='CPU')",
        "1) LogicalDevice(name='/device:CPU:1', device_type='CPU')",
    ]
    if not torch.cuda.is_available():
        assert lines[3] == "2"
    assert lines[-1].startswith("Virtual devices cannot be modified after being initialized")
