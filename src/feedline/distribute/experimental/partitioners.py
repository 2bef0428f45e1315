"""How many shards a large parameter is split into: ``tf.distribute.experimental.partitioners``.

A partitioner is called with a parameter's shape and dtype and returns the number of partitions
on each axis, as TensorFlow's partitioners do; feedline splits along axis 0 (rows) only, so every
entry but the first is 1. ``ParameterServerStrategy(variable_partitioner=...)`` places the shards on
the ``ps`` tasks. The arithmetic is TensorFlow's (``sharded_variable.py`` and
``partitioned_variables.py``), in exact integer arithmetic:

===========================  =================================================================
``FixedShardsPartitioner``   ``min(num_shards, rows)``
``MinSizePartitioner``       ``max(1, min(rows, max_shards, ceil(bytes / min_shard_bytes)))``
``MaxSizePartitioner``       ``ceil(rows / max(1, max_shard_bytes // row_bytes))``, at most
                             ``max_shards`` when given
===========================  =================================================================

``shard_rows`` and ``shard_offsets`` say which rows each shard holds: when the rows do not divide,
the first shards get one more (13 rows over 5 shards: 3, 3, 3, 2, 2).

The dtype may be a ``torch.dtype``, a NumPy dtype or type, or a name (``"float32"``,
``"bfloat16"``, ``"string"``); string and object dtypes count ``bytes_per_string`` bytes per
element. This module does not import torch.

Example:
  >>> from feedline.distribute.experimental import partitioners
  >>> partitioners.FixedShardsPartitioner(num_shards=2)((10, 3), "float32")
  [2, 1]
  >>> partitioners.MinSizePartitioner(min_shard_bytes=4, max_shards=2)((6, 1), "float32")
  [2, 1]
  >>> partitioners.MaxSizePartitioner(max_shard_bytes=4)((6, 1), "float32")
  [6, 1]
  >>> partitioners.shard_rows(13, 5), partitioners.shard_offsets(13, 5)
  ([3, 3, 3, 2, 2], [0, 3, 6, 9, 11])
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "FixedShardsPartitioner",
    "MaxSizePartitioner",
    "MinSizePartitioner",
    "Partitioner",
    "shard_offsets",
    "shard_rows",
]

# Dtype names that NumPy does not know, with their size in bytes (torch's extra dtypes).
_EXTRA_ITEMSIZES = {
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "complex32": 4,
    "chalf": 4,
    "quint8": 1,
    "qint8": 1,
    "qint32": 4,
    "quint4x2": 1,
}
_STRING_NAMES = frozenset({"string", "str", "bytes", "object"})


class Partitioner:
    """Base class of partitioners: ``partitioner(shape, dtype) -> partitions per axis``.

    Subclasses implement ``_num_shards(shape, dtype)``, the number of shards along axis 0; the base
    class checks the shape and the axis and builds the list, whose entries after the first are 1.
    A partitioner is a plain, picklable object: the strategy may send it to other processes.

    Example:
      >>> class Halves(Partitioner):
      ...     def _num_shards(self, shape, dtype):
      ...         return 2
      >>> Halves()((10, 3), "float32")
      [2, 1]
    """

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        """Partitions ``shape``.

        Args:
          shape: the parameter's shape (a ``torch.Size``, tuple or list of non-negative ints).
          dtype: the parameter's dtype: a ``torch.dtype``, a NumPy dtype or a name such as
            ``"float32"``.
          axis: the axis to partition along; feedline partitions along axis 0 only.

        Returns:
          The number of partitions on each axis: ``[n, 1, 1, ...]``, ``n >= 1``.

        Raises:
          ValueError: if ``axis`` is not 0, the shape is a scalar's or has a negative or
            non-integer dimension, or the dtype is not known.
        """
        if axis != 0:
            raise ValueError(
                f"{type(self).__name__} was asked to partition along axis {axis}; feedline "
                "partitions parameters along axis 0 (rows) only"
            )
        dims = _check_shape(shape)
        num = int(self._num_shards(dims, dtype))
        return [max(1, num)] + [1] * (len(dims) - 1)

    def _num_shards(self, shape: tuple[int, ...], dtype: Any) -> int:
        """Returns the number of shards along axis 0 for a checked ``shape`` (at least 1 row)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _num_shards(shape, dtype)")


