"""``feedline.service``: the data service (``tf.data.experimental.service``).

A dispatcher and workers take the input pipeline off the training process:
``dataset.apply(distribute(...))`` runs what comes before it on the workers and streams the
elements back. Also importable as ``feedline.data.experimental.service``.

The package is laid out by the process that runs the code: ``client/`` (what a training process
runs: ``distribute``, ``from_dataset_id``), ``dispatcher/``, ``worker/`` and ``status/`` (the
servers' page and metrics), standing on ``protocol`` (what they agree on) and a few shared
modules (``config``, ``splits``, ``ledger``, ``position``, ``shm``). ``DispatchServer`` and
``WorkerServer`` are imported on first use, so that a training process that only reads from the
service loads no server code.
"""

from typing import TYPE_CHECKING

from feedline import _porting
from feedline.service.client import (
    CrossTrainerCache,
    DataServiceDataset,
    distribute,
    distributed_save,
    from_dataset_id,
    register_dataset,
)
from feedline.service.config import DispatcherConfig, ShardingPolicy, WorkerConfig, local_token

if TYPE_CHECKING:
    from feedline.service.dispatcher import DispatchServer
    from feedline.service.worker import WorkerServer

__all__ = [
    "CrossTrainerCache",
    "DataServiceDataset",
    "DispatchServer",
    "DispatcherConfig",
    "ShardingPolicy",
    "WorkerConfig",
    "WorkerServer",
    "distribute",
    "distributed_save",
    "from_dataset_id",
    "local_token",
    "register_dataset",
]

__getattr__, __dir__ = _porting.lazy_attributes(
    __name__,
    {
        "DispatchServer": "feedline.service.dispatcher:DispatchServer",
        "WorkerServer": "feedline.service.worker:WorkerServer",
    },
)
