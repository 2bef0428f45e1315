"""The variables a parameter server holds, and the RPCs through which workers use them.

Each variable (or shard of a partitioned one) is a tensor under a name, with a lock, and the
optimizer that updates it (``updates.Update``, made by the first push that names one). The
methods, each one frame of ``feedline._net.wire`` (a JSON header and raw buffers):

=========  ======================================================================================
Create     ``{"variables": [{"name", "value", "overwrite"}]}`` + one buffer each: creates what does
           not exist (every between-graph worker creates the same variables; the first one wins)
           or, with ``overwrite``, assigns (a checkpoint being restored). Replies which it created.
Pull       ``{"variables": [{"name", "rows"}]}`` + the row indices (int64) of each ``rows``
           variable: the values, or those rows of them. With ``"push": [items]`` (a Push's
           ``variables``, their buffers first) it applies that push first, as Push does, then
           reads: a worker's push held until its next pull travels in one call with it.
Push       ``{"variables": [{"name", "grad", "rows", "optimizer", "hyper", "allow_nonfinite"}]}``
           + [rows] gradient each: applies the gradients with the named optimizer, all of them
           or (one refused) none. A gradient must have its variable's dtype (nothing is cast)
           and, unless its item says ``allow_nonfinite``, hold no NaN or infinity.
GetState   ``{"names": [...]}``: each variable's value and optimizer state (for checkpoints).
SetState   what GetState replies: assigns values and optimizer state.
=========  ======================================================================================

A name the ps does not hold is a ``NotFoundError`` (a restarted ps has lost its variables);
anything else wrong with a request is an ``InvalidArgumentError`` that names it, checked before
any of the request is applied. The store counts the pushes it applied and refused (``metrics``,
in the reply to ``Ping``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

from feedline._net.rpc import field
from feedline.distribute.parameter_server import _tensors
from feedline.distribute.parameter_server.updates import (
    Update,
    check_gradient,
    check_hyperparameters,
    hyperparameters,
)
from feedline.errors import InvalidArgumentError, NotFoundError

__all__ = ["METRICS", "VariableStore", "pack_state", "unpack_state"]


class _Variable:
    def __init__(self, value: torch.Tensor) -> None:
        self.value = torch.nn.Parameter(value, requires_grad=value.is_floating_point())
        self.lock = threading.Lock()
        self.update: Update | None = None


class _Gradient(NamedTuple):
    """One checked item of a push: what ``Update.apply`` takes, and for which variable."""

    variable: _Variable
    rows: torch.Tensor | None
    grad: torch.Tensor
    kind: str
    hyper: dict[str, Any]


class _Assignment(NamedTuple):
    """One checked item of SetState."""

    name: str
    value: torch.Tensor
    state: dict[str, Any]
    kind: str | None
    hyper: dict[str, Any]


#: What a ps counts (``VariableStore.metrics``, and the reply to ``Ping``).
METRICS = ("pushes", "pushes_refused", "pushes_refused_nonfinite")


class VariableStore:
    """The variables of one parameter server and the handlers of its RPCs. Thread-safe.

    Every request is checked whole before any of it is applied: a push (Create, SetState) that
    is refused changes no variable.
    """

    def __init__(self, task: str) -> None:
        self._task = task
        self._variables: dict[str, _Variable] = {}
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(METRICS, 0)

    def __len__(self) -> int:
        return len(self._variables)

    def metrics(self) -> dict[str, int]:
        """What this ps counted: ``pushes`` applied, ``pushes_refused`` (for any reason) and,
        of those, ``pushes_refused_nonfinite`` (a gradient with a NaN or an infinity)."""
        with self._lock:
            return dict(self._counts)

    def _count(self, *names: str) -> None:
        with self._lock:
            for name in names:
                self._counts[name] += 1

    def handlers(self) -> dict[str, Any]:
        return {
            "Create": self._create,
            "Pull": self._pull,
            "Push": self._push,
            "GetState": self._get_state,
            "SetState": self._set_state,
        }

    def _get(self, name: str) -> _Variable:
        variable = self._variables.get(name)
        if variable is None:
            raise NotFoundError(
                f"{self._task} holds no variable {name!r}: it was never created here, or this "
                "parameter server restarted and lost it (restart the cluster and restore the last "
                "checkpoint)",
                name=name,
            )
        return variable

    # -- handlers ------------------------------------------------------------------------------
    def _create(
        self, header: dict[str, Any], buffers: list[memoryview]
    ) -> tuple[dict[str, Any], list[Any]]:
        items = field(header, "variables", list)
        _check_count(buffers, len(items))
        checked = []
        for item, buffer in zip(items, buffers, strict=True):
            name = field(item, "name", str)
            value = _tensors.unpack(field(item, "value", dict), buffer)
            overwrite = field(item, "overwrite", bool, False)
            existing = self._variables.get(name)
            if existing is not None and overwrite:
                _check_shape(name, existing.value, value)
            checked.append((name, value, overwrite))
        created = []
        for name, value, overwrite in checked:
            with self._lock:
                existing = self._variables.get(name)
                if existing is None:
                    self._variables[name] = _Variable(value)
                    created.append(True)
                    continue
            created.append(False)
            if overwrite:
                with existing.lock, torch.no_grad():
                    _check_shape(name, existing.value, value)
                    existing.value.copy_(value)
        return {"created": created}, []

    def _pull(
        self, header: dict[str, Any], buffers: list[memoryview]
    ) -> tuple[dict[str, Any], list[Any]]:
        items = field(header, "variables", list)
        rows = iter(buffers)
        if "push" in header:  # applied first, all or nothing, before anything is read
            self._apply(field(header, "push", list), rows)
        metas, out = [], []
        for item in items:
            variable = self._get(field(item, "name", str))
            index = _rows(next(rows, None), variable) if field(item, "rows", bool) else None
            with variable.lock:
                value = variable.value.detach()
                value = value.index_select(0, index) if index is not None else value.clone()
            meta, array = _tensors.pack(value)
            metas.append(meta)
            out.append(array)
        return {"values": metas}, out

    def _push(
        self, header: dict[str, Any], buffers: list[memoryview]
    ) -> tuple[dict[str, Any], list[Any]]:
        """Applies every gradient of the push, or (one of them refused) none."""
        self._apply(field(header, "variables", list), iter(buffers))
        return {}, []

    def _apply(self, items: list[Any], parts: Iterator[memoryview]) -> None:
        """Applies the gradients of a push's ``items`` (their buffers from ``parts``), or
        (one of them refused) none."""
        try:
            gradients = self._check_push(items, parts)
        except Exception:
            self._count("pushes_refused")
            raise
        for gradient in gradients:
            variable = gradient.variable
            with variable.lock:
                if variable.update is None or variable.update.kind != gradient.kind:
                    variable.update = Update(gradient.kind, gradient.hyper, variable.value)
                else:
                    variable.update.set_hyperparameters(gradient.hyper)
                variable.update.apply(gradient.grad, gradient.rows)
        self._count("pushes")

    def _check_push(self, items: list[Any], parts: Iterator[memoryview]) -> list[_Gradient]:
        """The push's gradients, each checked: its variable exists and trains, its rows are the
        variable's, its dtype and shape are the variable's, its optimizer and hyperparameters
        can step, and (unless the item allows it) it is finite.

        Raises:
          NotFoundError: a variable this ps does not hold.
          InvalidArgumentError: anything else, naming the variable.
        """
        gradients: list[_Gradient] = []
        nonfinite: list[str] = []
        for item in items:
            name = field(item, "name", str)
            variable = self._get(name)
            index = _rows(next(parts, None), variable) if field(item, "rows", bool) else None
            grad = _tensors.unpack(field(item, "grad", dict), _next(parts))
            kind = field(item, "optimizer", str)
            hyper = field(item, "hyper", dict)
            rows = None if index is None else len(index)
            value = variable.value
            check_gradient(name, value.dtype, value.shape, grad, rows, kind, hyper)
            if not field(item, "allow_nonfinite", bool, False) and not _tensors.all_finite(grad):
                nonfinite.append(name)
            gradients.append(_Gradient(variable, index, grad, kind, hyper))
        if nonfinite:
            self._count("pushes_refused_nonfinite")
            names = ", ".join(map(repr, nonfinite))
            subject = (
                f"the gradient of {names} is"
                if len(nonfinite) == 1
                else (f"the gradients of {names} are")
            )
            raise InvalidArgumentError(
                f"{subject} not finite (NaN or infinity): {self._task} applied none of this "
                "push, since it would make the variable non-finite for every worker. Find "
                "where it comes from (a learning rate too high, a log or a division by 0; clip "
                "or skip such steps), or create the strategy with "
                "ParameterServerStrategy(..., allow_nonfinite=True) to apply such gradients"
            )
        return gradients

    def _get_state(
        self, header: dict[str, Any], buffers: list[memoryview]
    ) -> tuple[dict[str, Any], list[Any]]:
        names = field(header, "names", list)
        if not all(isinstance(name, str) for name in names):
            raise InvalidArgumentError(
                f"malformed request: names must be a list of strings, got {names!r:.200}"
            )
        items, out = [], []
        for name in names:
            variable = self._get(name)
            with variable.lock:
                value = variable.value.detach().clone()
                update = variable.update
                state = update.state() if update is not None else {}
                hyper = update.optimizer.param_groups[0] if update is not None else {}
                state_meta, state_buffers = pack_state(state)
            value_meta, value_array = _tensors.pack(value)
            items.append(
                {
                    "name": name,
                    "value": value_meta,
                    "optimizer": update.kind if update is not None else None,
                    "hyper": hyperparameters(hyper),
                    "state": state_meta,
                }
            )
            out.append(value_array)
            out.extend(state_buffers)
        return {"variables": items}, out

    def _set_state(
        self, header: dict[str, Any], buffers: list[memoryview]
    ) -> tuple[dict[str, Any], list[Any]]:
        parts = iter(buffers)
        assignments = []
        for item in field(header, "variables", list):
            name = field(item, "name", str)
            value = _tensors.unpack(field(item, "value", dict), _next(parts))
            state = unpack_state(field(item, "state", dict, {}), parts)
            kind = field(item, "optimizer", (str, type(None)), None)
            hyper = field(item, "hyper", dict, {})
            existing = self._variables.get(name)
            if existing is not None:
                _check_shape(name, existing.value, value)
            if kind is not None:
                check_hyperparameters(kind, hyper)
                _check_state(name, value, state)
            assignments.append(_Assignment(name, value, state, kind, hyper))
        for name, value, state, kind, hyper in assignments:
            with self._lock:
                variable = self._variables.setdefault(name, _Variable(value))
            with variable.lock:
                _check_shape(name, variable.value, value)
                with torch.no_grad():
                    variable.value.copy_(value)
                if kind is not None:
                    variable.update = Update(kind, hyper, variable.value)
                    variable.update.set_state(state)
        return {}, []


def pack_state(state: dict[str, Any]) -> tuple[dict[str, Any], list[np.ndarray]]:
    """An optimizer's per-parameter state as JSON and buffers (tensors in key order)."""
    meta: dict[str, Any] = {}
    buffers = []
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            tensor_meta, array = _tensors.pack(value)
            meta[key] = {"tensor": tensor_meta}
            buffers.append(array)
        else:
            meta[key] = {"number": value}
    return meta, buffers


