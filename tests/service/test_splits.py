"""Tests of feedline/service/splits.py and _split_source.py: split plans, split cursors, and
split sources on workers."""

from __future__ import annotations

import dataclasses
import doctest
import json
import os
import pathlib
import pickle
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

import feedline.service.splits as split_module
import feedline.service.worker.split_source as split_source_module
from feedline.data import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset
from feedline.data.dataset import DatasetIterator, IteratorContext, walk
from feedline.data.readers import NpyDataset, TextLineDataset, TFRecordDataset
from feedline.errors import FailedPreconditionError, InvalidArgumentError
from feedline.io import TFRecordWriter
from feedline.service.splits import SplitCursor, SplitPlan, split_plan
from feedline.service.worker.split_source import SplitSourceDataset, with_split_source

# -- a dispatcher and its workers, in one process ----------------------------------------------


class FakeDispatcher:
    """Hands out splits from one SplitCursor per repetition, to whichever worker asks first."""

    def __init__(self, plan: SplitPlan, num_workers: int = 2, split_size: int | None = None):
        self.plan = plan
        self.num_workers = num_workers
        self.split_size = split_size
        self.cursors: dict[int, SplitCursor] = {}
        self.handed: list[tuple[int, list[int] | None]] = []  # (repetition, split), in order
        self._lock = threading.Lock()

    def next_split(self, repetition: int) -> list[int] | None:
        with self._lock:
            cursor = self.cursors.get(repetition)
            if cursor is None:
                cursor = SplitCursor.start(self.plan, repetition, self.num_workers)
                if self.split_size is not None:
                    cursor = dataclasses.replace(cursor, split_size=self.split_size)
                self.cursors[repetition] = cursor
            split = cursor.next()
            self.handed.append((repetition, split))
            return split


class Worker:
    """One worker's provider: forwards to the dispatcher and records what this worker got."""

    def __init__(self, dispatcher: FakeDispatcher) -> None:
        self.dispatcher = dispatcher
        self.splits: list[tuple[int, list[int]]] = []

    def next_split(self, repetition: int) -> Sequence[int] | None:
        split = self.dispatcher.next_split(repetition)
        if split is not None:
            self.splits.append((repetition, split))
        return split


def _workers(
    dataset: Dataset, num_workers: int = 2, split_size: int | None = None
) -> tuple[FakeDispatcher, list[Worker], list[Dataset]]:
    dispatcher = FakeDispatcher(split_plan(dataset), num_workers, split_size)
    workers = [Worker(dispatcher) for _ in range(num_workers)]
    return dispatcher, workers, [with_split_source(dataset, w) for w in workers]


def _alternate(*iterators: Iterator[Any]) -> list[list[Any]]:
    """Pulls one element from each iterator in turn until all are exhausted."""
    out: list[list[Any]] = [[] for _ in iterators]
    live = list(range(len(iterators)))
    while live:
        for k in list(live):
            try:
                out[k].append(next(iterators[k]))
            except StopIteration:
                live.remove(k)
    return out


def _ints(elements: list[Any]) -> list[int]:
    return [int(e) for e in elements]


def _record_files(tmp_path: pathlib.Path, num_files: int, per_file: int) -> list[str]:
    paths = []
    for k in range(num_files):
        path = str(tmp_path / f"part{k}.tfrecord")
        with TFRecordWriter(path) as writer:
            for i in range(per_file):
                writer.write(f"{k}-{i}".encode())
        paths.append(path)
    return paths


def _text_files(tmp_path: pathlib.Path, num_files: int, per_file: int) -> list[str]:
    paths = []
    for k in range(num_files):
        path = tmp_path / f"part{k}.txt"
        path.write_text("".join(f"{k}-{i}\n" for i in range(per_file)))
        paths.append(str(path))
    return paths


def _empty_files(tmp_path: pathlib.Path, num_files: int) -> list[str]:
    paths = []
    for k in range(num_files):
        path = tmp_path / f"f{k:02d}.dat"
        path.write_bytes(b"")
        paths.append(str(path))
    return paths


