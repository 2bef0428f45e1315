"""The files of ``Dataset.cache(filename)``: NumPy ``.npy`` records, a JSON index and a lock.

``{filename}.data`` holds chunks of consecutive elements whose leaves have the same shapes and
dtypes (at most 256 elements or about 1 MiB): per leaf, the rows stacked as one ``.npy`` record
(no pickle), or, for byte strings (object arrays of ``bytes``), two: the int64 lengths of the
strings (the rows' shape) and their bytes concatenated in order (uint8), which read back exactly;
``{filename}.index`` (JSON: format, element count, spec, the seed of the pass that wrote them)
is written last, so that its presence
means a complete cache; ``{filename}.lock`` (holding the writer's pid) keeps a second writer out.
Writers write ``{filename}.data.tmp`` and rename it when the pass completes.

The index also lists where each chunk starts (its first element and its byte offset) and the data's
size: a complete local cache is then random-access (``FileRows``, the data memory-mapped and each
chunk's records found from that table), as a filled in-memory cache is, so ``shuffle``, ``batch``,
``shard`` and ``GlobalBatches`` read it by index in any process. A cache whose index lacks the
table (written by an earlier version) is read in order only.

``filename`` may be a URL of the file-system layer (``s3://bucket/cache/train``): the data is
then one upload to ``{filename}.data``, which the store shows only once the writer closes it,
and the index one upload after it (no rename, which object stores lack); a pass that stops
early discards its upload. The lock is an object written after checking that none exists, so
on a store it keeps out a writer that starts later, not one that starts in the same instant.
Readers read the data in ranged requests, ahead of the reader in the background.
"""

from __future__ import annotations

import bisect
import json
import mmap
import os
import sys
import threading
import uuid
from typing import Any, BinaryIO

import numpy as np

from feedline import _fs, structure
from feedline.data.dataset import Dataset, RowCursor
from feedline.data.ops import _snapshot_fs
from feedline.data.readers._files import open_remote
from feedline.errors import DataLossError, FailedPreconditionError, InvalidArgumentError

_FORMAT = "feedline-cache-2"
# A chunk holds at most this many elements, and stops growing past this many bytes.
_CHUNK_ROWS = 256
_CHUNK_BYTES = 1 << 20
# Reads by index: rows of at most this many chunks are taken chunk by chunk; spread over more,
# rows of at most this many bytes are gathered from the mapping's bytes in one indexing.
_FEW_CHUNKS = 4
_SMALL_ROW = 512


