"""``feedline.distribute.experimental``: the names TensorFlow keeps under ``experimental``.

``ValueContext`` and ``MultiWorkerMirroredStrategy`` are the objects of ``feedline.distribute``
(the latter resolved on first access). ``partitioners`` holds the ``variable_partitioner``
classes of ``ParameterServerStrategy``; ``ParameterServerStrategy`` (the object of
``feedline.distribute``) and ``coordinator`` (``feedline.distribute.coordinator``) are resolved
on first access.

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

__getattr__, __dir__ = _porting.lazy_attributes(
    __name__,
    {
        "MultiWorkerMirroredStrategy": "feedline.distribute:MultiWorkerMirroredStrategy",
        "ParameterServerStrategy": "feedline.distribute:ParameterServerStrategy",
        "coordinator": "feedline.distribute.coordinator",
        "PreemptionCheckpointHandler": ("feedline.train.preemption:PreemptionCheckpointHandler"),
        "TerminationConfig": "feedline.train.preemption:TerminationConfig",
    },
)

__all__ = [
    "CommunicationImplementation",
    "CommunicationOptions",
    "ValueContext",
    "distribute_dataset_for_worker",
    "partitioners",
]
