"""``CsvDataset``: the records of CSV files as tuples of typed scalars (tf.data's CsvDataset)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from typing import Any

import numpy as np

from feedline import structure
from feedline._csv_columns import parse_record_defaults, select_columns
from feedline._tfrecord import check_compression
from feedline.data.dataset import Dataset, DatasetIterator, IteratorContext
from feedline.data.readers._blocks import RecordError
from feedline.data.readers._files import (
    FileNames,
    FileReaderMixin,
    check_buffer_size,
    open_stream,
)
from feedline.data.readers._iterator import FilesIterator
from feedline.data.readers.text_line import LineReader
from feedline.errors import InvalidArgumentError
from feedline.structure import TensorSpec


class CsvDataset(FileReaderMixin, Dataset):
    """Each record of one or more CSV files as a tuple of 0-d arrays, one per column.

    Args:
      filenames: a file name, a list of them, or a Dataset of scalar file names.
      record_defaults: one entry per parsed column: a dtype (``float32``, ``float64``,
        ``int32``, ``int64`` or ``feedline.string``), which makes the column required, or a
        default value (``0.0`` → float32, ``0`` → int32 as in TensorFlow, ``""`` or ``b""`` →
        bytes, or a NumPy scalar of one of those dtypes), used where the field is empty or
        ``na_value``.
      compression_type: None or "" (none), "GZIP" or "ZLIB".
      buffer_size: the size in bytes of each read (None: 1 MiB); a remote file is read ahead
        in the background, 16 x buffer_size at most (docs/object_storage.md, "Readers").
      header: whether the first line of every file is a header, to skip.
      field_delim: the one-character field separator.
      use_quote_delim: whether ``"`` quotes fields (RFC 4180: a quoted field may hold the
        delimiter, newlines and ``""`` for a quote); if False quotes are ordinary characters.
      na_value: a field value that counts as missing (besides the empty field).
      select_cols: the sorted indices of the columns to parse (``record_defaults`` then has one
        entry per selected column; further fields in a record are ignored).
      exclude_cols: the sorted indices of the columns to skip; at most one of ``select_cols``
        and ``exclude_cols``.

    String columns hold bytes: 0-d object arrays holding a field's exact ``bytes`` (1-d object
    arrays of them in batches), as TensorFlow's ``.numpy()`` gives string tensors. A record with
    the wrong number of fields, a missing field without a default, or a field that does not parse
    as its column's type raise ``InvalidArgumentError`` naming the file, the line and the column.

    Example:
      >>> import os, tempfile
      >>> path = os.path.join(tempfile.mkdtemp(), "a.csv")
      >>> _ = open(path, "w").write("x,name\\n1.5,a\\n,b\\n")
      >>> ds = CsvDataset(path, [0.0, bytes], header=True)
      >>> [(float(x), s.item()) for x, s in ds]
      [(1.5, b'a'), (0.0, b'b')]
    """

    def __init__(
        self,
        filenames: FileNames,
        record_defaults: Sequence[Any],
        compression_type: str | None = None,
        buffer_size: int | None = None,
        header: bool = False,
        field_delim: str = ",",
        use_quote_delim: bool = True,
        na_value: str = "",
        select_cols: Sequence[int] | None = None,
        exclude_cols: Sequence[int] | None = None,
    ) -> None:
        self._init_files(filenames)
        self._columns = parse_record_defaults(record_defaults)
        self._compression = check_compression(compression_type, "CsvDataset")
        self._buffer_size = check_buffer_size(buffer_size, "CsvDataset")
        if not isinstance(field_delim, str | bytes) or len(field_delim) != 1:
            raise InvalidArgumentError(
                f"CsvDataset: field_delim must be one character, got {field_delim!r}"
            )
        if isinstance(field_delim, bytes):
            field_delim = field_delim.decode("latin-1")
        self._delim = field_delim
        self._header = bool(header)
        self._quotes = bool(use_quote_delim)
        self._na = na_value.decode("latin-1") if isinstance(na_value, bytes) else str(na_value)
        self._indices, self._num_fields, self._exact_fields = select_columns(
            len(self._columns), select_cols, exclude_cols
        )
        self._reader_args = {
            "record_defaults": record_defaults,
            "compression_type": compression_type,
            "buffer_size": buffer_size,
            "header": header,
            "field_delim": field_delim,
            "use_quote_delim": use_quote_delim,
            "na_value": na_value,
            "select_cols": select_cols,
            "exclude_cols": exclude_cols,
        }
        self._element_spec = tuple(TensorSpec((), c.dtype) for c in self._columns)

    def _make_iterator(self, ctx: IteratorContext) -> DatasetIterator:
        return FilesIterator(self, ctx)

    def _open_file(self, filename: str, position: int, listed_version: Any = None) -> _CsvReader:
        return _CsvReader(self, filename, position, listed_version)


class _CsvBlock:
    __slots__ = ("columns", "ends", "start")

    def __init__(self, columns: list[np.ndarray], ends: list[int], start: int) -> None:
        self.columns = columns
        self.ends = ends
        self.start = start

    def __len__(self) -> int:
        return len(self.ends)

    def end(self, i: int) -> int:
        return self.ends[i]

    def element(self, i: int) -> tuple[Any, ...]:
        return tuple(structure.row(column, i) for column in self.columns)

    def batch(self, lo: int, hi: int) -> tuple[np.ndarray, ...]:
        return tuple(column[lo:hi] for column in self.columns)


class _BadRecord(Exception):
    """Record ``index`` of a block cannot be parsed; ``error`` says why."""

    def __init__(self, index: int, error: InvalidArgumentError) -> None:
        super().__init__(index)
        self.index = index
        self.error = error


class _CsvReader:
    """Records of one CSV file: lines joined where a quoted field spans several."""

    def __init__(
        self, dataset: CsvDataset, filename: str, position: int, listed_version: Any = None
    ) -> None:
        self._dataset = dataset
        self._lines = LineReader(
            filename,
            dataset._compression,
            position,
            dataset._buffer_size,
            "CsvDataset",
            strip_cr=False,
            listed_version=listed_version,
        )
        self._filename = filename
        self._skip_header = dataset._header and position == 0
        self._pending: list[bytes] = []
        self._pending_quotes = 0
        self._position = position
        self._lines_end = position
        self._error: RecordError | None = None
        self._done = False

    def read_block(self) -> _CsvBlock | None:
        if self._error is not None:
            error, self._error = self._error, None
            self._done = True  # the iterator reads the file on after the bad record
            raise error
        while not self._done:
            got = self._lines.read_lines()
            if got is None:
                if not self._pending:
                    return None
                records, ends = [b"\n".join(self._pending)], [self._lines_end]
                start, self._pending = self._position, []
            else:
                records, ends, start = self._records(*got)
            if self._skip_header and records:
                self._skip_header = False
                start = ends[0]
                records, ends = records[1:], ends[1:]
            if records:
                self._position = ends[-1]
                return self._block(records, ends, start)
            self._position = start
        return None

    def _block(self, records: list[bytes], ends: list[int], start: int) -> _CsvBlock:
        """The parsed records; at a bad one, those before it (the error comes next call)."""
        try:
            return _CsvBlock(self._parse(records, ends, start), ends, start)
        except _BadRecord as bad:
            self._error = RecordError(bad.error, ends[bad.index])
            if not bad.index:
                return self.read_block()  # type: ignore[return-value]
            good = records[: bad.index], ends[: bad.index]
            return _CsvBlock(self._parse(*good, start), good[1], start)

    def _records(self, lines: list[bytes], ends: list[int], start: int) -> tuple[Any, ...]:
        self._lines_end = ends[-1]
        start = self._position
        if not self._dataset._quotes or (
            not self._pending and not any(b'"' in line for line in lines)
        ):
            return [line.removesuffix(b"\r") for line in lines], ends, start
        records: list[bytes] = []
        record_ends: list[int] = []
        for line, end in zip(lines, ends, strict=True):
            quotes = line.count(b'"')
            if self._pending or quotes % 2:
                self._pending.append(line)
                self._pending_quotes += quotes
                if self._pending_quotes % 2:
                    continue
                line = b"\n".join(self._pending)
                self._pending, self._pending_quotes = [], 0
            records.append(line.removesuffix(b"\r"))
            record_ends.append(end)
        return records, record_ends, start

    def _parse(self, records: list[bytes], ends: list[int], start: int) -> list[np.ndarray]:
        dataset = self._dataset
        texts = [record.decode("latin-1") for record in records]
        if dataset._quotes:
            rows = list(csv.reader(texts, delimiter=dataset._delim, quotechar='"', strict=False))
        else:
            rows = list(csv.reader(texts, delimiter=dataset._delim, quoting=csv.QUOTE_NONE))
        indices = dataset._indices
        needed = dataset._num_fields
        for k, row in enumerate(rows):
            if not row:
                rows[k] = row = [""]
            if len(row) < needed or (dataset._exact_fields and len(row) != needed):
                raise self._bad(
                    ends, start, k, f"expected {needed} fields but the record has {len(row)}"
                )
        columns = list(zip(*rows, strict=False)) if rows else []
        out = []
        for column, index in zip(dataset._columns, indices, strict=True):
            failure = column.convert(columns[index], dataset._na)
            if isinstance(failure, np.ndarray):
                out.append(failure)
                continue
            k, what = failure
            raise self._bad(ends, start, k, f"column {index}: {what}")
        return out

    def _bad(self, ends: list[int], start: int, k: int, what: str) -> _BadRecord:
        line = _line_number(self._dataset, self._filename, ends[k - 1] if k else start)
        error = InvalidArgumentError(f"CsvDataset: {self._filename!r}, line {line}: {what}")
        return _BadRecord(k, error)

    def close(self) -> None:
        self._lines.close()


def _line_number(dataset: CsvDataset, filename: str, offset: int) -> int:
    """The 1-based line at byte ``offset`` of a file (for error messages only)."""
    stream = open_stream(filename, dataset._compression, 0, "CsvDataset")
    try:
        return stream.read(offset).count(b"\n") + 1
    finally:
        stream.close()
