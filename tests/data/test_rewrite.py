"""Tests of ``Dataset._with_inputs`` (feedline/data/dataset.py): every operation rewritten over
other inputs yields what the same operation built over those inputs yields."""

from __future__ import annotations

import pathlib
import sqlite3
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import feedline.data  # noqa: F401 - imports every operation
from feedline.data import (
    Dataset,
    FixedLengthRecordDataset,
    Options,
    TextLineDataset,
    TFRecordDataset,
)
from feedline.data.dataset import walk
from feedline.data.experimental import (
    CsvDataset,
    NpyDataset,
    ParquetDataset,
    Reducer,
    SqlDataset,
    assert_cardinality,
    choose_from_datasets,
    from_list,
    group_by_reducer,
    prefetch_to_device,
    sample_from_datasets,
)
from feedline.errors import InvalidArgumentError
from feedline.io import TFRecordWriter
from tests.data.checkpoint_utils import all_operations, assert_checkpointing, assert_sequences_equal

Build = Callable[..., Dataset]


def _old() -> Dataset:
    return Dataset.range(10)


def _new() -> Dataset:
    return Dataset.range(10, 20)


_SCRATCH = tempfile.TemporaryDirectory(prefix="feedline-test-rewrite-")


def _deterministic() -> Options:
    options = Options()
    options.deterministic = True
    return options


