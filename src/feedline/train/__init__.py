"""``feedline.train``: TensorFlow's ``tf.train`` names that feedline offers.

``Example`` and its parts (``feedline.io.example_pb``, beside the parser that reads them) are the
protocol buffers that TFRecord files of examples hold; build
them as with ``tf.train.Example`` and parse them with ``feedline.io.parse_example``.

``Checkpoint``, ``CheckpointManager`` and ``latest_checkpoint`` save and restore models,
optimizers, iterators and metrics (``feedline.train.checkpoint``); ``BackupAndRestore`` saves
them every N steps of a training loop and restores them after a failure
(``feedline.train.backup_and_restore``); ``SidecarEvaluator`` evaluates each new checkpoint of
a training job as it appears (``feedline.train.sidecar_evaluator``). They need torch, which is
imported on first use of one of them, so that ``import feedline.train`` works without it.
"""

import importlib
from typing import Any

from feedline.io.example_pb import (
    BytesList,
    Example,
    Feature,
    Features,
    FloatList,
    Int64List,
)

_CHECKPOINT_NAMES = ("Checkpoint", "CheckpointLoadStatus", "CheckpointManager", "latest_checkpoint")

__all__ = [
    "BackupAndRestore",
    "BytesList",
    "Checkpoint",
    "CheckpointLoadStatus",
    "CheckpointManager",
    "Example",
    "Feature",
    "Features",
    "FloatList",
    "Int64List",
    "SidecarEvaluator",
    "latest_checkpoint",
]


def __getattr__(name: str) -> Any:
    if name in _CHECKPOINT_NAMES:
        return getattr(importlib.import_module("feedline.train.checkpoint"), name)
    if name == "BackupAndRestore":
        return importlib.import_module("feedline.train.backup_and_restore").BackupAndRestore
    if name == "SidecarEvaluator":
        return importlib.import_module("feedline.train.sidecar_evaluator").SidecarEvaluator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_CHECKPOINT_NAMES, "BackupAndRestore", "SidecarEvaluator"})
