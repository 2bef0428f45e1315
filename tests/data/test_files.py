"""Tests of feedline/data/readers/_files.py over URLs of the file-system layer: list_files, the
byte-stream readers, NpyDataset, ParquetDataset and cache(filename) on fsspec's in-memory file
system (``memory://``) read as they read local files, checkpoints included. (The object-store
server tests are in tests/test_fs.py.)"""

from __future__ import annotations

import gzip
import io
import logging
import pathlib
import re
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from feedline.data import Dataset, TextLineDataset, TFRecordDataset
from feedline.data.experimental import CsvDataset, NpyDataset, ParquetDataset, make_csv_dataset
from feedline.errors import DataLossError, InvalidArgumentError, NotFoundError, UnimplementedError
from feedline.io import TFRecordWriter, gfile
from tests.data.checkpoint_utils import checkpoint_test

_BUCKET = f"memory://feedline-files-{uuid.uuid4().hex}"


def _put(name: str, data: bytes) -> str:
    url = gfile.join(_BUCKET, name)
    with gfile.GFile(url, "wb") as f:
        f.write(data)
    return url


_TEXT = [
    _put(f"text/part-{k}.txt", b"".join(b"line %d.%d\n" % (k, j) for j in range(5)))
    for k in range(3)
]
_GZ = _put("text/zipped.txt.gz", gzip.compress(b"a\nb\nc\n"))
_CSV = _put("table.csv", b"x,y\n1,2.5\n3,4.5\n")


def _records() -> list[str]:
    urls = []
    for k in range(2):
        url = gfile.join(_BUCKET, "records", f"r{k}.tfrecord")
        with TFRecordWriter(url) as writer:  # the writer takes URLs too
            for j in range(4):
                writer.write(b"record %d.%d" % (k, j))
        urls.append(url)
    return urls


_RECORDS = _records()


def _npy(name: str, array: np.ndarray) -> str:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return _put(name, buffer.getvalue())


def _parquet(name: str, table: pa.Table, **options: object) -> str:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, write_page_checksum=True, **options)  # type: ignore[arg-type]
    return _put(name, buffer.getvalue())


_NPY = [
    _npy("arrays/a.npy", np.arange(14, dtype=np.int32).reshape(7, 2)),
    _npy("arrays/b.npy", np.arange(14, 20, dtype=np.int32).reshape(3, 2)),
]
_STRINGS = _npy("arrays/s.npy", np.array([b"ab", b"c\x00d", b""]))
_PARQUET = [
    _parquet(
        f"tables/t{k}.parquet",
        pa.table({"x": list(range(10 * k, 10 * k + 10)), "s": [f"v{i}" for i in range(10)]}),
        row_group_size=4,
    )
    for k in range(2)
]


def test_npy_files_read_by_ranges() -> None:
    ds = NpyDataset(_NPY)
    assert len(ds) == 10 and ds.element_spec.shape == (2,)
    assert [r.tolist() for r in ds] == np.arange(20).reshape(10, 2).tolist()
    # Random access: a shuffled batch gathers rows of both files by ranged reads.
    batch = next(iter(ds.shuffle(10, seed=3).batch(10)))
    assert sorted(batch[:, 0].tolist()) == list(range(0, 20, 2))
    names = Dataset.from_tensor_slices(_NPY)  # a dataset of names: read file after file
    assert [r.tolist() for r in NpyDataset(names).batch(4)][-1] == [[16, 17], [18, 19]]
    assert [r.item() for r in NpyDataset(_STRINGS)] == [b"ab", b"c\x00d", b""]


def test_npy_bad_input() -> None:
    missing = gfile.join(_BUCKET, "missing.npy")
    with pytest.raises(NotFoundError, match=re.escape(missing)):
        NpyDataset(missing)
    with pytest.raises(InvalidArgumentError, match=r"not a \.npy file"):
        NpyDataset(_put("arrays/not.npy", b"plain text, not an array"))
    fortran = _npy("arrays/f.npy", np.asfortranarray(np.arange(6).reshape(2, 3)))
    with pytest.raises(InvalidArgumentError, match="Fortran-ordered"):
        NpyDataset(fortran)
    whole = io.BytesIO()
    np.save(whole, np.arange(100, dtype=np.int64))
    truncated = _put("arrays/short.npy", whole.getvalue()[:-80])
    with pytest.raises(DataLossError, match="truncated"):
        NpyDataset(truncated)


