"""Tests of feedline/distribute/experimental/partitioners.py: TensorFlow's documented tables."""

from __future__ import annotations

import doctest
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from feedline.distribute import experimental
from feedline.distribute.experimental import partitioners
from feedline.distribute.experimental.partitioners import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
    Partitioner,
    shard_offsets,
    shard_rows,
)

# (partitioner, shape, dtype, expected partitions): the examples of TensorFlow's docstrings and
# tests (sharded_variable.py, partitioned_variables.py), then rows, bytes and limits at the edges.
TABLE = [
    # FixedShardsPartitioner: min(num_shards, rows).
    (FixedShardsPartitioner(num_shards=2), (10, 3), "float32", [2, 1]),
    (FixedShardsPartitioner(num_shards=5), (13,), "float32", [5]),
    (FixedShardsPartitioner(num_shards=4), (3, 2), "float32", [3, 1]),
    (FixedShardsPartitioner(num_shards=3), (9, 2, 2), "int64", [3, 1, 1]),
    # MinSizePartitioner: max(1, min(rows, max_shards, ceil(total_bytes / min_shard_bytes))).
    (MinSizePartitioner(min_shard_bytes=4, max_shards=2), (6, 1), "float32", [2, 1]),
    (MinSizePartitioner(min_shard_bytes=4, max_shards=10), (6, 1), "float32", [6, 1]),
    (MinSizePartitioner(max_shards=100), (1024, 1024), "float32", [16, 1]),  # 4 MiB / 256 KiB
    (MinSizePartitioner(max_shards=4), (1024, 1024), "float32", [4, 1]),
    (MinSizePartitioner(), (1024, 1024), "float32", [1, 1]),  # max_shards defaults to 1
    (MinSizePartitioner(max_shards=100), (1024, 1025), "float32", [17, 1]),  # rounds up
    (MinSizePartitioner(min_shard_bytes=10, max_shards=10), (6, 1), "float32", [3, 1]),
    (MinSizePartitioner(min_shard_bytes=1, max_shards=10), (3, 8), "float64", [3, 1]),  # rows
    (MinSizePartitioner(min_shard_bytes=16, max_shards=10), (8,), "string", [8]),
    (MinSizePartitioner(min_shard_bytes=32, max_shards=10), (8,), "string", [4]),
    (MinSizePartitioner(16, 10, bytes_per_string=4), (8,), "string", [2]),
    # MaxSizePartitioner: ceil(rows / max(1, max_shard_bytes // row_bytes)), at most max_shards.
    (MaxSizePartitioner(max_shard_bytes=4), (6, 1), "float32", [6, 1]),
    (MaxSizePartitioner(max_shard_bytes=4, max_shards=2), (6, 1), "float32", [2, 1]),
    (MaxSizePartitioner(max_shard_bytes=1024), (6, 1), "float32", [1, 1]),
    (MaxSizePartitioner(max_shard_bytes=8), (6, 1), "float32", [3, 1]),
    (MaxSizePartitioner(max_shard_bytes=12), (7, 1), "float32", [3, 1]),  # 3+3+1 rows
    (MaxSizePartitioner(max_shard_bytes=1), (5, 4), "float32", [5, 1]),  # a row per shard
    (MaxSizePartitioner(max_shard_bytes=(64 << 20) - 1), (1_000_000, 64), "float32", [4, 1]),
    (MaxSizePartitioner(max_shard_bytes=48), (6,), "string", [2]),
    (MaxSizePartitioner(48, bytes_per_string=8), (6,), "string", [1]),
]


@pytest.mark.parametrize(("partitioner", "shape", "dtype", "expected"), TABLE)
def test_tensorflow_table(partitioner: Partitioner, shape: tuple, dtype: str, expected: list):
    assert partitioner(shape, dtype) == expected
    assert partitioner(torch.Size(shape), dtype) == expected
    assert partitioner(list(shape), np.dtype(dtype) if dtype != "string" else np.str_) == expected


def test_dtypes_torch_numpy_and_names_agree() -> None:
    p = MaxSizePartitioner(max_shard_bytes=8)
    # 8 bytes a shard over 8 rows of one element: the element size decides the shards.
    by_size = {1: [1], 2: [2], 4: [4], 8: [8]}
    cases = [
        (torch.float32, 4),
        (torch.float64, 8),
        (torch.bfloat16, 2),
        (torch.float16, 2),
        (torch.int8, 1),
        (torch.bool, 1),
        (torch.int64, 8),
        (np.float32, 4),
        (np.dtype("int16"), 2),
        (np.uint8, 1),
        ("float32", 4),
        ("torch.float64", 8),
        ("bfloat16", 2),
        ("int64", 8),
        ("bool", 1),
        (bytes, 16),
        (object, 16),
        ("string", 16),
    ]
    for dtype, size in cases:
        expected = by_size.get(size, [8])
        assert p((8,), dtype) == expected, (dtype, size)


