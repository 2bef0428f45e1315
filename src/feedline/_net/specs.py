"""Element specs on the wire: data (JSON), never pickles.

A client that registers a dataset sends its element spec as ``encode_spec`` gives it; the
dispatcher keeps the bytes and hands them to ``from_dataset_id``, which rebuilds the spec with
``decode_spec``. Decoding runs no code of the sender's: it makes ``TensorSpec``,
``RaggedTensorSpec``, ``SparseTensorSpec`` and ``DatasetSpec`` leaves in tuples, lists, dicts
and namedtuples, and a namedtuple is the class already loaded in this process under its name
(with the same fields), else a new namedtuple class of that name and fields: a module is never
imported for it.

    >>> import numpy as np
    >>> from feedline.structure import TensorSpec
    >>> spec = (TensorSpec((None, 3), np.float32), {"label": TensorSpec((), np.int64)})
    >>> encode_spec(spec)[:60]
    b'{"t":"tuple","items":[{"t":"tensor","shape":[null,3],"dtype"'
    >>> decode_spec(encode_spec(spec)) == spec
    True
"""

from __future__ import annotations

import collections
import json
import sys
from typing import Any

import numpy as np

from feedline._net.elements import _BYTES_TAG, _parse_dtype
from feedline.errors import InvalidArgumentError
from feedline.structure import BYTES, DatasetSpec, RaggedTensorSpec, SparseTensorSpec, TensorSpec

__all__ = ["decode_spec", "encode_spec"]

_MAX_DEPTH = 64


def _dtype(dtype: np.dtype) -> str:
    return _BYTES_TAG if dtype == BYTES else dtype.str


def _shape(shape: tuple[int | None, ...] | None) -> list[int | None] | None:
    return None if shape is None else list(shape)  # None: an unknown rank


def _encode(spec: Any, depth: int) -> dict[str, Any]:
    if depth > _MAX_DEPTH:
        raise InvalidArgumentError(f"the element spec is nested more than {_MAX_DEPTH} deep")
    if spec is None:
        return {"t": "none"}
    if isinstance(spec, TensorSpec):
        return {"t": "tensor", "shape": _shape(spec.shape), "dtype": _dtype(spec.dtype),
                "name": spec.name}  # fmt: skip
    if isinstance(spec, RaggedTensorSpec):
        return {"t": "ragged", "shape": _shape(spec.shape), "dtype": _dtype(spec.dtype),
                "ragged_rank": spec.ragged_rank,
                "splits": _dtype(spec.row_splits_dtype)}  # fmt: skip
    if isinstance(spec, SparseTensorSpec):
        return {"t": "sparse", "shape": _shape(spec.shape), "dtype": _dtype(spec.dtype)}
    if isinstance(spec, DatasetSpec):
        return {"t": "dataset", "spec": _encode(spec.element_spec, depth + 1)}
    if isinstance(spec, tuple) and hasattr(type(spec), "_fields"):
        kind = type(spec)
        return {"t": "namedtuple", "module": kind.__module__, "name": kind.__qualname__,
                "fields": list(kind._fields),  # type: ignore[attr-defined]
                "items": [_encode(item, depth + 1) for item in spec]}  # fmt: skip
    if type(spec) in (tuple, list):
        return {"t": type(spec).__name__, "items": [_encode(item, depth + 1) for item in spec]}
    if type(spec) in (dict, collections.OrderedDict):
        items = []
        for key, value in spec.items():
            if isinstance(key, bool) or not isinstance(key, str | int):
                raise InvalidArgumentError(
                    f"the element spec has a dict key {key!r}: keys of elements sent through "
                    "the data service are strings or ints"
                )
            items.append([key, _encode(value, depth + 1)])
        return {"t": "dict" if type(spec) is dict else "odict", "items": items}
    raise InvalidArgumentError(
        f"the element spec holds {type(spec).__name__} {spec!r:.80}: the data service carries "
        "TensorSpec structures (tuples, lists, dicts, namedtuples) as data"
    )


def encode_spec(spec: Any) -> bytes:
    """``spec`` as compact JSON.

    Raises:
      InvalidArgumentError: it holds something other than specs in tuples, lists, dicts (of
        string or int keys) and namedtuples.
    """
    return json.dumps(_encode(spec, 0), separators=(",", ":")).encode()


