"""Tests of feedline/data/readers/list_files.py."""

from __future__ import annotations

import atexit
import collections
import os
import pathlib
import pickle
import shutil
import tempfile

import numpy as np
import pytest

from feedline.data import Dataset, TensorSpec, TextLineDataset
from feedline.data.dataset import IteratorContext
from feedline.data.readers import ListFilesDataset
from feedline.errors import InvalidArgumentError, NotFoundError
from feedline.io import gfile
from tests.data.checkpoint_utils import checkpoint_test

_DIR = tempfile.mkdtemp(prefix="feedline-test-list-files-")
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)
_NAMES = [f"part-{i:02d}.txt" for i in range(12)]
for _name in [*_NAMES, "other.csv", ".hidden.txt"]:
    pathlib.Path(_DIR, _name).touch()
_PATTERN = os.path.join(_DIR, "part-*.txt")


def names(dataset: Dataset) -> list[str]:
    return [os.path.basename(f.item().decode()) for f in dataset]


def test_unshuffled_names_are_sorted_0d_bytes() -> None:
    ds = Dataset.list_files(_PATTERN, shuffle=False)
    assert isinstance(ds, ListFilesDataset)
    assert ds.element_spec == TensorSpec((), np.dtype(object))
    first = next(iter(ds))
    assert first.shape == () and first.dtype == object and type(first.item()) is bytes
    assert names(ds) == _NAMES
    assert ds.cardinality() == 12 and len(ds) == 12


def test_several_patterns_are_sorted_together_keeping_duplicates() -> None:
    ds = Dataset.list_files(
        [
            os.path.join(_DIR, "part-1*"),
            os.path.join(_DIR, "*.csv"),
            os.path.join(_DIR, "part-11*"),
        ],
        shuffle=False,
    )
    assert names(ds) == ["other.csv", "part-10.txt", "part-11.txt", "part-11.txt"]


def test_hidden_files_match_as_in_tensorflow() -> None:
    assert ".hidden.txt" in names(Dataset.list_files(os.path.join(_DIR, "*.txt"), shuffle=False))


def test_no_match_names_the_pattern() -> None:
    pattern = os.path.join(_DIR, "nothing-*.bin")
    with pytest.raises(NotFoundError, match=r"no files matched pattern .*nothing-") as info:
        Dataset.list_files(pattern)
    assert info.value.name == pattern
    # TensorFlow raises InvalidArgumentError here: a ported `except` of it catches this too.
    assert isinstance(info.value, InvalidArgumentError)
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, ValueError)
    copy = pickle.loads(pickle.dumps(info.value))  # as an error crosses processes
    assert type(copy) is type(info.value) and copy.name == pattern and str(copy) == str(info.value)


def test_shuffled_by_default_and_a_permutation() -> None:
    ds = Dataset.list_files(_PATTERN)
    assert sorted(names(ds)) == _NAMES


def test_a_seed_gives_every_worker_the_same_order_and_each_pass_a_new_one() -> None:
    # Two workers build the same pipeline: pass k has the same order on both.
    worker0 = Dataset.list_files(_PATTERN, seed=42)
    worker1 = Dataset.list_files(_PATTERN, seed=42)
    first0, second0 = names(worker0), names(worker0)
    first1, second1 = names(worker1), names(worker1)
    assert first0 == first1 and second0 == second1
    assert first0 != second0  # reshuffled each pass
    assert sorted(first0) == _NAMES
    epochs = names(Dataset.list_files(_PATTERN, seed=42).repeat(2))
    assert epochs[:12] != epochs[12:] and sorted(epochs[12:]) == _NAMES
    assert names(Dataset.list_files(_PATTERN, seed=1)) != first0


def test_without_a_seed_orders_differ_between_workers() -> None:
    orders = {tuple(names(Dataset.list_files(_PATTERN))) for _ in range(5)}
    assert len(orders) > 1


def test_random_access_when_not_shuffled() -> None:
    ds = Dataset.list_files(_PATTERN, shuffle=False)
    access = ds._random_access()
    assert access is not None and len(access) == 12
    assert access.get(3).item().endswith(b"part-03.txt")
    assert [os.path.basename(n.decode()) for n in access.gather(np.array([11, 0]))] == [
        "part-11.txt",
        "part-00.txt",
    ]
    assert Dataset.list_files(_PATTERN, seed=1)._random_access() is None
    batch = next(iter(ds.batch(5)))
    assert batch.shape == (5,) and batch[0].endswith(b"part-00.txt")
    shuffled = names(ds.shuffle(100, seed=3))
    assert sorted(shuffled) == _NAMES


