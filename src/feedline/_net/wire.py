"""The wire format of the data service: frames of a JSON header and raw buffers, and elements.

gRPC carries each message body as raw ``bytes``; this module frames them itself, without pickle,
since frames come from the network and must be safe to parse. A frame is::

    b"FLW" | version (uint8) | header length (uint32 little-endian) | header | buffer region

The header is a compact UTF-8 JSON object; its reserved key ``"_frame"`` holds the buffer sizes
(``"sizes"``) and, when the region is compressed, the codec (``"codec": "lz4"``) and the region's
uncompressed size (``"raw_size"``). The buffers lie back to back in the region (lz4-block
compressed as a whole when a ``Compressor`` says it pays).

Elements travel in frames as their leaves' buffers, described in the header (``elements``).

    >>> header, views = decode_frame(encode_frame({"step": 7}, [b"abc", b""]))
    >>> header, [bytes(v) for v in views]
    ({'step': 7}, [b'abc', b''])
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

import lz4.block
import numpy as np

from feedline.errors import InvalidArgumentError

__all__ = ["Compressor", "decode_frame", "encode_frame"]

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
        return np.ascontiguousarray(buffer).data  # memoryview() of it
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
