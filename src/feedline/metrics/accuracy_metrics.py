"""Accuracy metrics: ``Accuracy`` (exact matches) and ``SparseCategoricalAccuracy`` (argmax).

The functions ``accuracy`` and ``sparse_categorical_accuracy`` give one float32 value per example
(1 for a match, 0 otherwise); the metrics are the weighted means of those values over every
update, as Keras computes them.
"""

from __future__ import annotations

from typing import Any

import torch

from feedline.errors import InvalidArgumentError
from feedline.metrics.base import sparse_labels
from feedline.metrics.reduction_metrics import MeanMetricWrapper
from feedline.nn.losses import to_tensor


def accuracy(y_true: Any, y_pred: Any) -> torch.Tensor:
    """1.0 where ``y_pred`` equals ``y_true``, else 0.0 (float32).

    The shapes must be equal, except that either may carry an extra trailing dimension of 1.
    """
    y_pred = to_tensor(y_pred, "y_pred")
    y_true = to_tensor(y_true, "y_true").to(y_pred.device)
    if y_pred.dim() == y_true.dim() + 1 and y_pred.shape[-1] == 1:
        y_pred = y_pred.squeeze(-1)
    elif y_true.dim() == y_pred.dim() + 1 and y_true.shape[-1] == 1:
        y_true = y_true.squeeze(-1)
    if y_true.shape != y_pred.shape:
        raise InvalidArgumentError(
            f"y_true of shape {tuple(y_true.shape)} and y_pred of shape {tuple(y_pred.shape)} "
            "must have the same shape"
        )
    return torch.eq(y_true, y_pred).to(torch.float32)


def sparse_categorical_accuracy(y_true: Any, y_pred: Any) -> torch.Tensor:
    """1.0 where the class of highest score in ``y_pred`` is the label ``y_true``, else 0.0.

    ``y_pred`` holds scores (probabilities or logits) of shape ``[..., classes]``; ``y_true`` the
    class indices, of shape ``[...]`` or ``[..., 1]``. Ties go to the first class, as argmax does.
    """
    y_pred = to_tensor(y_pred, "y_pred")
    labels = sparse_labels(to_tensor(y_true, "y_true"), y_pred)
    return torch.eq(labels, y_pred.argmax(dim=-1)).to(torch.float32)


def _plain_tensors(y_true: Any, y_pred: Any, sample_weight: Any) -> bool:
    """Whether an update may count its matches directly (``_CountingMetric``): unweighted,
    non-empty torch tensors on one device (not MPS, which the general path moves off)."""
    return (
        sample_weight is None
        and type(y_true) is torch.Tensor
        and type(y_pred) is torch.Tensor
        and y_true.device == y_pred.device
        and y_pred.device.type != "mps"
        and y_true.numel() > 0
        and y_pred.numel() > 0
    )


class _CountingMetric(MeanMetricWrapper):
    """An accuracy: the mean of per-example values that are 1 (a match) or 0. An unweighted
    update of plain tensors counts its matches with the few torch operations that need
    (``_matches``) and adds the count as it is (``Metric._add_count``); any other update takes
    the general path of ``MeanMetricWrapper``. Both give the same state."""

    def _matches(self, y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor | None:
        """The per-example matches (bool), or None where the shapes need the general path."""
        raise NotImplementedError

    def update_state(  # type: ignore[override]
        self, y_true: Any, y_pred: Any, sample_weight: Any = None
    ) -> None:
        """Adds the batch's per-example values, weighted by ``sample_weight`` (default 1)."""
        if _plain_tensors(y_true, y_pred, sample_weight):
            matches = self._matches(y_true, y_pred)
            if matches is not None:
                self._add_count(matches.sum(), matches.numel())
                return
        super().update_state(y_true, y_pred, sample_weight)


class Accuracy(_CountingMetric):
    """How often predictions equal labels: the weighted mean of ``accuracy(y_true, y_pred)``.

    Example (Keras' documented values):
      >>> m = Accuracy()
      >>> m.update_state([[1], [2], [3], [4]], [[0], [2], [3], [4]])
      >>> float(m.result())
      0.75
      >>> m.reset_state()
      >>> m.update_state([[1], [2], [3], [4]], [[0], [2], [3], [4]], sample_weight=[1, 1, 0, 0])
      >>> float(m.result())
      0.5
    """

    def __init__(self, name: str = "accuracy", dtype: Any = None) -> None:
        super().__init__(accuracy, name, dtype)

    def _matches(self, y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor | None:
        return torch.eq(y_true, y_pred) if y_true.shape == y_pred.shape else None


class SparseCategoricalAccuracy(_CountingMetric):
    """How often the top-scoring class is the integer label (the seeds' training accuracy).

    Example (Keras' documented values):
      >>> m = SparseCategoricalAccuracy()
      >>> m.update_state([[2], [1]], [[0.1, 0.6, 0.3], [0.05, 0.95, 0]])
      >>> float(m.result())
      0.5
      >>> m.reset_state()
      >>> m.update_state([[2], [1]], [[0.1, 0.6, 0.3], [0.05, 0.95, 0]], sample_weight=[0.7, 0.3])
      >>> round(float(m.result()), 6)
      0.3
    """

    def __init__(self, name: str = "sparse_categorical_accuracy", dtype: Any = None) -> None:
        super().__init__(sparse_categorical_accuracy, name, dtype)

    def _matches(self, y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor | None:
        if y_pred.dim() == 0 or y_true.shape != y_pred.shape[:-1]:
            return None
        return torch.eq(y_true, y_pred.argmax(dim=-1))
