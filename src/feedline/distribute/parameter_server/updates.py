"""Optimizer updates applied on a parameter server.

A worker pushes a gradient with the name of its optimizer (``SGD``, ``Adam``, ``AdamW``,
``Adagrad``, ``RMSprop``) and the hyperparameters of the parameter's group; the ps keeps one
torch optimizer per variable (per shard of a partitioned one) and steps it, so training through
the ps computes what the same optimizer computes locally. These optimizers work element by
element, so stepping each shard on its own is stepping the whole. A gradient of some rows (an
embedding) is applied to those rows alone where the rule allows it: SGD without momentum or
weight decay, and Adagrad without weight decay (TensorFlow's sparse updates); otherwise it is
made dense first, which is what the local optimizer computes for a dense gradient that is zero
outside those rows.

    >>> import torch
    >>> variable = torch.nn.Parameter(torch.zeros(3, 2))
    >>> update = Update("SGD", {"lr": 0.5}, variable)
    >>> update.apply(torch.ones(3, 2), None)
    >>> variable[0].tolist()
    [-0.5, -0.5]
    >>> update.apply(torch.ones(1, 2), torch.tensor([2]))
    >>> variable[:, 0].tolist()
    [-0.5, -0.5, -1.0]
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Sequence
from typing import Any

import torch

from feedline.distribute import _torch_hooks
from feedline.distribute.parameter_server import _tensors
from feedline.errors import InvalidArgumentError

__all__ = ["SUPPORTED", "Update", "check_gradient", "check_hyperparameters", "hyperparameters"]

#: The optimizers whose state and updates a parameter server holds, by class name.
SUPPORTED: dict[str, type[torch.optim.Optimizer]] = {
    "SGD": torch.optim.SGD,
    "Adam": torch.optim.Adam,
    "AdamW": torch.optim.AdamW,
    "Adagrad": torch.optim.Adagrad,
    "RMSprop": torch.optim.RMSprop,
}
# Group settings that say how to compute, not what: the ps picks its own.
_HOW = ("params", "foreach", "fused", "capturable", "differentiable")


def hyperparameters(group: dict[str, Any]) -> dict[str, Any]:
    """A parameter group's hyperparameters as JSON-able values (tensors become floats)."""
    hyper: dict[str, Any] = {}
    for key, value in group.items():
        if key in _HOW:
            continue
        if isinstance(value, torch.Tensor):
            value = value.item()
        elif isinstance(value, tuple):
            value = [v.item() if isinstance(v, torch.Tensor) else v for v in value]
        hyper[key] = value
    return hyper


def _unique(rows: torch.Tensor) -> bool:
    """Whether ``rows`` holds no index twice (a worker pushes each touched row once)."""
    return rows.numel() < 2 or bool((rows.sort().values.diff() != 0).all())


def _constructor_args(kind: str, hyper: Any) -> dict[str, Any]:
    if kind not in SUPPORTED:
        raise InvalidArgumentError(
            f"a parameter server applies updates of {sorted(SUPPORTED)}, not of {kind!r}"
        )
    if not isinstance(hyper, dict):
        raise InvalidArgumentError(f"malformed request: hyperparameters {hyper!r}")
    accepted = _accepted(kind)
    args = {k: tuple(v) if isinstance(v, list) else v for k, v in hyper.items() if k in accepted}
    args["foreach"] = False
    return args


def check_hyperparameters(kind: Any, hyper: Any) -> None:
    """Refuses what an optimizer of ``kind`` could not step with: an unknown kind, and
    hyperparameters that are not numbers (or lists of numbers, ``betas``), are not finite, or
    that torch's constructor refuses (a negative ``lr``), so that a push is checked whole before
    any of it is applied.

    Raises:
      InvalidArgumentError: naming the optimizer and what is wrong.
    """
    if not isinstance(kind, str):
        raise InvalidArgumentError(f"malformed request: optimizer {kind!r:.100} is not a name")
    args = _constructor_args(kind, hyper)
    for key, value in args.items():
        values = value if isinstance(value, tuple) else (value,)
        for number in values:
            if number is None or isinstance(number, bool):
                continue
            if not isinstance(number, int | float) or not _finite(number):
                raise InvalidArgumentError(
                    f"hyperparameter {key}={value!r:.100} of {kind} is not a finite number"
                )
    # Hashable now: numbers, None, and tuples of them.
    _check_constructor(kind, tuple(sorted(args.items())))


def check_gradient(
    name: str,
    dtype: torch.dtype,
    shape: Sequence[int],
    grad: torch.Tensor,
    rows: int | None,
    kind: Any,
    hyper: Any,
) -> None:
    """Refuses what a parameter server refuses of a push's gradient ``grad`` of variable
    ``name`` (of ``dtype`` and ``shape``; ``rows`` of its rows, None: all of it) for an
    optimizer ``kind`` with ``hyper``: a variable that does not train, a gradient of another
    dtype (nothing is cast) or shape, an optimizer that could not step
    (``check_hyperparameters``). A ps checks each push with it before applying any of it, and
    a worker before sending one to several ps tasks, so that none applies a push another
    refuses. What is finite is checked apart (``allow_nonfinite``).

    Raises:
      InvalidArgumentError: naming the variable and what is wrong.
    """
    if not (dtype.is_floating_point or dtype.is_complex):
        raise InvalidArgumentError(
            f"variable {name!r} is {_tensors.dtype_name(dtype)}: only floating-point and "
            "complex variables take gradients"
        )
    if grad.dtype != dtype:
        want = _tensors.dtype_name(dtype)
        raise InvalidArgumentError(
            f"the gradient of {name!r} is {_tensors.dtype_name(grad.dtype)}; the variable is "
            f"{want}, and a parameter server casts nothing: push a gradient of the variable's "
            f"dtype (grad.to(torch.{want}))"
        )
    expected = list(shape) if rows is None else [rows, *shape[1:]]
    if list(grad.shape) != expected:
        raise InvalidArgumentError(
            f"the gradient of {name!r} has shape {list(grad.shape)}; the variable takes {expected}"
        )
    check_hyperparameters(kind, hyper)


