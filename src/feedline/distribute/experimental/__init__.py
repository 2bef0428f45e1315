"""``feedline.distribute.experimental``: the names TensorFlow keeps under ``experimental``.

``ValueContext`` is the object of ``feedline.distribute``; ``MultiWorkerMirroredStrategy``
(resolved on first access) is its strategy with TensorFlow's experimental signature,
``(communication, cluster_resolver)``, and ``CollectiveCommunication`` is
``CommunicationImplementation``. ``partitioners`` holds the ``variable_partitioner`` classes of
``ParameterServerStrategy``; ``ParameterServerStrategy`` (the object of ``feedline.distribute``)
and ``coordinator`` (``feedline.distribute.coordinator``) are resolved on first access.

``PreemptionCheckpointHandler`` and ``TerminationConfig`` are TensorFlow's names for the objects
of ``feedline.train.preemption``: the handler saves checkpoints, so it lives in
``feedline.train``, a floor above this package, and is resolved on first access only (importing
``feedline.distribute`` never imports ``feedline.train``).
"""

from feedline import _porting
from feedline.distribute.experimental import partitioners
from feedline.distribute.experimental.worker import distribute_dataset_for_worker
from feedline.distribute.input_context import ValueContext
from feedline.distribute.multi_worker import CommunicationImplementation, CommunicationOptions

#: TensorFlow's older name of ``CommunicationImplementation``.
CollectiveCommunication = CommunicationImplementation

__getattr__, __dir__ = _porting.lazy_attributes(
    __name__,
    {
        "MultiWorkerMirroredStrategy": (
            "feedline.distribute.multi_worker:ExperimentalMultiWorkerMirroredStrategy"
        ),
        "ParameterServerStrategy": "feedline.distribute:ParameterServerStrategy",
        "coordinator": "feedline.distribute.coordinator",
        "PreemptionCheckpointHandler": ("feedline.train.preemption:PreemptionCheckpointHandler"),
        "TerminationConfig": "feedline.train.preemption:TerminationConfig",
    },
)

__all__ = [
    "CollectiveCommunication",
    "CommunicationImplementation",
    "CommunicationOptions",
    "ValueContext",
    "distribute_dataset_for_worker",
    "partitioners",
]