def test_parquet_files_on_the_store() -> None:
    rows = [(int(r["x"]), r["s"].item()) for r in ParquetDataset(_PARQUET)]
    assert rows == [(k * 10 + i, b"v%d" % i) for k in range(2) for i in range(10)]
    assert ParquetDataset(_PARQUET).cardinality() == 20
    batches = [b["x"].tolist() for b in ParquetDataset(_PARQUET[0], columns=["x"], batch_size=4)]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    missing = gfile.join(_BUCKET, "missing.parquet")
    with pytest.raises(NotFoundError, match=re.escape(missing)):
        list(ParquetDataset([_PARQUET[0], missing]))


def test_a_damaged_parquet_page_is_data_loss() -> None:
    data = bytearray(gfile.GFile(_PARQUET[0], "rb").read())
    data[200] ^= 0xFF  # inside a column chunk's pages
    damaged = _put("tables/damaged.parquet", bytes(data))
    with pytest.raises(DataLossError, match="damaged"):
        list(ParquetDataset(damaged))


def test_a_cache_file_on_the_store(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def count(x: np.ndarray) -> dict[str, np.ndarray]:
        calls.append(1)
        return {"x": x, "name": np.array(b"n%d" % int(x), dtype=object)}

    prefix = gfile.join(_BUCKET, f"cache-{uuid.uuid4().hex[:8]}")
    ds = Dataset.range(600).map(count).cache(gfile.join(prefix, "train"))
    assert [int(e["x"]) for e in ds] == list(range(600))
    filled = len(calls)
    assert sorted(gfile.listdir(prefix)) == ["train.data", "train.index"]
    assert [e["name"].item() for e in ds] == [b"n%d" % i for i in range(600)]
    assert len(calls) == filled  # the second pass read the store
    # A pass that stops early leaves nothing behind, not even its lock.
    partial = Dataset.range(10).cache(gfile.join(prefix, "partial"))
    it = iter(partial)
    next(it)
    with caplog.at_level(logging.WARNING):
        it.close()
    assert sorted(gfile.listdir(prefix)) == ["train.data", "train.index"]


def test_a_second_writer_of_a_cache_on_the_store_is_refused() -> None:
    from feedline.errors import FailedPreconditionError

    url = gfile.join(_BUCKET, f"cache-{uuid.uuid4().hex[:8]}", "c")
    ds = Dataset.range(5).cache(url)
    first = iter(ds)
    next(first)
    with pytest.raises(FailedPreconditionError, match="another iterator is writing"):
        next(iter(ds))
    assert [int(x) for x in first] == [1, 2, 3, 4]


def test_a_pattern_matching_nothing_is_the_same_error_as_locally(tmp_path: pathlib.Path) -> None:
    with pytest.raises(NotFoundError) as local:
        make_csv_dataset(str(tmp_path / "nothing-*.csv"), batch_size=1)
    with pytest.raises(NotFoundError) as remote:
        make_csv_dataset(gfile.join(_BUCKET, "nothing-*.csv"), batch_size=1)
    assert type(remote.value) is type(local.value)
    assert "no files match" in str(remote.value) and "no files match" in str(local.value)
    assert isinstance(local.value, ValueError)  # TensorFlow's make_csv_dataset: a ValueError


def test_list_files_globs_the_store_and_shuffles_by_seed() -> None:
    pattern = gfile.join(_BUCKET, "text", "part-*.txt")
    assert sorted(x.item().decode() for x in Dataset.list_files(pattern, shuffle=False)) == _TEXT
    first = [x.item() for x in Dataset.list_files(pattern, seed=3)]
    again = [x.item() for x in Dataset.list_files(pattern, seed=3)]
    assert first == again and sorted(first) == [u.encode() for u in _TEXT]
    with pytest.raises(NotFoundError, match="no files matched"):
        Dataset.list_files(gfile.join(_BUCKET, "nothing-*.txt"))


def test_readers_read_urls() -> None:
    lines = [x.item() for x in TextLineDataset(_TEXT[:2])]
    assert lines == [b"line %d.%d" % (k, j) for k in range(2) for j in range(5)]
    assert [x.item() for x in TextLineDataset(_GZ, compression_type="GZIP")] == [b"a", b"b", b"c"]
    rows = [(int(x), float(y)) for x, y in CsvDataset(_CSV, [np.int32, np.float32], header=True)]
    assert rows == [(1, 2.5), (3, 4.5)]
    records = Dataset.list_files(gfile.join(_BUCKET, "records", "*.tfrecord"), shuffle=False)
    read = records.interleave(TFRecordDataset, cycle_length=2, num_parallel_calls=2)
    assert sorted(x.item() for x in read) == sorted(
        b"record %d.%d" % (k, j) for k in range(2) for j in range(4)
    )


def test_a_compressed_tfrecord_written_to_the_store_reads_back() -> None:
    url = gfile.join(_BUCKET, "records", "zipped.tfrecord.gz")
    with TFRecordWriter(url, "GZIP") as writer:
        for j in range(3):
            writer.write(b"z%d" % j)
    assert [x.item() for x in TFRecordDataset(url, "GZIP")] == [b"z0", b"z1", b"z2"]


def test_missing_and_changed_objects() -> None:
    with pytest.raises(NotFoundError, match="does not exist"):
        list(TextLineDataset(gfile.join(_BUCKET, "missing.txt")))
    url = _put("shrinks.txt", b"one\ntwo\nthree\n")
    it = iter(TextLineDataset(url))
    next(it), next(it)
    state = it.get_state()
    _put("shrinks.txt", b"one\n")
    restored = iter(TextLineDataset(url))
    with pytest.raises(DataLossError, match="fewer than the saved position"):
        # A state saved before versions were kept: only the size can tell.
        restored.set_state({**state, "versions": [None]})
        next(restored)


def test_a_saved_position_holds_the_object_to_the_version_read() -> None:
    # The object is replaced by one of the same size: the rest of it read from the saved
    # position would be another version's lines after the first version's.
    url = _put("replaced.txt", b"one\ntwo\nthree\n")
    it = iter(TextLineDataset(url))
    assert [next(it).item(), next(it).item()] == [b"one", b"two"]
    state = it.get_state()
    restored = iter(TextLineDataset(url))
    restored.set_state(state)  # the same version: the rest of it
    assert [x.item() for x in restored] == [b"three"]
    _put("replaced.txt", b"uno\ndos\ntres!\n")
    again = iter(TextLineDataset(url))
    with pytest.raises(DataLossError, match=r"replaced\.txt' changed since it was listed or first"):
        again.set_state(state)
        next(again)
    assert [x.item() for x in TextLineDataset(url)] == [b"uno", b"dos", b"tres!"]


def test_schemes_without_a_back_end() -> None:
    with pytest.raises(UnimplementedError, match="scheme 'nope'"):
        list(TextLineDataset("nope://bucket/a.txt"))
    try:
        import s3fs  # noqa: F401
    except ImportError:
        with pytest.raises(InvalidArgumentError, match="pip install s3fs"):
            Dataset.list_files("s3://bucket/train-*.tfrecord")


test_checkpointing = checkpoint_test(
    __name__,
    text=lambda: TextLineDataset(_TEXT, buffer_size=4096),
    gzip=lambda: TextLineDataset(_GZ, compression_type="GZIP"),
    records=lambda: TFRecordDataset(_RECORDS),
    npy=lambda: NpyDataset(_NPY),
    npy_names=lambda: NpyDataset(Dataset.from_tensor_slices(_NPY)),
    parquet=lambda: ParquetDataset(_PARQUET, columns=["x", "s"]),
    parquet_batches=lambda: ParquetDataset(_PARQUET, batch_size=3),
    cache_file=lambda: Dataset.range(12).cache(gfile.join(_BUCKET, "checkpointed", "cache")),
    listed=lambda: Dataset.list_files(gfile.join(_BUCKET, "text", "*.txt"), seed=1).interleave(
        TextLineDataset, cycle_length=2
    ),
)
