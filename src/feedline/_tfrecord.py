"""The TFRecord record format, shared by its reader (feedline.data) and writer (feedline.io).

A TFRecord file is a sequence of records, each framed as::

    uint64  length              (little-endian)
    uint32  masked_crc32c(length)
    byte    data[length]
    uint32  masked_crc32c(data)

with ``masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2**32)`` of the CRC-32C
of ``x``. A file may be compressed as a whole with GZIP or ZLIB (``check_compression`` accepts
the ``compression_type`` values, which the text-line and CSV readers take too). The piece lives
on the ground floor so that ``feedline.data`` and ``feedline.io`` need not import each other.

Example:
  >>> HEADER.size, FOOTER.size, hex(masked_crc32c(b""))
  (12, 4, '0xa282ead8')
"""

from __future__ import annotations

import struct
from typing import Any

import google_crc32c

from feedline.errors import InvalidArgumentError

__all__ = [
    "COMPRESSION_TYPES",
    "FOOTER",
    "HEADER",
    "LENGTH",
    "MASK_DELTA",
    "check_compression",
    "masked_crc32c",
]

#: the ``compression_type`` values readers and writers accept ("" and None mean none).
COMPRESSION_TYPES = (None, "", "GZIP", "ZLIB")

HEADER = struct.Struct("<QI")
FOOTER = struct.Struct("<I")
LENGTH = struct.Struct("<Q")
MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    """The masked CRC-32C that TFRecord frames store after the length and after the data."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def check_compression(value: Any, operation: str) -> str:
    """``value`` as "", "GZIP" or "ZLIB", or an error naming it and the accepted values."""
    if value is None or value == "":
        return ""
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, str) and value.upper() in ("GZIP", "ZLIB"):
        return value.upper()
    raise InvalidArgumentError(
        f"{operation}: compression_type must be None, '', 'GZIP' or 'ZLIB', got {value!r}"
    )
