"""``Mean`` and ``Sum`` of values, and ``MeanMetricWrapper``: the mean of a per-example function.

A caution from the seeds: do not track a training loss that ``compute_average_loss`` scaled
with a ``Mean``. Two replicas, a global batch of 4, per-example losses ``[2, 3]`` and ``[4, 5]``:
each replica's scaled loss is its share of the step's mean loss, and ``strategy.reduce(SUM, ...)``
adds the shares up to that mean, 3.5. A ``Mean`` updated with the shares divides their total
by their count once more:

>>> from feedline.nn import compute_average_loss
>>> shares = [
...     compute_average_loss([2.0, 3.0], global_batch_size=4),
...     compute_average_loss([4.0, 5.0], global_batch_size=4),
... ]
>>> [float(share) for share in shares]
[1.25, 2.25]
>>> float(shares[0] + shares[1])  # what strategy.reduce(ReduceOp.SUM, per_replica_losses) gives
3.5
>>> loss_metric = Mean(name="train_loss")
>>> for share in shares:
...     loss_metric.update_state(share)
>>> loss_metric.get_state().tolist()  # [total, count]
[3.5, 2.0]
>>> float(loss_metric.result())  # 3.5 / 2, not the loss of the step
1.75

A ``Mean`` of the per-example losses themselves is the mean loss, whatever the replicas:

>>> loss_metric.reset_state()
>>> loss_metric.update_state([2.0, 3.0])
>>> loss_metric.update_state([4.0, 5.0])
>>> float(loss_metric.result())
3.5
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from feedline.metrics.base import Metric, metric_input, squeeze_or_expand, weighted_sums


class _Reduce(Metric):
    """Accumulates the weighted sum of values and the sum of weights."""

    _reduce_trailing = "mean"

    def update_state(self, values: Any, sample_weight: Any = None) -> None:
        """Adds ``values`` (any shape), each weighted by ``sample_weight`` (default 1).

        ``sample_weight`` is a scalar or broadcasts to ``values`` (see ``Mean``).
        """
        delta = weighted_sums(metric_input(values, "values"), sample_weight, self._reduce_trailing)
        if delta is not None:
            self._accumulate(delta)


class Mean(_Reduce):
    """The weighted mean of all values seen: ``sum(values * weights) / sum(weights)``.

    ``sample_weight`` is a scalar, or broadcasts to the values once a trailing dimension of 1 is
    dropped or added; weights of shape ``[batch]`` for values ``[batch, d, ...]`` weigh each
    example's mean. The result is 0 while the weights sum to 0.

    Example (Keras' documented values):
      >>> m = Mean()
      >>> m.update_state([1, 3, 5, 7])
      >>> float(m.result())
      4.0
      >>> m.reset_state()
      >>> m.update_state([1, 3, 5, 7], sample_weight=[1, 1, 0, 0])
      >>> float(m.result())
      2.0
    """

    def __init__(self, name: str = "mean", dtype: Any = None) -> None:
        super().__init__(name, dtype)

    def _result(self, total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        return torch.where(count != 0, total / count, 0.0)


class Sum(_Reduce):
    """The weighted sum of all values seen: ``sum(values * weights)``.

    Example (Keras' documented values):
      >>> m = Sum()
      >>> m.update_state([1, 3, 5, 7])
      >>> float(m.result())
      16.0
      >>> m.reset_state()
      >>> m.update_state([1, 3, 5, 7], sample_weight=[1, 1, 0, 0])
      >>> float(m.result())
      4.0
    """

    _reduce_trailing = "sum"

    def __init__(self, name: str = "sum", dtype: Any = None) -> None:
        super().__init__(name, dtype)

    def _result(self, total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        return total


class MeanMetricWrapper(Mean):
    """The weighted mean of ``fn(y_true, y_pred, **kwargs)``, a per-example value.

    Args:
      fn: returns one value per example (or per element) for a batch of labels and predictions.
      name: the metric's name; by default the function's name.
      dtype: the dtype of ``result()`` (float32 by default).
      **kwargs: passed to ``fn`` on every update.

    As in Keras, labels and predictions whose ranks differ by one are lined up first: the one
    with a trailing dimension of 1 loses it.

    Example:
      >>> m = MeanMetricWrapper(lambda y_true, y_pred: (y_true - y_pred).abs(), name="mae")
      >>> float(m([1.0, 2.0], [1.5, 2.0]))
      0.25
    """

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        name: str | None = None,
        dtype: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name or fn.__name__, dtype)
        self._fn = fn
        self._fn_kwargs = kwargs

    def get_config(self) -> dict[str, Any]:
        """``name``, ``dtype``, and for a plain wrapper ``fn`` and the keyword arguments it is
        called with (a subclass's function is its own)."""
        config = super().get_config()
        if type(self) is MeanMetricWrapper:
            config.update(fn=self._fn, **self._fn_kwargs)
        return config

    # Keras' signature: a wrapper is updated with labels and predictions, where Mean takes values.
    def update_state(  # type: ignore[override]
        self, y_true: Any, y_pred: Any, sample_weight: Any = None
    ) -> None:
        """Adds the batch's per-example values, weighted by ``sample_weight`` (default 1)."""
        y_true, y_pred = squeeze_or_expand(
            metric_input(y_true, "y_true"), metric_input(y_pred, "y_pred")
        )
        if y_true.numel() == 0 or y_pred.numel() == 0:
            return
        super().update_state(self._fn(y_true, y_pred, **self._fn_kwargs), sample_weight)
