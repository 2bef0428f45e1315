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
from feedline.distribute.strategy import (
    RunOptions,
    Strategy,
    StrategyExtended,
    experimental_set_strategy,
    get_strategy,
)
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
    "ParameterServerStrategy",
    "PerReplica",
    "PerReplicaSpec",
    "ReduceOp",
    "ReductionToOneDevice",
    "ReplicaContext",
    "RunOptions",
    "Server",
    "Strategy",
    "StrategyExtended",
    "ValueContext",
    "cluster_resolver",
    "coordinator",
    "experimental",
    "experimental_set_strategy",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "in_cross_replica_context",
]


# The parameter-server names import gRPC: resolved on first access.
__getattr__, __dir__ = _porting.lazy_attributes(
    __name__,
    {
        "ParameterServerStrategy": (
            "feedline.distribute.parameter_server.strategy:ParameterServerStrategy"
        ),
        "Server": "feedline.distribute.parameter_server.server:Server",
        "coordinator": "feedline.distribute.coordinator",
    },
)
