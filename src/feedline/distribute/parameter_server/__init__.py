"""The parameter-server core of ``ParameterServerStrategy``: servers (``server``), variables on
the ps (``variables``, ``runtime``, ``storage``, ``updates``), optimizers whose state the ps
keeps (``optimizer``), and the coordinator that schedules functions on workers
(``coordinator``, ``values``, ``closures``, ``executor``). Public names are re-exported by
``feedline.distribute`` and ``feedline.distribute.coordinator``.
"""

from feedline.distribute.parameter_server.coordinator import ClusterCoordinator
from feedline.distribute.parameter_server.runtime import ParameterServerUnavailableError
from feedline.distribute.parameter_server.server import Server
from feedline.distribute.parameter_server.strategy import ParameterServerStrategy
from feedline.distribute.parameter_server.values import (
    PerWorkerDataset,
    PerWorkerDatasetIterator,
    PerWorkerValues,
    RemoteValue,
)
from feedline.distribute.parameter_server.variables import PSParameter

__all__ = [
    "ClusterCoordinator",
    "PSParameter",
    "ParameterServerStrategy",
    "ParameterServerUnavailableError",
    "PerWorkerDataset",
    "PerWorkerDatasetIterator",
    "PerWorkerValues",
    "RemoteValue",
    "Server",
]