def test_patterns_as_arrays_and_paths() -> None:
    ds = Dataset.list_files(np.array([_PATTERN.encode()]), shuffle=False)
    assert names(ds) == _NAMES
    assert names(Dataset.list_files(pathlib.Path(_PATTERN), shuffle=False)) == _NAMES
    with pytest.raises(InvalidArgumentError, match="empty list"):
        Dataset.list_files([])
    with pytest.raises(InvalidArgumentError, match="seed must be an int"):
        Dataset.list_files(_PATTERN, seed="x")


def test_a_file_source_whose_sorted_names_can_be_sharded() -> None:
    ds = Dataset.list_files(_PATTERN, seed=5)
    assert ds._is_file_reader
    assert [os.path.basename(n) for n in ds._filenames] == _NAMES
    worker1 = ds._with_files(ds._filenames[1::2])
    assert sorted(names(worker1)) == _NAMES[1::2]
    assert pickle.loads(pickle.dumps(ds))._filenames == ds._filenames


test_checkpointing = checkpoint_test(
    __name__,
    sorted=lambda: Dataset.list_files(_PATTERN, shuffle=False),
    seeded=lambda: Dataset.list_files(_PATTERN, seed=9),
    batched=lambda: Dataset.list_files(_PATTERN, seed=9).batch(5),
)


def test_patterns_and_names_as_object_arrays_of_bytes_or_str() -> None:
    pattern = os.path.join(_DIR, "part-1*")
    expected = names(Dataset.list_files(pattern, shuffle=False))
    for given in (
        np.array(os.fsencode(pattern), dtype=object),
        np.array([os.fsencode(pattern)], dtype=object),
        np.array([pattern], dtype=object),
    ):
        assert names(Dataset.list_files(given, shuffle=False)) == expected
    with pytest.raises(InvalidArgumentError, match="a file name must be"):
        Dataset.list_files(np.array([1], dtype=object))
    batch = next(iter(Dataset.list_files(pattern, shuffle=False).batch(2)))
    assert batch.dtype == object and all(type(n) is bytes for n in batch.tolist())
    # Batches of names (object arrays of bytes) name files for the readers too.
    assert TextLineDataset(batch)._filenames == tuple(os.fsdecode(n) for n in batch.tolist())


def test_a_listing_does_not_replace_the_versions_a_pipeline_holds(s3_bucket: str) -> None:
    # A split run again holds its first run's versions; a listing made since (a restarted
    # program lists again) fills in the others only.
    urls = [f"{s3_bucket}/held/{name}.txt" for name in ("a", "b")]
    for url in urls:
        gfile.GFile(url, "wb").write(b"x\n")
    listing = Dataset.list_files(f"{s3_bucket}/held/*.txt", shuffle=False)
    ctx = IteratorContext(listing.options(), 0, collections.ChainMap({urls[0]: '"first-run"'}))
    iterator = listing._iterator(ctx)
    assert ctx.listed_versions[urls[0]] == '"first-run"'
    assert ctx.listed_versions[urls[1]] not in (None, '"first-run"')  # the listing's ETag
    iterator.close()
    # The listing's sizes go with its versions only: the held version's size is not known.
    assert ctx.listed_size(urls[1], ctx.listed_versions[urls[1]]) == 2
    assert ctx.listed_size(urls[0], '"first-run"') is None
    assert ctx.listed_size(urls[1], '"another"') is None
    assert ctx.listed_size(urls[1], None) is None


def test_a_listing_keeps_its_sizes_through_pickling_and_sharding(s3_bucket: str) -> None:
    urls = [f"{s3_bucket}/sized/{k}.txt" for k in range(3)]
    for k, url in enumerate(urls):
        gfile.GFile(url, "wb").write(b"x" * (k + 1))
    gfile.makedirs(f"{s3_bucket}/sized/9.dir")
    gfile.GFile(f"{s3_bucket}/sized/9.dir/inner", "wb").write(b"inner")
    listing = Dataset.list_files(f"{s3_bucket}/sized/*", shuffle=False)
    restored = pickle.loads(pickle.dumps(listing))
    assert restored._versions == listing._versions
    assert restored._versions.sizes == dict(zip(urls, [1, 2, 3], strict=True))  # no directory
    assert f"{s3_bucket}/sized/9.dir" in listing._filenames  # listed, with no size
    assert listing._with_files(urls[1:2])._versions.sizes == {urls[1]: 2}  # FILE sharding
    assert listing.fingerprint() == restored.fingerprint()
