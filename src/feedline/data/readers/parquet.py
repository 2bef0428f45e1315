"""``ParquetDataset``: the rows (or batches of rows) of Parquet files, read with pyarrow."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from feedline.data.dataset import (
    UNKNOWN_CARDINALITY,
    Dataset,
    DatasetIterator,
    IteratorContext,
)
from feedline.data.ops._checks import check_positive
from feedline.data.readers._arrow import (
    ArrowColumn,
    close_parquet,
    columns_block,
    damaged_parquet,
    open_parquet,
)
from feedline.data.readers._files import FileNames, FileReaderMixin, first_file_name
from feedline.data.readers._iterator import FilesIterator
from feedline.errors import DataLossError, FeedlineError, InvalidArgumentError
from feedline.structure import TensorSpec

_BLOCK_ROWS = 8192


class ParquetDataset(FileReaderMixin, Dataset):
    """The rows of Parquet files as dicts ``column name -> array``, file after file.

    Args:
      filenames: a file name, a list of them, or a Dataset of scalar file names; local paths
        or URLs (``s3://bucket/x.parquet``: the footer, then each column chunk read, is one
        ranged request; docs/object_storage.md).
      columns: the columns to read, in this order (default: all, in the file's order).
      batch_size: None yields one row at a time (0-d arrays, or fixed-size arrays for
        fixed-size list columns); n yields batches of n consecutive rows of a file as arrays
        with a leading dimension (a file's last batch may be smaller; batches never span files).

    The columns and their types come from the first file, read when the dataset is made; every
    file must have them with the same types. Numbers and booleans keep their dtype, strings and
    binaries become bytes (object arrays of ``bytes``, as ``tf.string``; a string's UTF-8 bytes:
    ``.item().decode()`` gives it back), ``fixed_size_list`` columns become fixed-shape arrays and
    ``list`` columns 1-d arrays of varying length. Null values raise ``InvalidArgumentError``
    (fill them when writing the file). The file is read in pyarrow record batches, never row by
    row. The iterator's state is the file and the row in it. Pages written with checksums
    (``pq.write_table(..., write_page_checksum=True)``) are verified as they are read; a page
    that fails its checksum, damaged compressed data or a broken footer is a ``DataLossError``
    naming the file, never a value.

    Example:
      >>> import os, tempfile
      >>> import pyarrow as pa, pyarrow.parquet as pq
      >>> path = os.path.join(tempfile.mkdtemp(), "a.parquet")
      >>> pq.write_table(pa.table({"x": [1, 2, 3], "s": ["a", "b", "c"]}), path)
      >>> [(int(r["x"]), r["s"].item()) for r in ParquetDataset(path)]
      [(1, b'a'), (2, b'b'), (3, b'c')]
      >>> [b["x"].tolist() for b in ParquetDataset(path, batch_size=2)]
      [[1, 2], [3]]
    """

    def __init__(
        self,
        filenames: FileNames,
        columns: Sequence[str] | None = None,
        batch_size: int | None = None,
    ) -> None:
        self._init_files(filenames)
        if batch_size is not None:
            batch_size = check_positive("batch_size", batch_size, "ParquetDataset")
        self._batch_size = batch_size
        if isinstance(columns, str):
            columns = [columns]
        self._reader_args = {"columns": columns, "batch_size": self._batch_size}
        self._schema_file = first_file_name(self, "ParquetDataset", "read the columns from")
        parquet = open_parquet(self._schema_file)
        schema = parquet.schema_arrow
        close_parquet(parquet)
        names = list(schema.names) if columns is None else [str(c) for c in columns]
        for name in names:
            if schema.get_field_index(name) < 0:
                raise InvalidArgumentError(
                    f"ParquetDataset: column {name!r} is not in {self._schema_file!r}, whose "
                    f"columns are {list(schema.names)}"
                )
        self._fields = [ArrowColumn(name, schema.field(name).type) for name in names]
        lead = () if self._batch_size is None else (None,)
        self._element_spec = {f.name: TensorSpec((*lead, *f.shape), f.dtype) for f in self._fields}

    def _cardinality(self) -> int:
        if self._filenames is None:
            return UNKNOWN_CARDINALITY
        rows = []
        for name in self._filenames:
            try:
                parquet = open_parquet(name)
            except (OSError, pa.ArrowException):  # the error comes when the file is read
                return UNKNOWN_CARDINALITY
            rows.append(parquet.metadata.num_rows)
            close_parquet(parquet)
        if self._batch_size is None:
            return sum(rows)
        return sum(-(-n // self._batch_size) for n in rows)

    def _make_iterator(self, ctx: IteratorContext) -> DatasetIterator:
        return FilesIterator(self, ctx, batchable=self._batch_size is None)

    def _open_file(
        self, filename: str, position: int, listed_version: Any = None
    ) -> _ParquetReader:
        return _ParquetReader(self, filename, position, listed_version)


class _ParquetReader:
    """Row blocks of one file from a row: whole items (rows, or batch_size rows) per block."""

    def __init__(
        self, dataset: ParquetDataset, filename: str, position: int, listed_version: Any = None
    ) -> None:
        self._dataset = dataset
        self._filename = filename
        parquet = self._parquet = open_parquet(filename, listed_version)
        try:
            self._start(dataset, filename, position)
        except BaseException:
            close_parquet(parquet)
            raise

    def _start(self, dataset: ParquetDataset, filename: str, position: int) -> None:
        parquet = self._parquet
        schema = parquet.schema_arrow
        for field in dataset._fields:
            index = schema.get_field_index(field.name)
            if index < 0 or schema.field(field.name).type != field.type:
                found = "missing" if index < 0 else str(schema.field(field.name).type)
                raise InvalidArgumentError(
                    f"ParquetDataset: column {field.name!r} is {field.type} in "
                    f"{dataset._schema_file!r} but {found} in {filename!r}; every file must have "
                    "the same columns and types"
                )
        metadata = parquet.metadata
        if position > metadata.num_rows:
            raise DataLossError(
                f"ParquetDataset: {filename!r} has {metadata.num_rows} rows, fewer than the saved "
                f"position {position}; the file changed since the state was saved",
                filename=filename,
                offset=position,
            )
        group, group_start = 0, 0
        while group < metadata.num_row_groups:
            rows = metadata.row_group(group).num_rows
            if group_start + rows > position:
                break
            group_start += rows
            group += 1
        self._item = dataset._batch_size or 1
        self._target = self._item * max(1, _BLOCK_ROWS // self._item)
        self._batches = parquet.iter_batches(
            batch_size=self._target,
            row_groups=range(group, metadata.num_row_groups),
            columns=[f.name for f in dataset._fields],
            use_threads=False,
        )
        self._skip = position - group_start
        self._row = position
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._exhausted = group >= metadata.num_row_groups

    def read_block(self) -> Any:
        while self._pending_rows < self._target and not self._exhausted:
            try:
                batch = next(self._batches, None)
            except FeedlineError:  # a remote file's (NotFoundError, changed object: DataLoss)
                raise
            except (pa.ArrowException, OSError) as error:
                raise damaged_parquet(self._filename, error, self._row) from error
            if batch is None:
                self._exhausted = True
                break
            if self._skip:
                skip = min(self._skip, batch.num_rows)
                batch, self._skip = batch.slice(skip), self._skip - skip
            if batch.num_rows:
                self._pending.append(batch)
                self._pending_rows += batch.num_rows
        if not self._pending_rows:
            return None
        take = self._pending_rows
        if not self._exhausted:
            take -= take % self._item
        table = pa.Table.from_batches(self._pending)
        rest = table.slice(take)
        self._pending, self._pending_rows = rest.to_batches(), rest.num_rows
        block = columns_block(
            table.slice(0, take),
            self._dataset._fields,
            self._filename,
            self._row,
            self._dataset._batch_size,
        )
        self._row += take
        return block

    def close(self) -> None:
        self._batches = iter(())
        close_parquet(self._parquet)
