"""``feedline.train``: TensorFlow's ``tf.train`` names that feedline offers.

``Example`` and its parts (``feedline.io.example_pb``, beside the parser that reads them) are the
protocol buffers that TFRecord files of examples hold; build them as with ``tf.train.Example``
and parse them with ``feedline.io.parse_example``.

``Checkpoint`` and ``latest_checkpoint`` (``feedline.train.checkpoint``) and
``CheckpointManager`` (``feedline.train.checkpoint_management``) save and restore models,
optimizers, iterators and metrics (``CheckpointOptions`` is TensorFlow's ``options=`` of their
calls); ``BackupAndRestore`` saves them every N steps of a training
loop and restores them after a failure (``feedline.train.backup_and_restore``);
``ClusterSpec`` is ``feedline.distribute.cluster_resolver.ClusterSpec`` (TensorFlow's
``tf.train.ClusterSpec``). ``SidecarEvaluator`` evaluates each new checkpoint of a training job
as it appears
(``feedline.train.sidecar_evaluator``). ``feedline.train.preemption`` holds the implementation of
``feedline.distribute.experimental.PreemptionCheckpointHandler``. They need torch, which is
imported on first use of one of them, so that ``import feedline.train`` works without it.
"""

from feedline import _porting
from feedline.io.example_pb import (
    BytesList,
    Example,
    Feature,
    Features,
    FloatList,
    Int64List,
)
from feedline.train.checkpoint_options import CheckpointOptions

__all__ = [
    "BackupAndRestore",
    "BytesList",
    "Checkpoint",
    "CheckpointLoadStatus",
    "CheckpointManager",
    "CheckpointMismatchError",
    "CheckpointOptions",
    "ClusterSpec",
    "Example",
    "Feature",
    "Features",
    "FloatList",
    "Int64List",
    "SidecarEvaluator",
    "latest_checkpoint",
]

# The names that need torch: resolved on first access.
__getattr__, __dir__ = _porting.lazy_attributes(
    __name__,
    {
        "BackupAndRestore": "feedline.train.backup_and_restore:BackupAndRestore",
        "Checkpoint": "feedline.train.checkpoint:Checkpoint",
        "CheckpointLoadStatus": "feedline.train.checkpoint:CheckpointLoadStatus",
        "CheckpointManager": "feedline.train.checkpoint_management:CheckpointManager",
        "CheckpointMismatchError": "feedline.train.checkpoint:CheckpointMismatchError",
        "ClusterSpec": "feedline.distribute.cluster_resolver:ClusterSpec",
        "SidecarEvaluator": "feedline.train.sidecar_evaluator:SidecarEvaluator",
        "latest_checkpoint": "feedline.train.checkpoint:latest_checkpoint",
    },
)
