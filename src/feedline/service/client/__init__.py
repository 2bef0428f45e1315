"""What a training process runs to read from the data service: ``distribute``,
``register_dataset``, ``from_dataset_id`` and the job reader behind their iterators.

Nothing here imports the dispatcher's or the workers' code: the client speaks to them through
``feedline.service.protocol``.
"""

from feedline.service.client.cross_trainer import CrossTrainerCache
from feedline.service.client.dataset import (
    DataServiceDataset,
    distribute,
    from_dataset_id,
    register_dataset,
)
from feedline.service.client.save import distributed_save

__all__ = [
    "CrossTrainerCache",
    "DataServiceDataset",
    "distribute",
    "distributed_save",
    "from_dataset_id",
    "register_dataset",
]
