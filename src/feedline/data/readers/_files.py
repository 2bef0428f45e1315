"""What the file readers share: file-name arguments, the reader mixin and decompressing streams."""

from __future__ import annotations

import glob
import os
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO, NamedTuple, Self

import numpy as np

from feedline import _fs
from feedline.data.dataset import AUTOTUNE, Dataset, IteratorContext, raw_elements
from feedline.errors import DataLossError, InvalidArgumentError, NotFoundError
from feedline.structure import TensorSpec

DEFAULT_BUFFER_SIZE = 1 << 20
_MIN_BUFFER_SIZE = 1 << 12
_COMPRESSED_CHUNK = 1 << 18

FileNames = str | bytes | os.PathLike | Sequence[Any] | np.ndarray | Dataset


def decode_name(value: Any) -> str:
    """One file name (str, bytes, path, or a 0-d array holding bytes or a str) as a str."""
    if isinstance(value, np.ndarray | np.generic) and np.ndim(value) == 0:
        value = value.item()
    if isinstance(value, str | bytes | os.PathLike):
        return os.fsdecode(value)
    raise InvalidArgumentError(
        f"a file name must be a str, bytes or path, got {type(value).__name__} {value!r}"
    )


def file_names(filenames: FileNames, operation: str) -> tuple[tuple[str, ...] | None, Any]:
    """``(names, None)`` for names given directly, or ``(None, dataset)`` for a Dataset of names."""
    if isinstance(filenames, Dataset):
        spec = filenames.element_spec
        if not (isinstance(spec, TensorSpec) and spec.shape == () and is_string_dtype(spec.dtype)):
            raise InvalidArgumentError(
                f"{operation}: a dataset of file names must have scalar string elements, "
                f"got element_spec {spec}"
            )
        return None, filenames
    if isinstance(filenames, np.ndarray | np.generic):
        return tuple(string_array_items(filenames, operation, "filenames")), None
    if isinstance(filenames, list | tuple):
        return tuple(decode_name(v) for v in filenames), None
    return (decode_name(filenames),), None


def is_string_dtype(dtype: np.dtype) -> bool:
    """Whether arrays of ``dtype`` hold strings: bytes (object or ``S``) or unicode (``U``)."""
    return dtype.kind in "SUO"


def string_array_items(value: np.ndarray | np.generic, operation: str, name: str) -> list[str]:
    """The file names (or patterns) in a 0-d or 1-d array of bytes or str, as str.

    Raises:
      InvalidArgumentError: another dtype or rank, or an object array holding something else.
    """
    array = np.asarray(value)
    if not is_string_dtype(array.dtype) or array.ndim > 1:
        raise InvalidArgumentError(
            f"{operation}: {name} must be a string scalar or vector, got an array of "
            f"dtype {array.dtype} and shape {array.shape}"
        )
    return [decode_name(v) for v in array.reshape(-1).tolist()]


def check_buffer_size(value: Any, operation: str) -> int:
    """The read size in bytes: ``DEFAULT_BUFFER_SIZE`` for None, at least 4 KiB otherwise."""
    if value is None:
        return DEFAULT_BUFFER_SIZE
    if isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < 0:
        raise InvalidArgumentError(
            f"{operation}: buffer_size must be None or an int >= 0 (bytes), got {value!r}"
        )
    return max(int(value), _MIN_BUFFER_SIZE)


def check_parallel_reads(value: Any, operation: str) -> int:
    """How many files are read at once: 1 for None, the CPU count for AUTOTUNE."""
    if value is None:
        return 1
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidArgumentError(
            f"{operation}: num_parallel_reads must be None, AUTOTUNE (-1) or an int >= 1, "
            f"got {value!r}"
        )
    value = int(value)
    if value == AUTOTUNE:
        return max(os.cpu_count() or 1, 1)
    if value < 1:
        raise InvalidArgumentError(
            f"{operation}: num_parallel_reads must be None, AUTOTUNE (-1) or an int >= 1, "
            f"got {value}"
        )
    return value


class FileReaderMixin:
    """The part every file-reading Dataset shares (a mixin, not an operation).

    A reader sets ``_filenames`` (the names, or None when they come from ``inputs[0]``, a
    Dataset of names) and ``_reader_args`` (its other constructor arguments), so that
    ``_with_files`` can make the same reader over other files.
    """

    _is_file_reader = True
    #: Whether ``_open_file`` reads nothing (it only makes the stream): a remote file that
    #: opens without a request then opens without one (``_iterator._EarlyOpen``).
    _opens_without_reading = False
    _filenames: tuple[str, ...] | None
    _reader_args: dict[str, Any]

    def _init_files(self, filenames: FileNames) -> None:
        names, dataset = file_names(filenames, type(self).__name__)
        Dataset.__init__(self, () if dataset is None else (dataset,))  # type: ignore[arg-type]
        self._filenames = names

    def _with_files(self, filenames: FileNames) -> Self:
        """The same reader over ``filenames`` (names, or a Dataset of names) instead."""
        return type(self)(filenames, **self._reader_args)  # type: ignore[call-arg]


