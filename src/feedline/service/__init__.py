"""``feedline.service``: the data service (``tf.data.experimental.service``).

A dispatcher and workers take the input pipeline off the training process:
``dataset.apply(distribute(...))`` runs what comes before it on the workers and streams the
elements back. Also importable as ``feedline.data.experimental.service``.
"""

from feedline.service.client import (
    DataServiceDataset,
    distribute,
    from_dataset_id,
    register_dataset,
)
from feedline.service.config import DispatcherConfig, ShardingPolicy, WorkerConfig
from feedline.service.dispatcher import DispatchServer
from feedline.service.worker import WorkerServer

__all__ = [
    "DataServiceDataset",
    "DispatchServer",
    "DispatcherConfig",
    "ShardingPolicy",
    "WorkerConfig",
    "WorkerServer",
    "distribute",
    "from_dataset_id",
    "register_dataset",
]
