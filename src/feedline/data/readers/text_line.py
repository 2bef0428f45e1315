"""``TextLineDataset``: the lines of text files, as 0-d arrays of bytes without the newline."""

from __future__ import annotations

from itertools import accumulate
from typing import Any

from feedline.data.dataset import Dataset
from feedline.data.readers._blocks import RecordBlock
from feedline.data.readers._files import (
    open_stream,
)
from feedline.data.readers._stream import ByteStreamReaderMixin


class TextLineDataset(ByteStreamReaderMixin, Dataset):
    """The lines of one or more text files, in file order.

    Lines end at ``\\n``; the newline and every ``\\r`` are dropped (so ``\\r\\n`` files read as
    ``\\n`` files, as in tf.data). A last line without a newline is a line; the empty string
    after a final newline is not. Lines are bytes: decode them where you need text. A line is a 0-d
    object array holding its exact ``bytes`` (``.item()`` gives them); batches are 1-d object
    arrays of ``bytes``.

    Args:
      filenames: a file name, a list of them, or a Dataset of scalar file names.
      compression_type: None or "" (none), "GZIP" or "ZLIB".
      buffer_size: the size in bytes of each read (None: 1 MiB); a remote file is read ahead
        in the background, 16 x buffer_size at most (docs/object_storage.md, "Readers").
      num_parallel_reads: None or 1 reads the files one after another; n > 1 (or AUTOTUNE)
        reads n files at once on background threads, in the order of
        ``interleave(cycle_length=n, block_length=1)``.

    The iterator's state is, for each open file, its name and the byte offset of the next line.

    Example:
      >>> import os, tempfile
      >>> path = os.path.join(tempfile.mkdtemp(), "a.txt")
      >>> _ = open(path, "wb").write(b"first\\r\\nsecond\\n")
      >>> [line.item() for line in TextLineDataset(path)]
      [b'first', b'second']
    """

    def _open_file(self, filename: str, position: int, listed_version: Any = None) -> LineReader:
        return LineReader(
            filename,
            self._compression,
            position,
            self._buffer_size,
            "TextLineDataset",
            listed_version=listed_version,
        )


class LineReader:
    """The lines of one file from a byte position, a buffer at a time (CSV reads with it too).

    ``read_lines`` returns the complete lines of the next buffer with the position after each;
    ``strip_cr`` drops every ``\\r``.
    """

    def __init__(
        self,
        filename: str,
        compression: str,
        position: int,
        buffer_size: int,
        operation: str,
        strip_cr: bool = True,
        listed_version: Any = None,
    ) -> None:
        self._stream = open_stream(
            filename, compression, position, operation, buffer_size, listed_version
        )
        self.filename = filename
        self._carry = b""
        self._base = position
        self._chunk = buffer_size
        self._strip_cr = strip_cr
        self._eof = False

    def read_lines(self) -> tuple[list[bytes], list[int], int] | None:
        """``(lines, ends, start)`` for the next complete lines, or None at the end of the file."""
        while True:
            if self._eof:
                return None
            data = self._stream.read(self._chunk)
            start = self._base
            if not data:
                self._eof = True
                if not self._carry:
                    return None
                data, self._carry = self._carry, b""
                lines = [data]
            else:
                data = self._carry + data if self._carry else data
                lines = data.split(b"\n")
                self._carry = lines.pop()
                if not lines:
                    continue
            ends = list(accumulate((len(line) + 1 for line in lines), initial=start))[1:]
            if self._eof:
                ends[-1] -= 1  # the last line had no newline
            self._base = ends[-1]
            if self._strip_cr and b"\r" in data:
                lines = [line.replace(b"\r", b"") for line in lines]
            return lines, ends, start

    def read_block(self) -> RecordBlock | None:
        got = self.read_lines()
        return None if got is None else RecordBlock(*got)

    def close(self) -> None:
        self._stream.close()
