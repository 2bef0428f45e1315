"""The TFRecord file format and ``TFRecordWriter`` (``tf.io.TFRecordWriter``).

A TFRecord file is a sequence of records, each framed with its length and masked CRC-32C
checksums (``feedline._tfrecord`` spells the frame out; ``TFRecordDataset`` reads what this
writer writes). A file may be compressed as a whole with GZIP or ZLIB; ``TFRecordDataset`` reads
it with the same ``compression_type``. Files written here are read by TensorFlow and vice versa.

Example:
  >>> import os, tempfile
  >>> path = os.path.join(tempfile.mkdtemp(), "data.tfrecord")
  >>> with TFRecordWriter(path) as writer:
  ...     writer.write(b"hello")
  >>> os.path.getsize(path)
  21
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import zlib
from typing import Any, BinaryIO

import numpy as np

from feedline import _fs
from feedline._tfrecord import (
    COMPRESSION_TYPES,
    FOOTER,
    LENGTH,
    check_compression,
    masked_crc32c,
)
from feedline.errors import FailedPreconditionError, InvalidArgumentError

__all__ = ["COMPRESSION_TYPES", "TFRecordOptions", "TFRecordWriter", "masked_crc32c"]


@dataclasses.dataclass(frozen=True)
class TFRecordOptions:
    """How a TFRecord file is compressed (``tf.io.TFRecordOptions``).

    Attributes:
      compression_type: None or "" (no compression), "GZIP" or "ZLIB".
      compression_level: 0 (none) to 9 (best); None is zlib's default (6).
      window_bits, mem_level, compression_strategy: zlib's ``wbits`` (8 to 15), ``memLevel``
        (1 to 9) and ``strategy`` of a ZLIB file; None is zlib's default.
      compression_method: zlib's method, ``zlib.DEFLATED`` (8), the only one there is.
      flush_mode, input_buffer_size, output_buffer_size: TensorFlow's buffering of its zlib
        stream; accepted, and the writer's own buffering applies.
    """

    compression_type: str | None = None
    flush_mode: int | None = None
    input_buffer_size: int | None = None
    output_buffer_size: int | None = None
    window_bits: int | None = None
    compression_level: int | None = None
    compression_method: int | None = None
    mem_level: int | None = None
    compression_strategy: int | None = None

    @classmethod
    def get_compression_type_string(cls, options: str | TFRecordOptions | None) -> str:
        """The compression of ``options`` (a ``TFRecordOptions``, a name or None) as
        TensorFlow's readers name it: ``""``, ``"GZIP"`` or ``"ZLIB"``."""
        if not isinstance(options, TFRecordOptions):
            options = cls(options)
        return options.compression_type or ""

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "compression_type", check_compression(self.compression_type, "TFRecordOptions")
        )
        level = self.compression_level
        if level is not None and (not isinstance(level, int) or not -1 <= level <= 9):
            raise InvalidArgumentError(
                f"TFRecordOptions: compression_level must be an int from 0 to 9 (or -1 for the "
                f"default), got {level!r}"
            )
        for field, low, high in (("window_bits", 8, 15), ("mem_level", 1, 9)):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, int) or not low <= value <= high):
                raise InvalidArgumentError(
                    f"TFRecordOptions: {field} must be an int from {low} to {high}, got {value!r}"
                )
        if self.compression_method not in (None, zlib.DEFLATED):
            raise InvalidArgumentError(
                f"TFRecordOptions: compression_method must be zlib.DEFLATED ({zlib.DEFLATED}), "
                f"got {self.compression_method!r}"
            )

    def _zlib_compressor(self) -> Any:
        """A compressor of a ZLIB file with these options."""
        return zlib.compressobj(
            -1 if self.compression_level is None else self.compression_level,
            zlib.DEFLATED,
            self.window_bits or zlib.MAX_WBITS,
            self.mem_level or zlib.DEF_MEM_LEVEL,
            self.compression_strategy or zlib.Z_DEFAULT_STRATEGY,
        )


