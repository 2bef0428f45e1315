"""Scheduled functions as they travel from the coordinator to a worker: cloudpickled.

``dumps_closure`` pickles ``(fn, args, kwargs)`` once, at ``schedule`` time, so that a function
that does not pickle fails there with the object named. Every schedule pickles the function's
globals and closure variables anew (a changed value, a learning rate set by a schedule, reaches
the workers); only cloudpickle's scan of ``sys.modules`` for the submodules a function's code
uses is remembered per code object, until a module is imported. Objects that stand for
something each worker holds its own of are pickled as references (``persistent_id``):

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
import itertools
import pickle
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import cloudpickle
import cloudpickle.cloudpickle as _cloudpickle

from feedline.errors import FailedPreconditionError, InvalidArgumentError

__all__ = ["ClosureUnpickler", "dumps_closure", "dumps_value", "loads"]

# cloudpickle's helpers for functions pickled by value (it has had them since 1.x); without
# them, functions are reduced by cloudpickle itself, uncached.
_HELPERS = ("_extract_code_globals", "_get_cell_contents", "_find_imported_submodules",
            "_make_function", "_function_setstate")  # fmt: skip
_CAN_CACHE = all(hasattr(_cloudpickle, name) for name in _HELPERS)
_SUBMODULES_CACHE_SIZE = 1024
# (code, ids of the modules it refers to) -> (len(sys.modules), those modules, submodules).
_submodules_cache: dict[tuple[Any, ...], tuple[int, tuple[Any, ...], list[Any]]] = {}


def _imported_submodules(code: types.CodeType, dependencies: Iterable[Any]) -> list[Any]:
    """cloudpickle's ``_find_imported_submodules`` (the submodules of the packages a function
    refers to that its code names: the worker imports them first), remembered per code object
    and packages while ``sys.modules`` keeps its size. The scan reads every name in
    ``sys.modules``, most of a function's pickling time; the values a function refers to are
    pickled anew every time all the same."""
    modules = tuple(d for d in dependencies if isinstance(d, types.ModuleType))
    key = (code, *map(id, modules))
    loaded = len(sys.modules)
    cached = _submodules_cache.get(key)
    if cached is not None and cached[0] == loaded:
        return list(cached[2])
    found = _cloudpickle._find_imported_submodules(code, modules)
    if len(_submodules_cache) >= _SUBMODULES_CACHE_SIZE:
        _submodules_cache.clear()
    _submodules_cache[key] = (loaded, modules, list(found))  # the modules kept: ids stay theirs
    return found


# type -> its ``_feedline_reference`` (or None): pickling asks for every object it saves, and
# a class lookup of a name most classes lack costs several times a dict's.
_references: dict[type, Any] = {}
_REFERENCES_CACHE_SIZE = 4096


def _reference_of(kind: type) -> Any:
    try:
        return _references[kind]
    except KeyError:
        pass
    except TypeError:  # a metaclass that makes its classes unhashable
        return getattr(kind, "_feedline_reference", None)
    if len(_references) >= _REFERENCES_CACHE_SIZE:
        _references.clear()
    reference = _references[kind] = getattr(kind, "_feedline_reference", None)
    return reference


class _Pickler(cloudpickle.CloudPickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.values: dict[int, Any] = {}

    def _dynamic_function_reduce(self, func: types.FunctionType) -> Any:
        """cloudpickle's reduction of a function pickled by value (its ``_function_getstate``),
        with the submodule scan cached (``_imported_submodules``); the same bytes."""
        if not _CAN_CACHE:
            return super()._dynamic_function_reduce(func)
        newargs = self._function_getnewargs(func)
        slotstate: dict[str, Any] = {
            # "".join: fresh strings, as cloudpickle makes them (interning would change the memo)
            "__name__": "".join(func.__name__),
            "__qualname__": "".join(func.__qualname__),
            "__annotations__": func.__annotations__,
            "__kwdefaults__": func.__kwdefaults__,
            "__defaults__": func.__defaults__,
            "__module__": func.__module__,
            "__doc__": func.__doc__,
            "__closure__": func.__closure__,
        }
        names = _cloudpickle._extract_code_globals(func.__code__)
        f_globals = {k: func.__globals__[k] for k in names if k in func.__globals__}
        cells = func.__closure__ or ()
        closure_values = [_cloudpickle._get_cell_contents(cell) for cell in cells]
        slotstate["_cloudpickle_submodules"] = _imported_submodules(
            func.__code__, itertools.chain(f_globals.values(), closure_values)
        )
        slotstate["__globals__"] = f_globals
        state = {"".join(k): v for k, v in func.__dict__.items()}
        return (
            _cloudpickle._make_function,
            newargs,
            (state, slotstate),
            None,
            None,
            _cloudpickle._function_setstate,
        )

    def persistent_id(self, obj: Any) -> Any:
        reference = _reference_of(type(obj))
        if reference is None:
            return None
        # A reference, or an error for what may not travel to a worker (a metric).
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
