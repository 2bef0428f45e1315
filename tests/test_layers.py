"""The layers of DESIGN.md: feedline.data (and io) never import torch; dependencies point down."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> None:
    """Runs ``code`` in a fresh interpreter, where nothing was imported yet."""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_feedline_data_does_not_import_torch() -> None:
    _run(
        "import sys, feedline, feedline.data, feedline.io, feedline.train\n"
        "import feedline.data.experimental\n"
        "assert 'torch' not in sys.modules, 'feedline.data imported torch'\n"
        "assert 'feedline.distribute' not in sys.modules\n"
        "assert 'feedline.service' not in sys.modules\n"
    )


def test_the_torch_adapters_import_torch_only_when_called() -> None:
    _run(
        "import sys, feedline.data as fd\n"
        "assert callable(fd.Dataset.from_torch) and callable(fd.Dataset.as_torch)\n"
        "assert 'torch' not in sys.modules and 'feedline.data.torch_loader' not in sys.modules\n"
        "loader = fd.Dataset.range(3).as_torch()\n"
        "assert 'torch' in sys.modules and [int(x) for x in loader] == [0, 1, 2]\n"
    )


def test_feedline_service_does_not_import_torch() -> None:
    _run(
        "import sys, feedline.service\n"
        "import feedline.data.experimental as experimental\n"
        "assert experimental.service.distribute is feedline.service.distribute\n"
        "from feedline.data.experimental.service import distribute\n"
        "assert distribute is feedline.service.distribute\n"
        "assert 'torch' not in sys.modules, 'feedline.service imported torch'\n"
    )


def test_import_feedline_imports_nothing_heavy() -> None:
    _run(
        "import sys, feedline\n"
        "for name in ('torch', 'feedline.data', 'feedline.distribute', 'feedline.service'):\n"
        "    assert name not in sys.modules, f'import feedline imported {name}'\n"
        "assert {'data', 'distribute', 'config', 'nn', 'compat'} <= set(dir(feedline))\n"
    )


def test_lazy_modules_of_feedline_do_not_import_torch() -> None:
    _run(
        "import sys, feedline as tf\n"
        "tf.data.Dataset.range(3), tf.data.experimental.AutoShardPolicy, tf.TensorSpec\n"
        "tf.data.experimental.service.distribute, tf.errors.OutOfRangeError, tf.io, tf.train\n"
        "tf.compat.v1.data.Options, tf.config.list_physical_devices('CPU')\n"
        "tf.config.set_logical_device_configuration(\n"
        "    tf.config.list_physical_devices('CPU')[0], [tf.config.LogicalDeviceConfiguration()])\n"
        "assert tf.config.list_logical_devices('CPU')[0].name == '/device:CPU:0'\n"
        "assert 'torch' not in sys.modules, 'a torch-free module of feedline imported torch'\n"
        "assert 'feedline.distribute' not in sys.modules\n"
        "tf.distribute.MirroredStrategy\n"
        "assert 'torch' in sys.modules\n"
    )