class NoFilesMatchedError(NotFoundError, InvalidArgumentError):
    """No file matches a pattern (``list_files``, ``make_csv_dataset``): a ``NotFoundError``
    naming it (``name``), and the ``InvalidArgumentError`` (a ``ValueError``) that TensorFlow
    raises there, so that a ported ``except`` of either catches it."""


def match_files(pattern: str, operation: str) -> list[str]:
    """The paths matching the glob ``pattern`` (``*``, ``?``, ``[...]``): on the local disk
    (hidden files too), or on the file system its URL names (``s3://bucket/train-*.tfrecord``),
    as URLs spelt like the pattern."""
    return list(list_matches(pattern, operation))


class Listed(NamedTuple):
    """What a listing says of a path: its version (the object's ETag or generation on a store,
    ``_fs.object_tag``; None for a local file and where the store gives none) and its size in
    bytes (None for a local file, whose listing does not read it)."""

    version: Any
    size: int | None


def list_matches(pattern: str, operation: str) -> dict[str, Listed]:
    """``match_files``, each path with what the listing says of it (``Listed``)."""
    if _fs.is_local(pattern) and not pattern.startswith("file://"):
        return dict.fromkeys(glob.glob(pattern, include_hidden=True), Listed(None, None))
    fs, inner = _fs.filesystem(pattern)
    with _fs.translate_errors(pattern, operation):
        found = fs.glob(inner, detail=True)
    local = _fs.is_local(pattern)
    return {
        _fs.unstrip(fs, name, pattern): Listed(None, None)
        if local
        else Listed(_fs.object_tag(info), _size(info))
        for name, info in found.items()
    }


def _size(info: Mapping[str, Any]) -> int | None:
    if info.get("type") == "directory":
        return None
    size = info.get("size")
    return size if type(size) is int and size >= 0 else None


# Remote files (object stores) are read ahead of the reader in the background: at most
# READ_AHEAD_BUFFERS x buffer_size bytes (16 MiB for the default buffer_size of 1 MiB), in
# ranged requests of half that window, at most REMOTE_BLOCK bytes each, as many of them in
# flight at once as the window holds, at most READ_AHEAD_REQUESTS (2 by default, 4 from a
# buffer_size of 2 MiB on).
READ_AHEAD_BUFFERS = 16
READ_AHEAD_REQUESTS = 4
REMOTE_BLOCK = 8 << 20