class _EndlessRows(Dataset):
    """A random-access source of infinite or unknown size (none ships with feedline)."""

    def __init__(self, cardinality: int) -> None:
        super().__init__()
        self._n = cardinality
        self._element_spec = Dataset.range(1).element_spec

    def _cardinality(self) -> int:
        return self._n

    def _random_access(self) -> Any:
        return Dataset.range(1)._random_access()


# -- split_plan ---------------------------------------------------------------------------------


def test_split_plan_of_element_sources() -> None:
    assert split_plan(Dataset.range(10)) == SplitPlan(10, False, None, "element")
    assert split_plan(Dataset.range(3, 20, 4)) == SplitPlan(5, False, None, "element")
    slices = Dataset.from_tensor_slices({"a": np.zeros((7, 2)), "b": np.arange(7)})
    assert split_plan(slices) == SplitPlan(7, False, None, "element")


def test_split_plan_looks_through_the_pipeline_to_the_source() -> None:
    dataset = (
        Dataset.range(12)
        .repeat(3)
        .shuffle(5, seed=1)
        .map(lambda x: x + 1)
        .interleave(lambda x: Dataset.range(x), cycle_length=2)
        .batch(4)
        .prefetch(2)
    )
    assert split_plan(dataset) == SplitPlan(12, False, None, "element")


def test_split_plan_of_list_files(tmp_path: pathlib.Path) -> None:
    _empty_files(tmp_path, 5)
    pattern = str(tmp_path / "*.dat")
    assert split_plan(Dataset.list_files(pattern, shuffle=False)) == SplitPlan(
        5, False, None, "file"
    )
    assert split_plan(Dataset.list_files(pattern, seed=7)) == SplitPlan(5, True, 7, "file")
    assert split_plan(Dataset.list_files(pattern)) == SplitPlan(5, True, None, "file")
    # a reader over a Dataset of names is split through that Dataset
    reader = TFRecordDataset(Dataset.list_files(pattern, seed=3)).map(lambda r: r)
    assert split_plan(reader) == SplitPlan(5, True, 3, "file")


def test_split_plan_of_objects_listed_with_their_sizes(s3_bucket: str) -> None:
    from feedline import _fs

    fs, root = _fs.filesystem(s3_bucket)
    for i in range(4):
        fs.pipe(f"{root}/part-{i}.dat", b"x" * (100 * (i + 1)))  # 100 .. 400 bytes: mean 250
    listing = Dataset.list_files(f"{s3_bucket}/part-*.dat", shuffle=False)
    assert listing.mean_bytes == 250
    assert split_plan(listing) == SplitPlan(4, False, None, "file", 250)
    assert split_plan(TFRecordDataset(listing)).unit_bytes == 250


def test_split_plan_of_file_readers(tmp_path: pathlib.Path) -> None:
    records = _record_files(tmp_path, 3, 2)
    lines = _text_files(tmp_path, 4, 2)
    assert split_plan(TFRecordDataset(records).batch(2)) == SplitPlan(3, False, None, "file")
    assert split_plan(TextLineDataset(lines)) == SplitPlan(4, False, None, "file")
    np.save(tmp_path / "a.npy", np.arange(6).reshape(3, 2))
    np.save(tmp_path / "b.npy", np.arange(4).reshape(2, 2))
    npy = NpyDataset([str(tmp_path / "a.npy"), str(tmp_path / "b.npy")])
    assert split_plan(npy) == SplitPlan(5, False, None, "element")  # random-access: rows


