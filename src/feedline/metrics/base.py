"""``Metric``: the base of every metric, keeping a ``(total, count)`` state under a lock.

The state is one float64 tensor ``[total, count]``. Updates add to it and never replace it, so
the states of several metrics (of several processes) combine by adding them: ``merge_state`` in
one process, ``torch.distributed.all_reduce`` of ``get_state()`` across processes.

The state lives on the device of the first update after construction or ``reset_state()``, so
that updates with CUDA tensors never wait for the GPU; ``result()`` does.

Counting metrics (the accuracies) add each batch's count of matches as it is, a tensor, and
its number of examples as a Python int (``_add_count``); those join the state at its next read
(or every ``_FOLD_EVERY`` batches), so an update costs the few torch operations that count and
nothing more. The state read is the same, exactly: counts are integers, summed exactly.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from feedline.distribute import context
from feedline.errors import FailedPreconditionError, InvalidArgumentError
from feedline.metrics.weights import MetricWeight, values_of
from feedline.nn.losses import broadcasts_to, match_weight_rank, to_tensor

# Counts (``_add_count``) held before they join the state: a bound on what a metric that is
# updated and never read keeps.
_FOLD_EVERY = 64


class Metric:
    """A running statistic: ``update_state(...)`` adds a batch, ``result()`` reads it.

    Subclasses compute a batch's ``(total, count)`` contribution in ``update_state`` and hand it
    to ``_accumulate``; they say what the result is in ``_result``. Updates from several threads
    (the replicas of a ``MirroredStrategy``) are safe; an empty batch changes nothing.

    A subclass may instead keep its state as Keras' own metrics do: weights made with
    ``add_weight`` in ``__init__``, changed in ``update_state`` (``assign_add``...) and read
    in its own ``result()`` (``feedline.metrics.weights``). Its state is then its weights, which
    add up across workers as Keras' metric variables do.

    Args:
      name: the metric's name, as in Keras; None: the class name in snake case.
      dtype: the dtype of ``result()`` (a torch or NumPy dtype, or its name); float32 by
        default. The state is float64 whatever it is.
    """

    def __init__(self, name: str | None = None, dtype: Any = None) -> None:
        self.name = _snake_case(type(self).__name__) if name is None else name
        self.dtype = result_dtype(dtype)
        self._lock = threading.RLock()
        self._state = torch.zeros(2, dtype=torch.float64)
        self._placed = False  # whether an update has chosen the state's device
        self._counts: list[torch.Tensor] = []  # counts of matches not in the state yet
        self._counted = 0  # the examples they were counted over
        self._weights: list[MetricWeight] = []  # ``add_weight``'s, in the order made
        self._summing = False  # ``result()`` reads the weights' sums over workers
        # A metric made under a multi-worker strategy's scope reads the sum over workers.
        self._strategy = context.get_strategy() if context.has_strategy() else None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's own ``result()`` reads its weights summed over the workers (a metric
        made under a multi-worker strategy's scope), as Keras' metric variables are read; a
        weight it returns comes back as its value then."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("result")
        if own is None or getattr(own, "_reads_sums", False):
            return

        @functools.wraps(own)
        def result(self: Metric, *args: Any, **kwargs: Any) -> Any:
            with self._reading_sums():  # a weight returned as it is: its value now
                return values_of(own(self, *args, **kwargs))

        result._reads_sums = True  # type: ignore[attr-defined]
        cls.result = result  # type: ignore[method-assign]

    # -- Keras' weights ----------------------------------------------------------------------
    def add_weight(
        self,
        name: str | None = None,
        shape: Sequence[int] = (),
        dtype: Any = None,
        initializer: Any = "zeros",
        aggregation: str | None = "sum",
        synchronization: Any = None,
    ) -> MetricWeight:
        """A new state variable of this metric (Keras' ``Metric.add_weight``): ``name``,
        ``shape``, ``dtype`` (the metric's by default) and ``initializer`` (``"zeros"``,
        ``"ones"``, a number or a function ``(shape, dtype)``). ``reset_state()`` sets it to
        zeros, as Keras does. The arguments are in tf.keras' order (Keras 3 takes the shape
        first: pass them by keyword).

        Raises:
          InvalidArgumentError: a name taken, or an ``aggregation`` other than ``"sum"``
            (feedline adds a metric's weights up across workers, as Keras' metric variables).
        """
        if isinstance(shape, int):
            shape = (shape,)
        aggregation = getattr(aggregation, "name", aggregation)
        if aggregation is not None and str(aggregation).lower() != "sum":
            raise InvalidArgumentError(
                f"metric weights add up across replicas and workers (aggregation 'sum'), as "
                f"Keras' do; got aggregation={aggregation!r}"
            )
        name = name or f"weight_{len(self._weights)}"
        if any(w.name == name for w in self._weights):
            raise InvalidArgumentError(f"metric {self.name!r} has a weight {name!r} already")
        weight = MetricWeight(
            self, name, shape, self.dtype if dtype is None else result_dtype(dtype), initializer
        )
        with self._lock:
            self._weights.append(weight)
        return weight

    @property
    def variables(self) -> list[MetricWeight]:
        """The weights ``add_weight`` made, in order (Keras' ``variables``)."""
        return list(self._weights)

    @property
    def weights(self) -> list[MetricWeight]:
        """``variables``."""
        return self.variables

    @contextmanager
    def _reading_sums(self) -> Iterator[None]:
        """While it lasts, the weights read their sums over the workers (under a multi-worker
        strategy; a collective: every worker reads the result at the same point)."""
        strategy = self._strategy
        if (
            not self._weights
            or self._summing
            or strategy is None
            or strategy.extended.num_workers <= 1
        ):
            yield
            return
        summed = strategy._sum_across_workers(self.get_state())
        with self._lock:
            self._summing = True
            for weight, part in zip(self._weights, self._split(summed), strict=True):
                weight._read = part
            try:
                yield
            finally:
                for weight in self._weights:
                    weight._read = None
                self._summing = False

    def _split(self, state: torch.Tensor) -> list[torch.Tensor]:
        """A flat state as the values of the weights, each of its shape and dtype."""
        parts, offset = [], 0
        for weight in self._weights:
            size = weight.shape.numel()
            parts.append(state[offset : offset + size].reshape(weight.shape).to(weight.dtype))
            offset += size
        return parts

    def _state_size(self) -> int:
        return sum(w.shape.numel() for w in self._weights) if self._weights else 2

    def update_state(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement update_state")

    def _result(self, total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement _result")

    def result(self) -> torch.Tensor:
        """The metric's value: a 0-d float32 tensor (0 before any update).

        Made under the scope of a multi-worker strategy, the value is over every worker's
        updates, and ``result()`` is a collective: every worker calls it at the same point.
        """
        with self._lock:
            self._fold()
            state = self._state
        if self._strategy is not None:
            state = self._strategy._sum_across_workers(state)
        total, count = state
        return self._result(total, count).to(self.dtype)

    def reset_state(self) -> None:
        """Forgets every update (a weight of ``add_weight`` is zeros again, as in Keras)."""
        with self._lock:
            for weight in self._weights:
                weight.assign(torch.zeros(weight.shape, dtype=weight.dtype))
            self._state = torch.zeros(2, dtype=torch.float64)
            self._placed = False
            self._counts, self._counted = [], 0

    def get_config(self) -> dict[str, Any]:
        """The constructor's arguments (Keras' ``get_config``): ``name`` and ``dtype``, and a
        subclass's own; ``type(metric).from_config(config)`` makes the metric again."""
        return {"name": self.name, "dtype": str(self.dtype).removeprefix("torch.")}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Metric:
        """A new metric of this class from ``get_config()``'s arguments (no state)."""
        return cls(**config)

    def reset_states(self) -> None:
        """Alias of ``reset_state`` (the older Keras name, used by the seeds)."""
        self.reset_state()

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``update_state(*args, **kwargs)``, then the ``result()`` including that update."""
        with self._lock:
            self.update_state(*args, **kwargs)
            return self.result()

    def get_state(self) -> torch.Tensor:
        """A copy of the state ``[total, count]`` (float64), for all-reducing or saving; of a
        metric with weights (``add_weight``), their values one after another."""
        with self._lock:
            if self._weights:
                device = self._weights[0]._tensor.device
                return torch.cat(
                    [w._tensor.reshape(-1).to(device, torch.float64) for w in self._weights]
                )
            self._fold()
            return self._state.clone()

    def set_state(self, state: Any) -> None:
        """Replaces the state with ``[total, count]`` (for example after an all-reduce), or a
        metric's weights with the values ``get_state()`` gives."""
        tensor = to_tensor(state, "state").detach().to(torch.float64)
        size = self._state_size()
        if tensor.shape != (size,):
            what = "its weights' values" if self._weights else "[total, count]"
            raise InvalidArgumentError(
                f"the state of metric {self.name!r} is {what} of shape ({size},), got shape "
                f"{tuple(tensor.shape)}"
            )
        with self._lock:
            if self._weights:
                for weight, part in zip(self._weights, self._split(tensor), strict=True):
                    weight.assign(part)
                return
            self._state = tensor.clone()
            self._placed = True
            self._counts, self._counted = [], 0

    def checkpoint_state(self) -> torch.Tensor:
        """What a ``Checkpoint`` saves: the state over every worker for a metric made under a
        multi-worker strategy (a collective, as saving is), else ``get_state()``. (This and the
        next two methods are ``feedline._checkpointable.Checkpointable``.)"""
        state = self.get_state()
        strategy = self._strategy
        if strategy is not None and strategy.extended.num_workers > 1:
            state = strategy._sum_across_workers(state)
        return state

    def restore_checkpoint_state(self, state: Any) -> None:
        """Restores a saved state so that ``result()`` reads it again: under several workers
        the chief holds it and the others start from zero, as the result sums them."""
        strategy = self._strategy
        if strategy is not None and strategy.extended.worker_index != 0:
            state = torch.zeros(self._state_size(), dtype=torch.float64)
        self.set_state(state)

    def check_restorable(self, state: Any) -> str | None:
        """None: ``set_state`` checks a metric's state as it restores it."""
        return None

    def merge_state(self, metrics: Iterable[Metric]) -> None:
        """Adds the states of other metrics of the same type to this one (as Keras does)."""
        for other in metrics:
            if type(other) is not type(self):
                raise InvalidArgumentError(
                    f"cannot merge a {type(other).__name__} into a {type(self).__name__}"
                )
            self._accumulate(other.get_state())

    def _accumulate(self, delta: torch.Tensor) -> None:
        """Adds ``delta = [total, count]`` (float64) to the state (the weights' values one
        after another, for a metric with weights)."""
        with self._lock:
            if self._weights:
                for weight, part in zip(self._weights, self._split(delta), strict=True):
                    weight.assign_add(part)
                return
            self._fold()
            self._add(delta)

    def _add_count(self, matches: torch.Tensor, examples: int) -> None:
        """Adds a batch of ``examples`` each weighted 1, of which ``matches`` (a 0-d integer
        tensor) count 1 and the others 0: kept as it is until the state is next read."""
        with self._lock:
            if self._counts and self._counts[0].device != matches.device:
                self._fold()
            self._counts.append(matches)
            self._counted += examples
            if len(self._counts) >= _FOLD_EVERY:
                self._fold()

    def _fold(self) -> None:
        """Under the lock: the counts of ``_add_count`` join the state."""
        if not self._counts:
            return
        counts, examples = self._counts, self._counted
        self._counts, self._counted = [], 0
        total = counts[0] if len(counts) == 1 else torch.stack(counts).sum()
        count = torch.tensor(float(examples), dtype=torch.float64, device=total.device)
        self._add(torch.stack((total.to(torch.float64), count)))

    def _add(self, delta: torch.Tensor) -> None:
        """Under the lock: adds ``delta`` to the state, which the first update places."""
        if delta.device != self._state.device:
            if self._placed:
                delta = delta.to(self._state.device)
            else:
                self._state = self._state.to(delta.device)
        self._state = self._state + delta
        self._placed = True

    @staticmethod
    def _feedline_reference(metric: Metric) -> None:
        """How the pickle of a function that ``ParameterServerStrategy`` schedules refers to a
        metric (``feedline.distribute.parameter_server.closures``): it may not. A worker would
        update its own copy, and the updates would be lost without a word; TensorFlow keeps
        such a metric in variables on the parameter servers, feedline in the coordinator."""
        raise FailedPreconditionError(
            f"the metric {metric.name!r} ({type(metric).__name__}) is used by a function "
            "scheduled on a worker, which would update a copy of it that is then lost; return "
            "what the metric needs from the function (e.g. `return labels, predictions`) and "
            "update the metric on the coordinator with the results' fetch(), or call it in "
            "strategy.run"
        )

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            self._fold()
            state = dict(self.__dict__)
        del state["_lock"]
        state["_strategy"] = None  # a strategy belongs to its process
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_counts", [])
        self.__dict__.setdefault("_counted", 0)
        self.__dict__.setdefault("_weights", [])
        self.__dict__.setdefault("_summing", False)
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _snake_case(name: str) -> str:
    """``"TruePositives"`` -> ``"true_positives"`` (Keras' default name of a metric)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def result_dtype(dtype: Any) -> torch.dtype:
    """A metric's ``dtype`` argument as a floating torch dtype (float32 for None).

    Raises:
      InvalidArgumentError: not a floating-point dtype.
    """
    if dtype is None:
        return torch.float32
    if not isinstance(dtype, torch.dtype):
        try:
            dtype = torch.from_numpy(np.empty(0, np.dtype(dtype))).dtype
        except (TypeError, ValueError) as error:
            raise InvalidArgumentError(
                f"a metric's dtype must be a dtype, got {dtype!r}"
            ) from error
    if not dtype.is_floating_point:
        raise InvalidArgumentError(f"a metric's dtype must be floating point, got {dtype}")
    return dtype


def squeeze_or_expand(y_true: torch.Tensor, y_pred: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``y_true`` and ``y_pred`` with a trailing dimension of 1 dropped from the one whose rank
    is one more than the other's, as Keras lines them up (``[[1], [2]]`` against ``[1, 3]``)."""
    if y_true.dim() == y_pred.dim() + 1 and y_true.shape[-1] == 1:
        y_true = y_true.squeeze(-1)
    elif y_pred.dim() == y_true.dim() + 1 and y_pred.shape[-1] == 1:
        y_pred = y_pred.squeeze(-1)
    return y_true, y_pred


def metric_input(value: Any, name: str) -> torch.Tensor:
    """``value`` as a tensor cut from autograd, off MPS (which has no float64)."""
    tensor = to_tensor(value, name).detach()
    return tensor.cpu() if tensor.device.type == "mps" else tensor


def weighted_sums(
    values: torch.Tensor, sample_weight: Any, reduce_trailing: str
) -> torch.Tensor | None:
    """``[sum(values * weights), sum(weights)]`` in float64; None for an empty batch.

    ``sample_weight`` None weighs every value 1. Weights are first brought to the values' rank
    (``match_weight_rank``) and broadcast to them; weights that cover only the leading dimensions
    (``[batch]`` for values ``[batch, h, w]``) weigh each example's values reduced over the rest
    with ``reduce_trailing`` ("mean" or "sum"), as Keras does.
    """
    if values.numel() == 0:
        return None
    values = values.to(torch.float64)
    if sample_weight is None:
        count = torch.tensor(float(values.numel()), dtype=torch.float64, device=values.device)
        return torch.stack((values.sum(), count))
    given = metric_input(sample_weight, "sample_weight")
    weights = match_weight_rank(given.to(values.device, torch.float64), values.dim())
    if not broadcasts_to(weights.shape, values.shape):
        if weights.shape != values.shape[: weights.dim()]:
            raise InvalidArgumentError(
                f"sample_weight of shape {tuple(given.shape)} does not broadcast to values of "
                f"shape {tuple(values.shape)}"
            )
        trailing = tuple(range(weights.dim(), values.dim()))
        values = values.mean(trailing) if reduce_trailing == "mean" else values.sum(trailing)
    weights = weights.expand(values.shape)
    return torch.stack(((values * weights).sum(), weights.sum()))


def sparse_labels(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    """Integer class labels for ``y_pred`` of shape ``[..., classes]``: shape ``[...]``.

    ``y_true`` has ``y_pred``'s shape without the class dimension, or with a class dimension of 1
    (``[[2], [1]]``, as Keras accepts); it moves to ``y_pred``'s device.
    """
    if y_pred.dim() == 0:
        raise InvalidArgumentError("y_pred must have a last dimension of classes, got a scalar")
    labels = y_true.to(y_pred.device)
    if labels.dim() == y_pred.dim() and labels.shape[-1] == 1:
        labels = labels.squeeze(-1)
    if labels.shape != y_pred.shape[:-1]:
        raise InvalidArgumentError(
            f"y_true of shape {tuple(y_true.shape)} does not match y_pred of shape "
            f"{tuple(y_pred.shape)}: sparse labels have the shape of y_pred without its last "
            f"(class) dimension, {tuple(y_pred.shape[:-1])}, or with a last dimension of 1"
        )
    return labels