# name -> (build, number of inputs): ``build(*inputs)`` over ``range(10)``-like inputs.
ONE_INPUT: dict[str, Build] = {
    "batch": lambda d: d.batch(3),
    "batch_drop": lambda d: d.batch(3, drop_remainder=True),
    "padded_batch": lambda d: d.map(lambda x: np.full(x % 3, x)).padded_batch(3),
    "unbatch": lambda d: d.batch(4).unbatch(),
    "ragged_batch": lambda d: d.map(lambda x: np.full(x % 3, x)).ragged_batch(3),
    "sparse_batch": lambda d: d.map(lambda x: np.full(x % 3, x)).sparse_batch(3, [None]),
    "rebatch": lambda d: d.batch(4).rebatch(3),
    "cache": lambda d: d.map(lambda x: x * 2).cache(),
    "enumerate": lambda d: d.enumerate(start=5),
    "filter": lambda d: d.filter(lambda x: x % 3 == 0),
    "flat_map": lambda d: d.flat_map(lambda x: Dataset.from_tensors(x).repeat(2)),
    "interleave": lambda d: d.interleave(
        lambda x: Dataset.from_tensors(x).repeat(3), cycle_length=2, block_length=2
    ),
    "interleave_parallel": lambda d: d.interleave(
        lambda x: Dataset.from_tensors(x).repeat(2), cycle_length=3, num_parallel_calls=2
    ),
    "ignore_errors": lambda d: d.ignore_errors(),
    "map": lambda d: d.map(lambda x: x * 3),
    "map_parallel": lambda d: d.map(lambda x: x + 1, num_parallel_calls=3, deterministic=True),
    "prefetch": lambda d: d.prefetch(2),
    "prefetch_to_device": lambda d: d.apply(prefetch_to_device("/cpu:0", 2)),
    "repeat": lambda d: d.repeat(2),
    "scan": lambda d: d.scan(np.int64(0), lambda total, x: (total + x, total)),
    "shard": lambda d: d.shard(3, 1),
    "shuffle": lambda d: d.shuffle(4, seed=7),
    "shuffle_streaming": lambda d: d.filter(lambda x: True).shuffle(4, seed=7),
    "skip": lambda d: d.skip(4),
    # A snapshot's directory is keyed by its input's fingerprint: the rewritten one has its own.
    "snapshot": lambda d: d.map(lambda x: x * 2).snapshot(_SCRATCH.name),
    "take": lambda d: d.take(4),
    "take_while": lambda d: d.take_while(lambda x: x % 10 < 7),
    "unique": lambda d: d.map(lambda x: x // 3).unique(),
    "with_options": lambda d: d.with_options(_deterministic()),
    "zip_one": lambda d: Dataset.zip((d,)),
    "assert_cardinality": lambda d: d.apply(assert_cardinality(10)),
    "rejection_resample": lambda d: d.rejection_resample(lambda x: x % 2, [0.3, 0.7], seed=3),
    "rejection_resample_given": lambda d: d.rejection_resample(
        lambda x: x % 3, [0.2, 0.3, 0.5], [1 / 3, 1 / 3, 1 / 3], seed=3
    ),
    "window": lambda d: d.window(3, shift=2).flat_map(lambda w: w.map(lambda x: x * 2)),
    "window_batched": lambda d: d.window(3, shift=1).flat_map(lambda w: w.batch(3)),
    "group_by_window": lambda d: d.group_by_window(
        lambda x: x % 3, lambda key, w: w.batch(2), window_size=2
    ),
    "bucket_by_sequence_length": lambda d: d.map(
        lambda x: np.full(x % 5, x)
    ).bucket_by_sequence_length(len, [2, 4], [2, 2, 3]),
    "group_by_reducer": lambda d: d.apply(
        group_by_reducer(lambda x: x % 3, Reducer(lambda k: k, lambda s, x: s + x, lambda s: s))
    ),
}

SEVERAL_INPUTS: dict[str, tuple[Build, int]] = {
    "concatenate": (lambda a, b: a.concatenate(b), 2),
    "zip_tuple": (lambda a, b: Dataset.zip((a, b)), 2),
    "zip_nested": (lambda a, b, c: Dataset.zip({"x": a, "y": (b, {"z": c})}), 3),
    "choose_from_datasets": (
        lambda a, b, c: choose_from_datasets([a, b], c.map(lambda x: x % 2)),
        3,
    ),
    "sample_from_datasets": (
        lambda a, b: sample_from_datasets([a, b], weights=[0.3, 0.7], seed=3),
        2,
    ),
    "sample_from_datasets_weights_dataset": (
        lambda a, b, w: sample_from_datasets(
            [a, b], weights=w.map(lambda x: np.array([x % 2, 1 - x % 2], np.float64)), seed=3
        ),
        3,
    ),
}


def _inputs(count: int, new: bool) -> list[Dataset]:
    base = 100 if new else 0
    return [Dataset.range(base + 10 * k, base + 10 * k + 10) for k in range(count)]


def _values(dataset: Dataset) -> list[Any]:
    return list(dataset)


def _check_rewrite(build: Build, old_inputs: list[Dataset], new_inputs: list[Dataset]) -> None:
    original = build(*old_inputs)
    before = _values(original)  # a pass over the original (it fills caches, counts passes)
    nodes = [(node, node.inputs) for node in walk(original)]
    rewritten = _rebuild(original, dict(zip(map(id, old_inputs), new_inputs, strict=True)))
    expected = _values(build(*new_inputs))
    assert_sequences_equal(_values(rewritten), expected, "rewritten")
    for node, inputs in nodes:  # the original graph is untouched
        assert node.inputs is inputs
    assert_sequences_equal(_values(build(*old_inputs)), before, "the original's output")
    assert len(expected) > 0
    assert not _same(before, expected), "the new inputs should change the output"


def _same(a: list[Any], b: list[Any]) -> bool:
    try:
        assert_sequences_equal(a, b)
    except AssertionError:
        return False
    return True


def _rebuild(dataset: Dataset, replacements: dict[int, Dataset]) -> Dataset:
    """``dataset`` with the sources in ``replacements`` (by id) replaced, through _with_inputs."""
    if id(dataset) in replacements:
        return replacements[id(dataset)]
    inputs = tuple(_rebuild(d, replacements) for d in dataset.inputs)
    if all(a is b for a, b in zip(inputs, dataset.inputs, strict=True)):
        return dataset
    return dataset._with_inputs(inputs)


@pytest.mark.parametrize("name", sorted(ONE_INPUT))
def test_one_input_operation(name: str) -> None:
    _check_rewrite(ONE_INPUT[name], [_old()], [_new()])


@pytest.mark.parametrize("name", sorted(SEVERAL_INPUTS))
def test_several_input_operation(name: str) -> None:
    build, count = SEVERAL_INPUTS[name]
    _check_rewrite(build, _inputs(count, new=False), _inputs(count, new=True))


def test_rewriting_one_of_several_inputs() -> None:
    a, b, c = Dataset.range(3), Dataset.range(3, 6), Dataset.range(100, 103)
    ds = Dataset.zip({"a": a, "b": b})
    out = ds._with_inputs((a, c))
    assert [(int(e["a"]), int(e["b"])) for e in out] == [(0, 100), (1, 101), (2, 102)]
    assert [(int(e["a"]), int(e["b"])) for e in ds] == [(0, 3), (1, 4), (2, 5)]


@pytest.mark.parametrize(
    "make",
    [
        lambda: Dataset.range(4),
        lambda: Dataset.from_tensors(np.arange(3)),
        lambda: Dataset.from_tensor_slices({"a": np.arange(4)}),
        lambda: Dataset.from_generator(lambda: iter(range(4)), output_types=np.int64),
    ],
    ids=["range", "from_tensors", "from_tensor_slices", "from_generator"],
)
def test_a_source_copies_itself(make: Callable[[], Dataset]) -> None:
    source = make()
    copy = source._with_inputs(())
    assert copy is not source and type(copy) is type(source)
    assert_sequences_equal(list(copy), list(source))
    assert copy.element_spec == source.element_spec


@pytest.mark.parametrize(
    "make",
    [
        lambda: Dataset.counter(3, 2),
        lambda: Dataset.random(seed=5),
        lambda: from_list([np.arange(k) for k in range(4)]),
    ],
    ids=["counter", "random", "from_list"],
)
def test_a_new_source_copies_itself(make: Callable[[], Dataset]) -> None:
    source = make()
    copy = source._with_inputs(())
    assert copy is not source and type(copy) is type(source)
    assert_sequences_equal(list(copy.take(5)), list(source.take(5)))
    assert copy.element_spec == source.element_spec


# -- caches of the node ---------------------------------------------------------------------


def test_a_filled_cache_is_not_shared_with_the_rewritten_copy() -> None:
    cached = Dataset.range(5).map(lambda x: x * 10).cache()
    assert [int(x) for x in cached] == [0, 10, 20, 30, 40]  # fills the cache
    assert cached._random_access() is not None
    copy = cached._with_inputs((Dataset.range(5, 8).map(lambda x: x * 10),))
    assert copy._store is not cached._store
    assert copy._random_access() is None  # empty until its own first pass
    assert [int(x) for x in copy] == [50, 60, 70]
    assert [int(x) for x in copy] == [50, 60, 70]
    assert [int(x) for x in cached] == [0, 10, 20, 30, 40]


def test_a_file_cache_copy_has_its_own_store(tmp_path: pathlib.Path) -> None:
    cached = Dataset.range(3).cache(str(tmp_path / "c"))
    copy = cached._with_inputs((Dataset.range(3),))
    assert copy._store is not cached._store
    assert copy._store._dataset is copy.inputs[0]
    assert [int(x) for x in copy] == [0, 1, 2]


def test_options_are_merged_again_from_the_new_inputs() -> None:
    ds = Dataset.range(4).map(lambda x: x)
    assert ds.options().deterministic is None  # cached on ds
    options = Options()
    options.deterministic = False
    copy = ds._with_inputs((Dataset.range(4).with_options(options),))
    assert copy.options().deterministic is False
    assert ds.options().deterministic is None


def test_the_copy_counts_its_own_passes() -> None:
    def make(source: Dataset) -> Dataset:
        return source.shuffle(10, seed=1)

    ds = make(Dataset.range(10))
    first_pass = [int(x) for x in ds]
    [int(x) for x in ds]  # a second pass: another order
    copy = ds._with_inputs((Dataset.range(10),))
    assert [int(x) for x in copy] == first_pass
    assert copy._passes_lock is not ds._passes_lock


def test_a_lazy_spec_is_kept_over_inputs_of_the_same_spec() -> None:
    calls: list[int] = []

    def fn(x: Any) -> Any:
        calls.append(1)
        return x * 2

    ds = Dataset.range(4).map(fn)
    assert ds.element_spec.dtype == np.int64
    n = len(calls)
    copy = ds._with_inputs((Dataset.range(10, 14),))
    assert copy.element_spec == ds.element_spec
    assert len(calls) == n  # not computed again


def test_a_lazy_spec_is_computed_again_over_inputs_of_another_spec() -> None:
    ds = Dataset.range(4).map(lambda x: x * 2)
    assert ds.element_spec.dtype == np.int64
    copy = ds._with_inputs((Dataset.from_tensor_slices(np.arange(4, dtype=np.float32)),))
    assert copy.element_spec.dtype == np.float32
    assert [float(x) for x in copy] == [0.0, 2.0, 4.0, 6.0]


def test_a_fixed_spec_over_inputs_of_another_spec_is_an_error() -> None:
    ds = Dataset.range(4).batch(2)
    with pytest.raises(InvalidArgumentError, match="rewrites must keep the inputs' element specs"):
        ds._with_inputs((Dataset.from_tensor_slices(np.arange(4, dtype=np.float32)),))


def test_the_number_and_type_of_inputs_are_checked() -> None:
    ds = Dataset.range(4).concatenate(Dataset.range(2))
    with pytest.raises(InvalidArgumentError, match="has 2 inputs; a rewrite must give as many"):
        ds._with_inputs((Dataset.range(3),))
    with pytest.raises(InvalidArgumentError, match="expects Dataset inputs, got list"):
        ds._with_inputs((Dataset.range(3), [1, 2]))  # type: ignore[arg-type]


def test_a_rewritten_dataset_checkpoints() -> None:
    def make() -> Dataset:
        ds = Dataset.range(10).map(lambda x: x * 2).shuffle(4, seed=2).batch(3).prefetch(1)
        return _rebuild(ds, {id(ds.inputs[0].inputs[0].inputs[0].inputs[0]): _new()})

    assert sorted(int(v) for b in make() for v in b) == list(range(20, 40, 2))
    assert_checkpointing(make)


# -- readers --------------------------------------------------------------------------------


def _text(path: pathlib.Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def _reader_cases(tmp_path: pathlib.Path) -> dict[str, tuple[Build, list[str], list[str]]]:
    """name -> (reader over a names Dataset, old files, new files)."""
    text = [_text(tmp_path / f"t{k}.txt", [f"line{k}.{j}" for j in range(3)]) for k in range(2)]
    csv = [_text(tmp_path / f"c{k}.csv", [f"{k},{j}" for j in range(3)]) for k in range(2)]
    records = []
    for k in range(2):
        path = str(tmp_path / f"r{k}.tfrecord")
        with TFRecordWriter(path) as writer:
            for j in range(3):
                writer.write(f"rec{k}.{j}".encode())
        records.append(path)
    npy = []
    for k in range(2):
        path = str(tmp_path / f"a{k}.npy")
        np.save(path, np.arange(4 * k, 4 * k + 4))
        npy.append(path)
    parquet = []
    for k in range(2):
        path = str(tmp_path / f"p{k}.parquet")
        pq.write_table(pa.table({"v": np.arange(3 * k, 3 * k + 3)}), path)
        parquet.append(path)
    fixed = []
    for k in range(2):
        path = tmp_path / f"f{k}.bin"
        path.write_bytes(bytes(range(6 * k, 6 * k + 6)))
        fixed.append(str(path))
    return {
        "text_line": (TextLineDataset, text[:1], text[1:]),
        "fixed_length": (lambda names: FixedLengthRecordDataset(names, 2), fixed[:1], fixed[1:]),
        "tfrecord": (TFRecordDataset, records[:1], records[1:]),
        "csv": (lambda names: CsvDataset(names, [np.int64, np.int64]), csv[:1], csv[1:]),
        "npy": (NpyDataset, npy[:1], npy[1:]),
        "parquet": (ParquetDataset, parquet[:1], parquet[1:]),
    }


@pytest.mark.parametrize("name", ["text_line", "fixed_length", "tfrecord", "csv", "npy", "parquet"])
def test_reader_over_a_names_dataset(tmp_path: pathlib.Path, name: str) -> None:
    build, old, new = _reader_cases(tmp_path)[name]
    _check_rewrite(
        build, [Dataset.from_tensor_slices(np.array(old))], [Dataset.from_tensor_slices(new)]
    )


@pytest.mark.parametrize("name", ["text_line", "fixed_length", "tfrecord", "csv", "npy", "parquet"])
def test_reader_given_names_copies_itself(tmp_path: pathlib.Path, name: str) -> None:
    build, old, _ = _reader_cases(tmp_path)[name]
    reader = build(old)
    assert reader.inputs == ()
    assert_sequences_equal(list(reader._with_inputs(())), list(reader))


def test_list_files_copies_itself(tmp_path: pathlib.Path) -> None:
    for k in range(3):
        _text(tmp_path / f"f{k}.txt", [])
    files = Dataset.list_files(str(tmp_path / "*.txt"), seed=4)
    assert_sequences_equal(
        list(files._with_inputs(())), list(Dataset.list_files(str(tmp_path / "*.txt"), seed=4))
    )


def test_sql_dataset_copies_itself(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "t.db")
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (v INTEGER)")
        db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(4)])
    db.close()
    ds = SqlDataset("sqlite", path, "SELECT v FROM t ORDER BY v", np.int64)
    copy = ds._with_inputs(())
    assert copy is not ds and copy.inputs == ()
    assert_sequences_equal(list(copy), list(ds))