def unpack_state(meta: dict[str, Any], buffers: Iterator[memoryview]) -> dict[str, Any]:
    """The state ``pack_state`` described, taking its tensors from ``buffers``."""
    state: dict[str, Any] = {}
    for key, entry in meta.items():
        if not isinstance(entry, dict):
            raise InvalidArgumentError(f"malformed request: optimizer state entry {entry!r}")
        if "tensor" in entry:
            state[key] = _tensors.unpack(entry["tensor"], _next(buffers))
        else:
            number = entry.get("number")
            if number is not None and not isinstance(number, int | float):
                raise InvalidArgumentError(
                    f"malformed request: optimizer state {key!r} is {number!r:.100}, not a number"
                )
            state[key] = number
    return state


def _next(buffers: Iterator[memoryview]) -> memoryview:
    buffer = next(buffers, None)
    if buffer is None:
        raise InvalidArgumentError("malformed request: fewer buffers than the header describes")
    return buffer


def _check_count(buffers: list[memoryview], count: int) -> None:
    if len(buffers) != count:
        raise InvalidArgumentError(
            f"malformed request: {count} variables but {len(buffers)} buffers"
        )


def _rows(buffer: memoryview | None, variable: _Variable) -> torch.Tensor:
    if buffer is None or buffer.nbytes % 8:
        raise InvalidArgumentError("malformed request: row indices must be an int64 buffer")
    index = torch.from_numpy(np.frombuffer(buffer, dtype=np.int64).copy())
    rows = variable.value.shape[0] if variable.value.dim() else 0
    if len(index) and (int(index.min()) < 0 or int(index.max()) >= rows):
        raise InvalidArgumentError(f"row indices outside [0, {rows}) of the variable")
    return index


def _check_state(name: str, value: torch.Tensor, state: dict[str, Any]) -> None:
    """Every tensor of an optimizer's state of variable ``name`` is a scalar (a step count) or
    of the variable's shape (a moment, a momentum buffer)."""
    for key, entry in state.items():
        if isinstance(entry, torch.Tensor) and entry.dim() and entry.shape != value.shape:
            raise InvalidArgumentError(
                f"optimizer state {key!r} of {name!r} has shape {list(entry.shape)}; the "
                f"variable has {list(value.shape)}"
            )


def _check_shape(name: str, current: torch.Tensor, value: torch.Tensor) -> None:
    if current.shape != value.shape:
        raise InvalidArgumentError(
            f"variable {name!r} has shape {list(current.shape)}; a value of shape "
            f"{list(value.shape)} cannot be assigned to it"
        )
