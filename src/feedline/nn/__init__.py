"""Loss scaling for training on several replicas: the PyTorch side of ``tf.nn``.

``compute_average_loss`` divides the sum of per-example losses by the global batch size, and
``scale_regularization_loss`` divides a regularization loss by the number of replicas in sync, so
that the replicas' summed gradients are those of the mean loss over the global batch.
"""

from feedline import _porting
from feedline.nn.losses import compute_average_loss, scale_regularization_loss

__all__ = ["compute_average_loss", "scale_regularization_loss"]


def __getattr__(name: str) -> object:
    raise _porting.missing_attribute(__name__, name)