# -- every operation is covered ---------------------------------------------------------------


def test_every_operation_is_rewritten_by_some_case(tmp_path: pathlib.Path) -> None:
    datasets: list[Dataset] = [build(_old()) for build in ONE_INPUT.values()]
    datasets += [build(*_inputs(n, False)) for build, n in SEVERAL_INPUTS.values()]
    for build, old, _ in _reader_cases(tmp_path).values():
        datasets.append(build(Dataset.from_tensor_slices(np.array(old))))
    covered = {type(node) for ds in datasets for node in walk(ds) if node.inputs}
    found = all_operations()
    sources = {"RangeDataset", "TensorDataset", "TensorSliceDataset", "GeneratorDataset"}
    sources |= {"ListFilesDataset", "TorchMapStyleDataset", "TorchIterableStyleDataset"}
    sources |= {"CounterDataset", "RandomDataset", "ListDataset"}
    sources |= {"LoadDataset", "LoadWhileWritingDataset", "SnapshotShardDataset"}
    sources |= {"SnapshotShardListDataset"}
    sources |= {"ElementsDataset"}  # the windows that window and group_by_window hand out
    sources |= {"SqlDataset"}  # a source of rows, not of files: see test_sql_dataset_copies_itself
    sources |= {"DatasetSliceDataset"}
    missing = sorted(c.__name__ for c in found - covered if c.__name__ not in sources)
    assert not missing, f"operations without a rewrite case: {missing}"