def test_results_are_whole_rows_and_at_least_one_shard() -> None:
    assert FixedShardsPartitioner(3)((0, 4), "float32") == [1, 1]
    assert MinSizePartitioner(1, 8)((0, 4), "float32") == [1, 1]
    assert MaxSizePartitioner(1)((0, 4), "float32") == [1, 1]
    assert MaxSizePartitioner(1)((5, 0), "float32") == [1, 1]


@pytest.mark.parametrize(
    ("num_rows", "num_shards", "rows", "offsets"),
    [
        (13, 5, [3, 3, 3, 2, 2], [0, 3, 6, 9, 11]),
        (10, 2, [5, 5], [0, 5]),
        (7, 3, [3, 2, 2], [0, 3, 5]),
        (1_000_000, 3, [333_334, 333_333, 333_333], [0, 333_334, 666_667]),
        (6, 1, [6], [0]),
        (2, 4, [1, 1, 0, 0], [0, 1, 2, 2]),
        (0, 2, [0, 0], [0, 0]),
    ],
)
def test_shard_rows_and_offsets(num_rows, num_shards, rows, offsets) -> None:
    assert shard_rows(num_rows, num_shards) == rows
    assert shard_offsets(num_rows, num_shards) == offsets
    assert sum(rows) == num_rows


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FixedShardsPartitioner(0), "num_shards must be a positive int; got 0"),
        (lambda: FixedShardsPartitioner(2.5), "num_shards must be a positive int; got 2.5"),
        (lambda: MinSizePartitioner(min_shard_bytes=0), "min_shard_bytes .* got 0"),
        (lambda: MinSizePartitioner(max_shards=-1), "max_shards .* got -1"),
        (lambda: MinSizePartitioner(bytes_per_string=0), "bytes_per_string .* got 0"),
        (lambda: MinSizePartitioner(max_shards=None), "max_shards .* got None"),
        (lambda: MaxSizePartitioner(max_shard_bytes=0), "max_shard_bytes .* got 0"),
        (lambda: MaxSizePartitioner(4, max_shards=0), "max_shards .* got 0"),
        (lambda: MaxSizePartitioner(4, bytes_per_string=-2), "bytes_per_string .* got -2"),
        (lambda: shard_rows(-1, 2), "num_rows must be a non-negative int; got -1"),
        (lambda: shard_rows(4, 0), "num_shards must be a positive int; got 0"),
        (lambda: shard_offsets(4, True), "num_shards must be a positive int; got True"),
    ],
)
def test_bad_arguments(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_calls() -> None:
    p = FixedShardsPartitioner(2)
    with pytest.raises(ValueError, match=r"along axis 1; feedline partitions .* axis 0"):
        p((4, 4), "float32", axis=1)
    with pytest.raises(ValueError, match=r"cannot partition a scalar \(shape \(\)\)"):
        p((), "float32")
    with pytest.raises(ValueError, match=r"negative dimension: \(4, -1\)"):
        p((4, -1), "float32")
    with pytest.raises(ValueError, match="sequence of ints"):
        p((4.5, 2), "float32")
    with pytest.raises(ValueError, match="unknown dtype 'floot32'"):
        MinSizePartitioner()((4,), "floot32")
    with pytest.raises(ValueError, match="dtype is None"):
        MaxSizePartitioner(4)((4,), None)


def test_subclass_hook_and_pickling() -> None:
    class Halves(Partitioner):
        def _num_shards(self, shape, dtype):
            return 2

    assert Halves()((10, 3, 2), torch.float32) == [2, 1, 1]
    with pytest.raises(NotImplementedError, match="Partitioner must implement _num_shards"):
        Partitioner()((4,), "float32")
    p = pickle.loads(pickle.dumps(MinSizePartitioner(4, 2)))
    assert p((6, 1), torch.float32) == [2, 1]
    assert repr(p) == "MinSizePartitioner(min_shard_bytes=4, max_shards=2, bytes_per_string=16)"


def test_exported_and_torch_free() -> None:
    assert experimental.partitioners is partitioners
    assert "partitioners" in experimental.__all__
    # feedline.distribute imports torch; the module itself does not, so load it on its own.
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('p', {partitioners.__file__!r})\n"
        "p = importlib.util.module_from_spec(spec); spec.loader.exec_module(p)\n"
        "assert p.MinSizePartitioner(4, 2)((6, 1), 'float32') == [2, 1]\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_doctests() -> None:
    results = doctest.testmod(partitioners)
    assert results.attempted > 0
    assert results.failed == 0
