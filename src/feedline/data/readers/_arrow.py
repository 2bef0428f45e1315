"""Arrow columns as NumPy arrays for ``ParquetDataset``: types, conversion and row blocks."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from feedline import _fs, structure
from feedline.errors import DataLossError, FeedlineError, InvalidArgumentError, NotFoundError


def open_parquet(filename: str, listed_version: Any = None) -> pq.ParquetFile:
    """``filename`` (a local path or a URL, ``s3://...``) as a ``ParquetFile`` whose pages are
    checked against their CRC-32 checksums where the file has them (``write_page_checksum=True``);
    NotFoundError or DataLossError where it cannot be opened. A remote file is read through
    ``_fs.RemoteReader``: each of pyarrow's reads (the footer, a column chunk) is one ranged
    request, made again at the offset reached after a transient failure, and an object that
    changes meanwhile, or is not ``listed_version`` (where given), is a DataLossError.
    ``close_parquet`` closes it."""
    source: Any = filename
    if not _fs.is_local(filename):
        source = _fs.RemoteReader(filename, 0, "ParquetDataset", listed_version=listed_version)
    elif filename.startswith("file://"):
        filename = source = _fs.filesystem(filename)[1]
    if isinstance(source, str) and not os.path.exists(source):
        raise NotFoundError(
            f"ParquetDataset: file {filename!r} does not exist; check the path", name=filename
        )
    try:
        return pq.ParquetFile(source, page_checksum_verification=True)
    except FeedlineError:
        close_source(source)
        raise
    except (pa.ArrowException, OSError) as error:
        close_source(source)
        raise damaged_parquet(filename, error) from error


def close_source(source: Any) -> None:
    if isinstance(source, _fs.RemoteReader):
        source.close()


def close_parquet(parquet: pq.ParquetFile) -> None:
    """Closes what ``open_parquet`` opened (a remote file's reader too)."""
    parquet.close(force=True)


def damaged_parquet(filename: str, error: BaseException, row: int | None = None) -> DataLossError:
    """The DataLossError of a Parquet file that pyarrow cannot read (a page that fails its
    checksum, damaged compressed data, a broken footer), naming the file."""
    where = "" if row is None else f" after row {row}"
    return DataLossError(
        f"ParquetDataset: {filename!r} is damaged or not a readable Parquet file{where}: "
        f"{type(error).__name__}: {error}",
        filename=filename,
    )


class ArrowColumn:
    """One column: its Arrow type and the dtype and per-row shape it has in elements.

    ``kind`` is "plain" (numbers, booleans), "bytes" (strings and binaries), "fixed" (nested
    fixed-size lists: a fixed shape) or "list" (a 1-d array of varying length per row).

    Strings and binaries are byte strings (``structure.BYTES``: object arrays of ``bytes``), as
    TensorFlow reads both into ``tf.string``: a ``string`` column's values are their UTF-8 bytes.
    """

    def __init__(self, name: str, arrow_type: pa.DataType) -> None:
        self.name = name
        self.type = arrow_type
        shape: list[int | None] = []
        leaf = arrow_type
        while pa.types.is_fixed_size_list(leaf):
            shape.append(leaf.list_size)
            leaf = leaf.value_type
        if shape:
            self.kind = "fixed"
        elif pa.types.is_list(leaf) or pa.types.is_large_list(leaf):
            self.kind, shape, leaf = "list", [None], leaf.value_type
        else:
            self.kind = "plain"
        if _is_bytes(leaf):
            if self.kind != "plain":
                raise self._unsupported()
            self.kind, self.dtype = "bytes", structure.BYTES
        else:
            try:
                self.dtype = np.dtype(leaf.to_pandas_dtype())
            except (NotImplementedError, TypeError):
                raise self._unsupported() from None
            if self.dtype == object:
                raise self._unsupported()
        self.shape = tuple(shape)

    def _unsupported(self) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"ParquetDataset: column {self.name!r} has type {self.type}, which has no NumPy "
            "form here; supported are numbers, booleans, strings/binaries, (fixed-size) lists of "
            "numbers; leave it out with columns=[...]"
        )

    def to_numpy(self, column: pa.ChunkedArray, filename: str, start_row: int) -> Any:
        """The column's rows as an array (a list of 1-d arrays for "list" columns)."""
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        self._check_nulls(array, filename, start_row)
        if self.kind == "bytes":
            return _bytes_column(array)
        if self.kind == "fixed":
            values = array
            while pa.types.is_fixed_size_list(values.type):
                values = values.flatten()
            return values.to_numpy(zero_copy_only=False).reshape((len(array), *self.shape))
        if self.kind == "list":
            return [np.asarray(row, dtype=self.dtype) for row in array.to_numpy(False)]
        return array.to_numpy(zero_copy_only=False)

    def _check_nulls(self, array: pa.Array, filename: str, start_row: int) -> None:
        nulls = array.null_count
        values = array
        while not nulls and _is_list(values.type):
            values = values.flatten()
            nulls = values.null_count
        if nulls:
            raise InvalidArgumentError(
                f"ParquetDataset: column {self.name!r} of {filename!r} has {nulls} null values "
                f"in rows from {start_row}; elements cannot hold nulls: fill them (for example "
                "with pyarrow.compute.fill_null) or leave the column out with columns=[...]"
            )


def _bytes_column(array: pa.Array) -> np.ndarray:
    """A string or binary column as a 1-d object array of exact ``bytes`` (strings UTF-8)."""
    if pa.types.is_string(array.type):
        array = array.cast(pa.binary())
    elif pa.types.is_large_string(array.type):
        array = array.cast(pa.large_binary())
    out = array.to_numpy(zero_copy_only=False)
    return out if out.dtype == structure.BYTES else structure.bytes_array(array.to_pylist())


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)


def _is_bytes(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
    )


class ColumnsBlock:
    """Rows of one file as columns; an item is one row, or ``batch_size`` rows."""

    __slots__ = ("_batched", "_columns", "_item", "_rows", "start")

    def __init__(
        self, columns: dict[str, Any], start: int, rows: int, batch_size: int | None
    ) -> None:
        self._columns = list(columns.items())
        self.start = start
        self._rows = rows
        self._batched = batch_size is not None
        self._item = batch_size or 1

    def __len__(self) -> int:
        return -(-self._rows // self._item)

    def end(self, i: int) -> int:
        return self.start + min((i + 1) * self._item, self._rows)

    def element(self, i: int) -> dict[str, Any]:
        if self._batched:
            return self.batch(i * self._item, (i + 1) * self._item)
        return {
            name: structure.row(column, i) if isinstance(column, np.ndarray) else column[i]
            for name, column in self._columns
        }

    def batch(self, lo: int, hi: int) -> dict[str, Any]:
        return {name: _rows(name, column, lo, hi) for name, column in self._columns}


def _rows(name: str, column: Any, lo: int, hi: int) -> np.ndarray:
    if isinstance(column, np.ndarray):
        return column[lo:hi]
    rows = column[lo:hi]
    if len({len(r) for r in rows}) > 1:
        raise InvalidArgumentError(
            f"ParquetDataset: cannot batch list column {name!r}: its rows have lengths "
            f"{sorted({len(r) for r in rows})}; read it without batch_size and use padded_batch"
        )
    return np.stack(rows)


def columns_block(
    table: pa.Table,
    fields: list[ArrowColumn],
    filename: str,
    start: int,
    batch_size: int | None,
) -> ColumnsBlock:
    columns = {f.name: f.to_numpy(table.column(f.name), filename, start) for f in fields}
    return ColumnsBlock(columns, start, table.num_rows, batch_size)
