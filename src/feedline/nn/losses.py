"""Loss scaling for synchronous training on several replicas (``tf.nn.compute_average_loss``).

Each replica computes the loss of its own slice of the global batch, and the replicas' gradients
are then *summed*. For that sum to be the gradient of the mean loss over the global batch, every
replica divides the sum of its per-example losses by the **global** batch size, not by its own
batch size. With two replicas, a global batch of 4 and per-example losses ``[2, 3]`` and ``[4, 5]``:

    replica 0: (2 + 3) / 4 = 1.25
    replica 1: (4 + 5) / 4 = 2.25
    strategy.reduce(SUM, ...): 1.25 + 2.25 = 3.5 = mean of [2, 3, 4, 5]

Dividing by the per-replica batch instead (``loss.mean()``) would give 2.5 and 4.5, whose sum is
twice the mean loss, and it changes from step to step when the last batch is partial.

The helpers ``to_tensor``, ``match_weight_rank`` and ``broadcasts_to`` are shared with
``feedline.metrics``.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

from feedline.distribute import get_replica_context
from feedline.errors import FailedPreconditionError, InvalidArgumentError

__all__ = ["compute_average_loss", "scale_regularization_loss"]


def compute_average_loss(
    per_example_loss: Any, sample_weight: Any = None, global_batch_size: Any = None
) -> torch.Tensor:
    """The sum of the (weighted) per-example losses divided by the global batch size.

    Call it inside the function that ``strategy.run`` runs; the result is this replica's share of
    the mean loss, and the shares of all replicas add up to the mean loss of the global batch.
    Gradients flow through ``per_example_loss`` (and ``sample_weight``): only torch operations run.

    Without ``global_batch_size`` the global batch is this replica's batch (the first dimension
    of ``per_example_loss``) times ``num_replicas_in_sync``, as in TensorFlow; outside any
    strategy that is the local batch. A replica that got an empty (size-0) batch returns 0, and so
    does a ``global_batch_size`` of 0 (TensorFlow divides with ``div_no_nan``). When
    the last global batch is partial, replicas may hold different numbers of examples; pass
    ``global_batch_size`` (the examples of the whole step) to scale that step exactly.

    Args:
      per_example_loss: the losses of this replica's examples, shape ``[batch, ...]``; a torch
        tensor, NumPy array or Python number (converted to a tensor). A scalar (rank 0) is
        accepted only with an explicit ``global_batch_size``.
      sample_weight: optional weights: a scalar, or a shape that broadcasts to the losses once
        a trailing dimension of 1 is dropped or added (``[batch]`` for losses ``[batch, 1]``).
      global_batch_size: a non-negative integer (0 gives a loss of 0, with zero gradients); by
        default inferred as above.

    Returns:
      A 0-d tensor in the dtype of ``per_example_loss`` (the default float dtype for integers).

    Raises:
      InvalidArgumentError: ``global_batch_size`` is not a non-negative integer, the weights do not
        broadcast to the losses, or a scalar loss comes without ``global_batch_size``.
      FailedPreconditionError: ``global_batch_size`` is left out in the cross-replica context of
        a strategy (inside ``strategy.scope()`` but outside ``strategy.run``).

    Example:
      >>> float(compute_average_loss([2.0, 3.0], global_batch_size=4))
      1.25
      >>> float(compute_average_loss([2.0, 3.0], sample_weight=[1.0, 0.0], global_batch_size=4))
      0.5
      >>> float(compute_average_loss([2.0, 3.0], global_batch_size=0))
      0.0
    """
    loss = _as_float(to_tensor(per_example_loss, "per_example_loss"))
    if sample_weight is not None:
        loss = loss * _weights_for(loss, sample_weight)
    if global_batch_size is None:
        if loss.dim() == 0:
            raise InvalidArgumentError(
                "per_example_loss is a scalar (rank 0), so it has no batch dimension to infer "
                "the global batch size from; pass global_batch_size, or the per-example losses "
                "of shape [batch_size, ...]"
            )
        global_batch_size = loss.shape[0] * _num_replicas_in_sync("compute_average_loss")
        if global_batch_size == 0:
            return loss.sum()  # an empty batch: 0, not 0 / 0, and gradients of zeros
    else:
        global_batch_size = _check_global_batch_size(global_batch_size)
        if global_batch_size == 0:
            return _zero_like(loss.sum())
    return loss.sum() / global_batch_size


def scale_regularization_loss(regularization_loss: Any) -> torch.Tensor:
    """The sum of ``regularization_loss`` divided by ``num_replicas_in_sync``.

    Every replica adds the same regularization loss; after the replicas' gradients are summed it
    must count once, so each replica adds its ``1 / num_replicas_in_sync`` share.

    Args:
      regularization_loss: a tensor (or a list of tensors, as ``model.losses``) to sum.

    Raises:
      FailedPreconditionError: in the cross-replica context of a strategy.

    Example:
      >>> float(scale_regularization_loss([0.5, 1.5]))  # one replica outside any strategy
      2.0
    """
    loss = _as_float(to_tensor(regularization_loss, "regularization_loss"))
    return loss.sum() / _num_replicas_in_sync("scale_regularization_loss")


def to_tensor(value: Any, name: str) -> torch.Tensor:
    """``value`` as a torch tensor: tensors as they are, NumPy arrays without copying.

    A list of tensors is stacked (keeping gradients); Python numbers and lists become tensors
    of torch's default dtypes (float32, int64), NumPy arrays keep their dtype.
    """
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, list | tuple) and any(isinstance(v, torch.Tensor) for v in value):
        return torch.stack([to_tensor(v, name) for v in value])
    if isinstance(value, np.ndarray | np.generic):
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise InvalidArgumentError(
                f"{name} must be numeric, got a NumPy array of {array.dtype}"
            )
        if not array.flags.writeable:  # torch.from_numpy warns about read-only memory
            array = array.copy()
        return torch.from_numpy(array)
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise InvalidArgumentError(
            f"{name} must be a tensor, a NumPy array or numbers, got {type(value).__name__}: "
            f"{error}"
        ) from error


def match_weight_rank(weights: torch.Tensor, rank: int) -> torch.Tensor:
    """Weights brought to ``rank`` as TensorFlow does: a trailing 1 dropped or one added.

    Scalar weights stay scalar; weights of rank ``rank + 1`` ending in 1 lose that dimension;
    weights of rank ``rank - 1`` gain a trailing one (per-example weights for ``[batch, d]``).
    """
    if weights.dim() == 0:
        return weights
    if weights.dim() == rank + 1 and weights.shape[-1] == 1:
        return weights.squeeze(-1)
    if weights.dim() == rank - 1:
        return weights.unsqueeze(-1)
    return weights


def broadcasts_to(shape: torch.Size, target: torch.Size) -> bool:
    """Whether a tensor of ``shape`` broadcasts to ``target`` without changing ``target``."""
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target), strict=False))


def _zero_like(total: torch.Tensor) -> torch.Tensor:
    """0 in ``total``'s dtype and device, still in its graph with zero gradients (even where
    ``total`` is infinite or NaN), as TensorFlow's ``div_no_nan`` by 0."""
    zero = torch.zeros((), dtype=total.dtype, device=total.device)
    return torch.where(torch.zeros((), dtype=torch.bool, device=total.device), total, zero)


