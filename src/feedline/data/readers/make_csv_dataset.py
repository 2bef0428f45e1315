"""``data.experimental.make_csv_dataset``: batches of CSV records as dicts of columns."""

from __future__ import annotations

import collections
import csv
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from feedline._tfrecord import check_compression
from feedline.data.dataset import AUTOTUNE, Dataset
from feedline.data.readers._files import NoFilesMatchedError, match_files, open_stream
from feedline.data.readers.csv import CsvDataset
from feedline.errors import InvalidArgumentError

_WHAT = "make_csv_dataset"
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
# The types inference tries in order, as TensorFlow does; a column takes the first type that
# every one of its fields fits.
_TYPES = (np.int32, np.int64, np.float32, np.float64, object)


def file_names(file_pattern: str | Sequence[str], operation: str) -> list[str]:
    """The files matching ``file_pattern`` (a glob or a list of them), each pattern's sorted."""
    patterns = [file_pattern] if isinstance(file_pattern, str | bytes) else list(file_pattern)
    names: list[str] = []
    for pattern in patterns:
        pattern = pattern.decode() if isinstance(pattern, bytes) else str(pattern)
        names += sorted(match_files(pattern, operation))
    if not names:
        raise NoFilesMatchedError(
            f"{operation}: no files match file_pattern {file_pattern!r}", name=str(file_pattern)
        )
    return names


def _lines(filename: str, compression: str, encoding: str) -> Iterator[str]:
    """The lines of one file, decoded (read lazily, for the first few rows)."""
    stream = open_stream(filename, compression, 0, _WHAT)
    try:
        rest = b""
        while True:
            chunk = stream.read(1 << 16)
            if not chunk:
                break
            *lines, rest = (rest + chunk).split(b"\n")
            for line in lines:
                yield line.removesuffix(b"\r").decode(encoding)
        if rest:
            yield rest.removesuffix(b"\r").decode(encoding)
    finally:
        stream.close()


def _records(
    filename: str, compression: str, encoding: str, delim: str, quotes: bool
) -> Iterator[list[str]]:
    lines = _lines(filename, compression, encoding)
    if quotes:
        return csv.reader(lines, delimiter=delim, quotechar='"', strict=False)
    return csv.reader(lines, delimiter=delim, quoting=csv.QUOTE_NONE)


def _fits(field: str, kind: Any) -> bool:
    try:
        if kind in (np.int32, np.int64):
            low, high = _INT32 if kind is np.int32 else _INT64
            return low <= int(field) <= high
        if kind in (np.float32, np.float64):
            with np.errstate(over="ignore"):
                return bool(np.isfinite(kind(field)))
    except (ValueError, OverflowError):
        return False
    return True


def _infer_type(field: str, na_value: str, previous: int | None) -> int | None:
    """The index in ``_TYPES`` of the narrowest type that ``field`` and the earlier fields fit."""
    if field in ("", na_value):
        return previous
    start = previous or 0
    return next(i for i in range(start, len(_TYPES)) if _fits(field, _TYPES[i]))


def _infer_defaults(
    names: list[str],
    num_columns: int,
    args: dict[str, Any],
    num_rows: int,
    select: list[int] | None,
) -> list[Any]:
    kinds: list[int | None] = [None] * num_columns
    rows = itertools.chain.from_iterable(
        itertools.islice(
            _records(name, args["compression"], args["encoding"], args["delim"], args["quotes"]),
            1 if args["header"] else 0,
            None,
        )
        for name in names
    )
    for row in itertools.islice(rows, num_rows):
        if select is not None:
            row = [row[i] for i in select if i < len(row)]
        for i, field in enumerate(row[:num_columns]):
            kinds[i] = _infer_type(field, args["na_value"], kinds[i])
    return [b"" if k is None or _TYPES[k] is object else np.dtype(_TYPES[k]).type(0) for k in kinds]


def _column_indices(select_columns: Sequence[Any], column_names: list[str]) -> list[int]:
    if all(isinstance(c, int | np.integer) for c in select_columns):
        indices = [int(c) for c in select_columns]
    elif all(isinstance(c, str) for c in select_columns):
        missing = [c for c in select_columns if c not in column_names]
        if missing:
            raise InvalidArgumentError(
                f"{_WHAT}: select_columns {missing} are not columns of {column_names}"
            )
        indices = [column_names.index(c) for c in select_columns]
    else:
        raise InvalidArgumentError(
            f"{_WHAT}: select_columns must be all column names or all indices, got "
            f"{list(select_columns)}"
        )
    if any(not 0 <= i < len(column_names) for i in indices):
        raise InvalidArgumentError(
            f"{_WHAT}: select_columns {indices} must be indices in [0, {len(column_names)})"
        )
    return sorted(set(indices))


def shuffle_and_repeat(
    dataset: Dataset,
    num_epochs: int | None,
    shuffle: bool,
    shuffle_buffer_size: int,
    shuffle_seed: int | None,
) -> Dataset:
    """``shuffle`` (reshuffled every epoch) and ``repeat(num_epochs)``, as tf.data's readers do:
    no repeat when ``num_epochs`` is 1, forever when it is None."""
    if shuffle:
        dataset = dataset.shuffle(shuffle_buffer_size, seed=shuffle_seed)
    if num_epochs != 1:
        dataset = dataset.repeat(num_epochs)
    return dataset


