"""A ``.npy`` file on a remote file system (``s3://...``): its header, then rows by ranged reads.

A local ``.npy`` file is memory-mapped; a remote one cannot be, so ``RemoteNpy`` reads the
header (one request for the first 4 KiB, which holds it unless it is unusually long), and then
the rows asked for: a run of consecutive rows is one ranged request. Opened as a ``stream``,
the object is read ahead in the background from the header on (``_fs.RemoteReader``), for a
reader that goes through the rows in order.
"""

from __future__ import annotations

import io
import math
import threading
from typing import Any

import numpy as np

from feedline import _fs
from feedline.data.readers._files import DEFAULT_BUFFER_SIZE, READ_AHEAD_BUFFERS, REMOTE_BLOCK
from feedline.errors import DataLossError, InvalidArgumentError

_HEAD = 4096  # bytes read first: the magic string and, almost always, the whole header


class RemoteNpy:
    """The array of a remote ``.npy`` file, read by rows: ``shape``, ``dtype``, ``ndim``,
    ``len()``, ``read(lo, hi)`` (rows ``lo`` to ``hi - 1``) and ``take(indices)``. Safe to
    use from several threads (one request at a time).

    Raises:
      NotFoundError: the object does not exist (naming the URL).
      InvalidArgumentError: it is not a ``.npy`` file of a C-ordered numeric, bool or string
        array.
      DataLossError: the object is shorter than its header says.
    """

    def __init__(self, url: str, stream: bool = False, listed_version: Any = None) -> None:
        self.url = url
        window = READ_AHEAD_BUFFERS * DEFAULT_BUFFER_SIZE if stream else 0
        self._reader = _fs.RemoteReader(
            url,
            0,
            "NpyDataset",
            block_size=min(REMOTE_BLOCK, max(_HEAD, window // 2)),
            read_ahead=window,
            listed_version=listed_version,
        )
        self._lock = threading.Lock()
        try:
            self._read_header()
        except BaseException:
            self._reader.close()
            raise

    def _read_header(self) -> None:
        head = self._reader.read(min(_HEAD, self._reader.size))
        if len(head) < 10 or head[:6] != b"\x93NUMPY":
            raise self._invalid("it does not start with the .npy magic string")
        wide = head[6] >= 2  # versions 2 and 3 give the header's length in 4 bytes, 1 in 2
        size_bytes = 4 if wide else 2
        length = int.from_bytes(head[8 : 8 + size_bytes], "little")
        need = 8 + size_bytes + length
        if len(head) < need:
            head += self._reader.read(need - len(head))
        file = io.BytesIO(head)
        try:
            version = np.lib.format.read_magic(file)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(file)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(file)
        except ValueError as error:
            raise self._invalid(str(error)) from error
        if dtype.hasobject:
            raise self._invalid("it holds Python objects, which are read only with pickle")
        if fortran and len(shape) > 1:
            raise InvalidArgumentError(
                f"NpyDataset: {self.url!r} holds a Fortran-ordered array, whose rows are not "
                "contiguous; a remote file is read by rows: save it C-ordered "
                "(np.save(f, np.ascontiguousarray(array)))"
            )
        self.shape: tuple[int, ...] = tuple(shape)
        self.dtype: np.dtype = dtype
        self.ndim = len(self.shape)
        self.offset = file.tell()  # of the first row
        self.row_bytes = dtype.itemsize * math.prod(self.shape[1:])
        expected = self.offset + dtype.itemsize * math.prod(self.shape)
        if self._reader.size < expected:
            raise DataLossError(
                f"NpyDataset: {self.url!r} holds {self._reader.size} bytes, but its header "
                f"describes an array of shape {self.shape} and dtype {dtype} ({expected} bytes "
                "with the header): the file is truncated",
                filename=self.url,
                offset=self._reader.size,
            )

    def _invalid(self, why: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"NpyDataset: {self.url!r} is not a .npy file of a numeric, bool or string array: {why}"
        )

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0

    def read(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo`` to ``hi - 1``, as an array of their own (one ranged request)."""
        count = max(0, hi - lo)
        with self._lock:
            self._reader.seek(self.offset + lo * self.row_bytes)
            data = self._reader.read(count * self.row_bytes)
        if len(data) != count * self.row_bytes:
            raise DataLossError(
                f"NpyDataset: {self.url!r} ended inside row {lo + len(data) // self.row_bytes}",
                filename=self.url,
                offset=self.offset + lo * self.row_bytes + len(data),
            )
        return np.frombuffer(data, self.dtype).reshape((count, *self.shape[1:]))

    def take(self, indices: np.ndarray) -> np.ndarray:
        """The rows at ``indices``, in their order: each run of consecutive rows one request."""
        indices = np.asarray(indices, dtype=np.int64)
        unique = np.unique(indices)
        if not len(unique):
            return np.empty((0, *self.shape[1:]), self.dtype)
        breaks = np.flatnonzero(np.diff(unique) != 1) + 1
        runs = np.split(unique, breaks)
        rows = np.concatenate([self.read(int(run[0]), int(run[-1]) + 1) for run in runs])
        return rows[np.searchsorted(unique, indices)]

    def close(self) -> None:
        self._reader.close()