def _finite(number: float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an int past a float's range
        return False


@functools.lru_cache(maxsize=256)
def _check_constructor(kind: str, args: tuple[tuple[str, Any], ...]) -> None:
    """Makes an optimizer of ``kind`` with ``args`` over a scratch parameter: what its
    constructor refuses is an ``InvalidArgumentError``. Cached: a cluster pushes few settings."""
    scratch = torch.nn.Parameter(torch.zeros(1))
    try:
        with _torch_hooks.without_optimizer_hooks():  # a worker may check under a scope
            SUPPORTED[kind]([scratch], **dict(args))
    except (ValueError, TypeError, RuntimeError) as error:
        raise InvalidArgumentError(
            f"{kind} refuses its hyperparameters {dict(args)}: {error}"
        ) from None


@functools.cache
def _accepted(kind: str) -> frozenset[str]:
    """The constructor arguments of optimizer ``kind``."""
    return frozenset(inspect.signature(SUPPORTED[kind].__init__).parameters)


class Update:
    """One variable's optimizer on a parameter server: ``kind`` with ``hyper``, over
    ``variable`` (a ``torch.nn.Parameter`` that the ps owns).

    Not thread-safe: the ps holds the variable's lock around every call.
    """

    def __init__(self, kind: str, hyper: dict[str, Any], variable: torch.nn.Parameter) -> None:
        self.kind = kind
        self._variable = variable
        args = _constructor_args(kind, hyper)  # checks the kind first
        self.optimizer = SUPPORTED[kind]([variable], **args)

    def set_hyperparameters(self, hyper: dict[str, Any]) -> None:
        """Takes the group's current values (a learning-rate schedule changes ``lr``)."""
        group = self.optimizer.param_groups[0]
        for key, value in _constructor_args(self.kind, hyper).items():
            if key in group:
                group[key] = value

    def _sparse_ok(self) -> bool:
        group = self.optimizer.param_groups[0]
        if group.get("weight_decay", 0) or group.get("maximize", False):
            return False
        if self.kind == "SGD":
            return not group.get("momentum", 0)
        return self.kind == "Adagrad"

    def apply(self, grad: torch.Tensor, rows: torch.Tensor | None) -> None:
        """Applies ``grad``: the whole variable's, or (``rows`` given) the rows ``rows``'."""
        variable = self._variable
        if rows is not None:
            if self._sparse_ok() and self.kind == "SGD":
                lr = float(self.optimizer.param_groups[0]["lr"])
                with torch.no_grad():
                    variable.index_add_(0, rows, grad.to(variable.dtype), alpha=-lr)
                return
            if self.kind == "Adagrad" and self._sparse_ok() and self._rowwise_ok(rows):
                self._adagrad_rows(grad.to(variable.dtype), rows)
                return
            if self._sparse_ok():
                variable.grad = torch.sparse_coo_tensor(
                    rows[None], grad.to(variable.dtype), variable.shape, check_invariants=True
                )
            else:
                dense = torch.zeros_like(variable)
                dense.index_add_(0, rows, grad.to(variable.dtype))
                variable.grad = dense
        else:
            variable.grad = grad.to(variable.dtype)
        with torch.sparse.check_sparse_tensor_invariants():
            self.optimizer.step()
        variable.grad = None

    def _rowwise_ok(self, rows: torch.Tensor) -> bool:
        """Whether ``_adagrad_rows`` computes what torch's sparse Adagrad step would: distinct
        rows, a real dtype, and the state torch keeps (the constructor makes it)."""
        state = self.optimizer.state.get(self._variable, {})
        return (
            not self._variable.is_complex()
            and isinstance(state.get("step"), torch.Tensor)
            and isinstance(state.get("sum"), torch.Tensor)
            and _unique(rows)
        )

    def _adagrad_rows(self, grad: torch.Tensor, rows: torch.Tensor) -> None:
        """torch's Adagrad step for a sparse gradient of distinct ``rows``, on those rows
        alone: the same arithmetic as its sparse path, without building sparse tensors."""
        group = self.optimizer.param_groups[0]
        state = self.optimizer.state[self._variable]
        with torch.no_grad():
            state["step"] += 1
            step = float(state["step"])
            clr = group["lr"] / (1 + (step - 1) * group["lr_decay"])
            total = state["sum"]
            total.index_add_(0, rows, grad.pow(2))
            std = total.index_select(0, rows).sqrt_().add_(group["eps"])
            self._variable.index_add_(0, rows, grad / std, alpha=-clr)

    def state(self) -> dict[str, Any]:
        """The optimizer's state of the variable (tensors and numbers), as torch keeps it."""
        return dict(self.optimizer.state.get(self._variable, {}))

    def set_state(self, state: dict[str, Any]) -> None:
        self.optimizer.state[self._variable] = dict(state)
