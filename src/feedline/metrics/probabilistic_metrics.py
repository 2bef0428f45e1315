"""``SparseCategoricalCrossentropy``: the mean cross-entropy of integer labels and class scores."""

from __future__ import annotations

from typing import Any

import torch

from feedline.errors import InvalidArgumentError
from feedline.metrics.base import metric_input, sparse_labels
from feedline.metrics.reduction_metrics import MeanMetricWrapper
from feedline.nn.losses import to_tensor

EPSILON = 1e-7
"""Probabilities are clipped to ``[EPSILON, 1 - EPSILON]`` before the log, as in Keras."""


def sparse_categorical_crossentropy(
    y_true: Any,
    y_pred: Any,
    from_logits: bool = False,
    axis: int = -1,
    ignore_class: int | None = None,
) -> torch.Tensor:
    """The cross-entropy of each example: ``-log p[label]``, of ``y_pred``'s shape without its
    class axis.

    Args:
      y_true: class indices in ``[0, classes)``, of ``y_pred``'s shape without the class axis
        (or with a class axis of 1 at the end).
      y_pred: probabilities over the classes along ``axis`` or, with ``from_logits=True``,
        unnormalized log-probabilities (logits). Probabilities are clipped to
        ``[EPSILON, 1 - EPSILON]``, then their logs normalized as logits, as Keras does.
      from_logits: whether ``y_pred`` holds logits.
      axis: the class axis of ``y_pred``.
      ignore_class: a label whose examples get a cross-entropy of 0 (Keras' "void" class); the
        metric leaves them out of its mean.

    Differentiable in ``y_pred`` (torch operations only), so it also serves as a per-example loss.

    Example (Keras' documented values):
      >>> loss = sparse_categorical_crossentropy([1, 2], [[0.05, 0.95, 0], [0.1, 0.8, 0.1]])
      >>> [round(v, 4) for v in loss.tolist()]
      [0.0513, 2.3026]

    Raises:
      InvalidArgumentError: a label is outside ``[0, classes)`` (other than ``ignore_class``)
        or the shapes do not match.
    """
    y_pred = to_tensor(y_pred, "y_pred")
    if y_pred.dtype not in (torch.float32, torch.float64):
        y_pred = y_pred.to(torch.float32)
    if y_pred.dim() > 0 and axis not in (-1, y_pred.dim() - 1):
        y_pred = y_pred.movedim(axis, -1)
    labels = sparse_labels(to_tensor(y_true, "y_true"), y_pred).long()
    valid = None if ignore_class is None else labels != int(ignore_class)
    if valid is not None:
        labels = torch.where(valid, labels, 0)
    classes = y_pred.shape[-1]
    # One host sync per call: on CUDA an out-of-range index in gather is a fatal device assert.
    outside = (labels < 0) | (labels >= classes)
    if bool(outside.any()):
        raise InvalidArgumentError(
            f"label {int(labels[outside][0])} is outside [0, {classes}): y_pred has {classes} "
            "classes"
        )
    if not from_logits:
        y_pred = y_pred.clamp(EPSILON, 1.0 - EPSILON).log()
    log_probs = torch.log_softmax(y_pred, dim=-1)
    loss = -log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return loss if valid is None else torch.where(valid, loss, 0.0)


class SparseCategoricalCrossentropy(MeanMetricWrapper):
    """The weighted mean of ``sparse_categorical_crossentropy`` over every update.

    Args:
      name: the metric's name.
      dtype: the dtype of ``result()`` (float32 by default).
      from_logits: whether predictions are logits rather than probabilities.
      ignore_class: a label whose examples the mean leaves out (Keras' "void" class).
      axis: the class axis of the predictions.

    Example (Keras' documented values):
      >>> m = SparseCategoricalCrossentropy()
      >>> m.update_state([1, 2], [[0.05, 0.95, 0], [0.1, 0.8, 0.1]])
      >>> round(float(m.result()), 4)  # (-log 0.95 - log 0.1) / 2
      1.1769
      >>> m.reset_state()
      >>> m.update_state([1, 2], [[0.05, 0.95, 0], [0.1, 0.8, 0.1]], sample_weight=[0.3, 0.7])
      >>> round(float(m.result()), 4)
      1.6272
    """

    def __init__(
        self,
        name: str = "sparse_categorical_crossentropy",
        dtype: Any = None,
        from_logits: bool = False,
        ignore_class: int | None = None,
        axis: int = -1,
    ) -> None:
        kwargs: dict[str, Any] = {"from_logits": from_logits, "axis": axis}
        if ignore_class is not None:
            kwargs["ignore_class"] = ignore_class
        super().__init__(sparse_categorical_crossentropy, name, dtype, **kwargs)
        self.from_logits = from_logits
        self.ignore_class = ignore_class
        self.axis = axis

    def get_config(self) -> dict[str, Any]:
        """``name``, ``dtype``, ``from_logits``, ``ignore_class`` and ``axis``."""
        return {
            **super().get_config(),
            "from_logits": self.from_logits,
            "ignore_class": self.ignore_class,
            "axis": self.axis,
        }

    def update_state(  # type: ignore[override]
        self, y_true: Any, y_pred: Any, sample_weight: Any = None
    ) -> None:
        """Adds the batch's cross-entropies, weighted by ``sample_weight`` (default 1); the
        examples of ``ignore_class`` weigh nothing."""
        if self.ignore_class is not None:
            labels = metric_input(y_true, "y_true")
            if labels.dim() == metric_input(y_pred, "y_pred").dim() and labels.shape[-1] == 1:
                labels = labels.squeeze(-1)
            kept = (labels != self.ignore_class).to(torch.float64)
            if sample_weight is not None:
                weights = metric_input(sample_weight, "sample_weight").to(kept)
                kept = kept * weights.reshape(*weights.shape, *[1] * (kept.dim() - weights.dim()))
            sample_weight = kept
        super().update_state(y_true, y_pred, sample_weight)
