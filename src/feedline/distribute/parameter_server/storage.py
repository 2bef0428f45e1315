"""The variables a parameter server holds, and the RPCs through which workers use them.

Each variable (or shard of a partitioned one) is a tensor under a name, with a lock, and the
optimizer that updates it (``updates.Update``, made by the first push that names one). The
methods, each one frame of ``feedline._net.wire`` (a JSON header and raw buffers):

=========  ======================================================================================
Create     ``{"variables": [{"name", "value", "overwrite"}]}`` + one buffer each: creates what does
           not exist (every between-graph worker creates the same variables; the first one wins)
           or, with ``overwrite``, assigns (a checkpoint being restored). Replies which it created.
Pull       ``{"variables": [{"name", "rows"}]}`` + the row indices (int64) of each ``rows``
           variable: the values, or those rows of them.
Push       ``{"variables": [{"name", "grad", "rows", "optimizer", "hyper"}]}`` + [rows] gradient:
           applies the gradient with the named optimizer.
GetState   ``{"names": [...]}``: each variable's value and optimizer state (for checkpoints).
SetState   what GetState replies: assigns values and optimizer state.
=========  ======================================================================================

A name the ps does not hold is a ``NotFoundError`` (a restarted ps has lost its variables).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from feedline._net.rpc import field
from feedline.distribute.parameter_server import _tensors
from feedline.distribute.parameter_server.updates import Update, hyperparameters
from feedline.errors import InvalidArgumentError, NotFoundError

__all__ = ["VariableStore", "pack_state", "unpack_state"]


class _Variable:
    def __init__(self, value: torch.Tensor) -> None:
        self.value = torch.nn.Parameter(value, requires_grad=value.is_floating_point())
        self.lock = threading.Lock()
        self.update: Update | None = None


class VariableStore:
    """The variables of one parameter server and the handlers of its RPCs. Thread-safe."""

    def __init__(self, task: str) -> None:
        self._task = task
        self._variables: dict[str, _Variable] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._variables)

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
        created = []
        for item, buffer in zip(items, buffers, strict=True):
            name = field(item, "name", str)
            value = _tensors.unpack(field(item, "value", dict), buffer)
            with self._lock:
                existing = self._variables.get(name)
                if existing is None:
                    self._variables[name] = _Variable(value)
                    created.append(True)
                    continue
            created.append(False)
            if field(item, "overwrite", bool, False):
                with existing.lock, torch.no_grad():
                    _check_shape(name, existing.value, value)
                    existing.value.copy_(value)
        return {"created": created}, []

    def _pull(
        self, header: dict[str, Any], buffers: list[memoryview]
    ) -> tuple[dict[str, Any], list[Any]]:
        items = field(header, "variables", list)
        rows = iter(buffers)
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
        items = field(header, "variables", list)
        parts = iter(buffers)
        for item in items:
            variable = self._get(field(item, "name", str))
            index = _rows(next(parts, None), variable) if field(item, "rows", bool) else None
            grad = _tensors.unpack(field(item, "grad", dict), _next(parts))
            expected = (
                variable.value.shape if index is None else (len(index), *variable.value.shape[1:])
            )
            if grad.shape != expected:
                raise InvalidArgumentError(
                    f"the gradient of {item['name']!r} has shape {list(grad.shape)}; the "
                    f"variable takes {list(expected)}"
                )
            kind = field(item, "optimizer", str)
            hyper = field(item, "hyper", dict)
            with variable.lock:
                if variable.update is None or variable.update.kind != kind:
                    variable.update = Update(kind, hyper, variable.value)
                else:
                    variable.update.set_hyperparameters(hyper)
                variable.update.apply(grad, index)
        return {}, []

    def _get_state(
        self, header: dict[str, Any], buffers: list[memoryview]
    ) -> tuple[dict[str, Any], list[Any]]:
        items, out = [], []
        for name in field(header, "names", list):
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
        for item in field(header, "variables", list):
            name = field(item, "name", str)
            value = _tensors.unpack(field(item, "value", dict), _next(parts))
            with self._lock:
                variable = self._variables.setdefault(name, _Variable(value))
            state = unpack_state(field(item, "state", dict, {}), parts)
            with variable.lock:
                _check_shape(name, variable.value, value)
                with torch.no_grad():
                    variable.value.copy_(value)
                kind = field(item, "optimizer", (str, type(None)), None)
                if kind is not None:
                    variable.update = Update(kind, field(item, "hyper", dict), variable.value)
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
            state[key] = entry.get("number")
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


def _check_shape(name: str, current: torch.Tensor, value: torch.Tensor) -> None:
    if current.shape != value.shape:
        raise InvalidArgumentError(
            f"variable {name!r} has shape {list(current.shape)}; a value of shape "
            f"{list(value.shape)} cannot be assigned to it"
        )