class FileStore:
    """The cache files of the elements of ``dataset``."""

    def __init__(self, filename: str, dataset: Dataset) -> None:
        self._dataset = dataset
        if filename.startswith("file://"):
            filename = _fs.filesystem(filename)[1]
        self.remote = not _fs.is_local(filename)
        self._data = filename + ".data"
        self._index = filename + ".index"
        self._lock = filename + ".lock"
        self.pending_seed: int | None = None  # see _MemoryStore.remember_seed
        self._rows: tuple[Any, FileRows] | None = None  # the files' identity, their rows

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "pending_seed": None, "_rows": None}  # run state does not travel

    @property
    def _spec(self) -> Any:
        return self._dataset.element_spec

    def complete(self) -> bool:
        return _snapshot_fs.exists(self._index)

    def remember_seed(self, seed: int) -> None:
        if self.pending_seed is None and not self.complete():
            self.pending_seed = seed

    def random_access(self) -> FileRows | None:
        """The rows of a complete local cache by index (``FileRows``), else None: a cache
        still to fill, one on a store (each row would be a request), or one written without a
        chunk table. Kept while the files are the same ones."""
        if self.remote:
            return None
        try:
            index = _snapshot_fs.read_bytes(self._index)
            stat = os.stat(self._data)
        except FileNotFoundError:
            return None
        key = (index, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        rows = self._rows
        if rows is None or rows[0] != key:
            meta = self.read_index(index)
            if "chunks" not in meta:
                return None
            rows = self._rows = (key, FileRows(self._data, meta, self._spec))
        return rows[1]

    def read_index(self, index: bytes | None = None) -> dict[str, Any]:
        """The index (its bytes, else read): element count, the seed of the pass that wrote the
        files and, where written, the chunk table."""
        if index is None:
            index = _snapshot_fs.read_bytes(self._index)
        meta = json.loads(index.decode("utf-8"))
        if meta.get("format") != _FORMAT:
            raise InvalidArgumentError(
                f"cache: {self._index} is in format {meta.get('format')!r}, but this version of "
                f"feedline reads {_FORMAT!r}; delete the cache files to rebuild them"
            )
        if meta.get("spec") != repr(self._spec):
            raise InvalidArgumentError(
                f"cache: {self._index} holds elements of spec {meta.get('spec')}, but this "
                f"dataset's elements are {self._spec}; delete the cache files or give another "
                "filename"
            )
        return meta

    def open_reader(self, position: int, offset: int, row: int) -> _FileReader | _RowsReader:
        """A reader from element ``position`` (at byte ``offset``, ``row`` into its chunk, as a
        reader's state says): by index where the files allow it, else in order."""
        rows = self.random_access()
        if rows is not None:
            return _RowsReader(rows, position)
        return _FileReader(self, position, offset, row)

    def open_writer(self, seed: int) -> _FileWriter | None:
        """A writer holding the lock, for the pass of ``seed``; None if another writer
        completed the cache meanwhile."""
        structure.check_dense(
            self._spec,
            f"cache({self._data.removesuffix('.data')!r}), a file cache,",
            "cache() in memory keeps them, or map them to dense arrays (r.to_tensor(), "
            "s.to_dense(), or their component arrays) before the cache",
        )
        if self.remote:
            self._lock_remote()
        else:
            os.makedirs(os.path.dirname(self._lock) or ".", exist_ok=True)
            try:
                fd = os.open(self._lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                raise self._locked() from None
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
        if self.complete():
            _snapshot_fs.remove(self._lock)
            return None
        return _FileWriter(self, seed)

    def _lock_remote(self) -> None:
        """Writes the lock object where none exists, and reads it back: a writer that raced
        this one and wrote last keeps the lock."""
        if _snapshot_fs.exists(self._lock):
            raise self._locked()
        token = f"{os.getpid()} {uuid.uuid4().hex}".encode()
        _snapshot_fs.write_atomic(self._lock, token)
        if _snapshot_fs.read_bytes(self._lock) != token:
            raise self._locked()

    def _locked(self) -> FailedPreconditionError:
        return FailedPreconditionError(
            f"cache: another iterator is writing this cache: the lock file {self._lock} "
            "exists. Read the dataset from one iterator at a time until its first pass "
            "completes, use another filename, or delete the lock file if no process is "
            "writing (one may have crashed)"
        )


class _FileReader:
    """Reads chunk after chunk; its place is the offset of the current chunk and a row in it."""

    def __init__(self, store: FileStore, position: int, offset: int, row: int) -> None:
        self._store = store
        meta = store.read_index()
        self._length = int(meta["elements"])
        self.seed = int(meta["seed"])
        leaves, self._treespec = structure.flatten(store._spec)
        self._num_leaves = len(leaves)
        self._bytes_leaves = [spec.dtype == structure.BYTES for spec in leaves]
        self._single = self._treespec.num_nodes == 1
        self._file: Any
        if store.remote:
            self._file = open_remote(store._data, offset, "cache")
        else:
            self._file = open(store._data, "rb")  # noqa: SIM115 - closed by close()
            self._file.seek(offset)
        self.offset = offset
        self.position = position
        self._columns: list[np.ndarray] = []
        self._rows = 0
        self.row = 0
        self.batched = False
        if row:
            self._load()
            self.row = row

    def _load(self) -> None:
        f = self._file
        start = f.tell()
        try:
            columns = [
                read_bytes_column(f)
                if is_bytes
                else np.lib.format.read_array(f, allow_pickle=False)
                for is_bytes in self._bytes_leaves
            ]
            rows = len(columns[0])
        except (ValueError, OSError, EOFError, IndexError, TypeError) as error:
            raise DataLossError(
                f"cache: {self._store._data} is damaged at byte {start} (element "
                f"{self.position}): {error}; delete the cache files to rebuild them",
                filename=self._store._data,
                offset=start,
            ) from error
        # A 0-d string row is taken as a 0-d array: a NumPy string scalar drops trailing NULs,
        # and an object array's row would be a bare ``bytes``.
        self._take = [c.dtype.kind in "SUO" and c.ndim == 1 for c in columns]
        self._columns, self._rows, self.offset, self.row = columns, rows, start, 0

    def next(self) -> Any:
        if self.position >= self._length:
            raise StopIteration
        if self.row >= self._rows:
            self._load()
        i = self.row
        leaves = [c[i, ...] if t else c[i] for c, t in zip(self._columns, self._take, strict=True)]
        self.row = i + 1
        self.position += 1
        return leaves[0] if self._single else structure.unflatten(self._treespec, leaves)

    def close(self) -> None:
        self._file.close()


class _RowsReader(RowCursor):
    """Reads a random-access cache in order, a batch's rows in one gather; its place in the
    reader's terms too (the offset of the chunk of its position, the row in that chunk)."""

    batched = True

    def __init__(self, rows: FileRows, position: int) -> None:
        super().__init__(rows, position)
        self.rows = rows
        self.seed = rows.seed

    @property
    def offset(self) -> int:
        return self.rows.chunk_place(self.position)[0]

    @property
    def row(self) -> int:
        return self.rows.chunk_place(self.position)[1]

    def close(self) -> None:
        return None


class _FileWriter:
    """Writes consecutive elements whose leaves have the same shapes and dtypes as one chunk:
    per leaf, one ``.npy`` record of the rows stacked."""

    def __init__(self, store: FileStore, seed: int) -> None:
        self._store = store
        self._seed = seed
        self._file: Any
        if store.remote:  # one upload, completed (so shown) at commit
            self._temp = store._data
            fs, inner = _fs.filesystem(self._temp)
            with _fs.translate_errors(self._temp, "cache"):
                self._file = fs.open(inner, "wb")
        else:
            self._temp = store._data + ".tmp"
            self._file = open(self._temp, "wb")  # noqa: SIM115 - closed by commit/abort
        self._count = 0
        self._rows: list[list[np.ndarray]] = []
        self._kind: list[tuple[tuple[int, ...], np.dtype]] = []
        self._bytes = 0
        self._chunks: list[tuple[int, int]] = []  # (first element, byte offset) of each chunk

    def add(self, element: Any) -> None:
        leaves = [np.asarray(a) for a in structure.flatten(element)[0]]
        kind = [(a.shape, a.dtype) for a in leaves]
        if self._rows and (
            kind != self._kind or len(self._rows) >= _CHUNK_ROWS or self._bytes >= _CHUNK_BYTES
        ):
            self._flush()
        self._kind = kind
        self._rows.append(leaves)
        self._bytes += sum(_nbytes(a) for a in leaves)
        self._count += 1

    def _flush(self) -> None:
        self._chunks.append((self._count - len(self._rows), self._file.tell()))
        for column in zip(*self._rows, strict=True):
            stacked = np.stack(column)
            if stacked.dtype == structure.BYTES:
                write_bytes_column(self._file, stacked)
            else:
                np.lib.format.write_array(self._file, stacked, allow_pickle=False)
        self._rows, self._bytes = [], 0

    def commit(self) -> None:
        store = self._store
        if self._rows:
            self._flush()
        size = self._file.tell()
        with _fs.translate_errors(self._temp, "cache"):
            self._file.close()
        if not store.remote:
            os.replace(self._temp, store._data)
        meta = {
            "format": _FORMAT,
            "elements": self._count,
            "seed": self._seed,
            "spec": repr(store._spec),
            "chunks": self._chunks,
            "bytes": size,
        }
        _snapshot_fs.write_atomic(store._index, json.dumps(meta).encode("utf-8"))
        _snapshot_fs.remove(store._lock)

    def abort(self) -> None:
        if _is_store_upload(self._file):  # a store's upload (s3fs, gcsfs, ...)
            with _fs.translate_errors(self._temp, "cache"):
                self._file.discard()  # an unfinished multipart upload is aborted, never shown
            self._file.closed = True  # closing would upload what is buffered
        else:
            self._file.close()
        for path in (self._temp, self._store._lock):
            _snapshot_fs.remove(path)


def _is_store_upload(file: object) -> bool:
    """Whether ``file`` is an upload to an object store through fsspec (s3fs, gcsfs, ...: an
    ``AbstractBufferedFile``); one can be only once fsspec is loaded, so this loads nothing."""
    spec = sys.modules.get("fsspec.spec")
    return spec is not None and isinstance(file, spec.AbstractBufferedFile)


def _nbytes(leaf: np.ndarray) -> int:
    """The memory a leaf holds, the strings of a byte-string leaf included."""
    if leaf.dtype == structure.BYTES:
        return leaf.nbytes + sum(len(item) for item in leaf.ravel().tolist())
    return leaf.nbytes


def write_bytes_column(file: BinaryIO, column: np.ndarray) -> None:
    """A byte-string column as two ``.npy`` records: its lengths and its concatenated bytes."""
    items = column.ravel().tolist()
    lengths = np.fromiter(map(len, items), np.int64, count=len(items)).reshape(column.shape)
    np.lib.format.write_array(file, lengths, allow_pickle=False)
    data = np.frombuffer(b"".join(items), np.uint8)
    np.lib.format.write_array(file, data, allow_pickle=False)


def read_bytes_column(file: BinaryIO) -> np.ndarray:
    """A byte-string column ``write_bytes_column`` wrote: an object array of exact ``bytes``."""
    lengths = np.lib.format.read_array(file, allow_pickle=False)
    data = np.lib.format.read_array(file, allow_pickle=False)
    column = _BytesColumn(lengths, data)
    return column.rows(np.arange(len(column)))


# -- by index -------------------------------------------------------------------------------


class FileRows:
    """The rows of a complete local cache by index (``RandomAccess``): the data file
    memory-mapped once, each chunk's ``.npy`` records found at first use from the index's chunk
    table, rows returned as read-only views of the mapping (a row of a byte-string leaf as
    its ``bytes``), the same values the reader in order gives. The mapping stays valid while
    the files are replaced: writers never write in place."""

    def __init__(self, path: str, meta: dict[str, Any], spec: Any) -> None:
        self.path = path
        self.seed = int(meta["seed"])
        self._length = int(meta["elements"])
        self._starts = [int(first) for first, _ in meta["chunks"]]
        self._offsets = [int(offset) for _, offset in meta["chunks"]]
        size = int(meta["bytes"])
        leaves, self._treespec = structure.flatten(spec)
        self._bytes_leaves = [leaf.dtype == structure.BYTES for leaf in leaves]
        self._single = self._treespec.num_nodes == 1
        self._chunks: dict[int, list[Any]] = {}
        # Per leaf, per chunk once parsed: the kind of its rows (a code for shape and dtype, -1
        # before), and where a numeric column starts in the mapping.
        chunks = len(self._starts)
        self._kind = [np.full(chunks, -1, np.int64) for _ in self._bytes_leaves]
        self._address = [np.zeros(chunks, np.int64) for _ in self._bytes_leaves]
        self._kinds: dict[tuple[tuple[int, ...], np.dtype], int] = {}
        self._lock = threading.Lock()
        self._map: mmap.mmap | None = None
        with open(path, "rb") as f:
            actual = os.fstat(f.fileno()).st_size
            if actual != size:
                raise DataLossError(
                    f"cache: {path} is damaged: it holds {actual} bytes, but its index says "
                    f"{size}; delete the cache files to rebuild them",
                    filename=path,
                )
            if size:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        # The mapping's bytes, where a numeric chunk's rows are found by address.
        self._flat = None if self._map is None else np.frombuffer(self._map, np.uint8)
        self._base = 0 if self._flat is None else self._flat.ctypes.data

    def __len__(self) -> int:
        return self._length

    def _chunk(self, c: int) -> list[Any]:
        """The columns of chunk ``c``: an array per numeric leaf, ``_BytesColumn`` per
        byte-string leaf."""
        columns = self._chunks.get(c)
        if columns is None:
            with self._lock:
                columns = self._chunks.get(c)
                if columns is None:
                    columns = self._parse(c)
                    for k, column in enumerate(columns):
                        kind = (column.shape[1:], column.dtype)
                        self._kind[k][c] = self._kinds.setdefault(kind, len(self._kinds))
                        if type(column) is np.ndarray and column.size:
                            self._address[k][c] = column.ctypes.data - self._base
                    self._chunks[c] = columns
        return columns

    def _parse(self, c: int) -> list[Any]:
        offset = self._offsets[c]
        end = self._starts[c + 1] if c + 1 < len(self._starts) else self._length
        rows = end - self._starts[c]
        try:
            columns: list[Any] = []
            for is_bytes in self._bytes_leaves:
                first, offset = self._record(offset)
                if is_bytes:
                    data, offset = self._record(offset)
                    columns.append(_BytesColumn(first, data))
                else:
                    columns.append(first)
            if any(len(column) != rows for column in columns):
                raise ValueError(f"a column does not hold the chunk's {rows} rows")
        except (ValueError, OSError, EOFError, IndexError, TypeError) as error:
            raise DataLossError(
                f"cache: {self.path} is damaged at byte {self._offsets[c]} (element "
                f"{self._starts[c]}): {error}; delete the cache files to rebuild them",
                filename=self.path,
                offset=self._offsets[c],
            ) from error
        return columns

    def _record(self, offset: int) -> tuple[np.ndarray, int]:
        """The ``.npy`` record at ``offset`` as a read-only view, and the offset after it."""
        mapped = self._map
        if mapped is None:
            raise EOFError("the data file is empty")
        mapped.seek(offset)
        version = np.lib.format.read_magic(mapped)
        if version == (1, 0):
            header = np.lib.format.read_array_header_1_0(mapped)
        else:
            header = np.lib.format.read_array_header_2_0(mapped)
        shape, fortran, dtype = header
        if dtype.hasobject:
            raise ValueError("a record holds Python objects")
        start = mapped.tell()
        count = int(np.prod(shape, dtype=np.int64))
        end = start + count * dtype.itemsize
        if end > len(mapped):
            raise EOFError(f"a record of {end - start} bytes runs past the end of the file")
        array = np.frombuffer(mapped, dtype, count, start) if count else np.empty(0, dtype)
        return array.reshape(shape, order="F" if fortran else "C"), end

    def chunk_place(self, position: int) -> tuple[int, int]:
        """The byte offset of the chunk holding element ``position`` and its row there (for
        the end, the last chunk and its length)."""
        if not self._starts:
            return 0, 0
        c = max(bisect.bisect_right(self._starts, position) - 1, 0)
        return self._offsets[c], position - self._starts[c]

    def _place(self, index: int) -> tuple[list[Any], int]:
        if not 0 <= index < self._length:
            raise IndexError(f"row {index} of a cache of {self._length} elements")
        c = bisect.bisect_right(self._starts, index) - 1
        return self._chunk(c), index - self._starts[c]

    def get(self, index: int) -> Any:
        columns, i = self._place(int(index))
        leaves = [structure.row(column, i) if type(column) is np.ndarray else column.row(i)
                  for column in columns]  # fmt: skip
        return leaves[0] if self._single else structure.unflatten(self._treespec, leaves)

    def gather(self, indices: np.ndarray) -> Any:
        """The rows at ``indices`` stacked; rows of different shapes are batch's error, as for
        any elements. Rows of a few chunks are taken chunk by chunk; rows spread over many (a
        shuffle's) are taken at once where they are small (their bytes gathered from the
        mapping in one indexing), else one by one."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(indices) and (indices.min() < 0 or indices.max() >= self._length):
            raise IndexError(f"rows out of a cache of {self._length} elements")
        chunk_of = np.searchsorted(self._starts, indices, side="right") - 1
        local = indices - np.asarray(self._starts, dtype=np.int64)[chunk_of]
        used = np.unique(chunk_of)
        for c in used.tolist():
            if c not in self._chunks:  # parsed chunks are listed after their kinds are set
                self._chunk(c)
        kinds = list(self._kinds)
        leaves = []
        for k, is_bytes in enumerate(self._bytes_leaves):
            codes = np.unique(self._kind[k][used]).tolist()
            if len(codes) > 1:
                # Chunks of different row shapes: stacking them is batch's error.
                return structure.batch_elements([self.get(i) for i in indices.tolist()], "cache")
            shape, dtype = kinds[codes[0]] if codes else ((), np.dtype(np.int64))
            out = np.empty((len(indices), *shape), dtype=object if is_bytes else dtype)
            row_bytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            if len(used) <= _FEW_CHUNKS:
                for c in used.tolist():
                    column, where = self._chunks[c][k], chunk_of == c
                    out[where] = column.rows(local[where]) if is_bytes else column[local[where]]
            elif not is_bytes and 0 < row_bytes <= _SMALL_ROW and self._flat is not None:
                at = self._address[k][chunk_of] + local * row_bytes
                raw = self._flat[at[:, None] + np.arange(row_bytes)]
                out = raw.view(dtype).reshape(out.shape)
            else:
                for j, (c, i) in enumerate(zip(chunk_of.tolist(), local.tolist(), strict=True)):
                    column = self._chunks[c][k]
                    out[j] = column.row(i) if is_bytes else column[i]
            leaves.append(out)
        return leaves[0] if self._single else structure.unflatten(self._treespec, leaves)


class _BytesColumn:
    """A byte-string column (``write_bytes_column``'s two records) read by row: its lengths
    and its concatenated bytes (views of the mapping, for reads by index); a row's strings are
    copied out. ValueError where the two records do not agree."""

    def __init__(self, lengths: np.ndarray, data: np.ndarray) -> None:
        if lengths.dtype != np.int64 or data.dtype != np.uint8 or data.ndim != 1:
            raise ValueError("a byte-string column is not int64 lengths and uint8 bytes")
        flat = lengths.reshape(-1)
        if (flat < 0).any() or int(flat.sum()) != len(data):
            raise ValueError(
                f"a byte-string column's lengths add up to {int(flat.sum())}, its bytes to "
                f"{len(data)}"
            )
        self._lengths = flat
        self._ends = np.cumsum(flat)
        self._data = data
        self.shape = lengths.shape
        self.dtype = structure.BYTES
        self._per_row = int(np.prod(lengths.shape[1:], dtype=np.int64))

    def __len__(self) -> int:
        return self.shape[0]

    def row(self, i: int) -> np.ndarray:
        """Row ``i`` as an object array of ``bytes`` (0-d for a column of single strings)."""
        return self.rows(np.array([i]))[0, ...]

    def rows(self, local: np.ndarray) -> np.ndarray:
        """Rows ``local`` as an object array of ``bytes``, one row after another."""
        per_row, data = self._per_row, self._data
        items = (local[:, None] * per_row + np.arange(per_row)).reshape(-1)
        ends = self._ends[items].tolist()
        starts = (self._ends[items] - self._lengths[items]).tolist()
        out = np.empty((len(local), *self.shape[1:]), dtype=object)
        out.reshape(-1)[:] = [data[a:b].tobytes() for a, b in zip(starts, ends, strict=True)]
        return out
