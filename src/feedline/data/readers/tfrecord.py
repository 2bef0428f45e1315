"""``TFRecordDataset``: the records of TFRecord files, CRC-checked, as 0-d arrays of bytes."""

from __future__ import annotations

from typing import Any

import google_crc32c

from feedline._tfrecord import FOOTER, HEADER, MASK_DELTA, masked_crc32c
from feedline.data.dataset import Dataset
from feedline.data.readers._blocks import RecordBlock
from feedline.data.readers._files import (
    open_stream,
)
from feedline.data.readers._stream import ByteStreamReaderMixin
from feedline.errors import DataLossError

_FRAME = HEADER.size + FOOTER.size
_TRUNCATED = "truncated record: the file ends inside it"
_BAD_LENGTH = "corrupted record: the length's CRC differs"
_BAD_DATA = "corrupted record: the data's CRC differs"


class TFRecordDataset(ByteStreamReaderMixin, Dataset):
    """The records of one or more TFRecord files, in file order.

    Args:
      filenames: a file name, a list of them, or a Dataset of scalar file names (as
        ``Dataset.list_files`` gives), so that ``TFRecordDataset(Dataset.list_files(pattern))``
        and ``Dataset.list_files(pattern).interleave(TFRecordDataset, cycle_length=4)`` both work.
      compression_type: None or "" (none), "GZIP" or "ZLIB".
      buffer_size: the size in bytes of each read (None: 1 MiB); a remote file is read ahead
        in the background, 16 x buffer_size at most (docs/object_storage.md, "Readers").
      num_parallel_reads: None or 1 reads the files one after another; n > 1 (or AUTOTUNE)
        reads n files at once on background threads and hands out their records in the order of
        ``interleave(cycle_length=n, block_length=1)``, the same on every run.

    Every record's length and data are checked against their CRC-32C. A mismatch or a file that
    ends inside a record raises ``DataLossError`` whose ``filename`` and ``offset`` (the byte
    offset of the record, in the decompressed stream for compressed files) say where; the next
    call goes on with the next file. A missing file raises ``NotFoundError`` when it is reached.

    A record is a 0-d object array holding the record's exact ``bytes`` (as TensorFlow's
    ``.numpy()`` gives a string tensor): ``.item()`` gives them, trailing NUL bytes included, and an
    empty record is ``b""``. Batches (``.batch(n)``) are 1-d object arrays of ``bytes``, which
    ``feedline.io.parse_example`` takes.

    The iterator's state is, for each open file, its name and the byte offset of the next record;
    restoring seeks there (a compressed file is decompressed up to it).

    Example:
      >>> import os, tempfile
      >>> from feedline.io import TFRecordWriter
      >>> path = os.path.join(tempfile.mkdtemp(), "a.tfrecord")
      >>> with TFRecordWriter(path) as w:
      ...     for r in (b"x", b"yz"):
      ...         w.write(r)
      >>> [r.item() for r in TFRecordDataset(path)]
      [b'x', b'yz']
    """

    def _open_file(self, filename: str, position: int, listed_version: Any = None) -> _RecordReader:
        return _RecordReader(
            filename, self._compression, position, self._buffer_size, listed_version
        )


class _RecordReader:
    """Parses the records of one file from a position, one read of ``buffer_size`` at a time.

    Each block holds the complete records of one read. A record that runs past the end of the
    read is completed with reads of exactly the missing bytes, so that buffers are never joined.
    """

    def __init__(
        self,
        filename: str,
        compression: str,
        position: int,
        buffer_size: int,
        listed_version: Any = None,
    ) -> None:
        self._stream = open_stream(
            filename, compression, position, "TFRecordDataset", buffer_size, listed_version
        )
        self._filename = filename
        self._buffer = b""
        self._pos = 0
        self._base = position  # the file position of self._buffer[0]
        self._chunk = buffer_size
        self._headers: dict[int, int] = {}  # lengths whose header CRC was checked -> that CRC
        self._error: DataLossError | None = None
        self._done = False

    def read_block(self) -> RecordBlock | None:
        if self._error is not None:
            error, self._error = self._error, None
            self._done = True  # a damaged file ends at the damage
            raise error
        if self._done:
            return None
        if self._pos >= len(self._buffer):
            self._base += len(self._buffer)
            self._buffer, self._pos = self._stream.read(self._chunk), 0
            if not self._buffer:
                return None
        start = self._base + self._pos
        records: list[bytes] = []
        ends: list[int] = []
        self._parse(records, ends)
        if self._error is None and self._pos < len(self._buffer):
            self._complete_straddler(records, ends)
        if not records:
            return self.read_block()
        return RecordBlock(records, ends, start)

    def _parse(self, records: list[bytes], ends: list[int]) -> None:
        """Appends the complete records of the buffer; stops before a damaged one (in _error)."""
        buf, pos, base = self._buffer, self._pos, self._base
        size = len(buf)
        known = self._headers
        unpack_header = HEADER.unpack_from
        unpack_footer = FOOTER.unpack_from
        crc = google_crc32c.value
        append, append_end = records.append, ends.append
        while size - pos >= _FRAME:
            length, length_crc = unpack_header(buf, pos)
            if known.get(length) != length_crc:
                c = crc(buf[pos : pos + 8])
                if (((c >> 15) | (c << 17)) + MASK_DELTA) & 0xFFFFFFFF != length_crc:
                    self._error = self._loss(base + pos, _BAD_LENGTH)
                    break
                known[length] = length_crc
            end = pos + _FRAME + length
            if end > size:
                break
            data = buf[pos + 12 : end - 4]
            c = crc(data)
            expected = unpack_footer(buf, end - 4)[0]
            if (((c >> 15) | (c << 17)) + MASK_DELTA) & 0xFFFFFFFF != expected:
                self._error = self._loss(base + pos, _BAD_DATA)
                break
            append(data)
            pos = end
            append_end(base + pos)
        self._pos = pos

    def _complete_straddler(self, records: list[bytes], ends: list[int]) -> None:
        """Reads the rest of the record that begins at the end of the buffer and parses it."""
        record = self._buffer[self._pos :]
        self._base += self._pos
        if len(record) < HEADER.size:
            record += self._read_exactly(HEADER.size - len(record))
        if len(record) >= HEADER.size:
            length, length_crc = HEADER.unpack_from(record, 0)
            if masked_crc32c(record[:8]) != length_crc:
                self._error = self._loss(self._base, _BAD_LENGTH)
                return
            missing = _FRAME + length - len(record)
            if missing > 0:
                record += self._read_exactly(missing)
        self._buffer, self._pos = record, 0
        if len(record) < _FRAME or len(record) < _FRAME + HEADER.unpack_from(record, 0)[0]:
            self._error = self._loss(self._base, _TRUNCATED)
            return
        self._parse(records, ends)

    def _read_exactly(self, n: int) -> bytes:
        """``n`` bytes, fewer only at the end of the file."""
        parts = []
        while n > 0:
            part = self._stream.read(n)
            if not part:
                break
            parts.append(part)
            n -= len(part)
        return b"".join(parts)

    def _loss(self, offset: int, what: str) -> DataLossError:
        return DataLossError(
            f"TFRecordDataset: {what} at byte offset {offset} of {self._filename!r}; the file is "
            "damaged (skip it, or use ignore_errors() to go on with the next file)",
            filename=self._filename,
            offset=offset,
        )

    def close(self) -> None:
        self._stream.close()
