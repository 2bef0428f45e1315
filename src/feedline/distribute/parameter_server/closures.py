"""Scheduled functions as they travel from the coordinator to a worker: cloudpickled.

``dumps_closure`` pickles ``(fn, args, kwargs)`` once, at ``schedule`` time, so that a function
that does not pickle fails there with the object named. Objects that stand for something each
worker holds its own of are pickled as references (``persistent_id``):

- a per-worker dataset or iterator (``("resource", id)``): the worker's own, made by it;
- ``PerWorkerValues`` (``("value", id)``): the worker's element, pickled per dispatch
  (``dumps_value``) and sent beside the closure;

and parameters made under ``ParameterServerStrategy.scope()`` pickle as the names of their
variables (``variables.PSParameter``), never as their values. ``ClosureUnpickler`` resolves the
references on the worker.
"""

from __future__ import annotations

import inspect
import io
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import cloudpickle

from feedline.errors import FailedPreconditionError, InvalidArgumentError

__all__ = ["ClosureUnpickler", "dumps_closure", "dumps_value", "loads"]


class _Pickler(cloudpickle.CloudPickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.values: dict[int, Any] = {}

    def persistent_id(self, obj: Any) -> Any:
        reference = getattr(type(obj), "_feedline_reference", None)
        if reference is None:
            return None
        kind, ident = reference(obj)
        if kind == "value":
            self.values[ident] = obj
        return (kind, ident)


def _dumps(obj: Any) -> tuple[bytes, dict[int, Any]]:
    buffer = io.BytesIO()
    pickler = _Pickler(buffer)
    pickler.dump(obj)
    return buffer.getvalue(), pickler.values


def dumps_closure(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> tuple[bytes, dict[int, Any]]:
    """The pickle of ``(fn, args, kwargs)`` and the ``PerWorkerValues`` it refers to, by id.

    Raises:
      InvalidArgumentError: something does not pickle; the message names it (an argument, or
        a global or closure variable of ``fn``).
    """
    try:
        return _dumps((fn, tuple(args), dict(kwargs)))
    except Exception as error:
        culprit = _culprit(fn, args, kwargs)
        raise InvalidArgumentError(
            f"the function {getattr(fn, '__qualname__', fn)!r} cannot be sent to the workers: "
            f"{culprit or 'it'} does not pickle ({type(error).__name__}: {error}); scheduled "
            "functions travel cloudpickled, so create such objects inside the function, or "
            "per worker with create_per_worker_dataset"
        ) from error


def dumps_value(value: Any) -> bytes:
    """One worker's element of a ``PerWorkerValues``."""
    data, nested = _dumps(value)
    if nested:
        raise InvalidArgumentError("PerWorkerValues cannot hold PerWorkerValues")
    return data


def _culprit(fn: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    candidates: list[tuple[str, Any]] = [
        (f"argument {i} ({a!r:.60})", a) for i, a in enumerate(args)
    ]
    candidates += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    if inspect.isfunction(fn):
        try:
            found = inspect.getclosurevars(fn)
        except (TypeError, ValueError):
            found = None
        if found is not None:
            candidates += [(f"closure variable {k!r}", v) for k, v in found.nonlocals.items()]
            candidates += [(f"global {k!r}", v) for k, v in found.globals.items()]
    else:
        candidates.append((f"the callable {fn!r:.60}", fn))
    for name, value in candidates:
        try:
            _dumps(value)
        except Exception:
            return f"{name}, a {type(value).__module__}.{type(value).__qualname__},"
    return None


class ClosureUnpickler(pickle.Unpickler):
    """Loads a closure on a worker, resolving references to this worker's resources and to its
    elements of ``PerWorkerValues``."""

    def __init__(
        self, data: bytes, resources: Mapping[int, Any], values: Mapping[int, Any]
    ) -> None:
        super().__init__(io.BytesIO(data))
        self._resources = resources
        self._values = values

    def persistent_load(self, pid: Any) -> Any:
        kind, ident = pid
        table = self._resources if kind == "resource" else self._values
        if ident not in table:
            raise FailedPreconditionError(
                f"this worker holds no {kind} {ident}: the coordinator sends every per-worker "
                "dataset and value before a function that uses it"
            )
        return table[ident]


def loads(data: bytes | memoryview, resources: Mapping[int, Any] | None = None) -> Any:
    """Unpickles what ``dumps_*`` pickled (references resolved against ``resources``)."""
    return ClosureUnpickler(bytes(data), resources or {}, {}).load()