def _gen() -> Iterator[int]:
    yield from range(3)


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (
            lambda: Dataset.from_generator(_gen, output_signature=Dataset.range(1).element_spec),
            ["the dataset's source is GeneratorDataset", "parallel_epochs", "list_files"],
        ),
        (
            lambda: Dataset.from_tensors(np.arange(3)).repeat(),
            ["the dataset's source is TensorDataset"],
        ),
        (
            lambda: Dataset.zip(Dataset.range(3), Dataset.from_tensor_slices([1, 2])),
            ["2 sources", "RangeDataset", "TensorSliceDataset", "ZipDataset", "interleave"],
        ),
        (
            lambda: Dataset.range(3).concatenate(Dataset.range(5)).map(lambda x: x),
            ["2 sources", "ConcatenateDataset"],
        ),
        (
            lambda: Dataset.sample_from_datasets([Dataset.range(3), Dataset.range(4)], seed=1),
            ["2 sources", "SampleFromDatasetsDataset"],
        ),
        (
            lambda: (lambda d: Dataset.zip(d, d))(Dataset.range(3)),
            ["source RangeDataset is read by 2 operations", "ZipDataset"],
        ),
        (lambda: _EndlessRows(INFINITE_CARDINALITY).batch(2), ["_EndlessRows", "infinite"]),
        (lambda: _EndlessRows(UNKNOWN_CARDINALITY), ["_EndlessRows", "unknown"]),
    ],
    ids=["generator", "from_tensors", "zip", "concatenate", "sample", "self-zip", "inf", "unk"],
)
def test_unsplittable_datasets_are_refused_with_the_reason(make: Any, words: list[str]) -> None:
    dataset = make()
    for call in (split_plan, lambda d: with_split_source(d, _FixedProvider([0]))):
        with pytest.raises(InvalidArgumentError) as info:
            call(dataset)
        message = str(info.value)
        assert "processing_mode='distributed_epoch'" in message
        assert "ShardingPolicy.OFF" in message
        for word in words:
            assert word in message


def test_reader_over_names_of_an_unsplittable_source_is_refused() -> None:
    spec = TFRecordDataset(["x"]).element_spec
    reader = TFRecordDataset(Dataset.from_generator(lambda: iter([b"x"]), output_signature=spec))
    with pytest.raises(InvalidArgumentError, match="source is GeneratorDataset"):
        split_plan(reader)


def test_split_source_needs_a_source_and_a_provider() -> None:
    dispatcher = FakeDispatcher(SplitPlan(3, False, None))
    with pytest.raises(InvalidArgumentError, match="without inputs"):
        SplitSourceDataset(Dataset.range(3).map(lambda x: x), dispatcher)
    with pytest.raises(InvalidArgumentError, match="next_split"):
        SplitSourceDataset(Dataset.range(3), object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="expected a Dataset"):
        split_plan([1, 2])  # type: ignore[arg-type]


# -- workers ------------------------------------------------------------------------------------


def test_two_workers_see_every_element_once() -> None:
    dataset = Dataset.range(100).map(lambda x: x * 2)
    _, workers, worker_datasets = _workers(dataset, split_size=3)
    got = _alternate(*(iter(d) for d in worker_datasets))
    assert all(got), "each worker gets some splits"
    assert sorted(_ints(got[0] + got[1])) == list(range(0, 200, 2))
    # worker 0 asked first: [0, 1, 2], worker 1 got [3, 4, 5], and so on in turn
    assert workers[0].splits[:2] == [(0, [0, 1, 2]), (0, [6, 7, 8])]
    assert workers[1].splits[:2] == [(0, [3, 4, 5]), (0, [9, 10, 11])]
    assert _ints(got[0][:6]) == [0, 2, 4, 12, 14, 16]