def _as_float(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.is_floating_point() else tensor.to(torch.get_default_dtype())


def _weights_for(loss: torch.Tensor, sample_weight: Any) -> torch.Tensor:
    given = to_tensor(sample_weight, "sample_weight")
    weights = match_weight_rank(given.to(device=loss.device, dtype=loss.dtype), loss.dim())
    if not broadcasts_to(weights.shape, loss.shape):
        raise InvalidArgumentError(
            f"sample_weight of shape {tuple(given.shape)} does not broadcast to per_example_loss "
            f"of shape {tuple(loss.shape)}; give one weight per example, shape "
            f"{tuple(loss.shape[:1])}, or a scalar"
        )
    return weights


def _check_global_batch_size(value: Any) -> int:
    if isinstance(value, torch.Tensor | np.ndarray | np.generic):
        if value.ndim != 0:
            raise InvalidArgumentError(
                f"global_batch_size must be a scalar, got shape {tuple(value.shape)}"
            )
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgumentError(
            f"global_batch_size must be an integer, got {value!r} ({type(value).__name__})"
        )
    if value < 0:
        raise InvalidArgumentError(
            f"global_batch_size must not be negative, got {value}; it is the number of examples "
            "that all replicas process in one step"
        )
    return int(value)


def _num_replicas_in_sync(caller: str) -> int:
    """The replicas of the current replica context; 1 outside any strategy."""
    replica_context = get_replica_context()
    if replica_context is None:
        raise FailedPreconditionError(
            f"{caller} was called in the cross-replica context of a strategy (inside "
            "strategy.scope() but outside strategy.run); call it inside the function that "
            "strategy.run runs"
            + (", or pass global_batch_size" if caller == "compute_average_loss" else "")
        )
    return int(replica_context.num_replicas_in_sync)