def _open_for_writing(path: str) -> BinaryIO:
    """``path`` created for writing: a local file, or an object of the file-system layer
    (``s3://...``), which an object store makes visible only once it is closed whole."""
    if _fs.is_local(path) and not path.startswith("file://"):
        return open(path, "wb", buffering=1 << 20)
    fs, inner = _fs.filesystem(path)
    with _fs.translate_errors(path, "TFRecordWriter"):
        return fs.open(inner, "wb")


class TFRecordWriter:
    """Writes records to a TFRecord file; usable as a context manager.

    Args:
      path: the file to create (an existing file is replaced): a local path, or a URL of any
        file system fsspec serves (``s3://bucket/train-0.tfrecord``, ``memory://...``).
      options: None, "", "GZIP", "ZLIB" or a ``TFRecordOptions``.

    ``write`` takes ``bytes`` (or a bytes-like object, a 0-d object array holding ``bytes`` such
    as a ``TFRecordDataset`` element, or a ``str``, which is encoded as UTF-8). ``flush`` makes
    everything written so far readable, also for compressed files. Writes are buffered;
    ``close`` (or leaving the ``with`` block) finishes the file.
    """

    def __init__(
        self, path: str | os.PathLike[str], options: str | TFRecordOptions | None = None
    ) -> None:
        if not isinstance(options, TFRecordOptions):
            options = TFRecordOptions(check_compression(options, "TFRecordWriter"))
        self._path = os.fspath(path)
        self._options = options
        level = -1 if options.compression_level is None else options.compression_level
        self._file: BinaryIO | None = _open_for_writing(self._path)
        self._gzip: gzip.GzipFile | None = None
        self._zlib: Any = None
        if options.compression_type == "GZIP":
            self._gzip = gzip.GzipFile(
                filename="",
                mode="wb",
                fileobj=self._file,
                compresslevel=6 if level < 0 else level,
                mtime=0,
            )
        elif options.compression_type == "ZLIB":
            self._zlib = options._zlib_compressor()

    @property
    def path(self) -> str:
        return self._path

    def write(self, record: bytes | bytearray | memoryview | np.ndarray | str) -> None:
        """Appends one record."""
        data = _as_bytes(record)
        header = LENGTH.pack(len(data))
        frame = b"".join(
            (header, FOOTER.pack(masked_crc32c(header)), data, FOOTER.pack(masked_crc32c(data)))
        )
        self._write_raw(frame)

    def _write_raw(self, frame: bytes) -> None:
        if self._file is None:
            raise FailedPreconditionError(
                f"TFRecordWriter for {self._path!r} is closed; open a new writer to write more"
            )
        if self._gzip is not None:
            self._gzip.write(frame)
        elif self._zlib is not None:
            self._file.write(self._zlib.compress(frame))
        else:
            self._file.write(frame)

    def flush(self) -> None:
        """Writes everything buffered to the file (a sync point for compressed streams)."""
        if self._file is None:
            return
        if self._gzip is not None:
            self._gzip.flush()
        elif self._zlib is not None:
            self._file.write(self._zlib.flush(zlib.Z_SYNC_FLUSH))
        self._file.flush()

    def close(self) -> None:
        """Finishes and closes the file; idempotent."""
        if self._file is None:
            return
        try:
            if self._gzip is not None:
                self._gzip.close()
            elif self._zlib is not None:
                self._file.write(self._zlib.flush(zlib.Z_FINISH))
        finally:
            self._file.close()
            self._file = None

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            return


def _as_bytes(record: Any) -> bytes:
    if isinstance(record, bytes):
        return record
    if isinstance(record, str):
        return record.encode("utf-8")
    if isinstance(record, np.ndarray) and record.ndim == 0:
        if record.dtype == object and isinstance(record.item(), bytes):
            return bytes(record.item())
        if record.dtype.kind == "S":
            return record.tobytes()
    if isinstance(record, bytearray | memoryview | np.bytes_):
        return bytes(record)
    raise InvalidArgumentError(
        f"TFRecordWriter.write takes bytes (or str, or a 0-d object array holding bytes), "
        f"got {type(record).__name__}"
    )
