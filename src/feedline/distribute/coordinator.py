"""``feedline.distribute.coordinator``: ``tf.distribute.coordinator``.

``ClusterCoordinator`` schedules functions on the workers of a ``ParameterServerStrategy``;
``RemoteValue`` is a scheduled function's result; ``PerWorkerValues`` holds one value per
worker (see ``feedline.distribute.parameter_server.coordinator``).
"""

from feedline.distribute.parameter_server.coordinator import ClusterCoordinator
from feedline.distribute.parameter_server.values import (
    PerWorkerDataset,
    PerWorkerDatasetIterator,
    PerWorkerValues,
    RemoteValue,
)

__all__ = [
    "ClusterCoordinator",
    "PerWorkerDataset",
    "PerWorkerDatasetIterator",
    "PerWorkerValues",
    "RemoteValue",
]