def _int_or_none(value: Any, what: str) -> int | None:
    if value is None or (type(value) is int and value >= 0):
        return value
    raise InvalidArgumentError(f"{what} must be a non-negative int or null, got {value!r:.40}")


def _shape_of(node: dict[str, Any]) -> tuple[int | None, ...]:
    shape = node.get("shape")
    if not isinstance(shape, list) or len(shape) > _MAX_DEPTH:
        raise InvalidArgumentError(f"a spec's shape must be a list, got {shape!r:.60}")
    return tuple(_int_or_none(d, "a spec's dimension") for d in shape)


def _dtype_of(name: Any) -> np.dtype:
    return BYTES if name == _BYTES_TAG else _parse_dtype(name)


def _items(node: dict[str, Any]) -> list[Any]:
    items = node.get("items")
    if not isinstance(items, list):
        raise InvalidArgumentError(f"a spec's items must be a list, got {items!r:.60}")
    return items


def _namedtuple(node: dict[str, Any], items: list[Any]) -> Any:
    module, name, fields = node.get("module"), node.get("name"), node.get("fields")
    if not (
        isinstance(module, str)
        and isinstance(name, str)
        and isinstance(fields, list)
        and all(isinstance(f, str) and f.isidentifier() for f in fields)
        and len(fields) == len(items)
    ):
        raise InvalidArgumentError("a namedtuple spec needs a module, a name and its fields")
    loaded: Any = sys.modules.get(module)  # only what is loaded: no import runs here
    for part in name.split("."):
        loaded = getattr(loaded, part, None)
    if (
        isinstance(loaded, type)
        and issubclass(loaded, tuple)
        and list(getattr(loaded, "_fields", ())) == fields
    ):
        return loaded(*items)
    short = name.rpartition(".")[2]
    try:
        made: Any = collections.namedtuple(short if short.isidentifier() else "Element", fields)  # type: ignore[misc]
    except ValueError as error:  # a keyword or a repeated field
        raise InvalidArgumentError(f"a namedtuple spec's fields are not valid: {error}") from None
    return made(*items)


def _decode(node: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise InvalidArgumentError(f"the element spec is nested more than {_MAX_DEPTH} deep")
    if not isinstance(node, dict):
        raise InvalidArgumentError(f"a spec node must be an object, got {node!r:.60}")
    kind = node.get("t")
    if kind == "none":
        return None
    if kind == "tensor":
        name = node.get("name")
        if name is not None and not isinstance(name, str):
            raise InvalidArgumentError(f"a TensorSpec's name must be a string, got {name!r:.40}")
        shape = None if node.get("shape", ()) is None else _shape_of(node)  # unknown rank
        return TensorSpec(shape, _dtype_of(node.get("dtype")), name)
    if kind == "ragged":
        rank = _int_or_none(node.get("ragged_rank"), "ragged_rank")
        splits = _dtype_of(node.get("splits"))
        return RaggedTensorSpec(_shape_of(node), _dtype_of(node.get("dtype")), rank, splits)
    if kind == "sparse":
        return SparseTensorSpec(_shape_of(node), _dtype_of(node.get("dtype")))
    if kind == "dataset":
        return DatasetSpec(_decode(node.get("spec"), depth + 1))
    if kind in ("tuple", "list", "namedtuple"):
        items = [_decode(item, depth + 1) for item in _items(node)]
        if kind == "namedtuple":
            return _namedtuple(node, items)
        return tuple(items) if kind == "tuple" else items
    if kind in ("dict", "odict"):
        pairs = []
        for pair in _items(node):
            if not (
                isinstance(pair, list)
                and len(pair) == 2
                and isinstance(pair[0], str | int)
                and not isinstance(pair[0], bool)
            ):
                raise InvalidArgumentError("a dict spec's items are [key, spec] pairs")
            pairs.append((pair[0], _decode(pair[1], depth + 1)))
        return dict(pairs) if kind == "dict" else collections.OrderedDict(pairs)
    raise InvalidArgumentError(f"unknown spec node type {kind!r:.40}")


def decode_spec(data: bytes | memoryview) -> Any:
    """The element spec ``encode_spec`` encoded, checked throughout (it comes from a peer).

    Raises:
      InvalidArgumentError: the bytes are not such an encoding.
    """
    try:
        node = json.loads(bytes(data))
    except (ValueError, RecursionError) as error:
        raise InvalidArgumentError(f"the element spec is not JSON: {error}") from None
    return _decode(node, 0)
