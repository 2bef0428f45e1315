"""``feedline.distribute``: distribution strategies that feed replicas and run on them.

Example:
  >>> import feedline.data as fd
  >>> import feedline.distribute as fdist
  >>> strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
  >>> dist = strategy.experimental_distribute_dataset(fd.Dataset.range(6).batch(4))
  >>> [strategy.experimental_local_results(x) for x in dist]
  [(tensor([0, 1]), tensor([2, 3])), (tensor([4]), tensor([5]))]
"""

from feedline import _porting
from feedline.distribute import cluster_resolver, experimental
from feedline.distribute.context import (
    ReplicaContext,
    get_replica_context,
    has_strategy,
    in_cross_replica_context,
)
from feedline.distribute.copy_mirroring import ReductionToOneDevice
from feedline.distribute.distributed_dataset import DistributedDataset, DistributedIterator
from feedline.distribute.input_context import (
    InputContext,
    InputOptions,
    InputReplicationMode,
    ValueContext,
)
from feedline.distribute.mirrored import MirroredStrategy
from feedline.distribute.multi_worker import MultiWorkerMirroredStrategy
from feedline.distribute.one_device import OneDeviceStrategy
from feedline.distribute.strategy import Strategy, StrategyExtended, get_strategy
from feedline.distribute.values import DistributedValues, PerReplica, PerReplicaSpec, ReduceOp

__all__ = [
    "DistributedDataset",
    "DistributedIterator",
    "DistributedValues",
    "InputContext",
    "InputOptions",
    "InputReplicationMode",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "OneDeviceStrategy",
    "PerReplica",
    "PerReplicaSpec",
    "ReduceOp",
    "ReductionToOneDevice",
    "ReplicaContext",
    "Strategy",
    "StrategyExtended",
    "ValueContext",
    "cluster_resolver",
    "experimental",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "in_cross_replica_context",
]


def __getattr__(name: str) -> object:
    raise _porting.missing_attribute(__name__, name)