def open_remote(
    filename: str,
    position: int,
    operation: str,
    buffer_size: int = DEFAULT_BUFFER_SIZE,
    listed_version: Any = None,
) -> _fs.RemoteReader:
    """A remote file (object store, or any non-local file system) opened at ``position`` and
    read ahead in the background: ``READ_AHEAD_BUFFERS x buffer_size`` bytes at most, each
    request made again at the offset reached after a transient failure (``_fs.RemoteReader``).

    Raises:
      NotFoundError: the object does not exist (naming the URL).
      DataLossError: the object is shorter than ``position``, or is not ``listed_version``
        (where given: its version when it was listed).
    """
    window = READ_AHEAD_BUFFERS * buffer_size
    raw = _fs.RemoteReader(
        filename,
        0,
        operation,
        block_size=min(REMOTE_BLOCK, window // 2),
        read_ahead=window,
        listed_version=listed_version,
        parallel_reads=READ_AHEAD_REQUESTS,
    )
    if position > raw.size:
        raw.close()
        raise _shorter(operation, filename, position, raw.size)
    raw.seek(position)
    raw.start_read_ahead()
    return raw


def open_stream(
    filename: str,
    compression: str,
    position: int,
    operation: str,
    buffer_size: int = DEFAULT_BUFFER_SIZE,
    listed_version: Any = None,
) -> Any:
    """``filename`` (a local path or any URL of the file-system layer, ``s3://...``) opened for
    reading at ``position`` (a position in the decompressed bytes). A remote file is read
    ahead in the background (``open_remote``), and must be ``listed_version`` where given.

    Raises:
      NotFoundError: the file does not exist.
      DataLossError: the file is shorter than ``position`` (it changed since a checkpoint), or
        is another version than the one listed.
    """
    if not _fs.is_local(filename):
        if not compression:
            return open_remote(filename, position, operation, buffer_size, listed_version)
        raw: Any = open_remote(filename, 0, operation, buffer_size, listed_version)
    else:
        raw = _open_local(filename, compression, position, operation)
        if not compression:
            return raw
    stream = InflateStream(raw, filename, compression, operation)
    skipped = stream.skip(position)
    if skipped < position:
        stream.close()
        raise _shorter(operation, filename, position, skipped)
    return stream


def _open_local(filename: str, compression: str, position: int, operation: str) -> BinaryIO:
    """A local file, opened at ``position`` if it is not compressed (else at 0)."""
    if filename.startswith("file://"):
        filename = _fs.filesystem(filename)[1]
    try:
        raw: BinaryIO = open(filename, "rb", buffering=0)  # noqa: SIM115
    except FileNotFoundError:
        raise NotFoundError(
            f"{operation}: file {filename!r} does not exist; check the path (or the pattern "
            "that produced it)",
            name=filename,
        ) from None
    except IsADirectoryError:
        raise NotFoundError(
            f"{operation}: {filename!r} is a directory, not a file", name=filename
        ) from None
    if not compression:
        size = os.fstat(raw.fileno()).st_size
        if position > size:
            raw.close()
            raise _shorter(operation, filename, position, size)
        raw.seek(position)
    return raw


def _shorter(operation: str, filename: str, position: int, size: int) -> DataLossError:
    return DataLossError(
        f"{operation}: {filename!r} holds {size} bytes, fewer than the saved position {position}; "
        "the file changed since the state was saved",
        filename=filename,
        offset=position,
    )


class InflateStream:
    """A GZIP or ZLIB file read as its decompressed bytes (several GZIP members are joined)."""

    def __init__(
        self, raw: BinaryIO | _fs.RemoteReader, filename: str, compression: str, operation: str
    ) -> None:
        self._raw = raw
        self._filename = filename
        self._operation = operation
        self._compression = compression
        self._wbits = 16 + zlib.MAX_WBITS if compression == "GZIP" else zlib.MAX_WBITS
        self._inflater = zlib.decompressobj(self._wbits)
        self._position = 0

    def read(self, n: int) -> bytes:
        """Up to ``n`` decompressed bytes; fewer only at the end of the stream."""
        chunks: list[bytes] = []
        have = 0
        while have < n:
            inflater = self._inflater
            if inflater.eof:
                data = inflater.unused_data or self._raw.read(_COMPRESSED_CHUNK)
                if not data:
                    break
                inflater = self._inflater = zlib.decompressobj(self._wbits)
            else:
                data = inflater.unconsumed_tail or self._raw.read(_COMPRESSED_CHUNK)
                if not data:
                    if have:
                        break  # hand out what there is; the next read raises
                    raise self._loss("the compressed stream ends early (truncated file)")
            try:
                piece = inflater.decompress(data, n - have)
            except zlib.error as error:
                raise self._loss(f"the compressed data is corrupted ({error})") from None
            if piece:
                chunks.append(piece)
                have += len(piece)
        self._position += have
        return b"".join(chunks)

    def skip(self, n: int) -> int:
        """Reads and drops ``n`` bytes; returns how many there were."""
        skipped = 0
        while skipped < n:
            piece = self.read(min(n - skipped, 1 << 22))
            if not piece:
                break
            skipped += len(piece)
        return skipped

    def _loss(self, what: str) -> DataLossError:
        return DataLossError(
            f"{self._operation}: {self._filename!r} ({self._compression}): {what} after "
            f"{self._position} decompressed bytes",
            filename=self._filename,
            offset=self._position,
        )

    def close(self) -> None:
        self._raw.close()


def first_file_name(reader: Any, operation: str, why: str) -> str:
    """The first file a reader will read (to take its schema from), peeking a names Dataset."""
    if reader._filenames is not None:
        if not reader._filenames:
            raise InvalidArgumentError(f"{operation}: no file names given; give at least one")
        return reader._filenames[0]
    names: Dataset = reader._inputs[0]
    iterator = names._iterator(IteratorContext(names.options()))
    try:
        first = next(raw_elements(iterator), None)
    finally:
        iterator.close()
    if first is None:
        raise InvalidArgumentError(
            f"{operation}: the dataset of file names is empty; it needs at least one file to {why}"
        )
    return decode_name(np.asarray(first))