def test_two_workers_in_threads_with_parallel_map_see_every_element_once() -> None:
    dataset = Dataset.range(1000).map(lambda x: x + 1, num_parallel_calls=4).prefetch(4)
    _, _, worker_datasets = _workers(dataset)
    results: list[list[int]] = [[], []]

    def run(k: int) -> None:
        results[k] = _ints(list(worker_datasets[k]))

    threads = [threading.Thread(target=run, args=(k,), name=f"worker{k}") for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(results[0] + results[1]) == list(range(1, 1001))


def test_the_original_dataset_is_unchanged_and_the_source_replaced() -> None:
    source = Dataset.range(10)
    dataset = source.map(lambda x: x * 3).batch(4)
    worker = with_split_source(dataset, FakeDispatcher(split_plan(dataset), 1))
    nodes = list(walk(worker))
    assert source not in nodes
    assert [type(n) for n in nodes if not n.inputs] == [SplitSourceDataset]
    assert worker.element_spec == dataset.element_spec
    assert [b.tolist() for b in worker] == [b.tolist() for b in dataset]
    assert [b.tolist() for b in dataset] == [[0, 3, 6, 9], [12, 15, 18, 21], [24, 27]]


def test_repeat_asks_for_one_repetition_per_epoch() -> None:
    dataset = Dataset.range(10).repeat(2)
    dispatcher, _, (worker,) = _workers(dataset, num_workers=1, split_size=4)
    assert _ints(list(worker)) == list(range(10)) * 2
    repetitions = [r for r, _ in dispatcher.handed]
    assert repetitions == [0, 0, 0, 0, 1, 1, 1, 1]  # 3 splits and None, per repetition
    assert dispatcher.handed[3] == (0, None)


def test_each_pass_is_a_new_repetition() -> None:
    dataset = Dataset.range(5)
    dispatcher, _, (worker,) = _workers(dataset, num_workers=1)
    assert _ints(list(worker)) == [0, 1, 2, 3, 4]
    assert _ints(list(worker)) == [0, 1, 2, 3, 4]
    assert sorted(dispatcher.cursors) == [0, 1]
    unread = iter(worker)  # made, never read: takes no repetition
    del unread
    assert _ints(list(worker)) == [0, 1, 2, 3, 4]
    assert sorted(dispatcher.cursors) == [0, 1, 2]


def test_from_tensor_slices_of_a_dict_under_two_workers() -> None:
    data = {"x": np.arange(40).reshape(20, 2), "label": np.arange(20) % 3}
    dataset = Dataset.from_tensor_slices(data)
    _, _, worker_datasets = _workers(dataset, split_size=2)
    got = _alternate(*(iter(d) for d in worker_datasets))
    rows = sorted(int(e["x"][0]) // 2 for e in got[0] + got[1])
    assert rows == list(range(20))
    for element in got[0] + got[1]:
        i = int(element["x"][0]) // 2
        np.testing.assert_array_equal(element["x"], data["x"][i])
        assert int(element["label"]) == i % 3
    assert worker_datasets[0].element_spec == dataset.element_spec


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_batch_over_a_split_source_gives_the_same_rows(drop_remainder: bool) -> None:
    dataset = Dataset.range(50).batch(8, drop_remainder=drop_remainder)
    _, _, (worker,) = _workers(dataset, num_workers=1, split_size=3)
    got = [b.tolist() for b in worker]
    assert got == [b.tolist() for b in dataset]
    data = {"a": np.arange(26, dtype=np.float32), "b": np.arange(52).reshape(26, 2)}
    dataset = Dataset.from_tensor_slices(data).batch(4, drop_remainder=drop_remainder)
    _, _, (worker,) = _workers(dataset, num_workers=1, split_size=5)
    expected = list(dataset)
    got = list(worker)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g["a"], e["a"])
        np.testing.assert_array_equal(g["b"], e["b"])


def test_split_rows_iterator_has_batchs_fast_path() -> None:
    dataset = Dataset.range(10)
    _, _, (worker,) = _workers(dataset, num_workers=1, split_size=3)
    iterator = iter(worker)
    assert iterator._next_batch is not None
    assert iterator._next_batch(4).tolist() == [0, 1, 2, 3]  # across two splits
    assert int(next(iterator)) == 4
    assert iterator._next_batch(100).tolist() == [5, 6, 7, 8, 9]
    with pytest.raises(StopIteration):
        iterator._next_batch(4)
    with pytest.raises(StopIteration):
        next(iterator)


@pytest.mark.parametrize("shuffle", [False, True])
def test_list_files_under_two_workers_yields_every_name_once(
    tmp_path: pathlib.Path, shuffle: bool
) -> None:
    names = _empty_files(tmp_path, 12)
    dataset = Dataset.list_files(str(tmp_path / "*.dat"), shuffle=shuffle, seed=5)
    dispatcher, _, worker_datasets = _workers(dataset)
    got = _alternate(*(iter(d) for d in worker_datasets))
    assert all(got)
    yielded = [e.item() for e in got[0] + got[1]]
    assert sorted(yielded) == sorted(os.fsencode(n) for n in names)
    assert all(e.shape == () and e.dtype == object for e in got[0] + got[1])
    order = [split[0] for r, split in dispatcher.handed if split is not None]
    assert sorted(order) == list(range(12))
    assert (order != list(range(12))) == shuffle
    if shuffle:  # the same seed, the same order; another repetition, another one
        again = FakeDispatcher(split_plan(dataset))
        assert [again.next_split(0) for _ in range(12)] == [[i] for i in order]
        assert [again.next_split(1) for _ in range(12)] != [[i] for i in order]


def test_tfrecord_reader_under_two_workers_reads_every_record_once(tmp_path: pathlib.Path) -> None:
    paths = _record_files(tmp_path, 5, 4)
    dataset = TFRecordDataset(paths, num_parallel_reads=2).map(lambda r: r)
    _, workers, worker_datasets = _workers(dataset)
    got = _alternate(*(iter(d) for d in worker_datasets))
    assert all(got)
    records = Counter(e.item() for e in got[0] + got[1])
    assert records == Counter(f"{k}-{i}".encode() for k in range(5) for i in range(4))
    # a worker reads its files whole, in file order
    files_of_0 = [split[0] for _, split in workers[0].splits]
    assert [e.item() for e in got[0]] == [f"{k}-{i}".encode() for k in files_of_0 for i in range(4)]


def test_text_line_reader_under_two_workers_in_threads(tmp_path: pathlib.Path) -> None:
    paths = _text_files(tmp_path, 6, 3)
    dataset = TextLineDataset(paths).batch(2)
    _, _, worker_datasets = _workers(dataset)
    results: list[list[bytes]] = [[], []]

    def run(k: int) -> None:
        results[k] = [line for batch in worker_datasets[k] for line in batch.tolist()]

    threads = [threading.Thread(target=run, args=(k,), name=f"reader{k}") for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    expected = [f"{k}-{i}".encode() for k in range(6) for i in range(3)]
    assert Counter(results[0] + results[1]) == Counter(expected)


def test_reader_over_listed_files_and_interleave(tmp_path: pathlib.Path) -> None:
    _record_files(tmp_path, 4, 3)
    pattern = str(tmp_path / "*.tfrecord")
    expected = Counter(f"{k}-{i}".encode() for k in range(4) for i in range(3))
    for dataset in (
        TFRecordDataset(Dataset.list_files(pattern, seed=1)),
        Dataset.list_files(pattern, shuffle=False).interleave(TFRecordDataset, cycle_length=2),
    ):
        _, _, worker_datasets = _workers(dataset)
        got = _alternate(*(iter(d) for d in worker_datasets))
        assert Counter(e.item() for e in got[0] + got[1]) == expected


def test_readers_made_inside_interleave_over_names_read_whole_files(
    tmp_path: pathlib.Path,
) -> None:
    # The names are the source: each split hands a worker whole files, every line once.
    paths = _text_files(tmp_path, 4, 3)
    dataset = Dataset.from_tensor_slices(paths).interleave(
        lambda path: TextLineDataset(path), cycle_length=1
    )
    assert split_plan(dataset) == SplitPlan(4, False, None, "element")
    _, workers, worker_datasets = _workers(dataset, split_size=1)
    got = _alternate(*(iter(d) for d in worker_datasets))
    for worker, lines in zip(workers, got, strict=True):
        files = [k for _, split in worker.splits for k in split]
        assert [e.item().decode() for e in lines] == [f"{k}-{i}" for k in files for i in range(3)]
    assert sorted(k for w in workers for _, split in w.splits for k in split) == [0, 1, 2, 3]


def test_split_source_iterators_cannot_be_checkpointed_or_pickled() -> None:
    worker = with_split_source(Dataset.range(4).batch(2), FakeDispatcher(SplitPlan(4, False, None)))
    iterator = iter(worker)
    next(iterator)
    with pytest.raises(FailedPreconditionError, match="cannot be checkpointed"):
        iterator.get_state()
    with pytest.raises(FailedPreconditionError, match="cannot be checkpointed"):
        iterator.set_state({"input": {}})
    with pytest.raises(TypeError, match="with_split_source on the worker"):
        pickle.dumps(worker)


class _FixedProvider:
    def __init__(self, split: Any) -> None:
        self.split = split

    def next_split(self, repetition: int) -> Any:
        split, self.split = self.split, None
        return split


def test_a_split_that_does_not_fit_the_source_is_an_error() -> None:
    with pytest.raises(FailedPreconditionError, match=r"unit 7 .* outside \[0, 5\)"):
        list(SplitSourceDataset(Dataset.range(5), _FixedProvider([1, 7])))
    with pytest.raises(InvalidArgumentError, match="sequence of unit indices"):
        list(SplitSourceDataset(Dataset.range(5), _FixedProvider([0.5])))
    assert list(SplitSourceDataset(Dataset.range(5), _FixedProvider([]))) == []


def test_split_source_iterator_base_is_initialised() -> None:
    source = SplitSourceDataset(Dataset.range(3), _FixedProvider([2, 0]))
    iterator = source._iterator(IteratorContext(source.options()))
    assert isinstance(iterator, DatasetIterator)
    assert _ints(list(iterator)) == [2, 0]
    assert iterator.repetition == 0
    assert source.cardinality() == UNKNOWN_CARDINALITY


# -- SplitCursor --------------------------------------------------------------------------------


def _drain(cursor: SplitCursor) -> list[list[int]]:
    splits = []
    while (split := cursor.next()) is not None:
        splits.append(split)
    return splits


@pytest.mark.parametrize("num_units", [0, 1, 5, 31, 100, 5000, 100_003])
@pytest.mark.parametrize("num_workers", [0, 1, 2, 7])
def test_split_cursor_covers_every_unit_once(num_units: int, num_workers: int) -> None:
    plan = SplitPlan(num_units, False, None)
    splits = _drain(SplitCursor.start(plan, 0, num_workers))
    assert [i for s in splits for i in s] == list(range(num_units))
    size = min(max(num_units // (16 * max(1, num_workers)), 1), 1024)
    assert all(len(s) == size for s in splits[:-1])
    files = _drain(SplitCursor.start(SplitPlan(num_units, False, None, "file"), 3, num_workers))
    assert [i for s in files for i in s] == list(range(num_units))
    size = min(max(num_units // (16 * max(1, num_workers)), 1), 64)
    assert all(len(s) == size for s in files[:-1])


def test_split_cursor_sizes() -> None:
    assert SplitCursor.start(SplitPlan(100, False, None), 0, 2).split_size == 3
    assert SplitCursor.start(SplitPlan(10, False, None), 0, 2).split_size == 1
    assert SplitCursor.start(SplitPlan(10**7, False, None), 0, 4).split_size == 1024
    # Files: one to a split while there are few, then several, at most 64.
    assert SplitCursor.start(SplitPlan(20, False, None, "file"), 0, 2).split_size == 1
    assert SplitCursor.start(SplitPlan(100, False, None, "file"), 0, 2).split_size == 3
    assert SplitCursor.start(SplitPlan(10_000, False, None, "file"), 0, 2).split_size == 64
    assert SplitCursor.start(SplitPlan(10**7, False, None, "file"), 0, 4).split_size == 64


@pytest.mark.parametrize(
    ("unit_bytes", "num_units", "num_workers", "size"),
    [
        (None, 10_000, 1, 64),  # sizes not known (a local listing): 64 files at most
        (10, 10_000, 1, 625),  # tiny objects: a sixteenth of the worker's share
        (10, 10**6, 4, 1024),  # at most 1024, as elements
        (100_000, 10**6, 4, 671),  # 100 kB images: 64 MiB a split
        (1 << 20, 10**6, 4, 64),  # 1 MiB: 64 files, as without sizes
        (100 << 20, 10**6, 4, 64),  # large files: never fewer than 64 at most
        (10, 20, 2, 1),  # few files still go one to a split
    ],
)
def test_splits_of_files_of_known_size_hold_about_64_mib(
    unit_bytes: int | None, num_units: int, num_workers: int, size: int
) -> None:
    plan = SplitPlan(num_units, False, None, "file", unit_bytes)
    assert SplitCursor.start(plan, 0, num_workers).split_size == size
    # Element plans do not look at it.
    assert SplitCursor.start(SplitPlan(10**7, False, None), 0, 4).split_size == 1024


def test_a_plan_journaled_without_unit_bytes_reads_back() -> None:
    old = {"num_units": 5, "shuffle": True, "seed": 3, "unit": "file"}
    assert SplitPlan.from_json(old) == SplitPlan(5, True, 3, "file")
    assert SplitPlan(5, True, 3, "file").to_json() == old  # as before, where not known
    sized = SplitPlan(5, True, 3, "file", 4096)
    assert SplitPlan.from_json(sized.to_json()) == sized
    with pytest.raises(InvalidArgumentError, match="unit_bytes"):
        SplitPlan(5, True, 3, "file", -1)
    with pytest.raises(InvalidArgumentError, match="missing"):
        SplitPlan.from_json({"num_units": 5, "shuffle": True, "seed": 3})
    with pytest.raises(InvalidArgumentError, match="missing"):  # a cursor's fields stay required
        SplitCursor.from_json({"num_units": 5, "split_size": 1, "seed": None})


@pytest.mark.parametrize("num_units", [2, 50, 3000])
def test_shuffled_split_cursor_is_a_permutation_per_repetition(num_units: int) -> None:
    plan = SplitPlan(num_units, True, 11, "file")
    orders = [[i for s in _drain(SplitCursor.start(plan, r, 2)) for i in s] for r in range(4)]
    for order in orders:
        assert sorted(order) == list(range(num_units))
    if num_units >= 50:
        assert orders[0] != list(range(num_units))
        assert len({tuple(o) for o in orders}) == 4
    again = [i for s in _drain(SplitCursor.start(plan, 2, 5)) for i in s]
    assert again == orders[2]  # reproducible from the plan's seed
    unseeded = dataclasses.replace(plan, seed=None)
    a, b = (SplitCursor.start(unseeded, 0, 2) for _ in range(2))
    if num_units >= 50:
        assert a.seed != b.seed and _drain(a) != _drain(b)


@pytest.mark.parametrize("seed", [None, 4])
def test_split_cursor_resumes_from_json_mid_way(seed: int | None) -> None:
    plan = SplitPlan(500, seed is not None, seed)
    cursor = SplitCursor.start(plan, 1, 3)
    first = [cursor.next() for _ in range(4)]
    record = json.loads(json.dumps(cursor.to_json()))
    assert record["position"] == sum(len(s) for s in first)  # type: ignore[arg-type]
    resumed = SplitCursor.from_json(record)
    assert resumed == cursor
    rest = _drain(resumed)
    assert rest == _drain(cursor)
    everything = [i for s in first + rest for i in s]  # type: ignore[operator]
    assert sorted(everything) == list(range(500))
    assert resumed.done and resumed.next() is None


@pytest.mark.parametrize(
    "record",
    [
        None,
        [500, 3, 0, None],
        {"num_units": 5, "split_size": 1, "position": 0},
        {"num_units": 5, "split_size": 1, "position": 0, "seed": None, "order": [1]},
        {"num_units": 5, "split_size": 0, "position": 0, "seed": None},
        {"num_units": 5, "split_size": 1, "position": 6, "seed": None},
        {"num_units": -1, "split_size": 1, "position": 0, "seed": None},
        {"num_units": "5", "split_size": 1, "position": 0, "seed": None},
        {"num_units": 5, "split_size": True, "position": 0, "seed": None},
        {"num_units": 5, "split_size": 1, "position": 0, "seed": 1.5},
        {"num_units": 5, "split_size": 1, "position": 0, "seed": -3},
    ],
)
def test_split_cursor_from_json_rejects_bad_records(record: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="SplitCursor"):
        SplitCursor.from_json(record)


def test_split_cursor_start_checks_its_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="repetition"):
        SplitCursor.start(SplitPlan(5, False, None), -1, 2)
    with pytest.raises(InvalidArgumentError, match="num_workers"):
        SplitCursor.start(SplitPlan(5, False, None), 0, 2.0)  # type: ignore[arg-type]


# -- SplitPlan JSON -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "plan",
    [SplitPlan(0, False, None), SplitPlan(10, True, 7, "file"), SplitPlan(3, True, None, "file")],
)
def test_split_plan_json_round_trip(plan: SplitPlan) -> None:
    record = json.loads(json.dumps(plan.to_json()))
    assert record == {
        "num_units": plan.num_units,
        "shuffle": plan.shuffle,
        "seed": plan.seed,
        "unit": plan.unit,
    }
    assert SplitPlan.from_json(record) == plan


_GOOD_PLAN = {"num_units": 4, "shuffle": False, "seed": None, "unit": "element"}


@pytest.mark.parametrize(
    ("record", "words"),
    [
        ("plan", "expects a dict, got str"),
        ({"num_units": 4, "shuffle": False, "seed": None}, "missing ['unit']"),
        ({**_GOOD_PLAN, "extra": 1}, "unknown ['extra']"),
        ({**_GOOD_PLAN, "num_units": -1}, "num_units must be >= 0"),
        ({**_GOOD_PLAN, "num_units": "4"}, "num_units must be an int"),
        ({**_GOOD_PLAN, "num_units": True}, "num_units must be an int"),
        ({**_GOOD_PLAN, "num_units": 4.0}, "num_units must be an int"),
        ({**_GOOD_PLAN, "shuffle": "yes"}, "shuffle must be a bool"),
        ({**_GOOD_PLAN, "seed": 1.5}, "seed must be an int"),
        ({**_GOOD_PLAN, "unit": "row"}, "unit must be one of"),
    ],
)
def test_split_plan_from_json_rejects_bad_input(record: Any, words: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        SplitPlan.from_json(record)
    assert words in str(info.value)


@pytest.mark.parametrize("module", [split_module, split_source_module])
def test_module_doctests(module: Any) -> None:
    results = doctest.testmod(module)
    assert results.attempted > 0
    assert results.failed == 0


# -- cost and bounds -------------------------------------------------------------------------------


def test_a_shuffled_split_of_ten_million_files_costs_no_memory_per_file() -> None:
    # The dispatcher reads a job's cursor back from its JSON at every GetSplit: the split's
    # units come from an index-to-position function of the seed, never from a list of every
    # file (80 MB for 10^7 files, and ~0.5 s to shuffle).
    import tracemalloc

    plan = SplitPlan(10**7, True, 3, "file")
    record = SplitCursor.start(plan, 0, 4).to_json()
    tracemalloc.start()
    try:
        units = []
        for _ in range(20):
            cursor = SplitCursor.from_json(record)
            units += cursor.next() or []
            record = cursor.to_json()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert len(set(units)) == 20 * 64 and all(0 <= u < 10**7 for u in units)
    assert units != list(range(20 * 64))


# Splits of 7 units cross the permutation's blocks everywhere; 65,537 units (just over a power
# of four: the most cycle walking) go in splits of 1024, the size a plan that large is given.
@pytest.mark.parametrize(
    ("num_units", "split_size"),
    [(1, 7), (2, 7), (3, 7), (4, 7), (5, 7), (17, 7), (1000, 7), (4097, 7), (65_537, 1024)],
)
def test_the_shuffled_order_is_a_permutation_fixed_by_the_seed(
    num_units: int, split_size: int
) -> None:
    def order(seed: int) -> list[int]:
        return [i for s in _drain(SplitCursor(num_units, split_size, 0, seed)) for i in s]

    first = order(5)
    assert sorted(first) == list(range(num_units))
    assert order(5) == first
    if num_units >= 17:
        assert order(6) != first and first != list(range(num_units))


def test_a_plan_of_too_many_files_or_shuffled_units_is_refused() -> None:
    limit = split_module.MAX_LISTED_UNITS
    assert limit >= 10**7  # ImageNet's 1,281,167 files fit, and then some
    SplitPlan(limit, True, 1, "file")
    SplitPlan(10**12, False, None, "element")  # a range: nothing is kept per unit
    for plan in ((3 * 10**7, True, 1, "file"), (limit + 1, False, None, "file")):
        with pytest.raises(InvalidArgumentError, match=f"at most {limit:,}"):
            SplitPlan(*plan)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="at most"):
        SplitPlan(3 * 10**7, True, None, "element")
    with pytest.raises(InvalidArgumentError, match="at most"):
        SplitPlan(1 << 63, False, None, "element")
