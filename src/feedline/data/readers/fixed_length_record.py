"""``FixedLengthRecordDataset``: the fixed-size records of binary files (CIFAR-10's format)."""

from __future__ import annotations

import warnings
from typing import Any

from feedline.data.dataset import Dataset
from feedline.data.readers._blocks import RecordBlock
from feedline.data.readers._files import FileNames, open_stream
from feedline.data.readers._stream import ByteStreamReaderMixin
from feedline.errors import InvalidArgumentError


def _byte_count(value: Any, name: str, lowest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
        raise InvalidArgumentError(
            f"FixedLengthRecordDataset: {name} must be an int >= {lowest}, got {value!r}"
        )
    return value


class FixedLengthRecordDataset(ByteStreamReaderMixin, Dataset):
    """The records of ``record_bytes`` bytes each in one or more files, after a header of
    ``header_bytes`` and before a footer of ``footer_bytes`` that are skipped.

    Each element is one record as a 0-d object array of ``bytes`` (``.item()`` gives them; decode
    them with ``feedline.io.decode_raw``). Where a file's body is not a whole number of records
    the partial record at its end is dropped with a warning, as TensorFlow does; a file shorter
    than its header and footer is an ``InvalidArgumentError``.

    Args:
      filenames: a file name, a list of them, or a Dataset of scalar file names.
      record_bytes: the size of each record, >= 1.
      header_bytes: bytes to skip at the start of each file (default 0).
      footer_bytes: bytes to skip at the end of each file (default 0).
      buffer_size: the size in bytes of each read (None: 1 MiB); a remote file is read ahead
        in the background, 16 x buffer_size at most (docs/object_storage.md, "Readers").
      compression_type: None or "" (none), "GZIP" or "ZLIB".
      num_parallel_reads: None or 1 reads the files one after another; n > 1 (or AUTOTUNE)
        reads n files at once, in the order of ``interleave(cycle_length=n, block_length=1)``.
      name: accepted for TensorFlow compatibility; unused.

    The iterator's state is, for each open file, its name and the byte offset of the next record.

    Example:
      >>> import os, tempfile
      >>> path = os.path.join(tempfile.mkdtemp(), "records.bin")
      >>> _ = open(path, "wb").write(b"HDRabcdefFT")
      >>> [r.item() for r in FixedLengthRecordDataset(path, 2, header_bytes=3, footer_bytes=2)]
      [b'ab', b'cd', b'ef']
    """

    def __init__(
        self,
        filenames: FileNames,
        record_bytes: int,
        header_bytes: int | None = None,
        footer_bytes: int | None = None,
        buffer_size: int | None = None,
        compression_type: str | None = None,
        num_parallel_reads: int | None = None,
        name: str | None = None,
    ) -> None:
        self._record_bytes = _byte_count(record_bytes, "record_bytes", 1)
        self._header_bytes = _byte_count(header_bytes or 0, "header_bytes", 0)
        self._footer_bytes = _byte_count(footer_bytes or 0, "footer_bytes", 0)
        super().__init__(filenames, compression_type, buffer_size, num_parallel_reads)
        self._reader_args.update(
            record_bytes=record_bytes, header_bytes=header_bytes, footer_bytes=footer_bytes
        )

    def _open_file(self, filename: str, position: int, listed_version: Any = None) -> RecordReader:
        return RecordReader(
            filename,
            self._compression,
            position,
            self._buffer_size,
            self._record_bytes,
            self._header_bytes if position == 0 else 0,
            self._footer_bytes,
            listed_version,
        )


class RecordReader:
    """The records of one file from a byte position, a buffer at a time. From the start of the
    file the header is skipped first; the last ``footer_bytes`` read are held back until the end
    of the file shows that they are the footer."""

    def __init__(
        self,
        filename: str,
        compression: str,
        position: int,
        buffer_size: int,
        record_bytes: int,
        header_bytes: int,
        footer_bytes: int,
        listed_version: Any = None,
    ) -> None:
        self._stream = open_stream(
            filename,
            compression,
            position,
            "FixedLengthRecordDataset",
            buffer_size,
            listed_version,
        )
        self._filename = filename
        self._position = position  # of the first byte of ``_pending`` in the file
        self._record = record_bytes
        self._skip = header_bytes
        self._header = header_bytes
        self._footer = footer_bytes
        self._chunk = max(buffer_size, record_bytes)
        self._pending = b""
        self._from_start = position == 0

    def read_block(self) -> RecordBlock | None:
        while True:
            data = self._stream.read(self._chunk)
            if not data:
                return self._last_block()
            self._pending += data
            if self._skip:
                dropped = min(self._skip, len(self._pending))
                self._pending = self._pending[dropped:]
                self._position += dropped
                self._skip -= dropped
            count = (len(self._pending) - self._footer) // self._record
            if not self._skip and count > 0:
                return self._take(count)

    def _last_block(self) -> RecordBlock | None:
        body = len(self._pending) - self._footer
        if self._skip or body < 0:
            if self._from_start:
                raise InvalidArgumentError(
                    f"FixedLengthRecordDataset: file {self._filename!r} is too small: "
                    f"{self._position + len(self._pending)} bytes, fewer than its header and "
                    f"footer ({self._header} + {self._footer} bytes)"
                )
            return None
        count = body // self._record
        if count:
            return self._take(count)
        if body:
            warnings.warn(
                f"FixedLengthRecordDataset: excluding the header and footer, file "
                f"{self._filename!r} ends with {body} bytes, not a whole record of "
                f"{self._record} bytes; they are dropped",
                stacklevel=2,
            )
            self._pending = self._pending[body:]
        return None

    def _take(self, count: int) -> RecordBlock:
        size = self._record
        records = [self._pending[i * size : (i + 1) * size] for i in range(count)]
        ends = [self._position + (i + 1) * size for i in range(count)]
        start = self._position
        self._pending = self._pending[count * size :]
        self._position = ends[-1]
        return RecordBlock(records, ends, start)

    def close(self) -> None:
        self._stream.close()
