"""``MetricWeight``: a state variable of a metric written as Keras writes its own, made by
``Metric.add_weight``.

A Keras metric subclass keeps its state in variables: ``self.add_weight(name="tp",
initializer="zeros")`` in ``__init__``, ``self.tp.assign_add(...)`` in ``update_state`` and
arithmetic on them in ``result()``. A ``MetricWeight`` is that variable on a torch tensor:
``assign``, ``assign_add`` and ``assign_sub`` replace its value (never in place, so a value read
before stays as it was), reads go through ``value`` / ``read_value()`` / ``numpy()``, and it
takes part in torch operations and Python arithmetic as its tensor does. Like Keras' metric
variables (``aggregation="sum"``) the weights of a metric add up across workers: its state is
the weights one after another (``Metric.get_state``), and a metric made under a multi-worker
strategy's scope reads their sums over the workers in ``result()``.

  >>> import torch
  >>> from feedline.metrics import Metric
  >>> class Positives(Metric):
  ...     def __init__(self, name="positives", dtype=None):
  ...         super().__init__(name=name, dtype=dtype)
  ...         self.count = self.add_weight(name="count", initializer="zeros")
  ...     def update_state(self, values):
  ...         self.count.assign_add((torch.as_tensor(values) > 0).sum())
  ...     def result(self):
  ...         return self.count + 0
  >>> m = Positives()
  >>> m.update_state([1, -2, 3]); m.update_state([4])
  >>> m.result(), m.count
  (tensor(3.), <MetricWeight 'count' shape=() dtype=float32: 3.0>)
  >>> m.get_state()  # the weights' values, one after another
  tensor([3.], dtype=torch.float64)
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from feedline.errors import InvalidArgumentError
from feedline.nn.losses import to_tensor

if TYPE_CHECKING:
    from feedline.metrics.base import Metric

__all__ = ["MetricWeight", "values_of"]


class MetricWeight:
    """A metric's state variable (``Metric.add_weight``; Keras' metric variable).

    Args:
      metric: the metric it belongs to (its lock guards the value).
      name: its name, unique in the metric.
      shape: its shape.
      dtype: its torch dtype.
      initializer: ``"zeros"``, ``"ones"``, a number, or a function ``(shape, dtype)`` that
        returns the first value.
    """

    def __init__(
        self,
        metric: Metric,
        name: str,
        shape: Sequence[int],
        dtype: torch.dtype,
        initializer: Any,
    ) -> None:
        self.name = name
        self._metric = metric
        self._shape = torch.Size(shape)
        self._dtype = dtype
        self._tensor = self._coerce(_initial_value(initializer, self._shape, dtype), "initializer")
        self._placed = False  # whether an assignment chose the device
        # While ``result()`` reads the sums over the workers: the sum, read in place of the value.
        self._read: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self._shape

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def value(self) -> torch.Tensor:
        """The current value (the sum over workers while ``result()`` of a metric made under a
        multi-worker strategy runs)."""
        return self._tensor if self._read is None else self._read

    def read_value(self) -> torch.Tensor:
        """``value`` (Keras' name)."""
        return self.value

    def numpy(self) -> np.ndarray:
        """The value as a NumPy array."""
        return self.value.detach().cpu().numpy()

    def assign(self, value: Any) -> MetricWeight:
        """Replaces the value with ``value`` (of the weight's shape, cast to its dtype).

        Raises:
          InvalidArgumentError: ``value`` is not numbers of the weight's shape.
        """
        with self._metric._lock:
            self._set(self._coerce(value, "the value assigned"))
        return self

    def assign_add(self, delta: Any) -> MetricWeight:
        """Adds ``delta`` (of the weight's shape) to the value."""
        return self._change(delta, operator.add, "the value added")

    def assign_sub(self, delta: Any) -> MetricWeight:
        """Subtracts ``delta`` (of the weight's shape) from the value."""
        return self._change(delta, operator.sub, "the value subtracted")

    def _change(self, delta: Any, op: Callable[[Any, Any], Any], what: str) -> MetricWeight:
        with self._metric._lock:
            self._set(op(self._tensor, self._coerce(delta, what).to(self._tensor.device)))
        return self

    def _set(self, value: torch.Tensor) -> None:
        """Under the metric's lock: the new value; the first assignment places the weight on
        its value's device (as a metric's first update places its state)."""
        if value.device != self._tensor.device and self._placed:
            value = value.to(self._tensor.device)
        self._tensor = value
        self._placed = True

    def _coerce(self, value: Any, what: str) -> torch.Tensor:
        tensor = to_tensor(value.value if isinstance(value, MetricWeight) else value, what)
        tensor = tensor.detach().to(self._dtype)
        if tensor.shape != self._shape:
            if tensor.numel() == 1 and self._shape.numel() == 1:
                return tensor.reshape(self._shape)
            raise InvalidArgumentError(
                f"metric weight {self.name!r} has shape {tuple(self._shape)}; {what} has shape "
                f"{tuple(tensor.shape)}"
            )
        return tensor

    # -- as a tensor ---------------------------------------------------------------------------
    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return func(*values_of(list(args)), **values_of(kwargs or {}))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def __float__(self) -> float:
        return float(self.value)

    def __int__(self) -> int:
        return int(self.value)

    def __bool__(self) -> bool:
        return bool(self.value)

    def __getitem__(self, index: Any) -> torch.Tensor:
        return self.value[index]

    def __len__(self) -> int:
        return len(self.value)

    def __neg__(self) -> torch.Tensor:
        return -self.value

    def __abs__(self) -> torch.Tensor:
        return abs(self.value)

    def __repr__(self) -> str:
        value = self.value.detach().cpu()
        shown = value.item() if value.numel() == 1 else value.tolist()
        return (
            f"<MetricWeight {self.name!r} shape={tuple(self._shape)} "
            f"dtype={str(self._dtype).removeprefix('torch.')}: {shown}>"
        )


def values_of(value: Any) -> Any:
    """``value`` with each ``MetricWeight`` in it (in lists, tuples and dicts) as its value."""
    if isinstance(value, MetricWeight):
        return value.value
    if isinstance(value, list | tuple):
        return type(value)(values_of(v) for v in value)
    if isinstance(value, dict):
        return {k: values_of(v) for k, v in value.items()}
    return value


def _binary(op: Callable[[Any, Any], Any], reflected: bool) -> Callable[..., Any]:
    def method(self: MetricWeight, other: Any) -> Any:
        other = values_of(other)
        return op(other, self.value) if reflected else op(self.value, other)

    return method


for _name, _op in {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "pow": operator.pow,
    "matmul": operator.matmul,
}.items():
    setattr(MetricWeight, f"__{_name}__", _binary(_op, reflected=False))
    setattr(MetricWeight, f"__r{_name}__", _binary(_op, reflected=True))
for _name, _op in {
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}.items():
    setattr(MetricWeight, f"__{_name}__", _binary(_op, reflected=False))


def _initial_value(initializer: Any, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """The first value ``initializer`` gives a weight of ``shape`` and ``dtype``.

    Raises:
      InvalidArgumentError: not an initializer feedline knows.
    """
    if initializer is None or initializer == "zeros":
        return torch.zeros(shape, dtype=dtype)
    if initializer == "ones":
        return torch.ones(shape, dtype=dtype)
    if isinstance(initializer, int | float) and not isinstance(initializer, bool):
        return torch.full(shape, float(initializer), dtype=dtype)
    if callable(initializer):
        return to_tensor(initializer(tuple(shape), dtype), "the initializer's value")
    raise InvalidArgumentError(
        f"a metric weight's initializer is 'zeros', 'ones', a number or a function "
        f"(shape, dtype) -> value, got {initializer!r}"
    )
