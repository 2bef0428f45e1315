"""Elements on the wire: their leaves as raw buffers, described by a JSON-able ``meta``.

Elements travel as their flat lists of leaves (the caller flattens and unflattens them with the
element spec it knows): ``pack_elements`` gives a JSON-able description of them, to be put in a
frame's header (``wire``), and the buffers that hold their data; ``unpack_elements`` rebuilds
them from both, checking everything, since frames come from the network.

    >>> import numpy as np
    >>> from feedline._net.wire import decode_frame, encode_frame
    >>> elements = [[np.arange(3, dtype=np.float32), bytes_scalar(b"a\\x00")]] * 2
    >>> meta, buffers = pack_elements(elements)
    >>> header, views = decode_frame(encode_frame({"elements": meta}, buffers))
    >>> [[a.tolist() for a in element] for element in unpack_elements(header["elements"], views)]
    [[[0.0, 1.0, 2.0], b'a\\x00'], [[0.0, 1.0, 2.0], b'a\\x00']]

Numeric leaves are sent as their own memory and come back as read-only ``np.frombuffer`` views
of the frame (or of its decompressed region), so a consumer that keeps one keeps the whole frame
alive; copy it to keep it alone.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from feedline.errors import InvalidArgumentError
from feedline.structure import BYTES, bytes_array, bytes_scalar

__all__ = ["pack_elements", "unpack_elements"]

# Elements. A signature is one element's leaves, each [dtype, shape]: dtype is ``dtype.str`` of a
# numeric, bool or unicode leaf (one buffer each) or "bytes" for an object array of bytes (one
# buffer per item). Meta is {"signatures": [...], "count": n} when every element has the one
# signature and takes at least one buffer, else {"signatures": [...], "elements": [index, ...]}.

_BYTES_TAG = "bytes"
_DTYPE_RE = re.compile(r"[<>|][biufcU][0-9]{1,6}")
_KINDS = frozenset("biufcU")
_MAX_RANK = 64


def pack_elements(
    elements: Sequence[Sequence[np.ndarray]],
) -> tuple[dict[str, Any], list[memoryview | bytes]]:
    """A JSON-able description of ``elements`` and the buffers that hold their data.

    Args:
      elements: each element as its flat list of leaves: arrays of a bool, numeric or unicode
        dtype, or object arrays of ``bytes``.

    Returns:
      ``(meta, buffers)``: send ``meta`` in the frame header and ``buffers`` to ``encode_frame``.
      Numeric leaves' buffers are their own memory (C-contiguous leaves are not copied).

    Raises:
      InvalidArgumentError: a leaf has another dtype, or an object leaf holds something else.
    """
    buffers: list[memoryview | bytes] = []
    if not elements:
        return {"signatures": [], "count": 0}, buffers
    first = elements[0]
    dtypes = [leaf.dtype for leaf in first]
    shapes = [leaf.shape for leaf in first]
    if _all_alike(elements, dtypes, shapes) and _buffer_count(dtypes, shapes):
        signature = _signature(first)
        is_bytes = [dtype == BYTES for dtype in dtypes]
        if any(is_bytes):
            for element in elements:
                _add_buffers(element, is_bytes, buffers)
        else:
            buffers.extend([_numeric_view(leaf) for element in elements for leaf in element])
        return {"signatures": [signature], "count": len(elements)}, buffers
    index: dict[tuple[Any, ...], tuple[int, list[bool]]] = {}
    signatures: list[list[list[Any]]] = []
    order: list[int] = []
    for element in elements:
        key = tuple([(leaf.dtype, leaf.shape) for leaf in element])
        known = index.get(key)
        if known is None:
            known = index[key] = (len(signatures), [dtype == BYTES for dtype, _ in key])
            signatures.append(_signature(element))
        order.append(known[0])
        _add_buffers(element, known[1], buffers)
    return {"signatures": signatures, "elements": order}, buffers


def _all_alike(
    elements: Sequence[Sequence[np.ndarray]], dtypes: list[np.dtype], shapes: list[tuple[int, ...]]
) -> bool:
    """Whether every element has leaves of ``dtypes`` and ``shapes`` (a hot loop)."""
    count = len(dtypes)
    for element in elements:
        if len(element) != count:
            return False
        for leaf, dtype, shape in zip(element, dtypes, shapes, strict=True):
            if leaf.shape != shape or leaf.dtype != dtype:
                return False
    return True


def _buffer_count(dtypes: Sequence[np.dtype], shapes: Sequence[tuple[int, ...]]) -> int:
    return sum(
        math.prod(shape) if dtype == BYTES else 1
        for dtype, shape in zip(dtypes, shapes, strict=True)
    )


def _signature(element: Sequence[np.ndarray]) -> list[list[Any]]:
    signature = []
    for leaf in element:
        dtype = leaf.dtype
        if dtype.kind not in _KINDS and dtype != BYTES:
            raise InvalidArgumentError(
                f"cannot send a leaf of dtype {dtype}: leaves must be bool, numeric, str "
                "(unicode) or bytes (object arrays of bytes)"
            )
        signature.append([_BYTES_TAG if dtype == BYTES else dtype.str, list(leaf.shape)])
    return signature


def _numeric_view(leaf: np.ndarray) -> memoryview:
    view = leaf.data  # memoryview(leaf)
    return view if view.c_contiguous else np.ascontiguousarray(leaf).data


def _add_buffers(
    element: Sequence[np.ndarray], is_bytes: list[bool], buffers: list[memoryview | bytes]
) -> None:
    for leaf, bytes_leaf in zip(element, is_bytes, strict=True):
        if not bytes_leaf:
            buffers.append(_numeric_view(leaf))
            continue
        if not leaf.ndim:
            item = leaf.item()
            if type(item) is not bytes:
                _not_bytes(item)
            buffers.append(item)
            continue
        items = leaf.ravel().tolist()
        for item in items:
            if type(item) is not bytes:
                _not_bytes(item)
        buffers.extend(items)


def _not_bytes(item: Any) -> None:
    raise InvalidArgumentError(
        f"an object leaf must hold bytes, but one of its items is of type {type(item).__name__}: "
        f"{item!r:.100}"
    )


def unpack_elements(meta: dict[str, Any], buffers: Sequence[memoryview]) -> list[list[np.ndarray]]:
    """The elements that ``pack_elements`` described in ``meta``, from their ``buffers``.

    Numeric, bool and unicode leaves are read-only views of the buffers; bytes leaves are object
    arrays of ``bytes`` (0-d for a scalar).

    Args:
      meta: the description made by ``pack_elements`` (after a JSON round trip).
      buffers: the frame's buffers, as ``decode_frame`` returns them.

    Raises:
      InvalidArgumentError: ``meta`` is malformed or does not fit the buffers.
    """
    if not isinstance(meta, dict) or not isinstance(meta.get("signatures"), list):
        raise InvalidArgumentError(
            f"element meta must be an object with a 'signatures' list, not {meta!r:.200}"
        )
    plans = [_parse_signature(s) for s in meta["signatures"]]
    costs = [sum(leaf[4] for leaf in plan) for plan in plans]
    if "count" in meta:
        count = meta["count"]
        if (len(plans) != 1 and count != 0) or type(count) is not int or count < 0:
            raise InvalidArgumentError(
                f"element meta with a count needs one signature and a non-negative integer "
                f"count, not {len(plans)} signatures and count {count!r:.50}"
            )
        if count and not costs[0]:
            raise InvalidArgumentError("element meta with a count needs elements that take buffers")
        if count and count * costs[0] != len(buffers):
            raise InvalidArgumentError(
                f"element meta describes {count * costs[0]} buffers but the frame holds "
                f"{len(buffers)}"
            )
        order = [0] * count
    else:
        listed = meta.get("elements")
        if not isinstance(listed, list) or not all(
            type(i) is int and 0 <= i < len(plans) for i in listed
        ):
            raise InvalidArgumentError(
                f"element meta 'elements' must be a list of indices into its {len(plans)} "
                f"signatures, not {listed!r:.200}"
            )
        order = listed
    needed = sum(costs[i] for i in order)
    if needed != len(buffers):
        raise InvalidArgumentError(
            f"element meta describes {needed} buffers but the frame holds {len(buffers)}"
        )
    frombuffer = np.frombuffer
    only = plans[0][0] if len(plans) == 1 and len(plans[0]) == 1 else None
    if only is not None and only[0] is not None:
        # Elements of one numeric leaf each (a hot path): a buffer per element.
        kind, dims, reshaped, size = only[0], only[1], only[2], only[3]
        for buffer in buffers:
            if buffer.nbytes != size:
                raise InvalidArgumentError(
                    f"element meta says a {kind.str} leaf of shape {dims} ({size} bytes) "
                    f"but its buffer holds {buffer.nbytes} bytes"
                )
        if reshaped:
            return [[frombuffer(buffer, kind).reshape(dims)] for buffer in buffers]
        return [[frombuffer(buffer, kind)] for buffer in buffers]
    elements = []
    position = 0
    for i in order:
        leaves = []
        for dtype, shape, reshape, nbytes, taken in plans[i]:
            if dtype is None:
                items = [bytes(b) for b in buffers[position : position + taken]]
                leaves.append(
                    bytes_scalar(items[0]) if not shape else bytes_array(items).reshape(shape)
                )
            else:
                buffer = buffers[position]
                if buffer.nbytes != nbytes:
                    raise InvalidArgumentError(
                        f"element meta says a {dtype.str} leaf of shape {shape} ({nbytes} bytes) "
                        f"but its buffer holds {buffer.nbytes} bytes"
                    )
                leaf = frombuffer(buffer, dtype)
                leaves.append(leaf.reshape(shape) if reshape else leaf)
            position += taken
        elements.append(leaves)
    return elements


def _parse_signature(
    signature: Any,
) -> list[tuple[np.dtype | None, tuple[int, ...], bool, int, int]]:
    """Per leaf: dtype (None for bytes), shape, whether ``np.frombuffer``'s 1-d result needs a
    reshape, the bytes of a numeric leaf, and the buffers the leaf takes."""
    if not isinstance(signature, list):
        raise InvalidArgumentError(f"element signature must be a list, not {signature!r:.200}")
    plan: list[tuple[np.dtype | None, tuple[int, ...], bool, int, int]] = []
    for leaf in signature:
        if not (isinstance(leaf, list) and len(leaf) == 2 and isinstance(leaf[1], list)):
            raise InvalidArgumentError(
                f"leaf description must be [dtype, shape], not {leaf!r:.200}"
            )
        name, dims = leaf
        if not all(type(d) is int and d >= 0 for d in dims) or len(dims) > _MAX_RANK:
            raise InvalidArgumentError(
                f"leaf shape must be a list of at most {_MAX_RANK} non-negative integers, not "
                f"{dims!r:.200}"
            )
        shape = tuple(dims)
        size = math.prod(shape)
        dtype = None if name == _BYTES_TAG else _parse_dtype(name)
        if not size:
            # Only a zero-size shape can be absurd without failing the byte or buffer counts.
            try:
                np.empty(shape, dtype=BYTES if dtype is None else dtype)
            except (ValueError, OverflowError) as error:
                raise InvalidArgumentError(f"leaf shape {dims} is not valid: {error}") from None
        if dtype is None:
            plan.append((None, shape, False, 0, size))
            continue
        plan.append((dtype, shape, len(shape) != 1, size * dtype.itemsize, 1))
    return plan


def _parse_dtype(name: Any) -> np.dtype:
    if isinstance(name, str) and _DTYPE_RE.fullmatch(name):
        try:
            dtype = np.dtype(name)
        except TypeError:
            dtype = None
        if dtype is not None and dtype.kind in _KINDS and dtype.itemsize and dtype.str == name:
            return dtype
    raise InvalidArgumentError(
        f"leaf dtype {name!r:.50} is not allowed: use a bool, numeric or unicode NumPy dtype "
        f"string such as '<f4', '|b1' or '<U3', or {_BYTES_TAG!r}"
    )
