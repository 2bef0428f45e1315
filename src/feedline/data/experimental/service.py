"""``feedline.data.experimental.service``: the data service under the seed's name.

The same objects as ``feedline.service`` (which depends on ``feedline.data``, not the other way
round: this module is only an alias, imported when asked for).
"""

from feedline.service import (
    DataServiceDataset,
    DispatcherConfig,
    DispatchServer,
    ShardingPolicy,
    WorkerConfig,
    WorkerServer,
    distribute,
    from_dataset_id,
    register_dataset,
)

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