class FixedShardsPartitioner(Partitioner):
    """Splits every parameter into ``num_shards`` shards, or one per row if it has fewer rows.

    Args:
      num_shards: the number of shards, a positive int.

    Raises:
      ValueError: if ``num_shards`` is not a positive int.

    Example:
      >>> FixedShardsPartitioner(num_shards=2)((10, 3), "float32")
      [2, 1]
      >>> FixedShardsPartitioner(num_shards=4)((3,), "float32")
      [3]
    """

    def __init__(self, num_shards: int) -> None:
        self._num_shards_arg = _positive_int("num_shards", num_shards)

    def __repr__(self) -> str:
        return f"FixedShardsPartitioner(num_shards={self._num_shards_arg})"

    def _num_shards(self, shape: tuple[int, ...], dtype: Any) -> int:
        del dtype
        return min(self._num_shards_arg, shape[0])


class MinSizePartitioner(Partitioner):
    """Makes as many shards as it can while each holds at least ``min_shard_bytes``.

    The number of shards is ``ceil(total_bytes / min_shard_bytes)``, at most ``max_shards`` and at
    most the number of rows, at least 1.

    Args:
      min_shard_bytes: the least bytes of a shard; 256 KiB by default.
      max_shards: the most shards; 1 by default (no partitioning), as in TensorFlow.
      bytes_per_string: the bytes counted per element of a string (or object) parameter.

    Raises:
      ValueError: if an argument is not a positive int.

    Example:
      >>> MinSizePartitioner(min_shard_bytes=4, max_shards=2)((6, 1), "float32")
      [2, 1]
      >>> MinSizePartitioner(min_shard_bytes=4, max_shards=10)((6, 1), "float32")
      [6, 1]
      >>> MinSizePartitioner(max_shards=4)((1024, 1024), "float32")  # 4 MiB / 256 KiB = 16
      [4, 1]
    """

    def __init__(
        self, min_shard_bytes: int = 256 << 10, max_shards: int = 1, bytes_per_string: int = 16
    ) -> None:
        self._min_shard_bytes = _positive_int("min_shard_bytes", min_shard_bytes)
        self._max_shards = _positive_int("max_shards", max_shards)
        self._bytes_per_string = _positive_int("bytes_per_string", bytes_per_string)

    def __repr__(self) -> str:
        return (
            f"MinSizePartitioner(min_shard_bytes={self._min_shard_bytes}, "
            f"max_shards={self._max_shards}, bytes_per_string={self._bytes_per_string})"
        )

    def _num_shards(self, shape: tuple[int, ...], dtype: Any) -> int:
        total_bytes = _num_elements(shape) * _element_size(dtype, self._bytes_per_string)
        by_size = -(-total_bytes // self._min_shard_bytes)
        return max(1, min(shape[0], self._max_shards, by_size))


class MaxSizePartitioner(Partitioner):
    """Makes as few shards as it can while each holds at most ``max_shard_bytes``.

    A shard holds whole rows: ``max_shard_bytes // row_bytes`` of them, at least one (a single row
    larger than ``max_shard_bytes`` is a shard of its own). ``max_shards``, when given, takes
    precedence, and shards may then be larger than ``max_shard_bytes``.

    Args:
      max_shard_bytes: the most bytes of a shard.
      max_shards: the most shards, or ``None`` for no limit.
      bytes_per_string: the bytes counted per element of a string (or object) parameter.

    Raises:
      ValueError: if an argument is not a positive int (or ``None`` for ``max_shards``).

    Example:
      >>> MaxSizePartitioner(max_shard_bytes=4)((6, 1), "float32")
      [6, 1]
      >>> MaxSizePartitioner(max_shard_bytes=4, max_shards=2)((6, 1), "float32")
      [2, 1]
      >>> MaxSizePartitioner(max_shard_bytes=1024)((6, 1), "float32")
      [1, 1]
    """

    def __init__(
        self, max_shard_bytes: int, max_shards: int | None = None, bytes_per_string: int = 16
    ) -> None:
        self._max_shard_bytes = _positive_int("max_shard_bytes", max_shard_bytes)
        self._max_shards = None if max_shards is None else _positive_int("max_shards", max_shards)
        self._bytes_per_string = _positive_int("bytes_per_string", bytes_per_string)

    def __repr__(self) -> str:
        return (
            f"MaxSizePartitioner(max_shard_bytes={self._max_shard_bytes}, "
            f"max_shards={self._max_shards}, bytes_per_string={self._bytes_per_string})"
        )

    def _num_shards(self, shape: tuple[int, ...], dtype: Any) -> int:
        row_bytes = _num_elements(shape[1:]) * _element_size(dtype, self._bytes_per_string)
        rows_per_shard = max(1, self._max_shard_bytes // row_bytes) if row_bytes else shape[0]
        num = -(-shape[0] // max(1, rows_per_shard))
        if self._max_shards is not None:
            num = min(self._max_shards, num)
        return num


def shard_rows(num_rows: int, num_shards: int) -> list[int]:
    """Returns how many rows each of ``num_shards`` shards holds; the first shards get one more.

    Args:
      num_rows: the rows of the whole parameter, a non-negative int.
      num_shards: the number of shards, a positive int (shards may be empty when it exceeds
        ``num_rows``; the partitioners never ask for more shards than rows).

    Raises:
      ValueError: if ``num_rows`` is negative or ``num_shards`` is not positive.

    Example:
      >>> shard_rows(13, 5)
      [3, 3, 3, 2, 2]
      >>> shard_rows(6, 3)
      [2, 2, 2]
    """
    num_rows = _non_negative_int("num_rows", num_rows)
    num_shards = _positive_int("num_shards", num_shards)
    base, extra = divmod(num_rows, num_shards)
    return [base + 1] * extra + [base] * (num_shards - extra)


def shard_offsets(num_rows: int, num_shards: int) -> list[int]:
    """Returns the first row of each shard, as ``shard_rows`` splits the rows.

    Shard ``i`` holds rows ``offsets[i]`` to ``offsets[i] + shard_rows(...)[i]`` (exclusive).

    Args:
      num_rows: the rows of the whole parameter, a non-negative int.
      num_shards: the number of shards, a positive int.

    Raises:
      ValueError: if ``num_rows`` is negative or ``num_shards`` is not positive.

    Example:
      >>> shard_offsets(13, 5)
      [0, 3, 6, 9, 11]
    """
    offsets = []
    start = 0
    for rows in shard_rows(num_rows, num_shards):
        offsets.append(start)
        start += rows
    return offsets


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")
    return int(value)


def _non_negative_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative int; got {value!r}")
    return int(value)


def _check_shape(shape: Any) -> tuple[int, ...]:
    try:
        dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise ValueError(
            f"shape must be a sequence of ints (a torch.Size, tuple or list); got {shape!r}"
        ) from None
    if any(d < 0 for d in dims):
        raise ValueError(f"shape has a negative dimension: {dims}")
    if not dims:
        raise ValueError(
            "cannot partition a scalar (shape ()) along axis 0; partitioners split parameters "
            "of rank 1 or more"
        )
    return dims


def _num_elements(dims: Sequence[int]) -> int:
    count = 1
    for d in dims:
        count *= d
    return count


def _element_size(dtype: Any, bytes_per_string: int) -> int:
    """Bytes per element of ``dtype`` (torch, NumPy or a name); a string is ``bytes_per_string``."""
    if dtype is None:
        raise ValueError("dtype is None: give the parameter's dtype, for example torch.float32")
    if type(dtype).__module__ == "torch":  # a torch.dtype, recognised without importing torch
        return int(dtype.itemsize)
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.").removeprefix("tf.")
        if name in _STRING_NAMES:
            return bytes_per_string
        if name in _EXTRA_ITEMSIZES:
            return _EXTRA_ITEMSIZES[name]
        dtype = name
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        raise ValueError(
            f"unknown dtype {dtype!r}: use a torch.dtype, a NumPy dtype or a name such as "
            "'float32' or 'string'"
        ) from None
    if np_dtype.kind in "USO":
        return bytes_per_string
    return int(np_dtype.itemsize)