def make_csv_dataset(
    file_pattern: str | Sequence[str],
    batch_size: int,
    column_names: Sequence[str] | None = None,
    column_defaults: Sequence[Any] | None = None,
    label_name: str | None = None,
    select_columns: Sequence[Any] | None = None,
    field_delim: str = ",",
    use_quote_delim: bool = True,
    na_value: str = "",
    header: bool = True,
    num_epochs: int | None = None,
    shuffle: bool = True,
    shuffle_buffer_size: int = 10000,
    shuffle_seed: int | None = None,
    prefetch_buffer_size: int | None = None,
    num_parallel_reads: int | None = None,
    sloppy: bool = False,
    num_rows_for_inference: int = 100,
    compression_type: str | None = None,
    ignore_errors: bool = False,
    encoding: str = "utf-8",
) -> Dataset:
    """Batches of the records of CSV files, as ``OrderedDict``s of columns (tf.data's
    ``make_csv_dataset``).

    Each element is an ``OrderedDict`` of column name -> a batch of that column's values, or
    ``(features, label)`` where ``label_name`` names the label column. Column names come from
    ``column_names`` or the files' header line; column types from ``column_defaults`` (as
    ``CsvDataset``'s ``record_defaults``: a dtype for a required column, or a default value) or,
    without them, from the first ``num_rows_for_inference`` records: each column takes the first
    of int32, int64, float32, float64 and string that all its fields fit, and its empty fields
    become 0 or ``b""``. The files are shuffled and read ``num_parallel_reads`` at a time;
    records are shuffled in a buffer of ``shuffle_buffer_size`` and repeated ``num_epochs``
    times (forever where None, and then every batch is full: ``drop_remainder`` is set).

    Example:
      >>> import os, tempfile
      >>> path = os.path.join(tempfile.mkdtemp(), "a.csv")
      >>> _ = open(path, "w").write("x,name,y\\n1,a,0.5\\n2,b,1.5\\n")
      >>> ds = make_csv_dataset(path, 2, label_name="y", num_epochs=1, shuffle=False)
      >>> features, label = next(iter(ds))
      >>> list(features), features["x"].tolist(), features["x"].dtype, label.tolist()
      (['x', 'name'], [1, 2], dtype('int32'), [0.5, 1.5])
    """
    names = file_names(file_pattern, _WHAT)
    compression = check_compression(compression_type, _WHAT)
    args = {
        "compression": compression,
        "encoding": encoding,
        "delim": field_delim,
        "quotes": bool(use_quote_delim),
        "header": bool(header),
        "na_value": na_value,
    }
    if column_names is None:
        if not header:
            raise InvalidArgumentError(
                f"{_WHAT}: give column_names, or header=True to read them from the files"
            )
        first = next(_records(names[0], compression, encoding, field_delim, use_quote_delim), None)
        if not first:
            raise InvalidArgumentError(f"{_WHAT}: {names[0]!r} has no header line")
        column_names = first
    column_names = list(column_names)
    if len(set(column_names)) != len(column_names):
        raise InvalidArgumentError(f"{_WHAT}: column names must be unique, got {column_names}")
    select = None if select_columns is None else _column_indices(select_columns, column_names)
    if column_defaults is None:
        count = len(select) if select is not None else len(column_names)
        column_defaults = _infer_defaults(names, count, args, num_rows_for_inference, select)
    column_defaults = list(column_defaults)
    if select is not None:
        if len(column_defaults) != len(select):
            raise InvalidArgumentError(
                f"{_WHAT}: column_defaults has {len(column_defaults)} entries but select_columns "
                f"{len(select)}; give one per selected column"
            )
        column_names = [column_names[i] for i in select]
    elif len(column_defaults) != len(column_names):
        raise InvalidArgumentError(
            f"{_WHAT}: column_defaults has {len(column_defaults)} entries but there are "
            f"{len(column_names)} columns {column_names}"
        )
    if label_name is not None and label_name not in column_names:
        raise InvalidArgumentError(
            f"{_WHAT}: label_name {label_name!r} is not one of the columns {column_names}"
        )
    keys = tuple(column_names)

    def read(filename: Any) -> Dataset:
        reader: Dataset = CsvDataset(
            filename,
            column_defaults,
            compression_type=compression_type,
            header=header,
            field_delim=field_delim,
            use_quote_delim=use_quote_delim,
            na_value=na_value,
            select_cols=select,
        )
        return reader.ignore_errors() if ignore_errors else reader

    def to_features(*columns: Any) -> Any:
        features = collections.OrderedDict(zip(keys, columns, strict=True))
        if label_name is None:
            return features
        label = features.pop(label_name)
        return features, label

    files = Dataset.from_tensor_slices(names)
    if shuffle:
        files = files.shuffle(len(names), seed=shuffle_seed)
    cycle = 1 if num_parallel_reads is None else num_parallel_reads
    dataset = files.interleave(
        read,
        cycle_length=cycle if cycle != AUTOTUNE else None,
        num_parallel_calls=None if cycle == 1 else cycle,
        deterministic=None if cycle == 1 else not sloppy,
    )
    dataset = shuffle_and_repeat(dataset, num_epochs, shuffle, shuffle_buffer_size, shuffle_seed)
    dataset = dataset.batch(batch_size, drop_remainder=num_epochs is None)
    dataset = dataset.map(to_features)
    return dataset.prefetch(AUTOTUNE if prefetch_buffer_size is None else prefetch_buffer_size)
