"""The wire format of the data service: frames of a JSON header and raw buffers, and elements.

gRPC carries each message body as raw ``bytes``; this module frames them itself, without pickle,
since frames come from the network and must be safe to parse. A frame is::

    b"FLW" | version (uint8) | header length (uint32 little-endian) | header | buffer region

The header is a compact UTF-8 JSON object; its reserved key ``"_frame"`` holds the buffer sizes
(``"sizes"``) and, when the region is compressed, the codec (``"codec": "lz4"``) and the region's
uncompressed size (``"raw_size"``). The buffers lie back to back in the region (lz4-block
compressed as a whole when a ``Compressor`` says it pays).

Elements travel as their flat lists of leaves (the caller flattens and unflattens them with the
element spec it knows): ``pack_elements`` gives a JSON-able description of them, to be put in
the header, and the buffers that hold their data; ``unpack_elements`` rebuilds them from both.

    >>> import numpy as np
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

import json
import math
import re
import struct
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

import lz4.block
import numpy as np

from feedline.data.structure import BYTES, bytes_array, bytes_scalar
from feedline.errors import InvalidArgumentError

__all__ = ["Compressor", "decode_frame", "encode_frame", "pack_elements", "unpack_elements"]

_MAGIC = b"FLW"
_VERSION = 1
_PREFIX = struct.Struct("<3sBI")
_RESERVED = "_frame"
_LZ4 = "lz4"
#: The largest region lz4's block format can compress, and so the largest a frame may declare.
_MAX_RAW_SIZE = 0x7E000000
#: lz4 expands at most ~255 times (a long match costs one byte per 255 of its length).
_LZ4_MAX_RATIO = 256

Buffer = bytes | bytearray | memoryview | np.ndarray


class Compressor:
    """Decides, frame by frame, whether to lz4-compress a frame's buffer region.

    ``Compressor(None)`` never compresses. ``Compressor("AUTO")`` compresses a region with
    ``lz4.block`` only when it pays: regions under ``MIN_SIZE`` bytes are sent as they are, and an
    attempt that saves less than ``MIN_SAVING`` of the size is discarded, after which the next 16
    regions (doubling after each further failure, up to 256) are sent without trying; a success
    resets the wait to 16. Only regions of at least ``MIN_SIZE`` bytes count as calls here.

    The state is not locked. Use it from one producer thread; concurrent calls still give right
    results, but the skip counting (and ``attempts``) becomes approximate.

    Args:
      mode: ``"AUTO"`` or ``None``.

    Raises:
      InvalidArgumentError: ``mode`` is something else.
    """

    MIN_SIZE = 4096
    MIN_SAVING = 0.2
    FIRST_BACKOFF = 16
    MAX_BACKOFF = 256

    def __init__(self, mode: str | None) -> None:
        if mode not in ("AUTO", None):
            raise InvalidArgumentError(
                f"compression mode {mode!r} is not supported; use 'AUTO' or None"
            )
        self.mode = mode
        self.attempts = 0  # regions actually run through lz4, for tests and metrics
        self._skip = 0
        self._backoff = self.FIRST_BACKOFF

    def compress(self, region: bytes | memoryview) -> tuple[str | None, bytes | memoryview]:
        """``("lz4", compressed)`` when compressing ``region`` pays, else ``(None, region)``."""
        size = memoryview(region).nbytes
        if self.mode is None or size < self.MIN_SIZE or size > _MAX_RAW_SIZE:
            return None, region
        if self._skip > 0:
            self._skip -= 1
            return None, region
        self.attempts += 1
        compressed = lz4.block.compress(region, store_size=False)
        if len(compressed) <= size * (1 - self.MIN_SAVING):
            self._backoff = self.FIRST_BACKOFF
            return _LZ4, compressed
        self._skip = self._backoff
        self._backoff = min(2 * self._backoff, self.MAX_BACKOFF)
        return None, region


def encode_frame(
    header: dict[str, Any], buffers: Sequence[Buffer] = (), *, compressor: Compressor | None = None
) -> bytes:
    """One message: ``header`` and ``buffers`` framed as the module docstring shows.

    The buffers' bytes are copied once, into the frame (NumPy arrays that are not C-contiguous
    are made so first). With a compressor, the region may be compressed instead (see
    ``Compressor``).

    Args:
      header: a JSON-able dict, without the reserved key ``"_frame"``.
      buffers: the payload; NumPy arrays contribute their memory (not object arrays).
      compressor: decides whether to compress the buffer region; ``None`` never compresses.

    Returns:
      The frame, for ``decode_frame``.

    Raises:
      InvalidArgumentError: the header uses the reserved key or is not JSON-able, or a buffer
        is an object array.
    """
    if _RESERVED in header:
        raise InvalidArgumentError(f"header key {_RESERVED!r} is reserved for the frame's sizes")
    views: list[bytes | memoryview] = []
    sizes: list[int] = []
    for buffer in buffers:
        if type(buffer) is bytes:
            views.append(buffer)
            sizes.append(len(buffer))
            continue
        view = buffer
        if type(view) is not memoryview or not view.c_contiguous or "O" in view.format:
            view = _as_view(buffer)
        views.append(view)
        sizes.append(view.nbytes)
    frame = _join(header, {"sizes": sizes}, views)
    if compressor is None or compressor.mode is None:
        return frame
    region = memoryview(frame)[len(frame) - sum(sizes) :]
    codec, compressed = compressor.compress(region)
    if codec is None:
        return frame
    return _join(header, {"sizes": sizes, "codec": codec, "raw_size": len(region)}, [compressed])


def _as_view(buffer: Buffer) -> memoryview:
    if isinstance(buffer, np.ndarray):
        if buffer.dtype.hasobject:
            raise InvalidArgumentError(
                "a frame buffer cannot be an object array (it holds pointers, not data); send "
                "byte strings with pack_elements"
            )
        return memoryview(np.ascontiguousarray(buffer))
    view = memoryview(buffer)
    if "O" in view.format:
        raise InvalidArgumentError("a frame buffer cannot hold Python objects (format 'O')")
    return view if view.c_contiguous else memoryview(view.tobytes())


def _join(header: dict[str, Any], frame_info: dict[str, Any], views: list[Any]) -> bytes:
    try:
        text = json.dumps({**header, _RESERVED: frame_info}, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise InvalidArgumentError(f"frame header is not JSON-serializable: {error}") from None
    encoded = text.encode("utf-8")
    return b"".join([_PREFIX.pack(_MAGIC, _VERSION, len(encoded)), encoded, *views])


def decode_frame(
    data: bytes | memoryview, *, max_header_bytes: int = 1 << 20
) -> tuple[dict[str, Any], list[memoryview]]:
    """The header (without ``"_frame"``) and buffers of a frame made by ``encode_frame``.

    The buffers are memoryviews of ``data`` (or of the decompressed region), not copies.

    Args:
      data: one frame.
      max_header_bytes: the longest JSON header accepted.

    Raises:
      InvalidArgumentError: ``data`` is not a well-formed frame; the message says what is wrong.
    """
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        if not view.c_contiguous:
            raise InvalidArgumentError("frame data must be a contiguous buffer")
        view = view.cast("B")
    if len(view) < _PREFIX.size:
        raise InvalidArgumentError(
            f"frame truncated: {len(view)} bytes, shorter than the {_PREFIX.size}-byte prefix"
        )
    magic, version, header_size = _PREFIX.unpack_from(view)
    if magic != _MAGIC:
        raise InvalidArgumentError(f"not a feedline frame: magic {magic!r}, expected {_MAGIC!r}")
    if version != _VERSION:
        raise InvalidArgumentError(
            f"frame version {version} is not supported; this feedline reads version {_VERSION}"
        )
    if header_size > max_header_bytes:
        raise InvalidArgumentError(
            f"frame header of {header_size} bytes is longer than max_header_bytes="
            f"{max_header_bytes}"
        )
    start = _PREFIX.size + header_size
    if start > len(view):
        raise InvalidArgumentError(
            f"frame truncated: header of {header_size} bytes but only {len(view) - _PREFIX.size} "
            "bytes follow the prefix"
        )
    header = _parse_header(view[_PREFIX.size : start])
    info = header.pop(_RESERVED, None)
    if not isinstance(info, dict):
        raise InvalidArgumentError(f"frame header has no {_RESERVED!r} object: {info!r}")
    sizes = info.get("sizes")
    if not (isinstance(sizes, list) and set(map(type, sizes)) <= {int}) or (
        sizes and min(sizes) < 0
    ):
        raise InvalidArgumentError(
            f"frame buffer sizes must be a list of non-negative integers, not {sizes!r:.200}"
        )
    region = view[start:]
    codec = info.get("codec")
    if codec is not None:
        region = _decompress(codec, info.get("raw_size"), region)
    if sum(sizes) != len(region):
        raise InvalidArgumentError(
            f"frame buffer sizes add up to {sum(sizes)} bytes but the region holds {len(region)} "
            "(truncated or corrupted frame)"
        )
    ends = list(accumulate(sizes))
    return header, [region[e - s : e] for s, e in zip(sizes, ends, strict=True)]


def _parse_header(raw: memoryview) -> dict[str, Any]:
    try:
        header = json.loads(str(raw, "utf-8"))
    except (ValueError, RecursionError) as error:
        raise InvalidArgumentError(f"frame header is not valid UTF-8 JSON: {error}") from None
    if not isinstance(header, dict):
        raise InvalidArgumentError(
            f"frame header must be a JSON object, not {type(header).__name__}"
        )
    return header


def _decompress(codec: Any, raw_size: Any, region: memoryview) -> memoryview:
    if codec != _LZ4:
        raise InvalidArgumentError(f"frame codec {codec!r} is unknown; this feedline reads 'lz4'")
    limit = min(_MAX_RAW_SIZE, _LZ4_MAX_RATIO * len(region) + 1024)
    if type(raw_size) is not int or not 0 <= raw_size <= limit:
        raise InvalidArgumentError(
            f"frame declares an uncompressed size of {raw_size!r:.50}; it must be an integer in "
            f"[0, {limit}] for {len(region)} compressed bytes"
        )
    try:
        raw = lz4.block.decompress(region, uncompressed_size=raw_size)
    except (lz4.block.LZ4BlockError, ValueError) as error:
        raise InvalidArgumentError(f"frame region does not decompress: {error}") from None
    if len(raw) != raw_size:
        raise InvalidArgumentError(
            f"frame region decompresses to {len(raw)} bytes, not the declared {raw_size}"
        )
    return memoryview(raw)


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
    view = memoryview(leaf)
    return view if view.c_contiguous else memoryview(np.ascontiguousarray(leaf))


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
        order = meta.get("elements")
        if not isinstance(order, list) or not all(
            type(i) is int and 0 <= i < len(plans) for i in order
        ):
            raise InvalidArgumentError(
                f"element meta 'elements' must be a list of indices into its {len(plans)} "
                f"signatures, not {order!r:.200}"
            )
    needed = sum(costs[i] for i in order)
    if needed != len(buffers):
        raise InvalidArgumentError(
            f"element meta describes {needed} buffers but the frame holds {len(buffers)}"
        )
    frombuffer = np.frombuffer
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
    plan = []
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
