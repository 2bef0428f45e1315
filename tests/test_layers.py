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


def test_feedline_service_does_not_import_torch() -> None:
    _run(
        "import sys, feedline.service\n"
        "import feedline.data.experimental as experimental\n"
        "assert experimental.service.distribute is feedline.service.distribute\n"
        "from feedline.data.experimental.service import distribute\n"
        "assert distribute is feedline.service.distribute\n"
        "assert 'torch' not in sys.modules, 'feedline.service imported torch'\n"
    )
