"""``NpyDataset``: the rows of ``.npy`` files along their first dimension, memory-mapped (local
files) or read by ranges (remote ones, ``s3://...``)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from feedline import _fs
from feedline.data.dataset import (
    UNKNOWN_CARDINALITY,
    Dataset,
    DatasetIterator,
    IteratorContext,
)
from feedline.data.readers._files import FileNames, FileReaderMixin, first_file_name
from feedline.data.readers._iterator import FilesIterator
from feedline.data.readers._remote_npy import RemoteNpy
from feedline.errors import DataLossError, InvalidArgumentError, NotFoundError
from feedline.structure import TensorSpec

_BLOCK_ROWS = 4096
_REMOTE_BLOCK_BYTES = 1 << 20  # a remote file's rows are handed out about this many at once
MmapMode = Literal["r", "c"]
_MMAP_MODES = (None, "r", "c")


class NpyDataset(FileReaderMixin, Dataset):
    """Row ``i`` of the dataset is row ``i`` of the concatenated ``.npy`` files.

    Args:
      filenames: a file name, a list of them, or a Dataset of scalar file names; local paths
        or URLs (``s3://bucket/x.npy``, docs/object_storage.md).
      mmap_mode: "r" (default) memory-maps each local file read-only, so only the rows read
        are loaded; "c" maps copy-on-write; None loads each file whole when it is opened.
        A remote file is never loaded whole: its header is read, then its rows by ranged
        requests (read ahead in the background when the rows are read in order; a gather of
        random rows asks for each run of consecutive rows). Remote files must be C-ordered.

    Every file must hold an array of at least one dimension, and all files the same dtype and
    the same shape past the first dimension (``InvalidArgumentError`` naming both files and
    their shapes otherwise). Elements are copies, never views of the mapped files. The rows of
    an ``S`` (bytes) array become object arrays of ``bytes``, feedline's byte strings (holding
    the strings as ``S`` stores them: without trailing NUL bytes).

    Given a list of names, the files' headers are read when the dataset is made: the length is
    known and the dataset is random-access (``shuffle`` and ``batch`` gather rows by index).
    The iterator's state is the file and the row in it.

    Example:
      >>> import os, tempfile
      >>> d = tempfile.mkdtemp()
      >>> np.save(os.path.join(d, "a.npy"), np.arange(6).reshape(3, 2))
      >>> np.save(os.path.join(d, "b.npy"), np.arange(6, 10).reshape(2, 2))
      >>> ds = NpyDataset([os.path.join(d, "a.npy"), os.path.join(d, "b.npy")])
      >>> len(ds), [r.tolist() for r in ds.batch(2)][-1]
      (5, [[8, 9]])
    """

    def __init__(self, filenames: FileNames, mmap_mode: MmapMode | None = "r") -> None:
        self._init_files(filenames)
        if mmap_mode not in _MMAP_MODES:
            raise InvalidArgumentError(
                f"NpyDataset: mmap_mode must be 'r', 'c' or None (read-only access), "
                f"got {mmap_mode!r}"
            )
        self._mmap_mode = mmap_mode
        self._reader_args = {"mmap_mode": mmap_mode}
        self._spec_file = first_file_name(self, "NpyDataset", "read the dtype and shape from")
        first = load_array(self._spec_file, "r", header_only=True)
        if first.ndim == 0:
            raise InvalidArgumentError(
                f"NpyDataset: {self._spec_file!r} holds a 0-d array; its rows are along the first "
                "dimension, so it needs at least one"
            )
        self._dtype, self._row_shape = first.dtype, first.shape[1:]
        self._rows: tuple[int, ...] | None = None
        if self._filenames is not None:
            self._rows = tuple(
                self.check_array(load_array(name, "r", header_only=True), name).shape[0]
                for name in self._filenames
            )
        self._element_spec = TensorSpec(self._row_shape, self._dtype)

    def check_array(self, array: _Array, filename: str) -> _Array:
        """``array`` if it has the dtype and row shape of the first file, else an error."""
        if array.ndim == 0 or array.dtype != self._dtype or array.shape[1:] != self._row_shape:
            raise InvalidArgumentError(
                f"NpyDataset: {filename!r} holds an array of dtype {array.dtype} and shape "
                f"{array.shape}, but {self._spec_file!r} holds dtype {self._dtype} and shape "
                f"(n, {', '.join(map(str, self._row_shape))}); all files need the same dtype and "
                "the same shape past the first dimension"
            )
        return array

    def _cardinality(self) -> int:
        return UNKNOWN_CARDINALITY if self._rows is None else sum(self._rows)

    def _random_access(self) -> _NpyAccess | None:
        if self._rows is None or self._filenames is None:  # rows are counted only from names
            return None
        return _NpyAccess(self, self._filenames, self._rows)

    def _make_iterator(self, ctx: IteratorContext) -> DatasetIterator:
        return FilesIterator(self, ctx)

    def _open_file(self, filename: str, position: int, listed_version: Any = None) -> _NpyReader:
        array = self.check_array(
            load_array(filename, self._mmap_mode, stream=True, listed_version=listed_version),
            filename,
        )
        if position > len(array):
            if isinstance(array, RemoteNpy):
                array.close()
            raise DataLossError(
                f"NpyDataset: {filename!r} has {len(array)} rows, fewer than the saved position "
                f"{position}; the file changed since the state was saved",
                filename=filename,
                offset=position,
            )
        return _NpyReader(array, position)


_Array = np.ndarray | RemoteNpy


def load_array(
    filename: str,
    mmap_mode: MmapMode | None,
    stream: bool = False,
    header_only: bool = False,
    listed_version: Any = None,
) -> _Array:
    """The array in a ``.npy`` file: memory-mapped unless ``mmap_mode`` is None, or, for a
    remote file, a ``RemoteNpy`` that reads rows by ranges (read ahead if ``stream``; only its
    header is read and it is closed already if ``header_only``), of ``listed_version``."""
    if not _fs.is_local(filename):
        remote = RemoteNpy(filename, stream=stream, listed_version=listed_version)
        if header_only:
            remote.close()
        return remote
    if filename.startswith("file://"):
        filename = _fs.filesystem(filename)[1]
    try:
        return np.load(filename, mmap_mode=mmap_mode, allow_pickle=False)
    except FileNotFoundError:
        raise NotFoundError(
            f"NpyDataset: file {filename!r} does not exist; check the path", name=filename
        ) from None
    except ValueError as error:
        raise InvalidArgumentError(
            f"NpyDataset: {filename!r} is not a .npy file of a numeric, bool or string array: "
            f"{error}"
        ) from error


class _RowsBlock:
    """Rows of a file from row ``start`` (``rows``: a view of the mapped file, or read)."""

    __slots__ = ("_rows", "start")

    def __init__(self, rows: np.ndarray, start: int) -> None:
        self._rows = rows
        self.start = start

    def __len__(self) -> int:
        return len(self._rows)

    def end(self, i: int) -> int:
        return self.start + i + 1

    def element(self, i: int) -> np.ndarray:
        return _rows(self._rows[i])

    def batch(self, lo: int, hi: int) -> np.ndarray:
        return _rows(self._rows[lo:hi])


def _rows(rows: np.ndarray | np.generic) -> np.ndarray:
    """A copy of ``rows`` of a file; ``S`` strings as an object array of ``bytes``."""
    array = np.asarray(rows)
    return array.astype(object) if array.dtype.kind == "S" else np.array(array)


class _NpyReader:
    def __init__(self, array: _Array, position: int) -> None:
        self._array: _Array | None = array
        self._row = position
        self._step = _BLOCK_ROWS
        if isinstance(array, RemoteNpy):
            self._step = max(1, _REMOTE_BLOCK_BYTES // max(1, array.row_bytes))

    def read_block(self) -> _RowsBlock | None:
        array = self._array
        if array is None or self._row >= len(array):
            return None
        stop = min(len(array), self._row + self._step)
        if isinstance(array, RemoteNpy):
            block = _RowsBlock(array.read(self._row, stop), self._row)
        else:
            block = _RowsBlock(array[self._row : stop], self._row)
        self._row = stop
        return block

    def close(self) -> None:
        array, self._array = self._array, None
        if isinstance(array, RemoteNpy):
            array.close()


class _NpyAccess:
    """Rows of all files by global index; files are mapped when first touched."""

    def __init__(self, dataset: NpyDataset, names: tuple[str, ...], rows: tuple[int, ...]) -> None:
        self._dataset = dataset
        self._names = names
        self._offsets = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
        self._arrays: list[_Array | None] = [None] * len(self._names)

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def _array(self, f: int) -> _Array:
        array = self._arrays[f]
        if array is None:
            name = self._names[f]
            array = self._dataset.check_array(load_array(name, self._dataset._mmap_mode), name)
            self._arrays[f] = array
        return array

    def get(self, index: int) -> np.ndarray:
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} is outside [0, {len(self)})")
        f = int(np.searchsorted(self._offsets, index, side="right")) - 1
        array, row = self._array(f), index - int(self._offsets[f])
        if isinstance(array, RemoteNpy):
            return _rows(array.read(row, row + 1)[0])
        return _rows(array[row])

    def gather(self, indices: np.ndarray | slice) -> np.ndarray:
        if isinstance(indices, slice):
            indices = np.arange(len(self))[indices]
        indices = np.asarray(indices, dtype=np.int64)
        files = np.searchsorted(self._offsets, indices, side="right") - 1
        local = indices - self._offsets[files]
        if len(files) and (files == files[0]).all():
            return _taken(self._take(int(files[0]), local))
        out = np.empty((len(indices), *self._dataset._row_shape), self._dataset._dtype)
        for f in np.unique(files).tolist():
            mask = files == f
            out[mask] = self._take(f, local[mask])
        return _taken(out)

    def _take(self, f: int, rows: np.ndarray) -> np.ndarray:
        array = self._array(f)
        if isinstance(array, RemoteNpy):
            return array.take(rows)
        return np.take(array, rows, axis=0)


def _taken(rows: np.ndarray) -> np.ndarray:
    """Rows gathered (a new array already); ``S`` strings as an object array of ``bytes``."""
    return rows.astype(object) if rows.dtype.kind == "S" else rows
