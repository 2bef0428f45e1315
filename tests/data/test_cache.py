"""Tests of feedline/data/ops/cache.py."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

from feedline.data import Dataset, TensorSpec
from feedline.errors import DataLossError, FailedPreconditionError, InvalidArgumentError
from tests.data.checkpoint_utils import checkpoint_test


class Counted:
    """A source that counts the elements it produces: how a test sees the input being read."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.produced = 0

    def _generate(self):
        for i in range(self.n):
            self.produced += 1
            yield i * 10

    def dataset(self) -> Dataset:
        return Dataset.from_generator(self._generate, output_signature=TensorSpec((), np.int64))


def _ints(ds: Dataset) -> list[int]:
    return [int(x) for x in ds]


def test_second_pass_reads_the_memory_cache() -> None:
    source = Counted(3)
    ds = source.dataset().cache()
    assert _ints(ds) == [0, 10, 20]
    assert _ints(ds) == [0, 10, 20]
    assert source.produced == 3
    assert _ints(ds.map(lambda x: x + 1)) == [1, 11, 21]
    assert source.produced == 3


def test_repeat_epochs_read_the_cache() -> None:
    source = Counted(4)
    assert _ints(source.dataset().cache().repeat(3)) == [0, 10, 20, 30] * 3
    assert source.produced == 4


def test_a_partial_pass_leaves_no_cache() -> None:
    source = Counted(4)
    ds = source.dataset().cache()
    assert _ints(ds.take(2)) == [0, 10]
    assert ds._random_access() is None
    assert _ints(ds) == [0, 10, 20, 30]
    assert source.produced == 6
    assert _ints(ds) == [0, 10, 20, 30]
    assert source.produced == 6


def test_a_full_memory_cache_is_random_access() -> None:
    ds = Dataset.range(10).map(lambda x: (x, x * 2.0)).cache()
    assert ds._random_access() is None
    list(ds)
    access = ds._random_access()
    assert access is not None and len(access) == 10
    x, y = access.gather(np.array([3, 1]))
    assert x.tolist() == [3, 1] and y.tolist() == [6.0, 2.0]
    ((first, second),) = list(ds.shuffle(10, seed=1).batch(10))  # the permutation fast path
    assert sorted(first.tolist()) == list(range(10))
    np.testing.assert_array_equal(second, first * 2.0)
    assert [b.tolist() for b, _ in ds.batch(4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_elements_of_different_shapes_are_cached_as_a_list() -> None:
    ds = Dataset.from_generator(
        lambda: (np.full(n, n) for n in (1, 2, 3)), output_signature=TensorSpec((None,), np.int64)
    ).cache()
    assert [x.tolist() for x in ds] == [[1], [2, 2], [3, 3, 3]]
    assert [x.tolist() for x in ds] == [[1], [2, 2], [3, 3, 3]]
    assert ds._random_access() is None


def test_a_pickled_memory_cache_travels_empty() -> None:
    ds = Dataset.range(3).cache()
    list(ds)
    assert ds._random_access() is not None
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._random_access() is None
    assert _ints(copy) == [0, 1, 2]


def test_file_cache_is_written_at_the_end_and_read_after(tmp_path) -> None:
    prefix = str(tmp_path / "sub" / "cache")
    source = Counted(3)
    ds = source.dataset().map(lambda x: (x, {"s": str(x)})).cache(prefix)
    it = iter(ds)
    next(it)
    assert sorted(os.listdir(tmp_path / "sub")) == ["cache.data.tmp", "cache.lock"]
    rest = list(it)
    assert len(rest) == 2
    assert sorted(os.listdir(tmp_path / "sub")) == ["cache.data", "cache.index"]
    out = [(int(x), d["s"].item().decode()) for x, d in ds]
    assert out == [(0, "0"), (10, "10"), (20, "20")]
    assert source.produced == 3


def test_a_partial_pass_leaves_no_files(tmp_path) -> None:
    prefix = str(tmp_path / "cache")
    ds = Dataset.range(5).cache(prefix)
    assert _ints(ds.take(2)) == [0, 1]
    assert os.listdir(tmp_path) == []


def test_another_process_reads_the_files(tmp_path) -> None:
    prefix = str(tmp_path / "cache")
    assert _ints(Dataset.range(4).map(lambda x: x * 3).cache(prefix)) == [0, 3, 6, 9]
    script = textwrap.dedent(
        f"""
        import numpy as np
        from feedline.data import Dataset, TensorSpec

        def never():
            raise AssertionError("the input was read: the cache was not used")
            yield

        ds = Dataset.from_generator(never, output_signature=TensorSpec((), np.int64))
        print([int(x) for x in ds.cache({prefix!r})])
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[0, 3, 6, 9]"


def test_the_lock_file_keeps_a_second_writer_out(tmp_path) -> None:
    prefix = str(tmp_path / "cache")
    ds = Dataset.range(3).cache(prefix)
    first, second = iter(ds), iter(ds)
    assert int(next(first)) == 0
    with pytest.raises(FailedPreconditionError, match=r"lock file .*cache\.lock exists"):
        next(second)
    assert _ints(first) == [1, 2]
    assert _ints(ds) == [0, 1, 2]


def test_a_stale_lock_file_is_reported(tmp_path) -> None:
    prefix = str(tmp_path / "cache")
    (tmp_path / "cache.lock").write_text("12345")
    with pytest.raises(FailedPreconditionError, match="delete the lock file if no process"):
        list(Dataset.range(3).cache(prefix))


def test_files_of_another_pipeline_are_refused(tmp_path) -> None:
    prefix = str(tmp_path / "cache")
    list(Dataset.range(3).cache(prefix))
    with pytest.raises(InvalidArgumentError, match=r"holds elements of spec .* delete the cache"):
        list(Dataset.range(3).map(lambda x: (x, x)).cache(prefix))


def test_damaged_files_raise_data_loss(tmp_path) -> None:
    prefix = str(tmp_path / "cache")
    list(Dataset.range(3).cache(prefix))
    data = tmp_path / "cache.data"
    data.write_bytes(data.read_bytes()[:-20])
    with pytest.raises(DataLossError) as info:
        list(Dataset.range(3).cache(prefix))
    assert info.value.filename == str(data)
    assert re.search(r"is damaged: it holds \d+ bytes, but its index says", info.value.args[0])
    # Read in order (an index without the chunk table), the damage is found where it is.
    index = tmp_path / "cache.index"
    meta = json.loads(index.read_text())
    del meta["chunks"]
    index.write_text(json.dumps(meta))
    with pytest.raises(DataLossError) as info:
        list(Dataset.range(3).cache(prefix))
    assert re.search(r"is damaged at byte \d+ \(element 0\)", info.value.args[0])


def test_file_cache_keeps_bytes_exactly_and_chunks_by_shape(tmp_path) -> None:
    records = [b"a\x00", b"bc", b"", b"d\x00\x00", b"ef", b"\x00"]
    ds = Dataset.from_generator(
        lambda: iter(records), output_signature=TensorSpec((), np.bytes_)
    ).cache(str(tmp_path / "records"))
    for _ in range(2):
        elements = list(ds)
        assert all(r.shape == () and r.dtype == object for r in elements)
        assert [r.item() for r in elements] == records
        assert [x for b in ds.batch(4) for x in b.tolist()] == records
    vectors = Dataset.from_generator(
        lambda: iter([records[:2], records[2:4], records[4:]]),
        output_signature=TensorSpec((2,), np.bytes_),
    ).cache(str(tmp_path / "vectors"))
    for _ in range(2):
        assert [v.tolist() for v in vectors] == [records[:2], records[2:4], records[4:]]
    ragged = _ragged().cache(str(tmp_path / "ragged"))
    for _ in range(2):
        assert [x.tolist() for x in ragged] == [[0] * n for n in (1, 1, 2, 2, 2, 1)]


def _ragged() -> Dataset:
    return Dataset.from_generator(
        lambda: (np.zeros(n, np.int64) for n in (1, 1, 2, 2, 2, 1)),
        output_signature=TensorSpec((None,), np.int64),
    )


def test_bad_filename() -> None:
    with pytest.raises(TypeError, match="filename must be a str or path, got 3"):
        Dataset.range(3).cache(3)


def test_a_restored_writing_pass_reads_on_and_a_later_pass_fills_the_cache() -> None:
    source = Counted(5)
    ds = source.dataset().cache()
    it = iter(ds)
    next(it)
    state = it.get_state()
    it.close()
    restored = iter(ds)
    restored.set_state(state)
    assert _ints(restored) == [10, 20, 30, 40]
    assert ds._random_access() is None  # it lacked the first element: no cache
    assert _ints(ds) == [0, 10, 20, 30, 40]
    produced = source.produced
    assert _ints(ds) == [0, 10, 20, 30, 40]
    assert source.produced == produced


def test_a_read_state_restored_without_the_cache_replays_the_input() -> None:
    def make() -> Dataset:
        return Dataset.range(6).map(lambda x: x * 2).cache()

    ds = make()
    list(ds)
    it = iter(ds)
    next(it), next(it)
    state = it.get_state()
    assert state["mode"] == "read"
    fresh = make()  # a new process: its cache is empty
    restored = iter(fresh)
    restored.set_state(state)
    assert _ints(restored) == [4, 6, 8, 10]
    assert fresh._random_access() is not None  # the replay filled the cache


def test_cache_shuffle_repeat_restored_in_a_fresh_pipeline() -> None:
    def make() -> Dataset:
        return Dataset.range(8).cache().shuffle(8, seed=1).batch(3).repeat(3)

    it = iter(make())
    for _ in range(4):  # into the second epoch, where shuffle reads the full cache
        next(it)
    state = it.get_state()
    rest = [b.tolist() for b in it]
    restored = iter(make())
    restored.set_state(state)
    assert [b.tolist() for b in restored] == rest


_TMP = tempfile.TemporaryDirectory(prefix="feedline-test-cache-")
_FILE_NUMBERS = itertools.count()
_SHARED_MEMORY = Dataset.range(10).map(lambda x: x * 3).cache()
_SHARED_FILE = Dataset.range(10).map(lambda x: (x, str(x))).cache(os.path.join(_TMP.name, "shared"))


def _fresh_file() -> str:
    return os.path.join(_TMP.name, f"fresh-{next(_FILE_NUMBERS)}")


test_checkpointing = checkpoint_test(
    __name__,
    memory=lambda: Dataset.range(12).shuffle(5, seed=2).cache(),
    memory_filled=lambda: _SHARED_MEMORY.batch(3),
    file=lambda: Dataset.range(8).map(lambda x: (x, {"s": str(x)})).cache(_fresh_file()),
    file_filled=lambda: _SHARED_FILE.map(lambda x, s: (x + 1, s)),
    file_chunks=lambda: _ragged().cache(_fresh_file()),
    file_filled_shuffled=lambda: _SHARED_FILE.shuffle(10, seed=4).batch(3),
)


def _mixed(n: int) -> Dataset:
    """``n`` elements of every kind of leaf a file cache keeps: float rows, a 0-d byte string
    (NULs and empty ones included), a pair of byte strings, an int scalar."""
    words = [(b"%d\x00" % i) * (i % 4) for i in range(n)]
    return Dataset.from_tensor_slices(
        {
            "x": np.arange(n * 3, dtype=np.float32).reshape(n, 3),
            "s": np.array(words, dtype=object),
            "pair": np.array([[w, w[::-1]] for w in words], dtype=object),
            "y": np.arange(n),
        }
    )


def _same(a: dict, b: dict) -> bool:
    return all(
        np.array_equal(a[k], b[k]) and np.shape(a[k]) == np.shape(b[k])
        and np.asarray(a[k]).dtype == np.asarray(b[k]).dtype and type(a[k]) is type(b[k])
        for k in a
    )  # fmt: skip


def test_a_complete_file_cache_is_random_access_in_any_pipeline(tmp_path) -> None:
    prefix = str(tmp_path / "mixed")
    n = 700  # three chunks of 256 rows
    in_order = list(_mixed(n).cache(prefix))  # fills the files
    # Another pipeline over the files (as in another process): its input is never read.
    calls: list[int] = []
    reread = _mixed(n).map(lambda e: calls.append(1) or e).cache(prefix)
    assert reread.element_spec == _mixed(n).element_spec
    calls.clear()  # learning the map's output spec called it
    access = reread._random_access()
    assert access is not None and len(access) == n
    for i in (0, 1, 255, 256, 511, 512, 699):
        assert _same(access.get(i), in_order[i]), i
    picked = [699, 0, 300, 5, 256, 255]
    gathered = access.gather(np.array(picked))
    for k, i in enumerate(picked):
        assert _same({key: gathered[key][k, ...] for key in gathered}, {
            key: np.asarray(value) for key, value in in_order[i].items()
        })  # fmt: skip
    # The fast paths read it by index, with the same results as the same rows in memory.
    memory = _mixed(n)
    for make in (
        lambda ds: ds.batch(64),
        lambda ds: ds.shuffle(n, seed=3).batch(50),
        lambda ds: ds.shard(3, 1).batch(7),
    ):
        got, want = list(make(reread)), list(make(memory))
        assert len(got) == len(want)
        assert all(_same(g, w) for g, w in zip(got, want, strict=True))
    assert calls == []  # the input of a complete cache is never read


def test_rows_of_a_file_cache_in_chunks_of_different_shapes(tmp_path) -> None:
    prefix = str(tmp_path / "ragged")
    in_order = [x.tolist() for x in _ragged().cache(prefix)]
    access = _ragged().cache(prefix)._random_access()
    assert [access.get(i).tolist() for i in range(6)] == in_order
    assert access.gather(np.array([4, 2])).tolist() == [[0, 0], [0, 0]]
    with pytest.raises(InvalidArgumentError, match="cache"):
        access.gather(np.array([0, 2]))  # rows of 1 and 2: batch's error


def test_a_file_cache_is_read_in_order_where_it_cannot_be_by_index(tmp_path) -> None:
    # Not complete yet: read from the input.
    prefix = str(tmp_path / "c")
    ds = Dataset.range(5).cache(prefix)
    assert ds._random_access() is None
    assert _ints(ds) == [0, 1, 2, 3, 4]
    assert ds._random_access() is not None
    # An index without a chunk table (an earlier version's files): in order.
    index = tmp_path / "c.index"
    meta = json.loads(index.read_text())
    del meta["chunks"]
    index.write_text(json.dumps(meta))
    ds = Dataset.range(5).cache(prefix)
    assert ds._random_access() is None
    assert _ints(ds.batch(2).unbatch()) == [0, 1, 2, 3, 4]
    # On a store: a row would be a request.
    remote = Dataset.range(5).cache("memory://feedline-test-cache/by-index")
    assert _ints(remote) == [0, 1, 2, 3, 4]
    assert remote._random_access() is None and _ints(remote) == [0, 1, 2, 3, 4]


def test_damaged_files_read_by_index_raise_data_loss(tmp_path) -> None:
    prefix = str(tmp_path / "cache")
    list(Dataset.range(600).cache(prefix))
    data = tmp_path / "cache.data"
    meta = json.loads((tmp_path / "cache.index").read_text())
    second = meta["chunks"][1][1]
    raw = bytearray(data.read_bytes())
    raw[second : second + 6] = b"garbag"  # the second chunk's record header
    data.write_bytes(bytes(raw))
    access = Dataset.range(600).cache(prefix)._random_access()
    assert int(access.get(3)) == 3  # the first chunk is whole
    with pytest.raises(DataLossError, match=rf"is damaged at byte {second} \(element 256\)"):
        access.get(300)
    data.write_bytes(bytes(raw[:-8]))
    with pytest.raises(DataLossError, match=r"holds .* bytes, but its index says"):
        list(Dataset.range(600).cache(prefix).shuffle(600, seed=1))


def test_cache_files_of_another_format_are_refused(tmp_path) -> None:
    prefix = str(tmp_path / "old")
    list(Dataset.range(3).cache(prefix))
    index = tmp_path / "old.index"
    meta = json.loads(index.read_text())
    index.write_text(json.dumps({**meta, "format": "feedline-cache-1"}))  # S-array strings
    with pytest.raises(InvalidArgumentError, match="is in format 'feedline-cache-1'"):
        list(Dataset.range(3).cache(prefix))


def test_damaged_byte_strings_in_cache_files_are_data_loss(tmp_path) -> None:
    prefix = str(tmp_path / "strings")
    source = Dataset.from_tensor_slices([b"a\x00", b"bc"])
    assert [r.item() for r in source.cache(prefix)] == [b"a\x00", b"bc"]
    data = tmp_path / "strings.data"
    data.write_bytes(data.read_bytes()[:-1])  # one byte of the strings is lost
    index = tmp_path / "strings.index"
    meta = json.loads(index.read_text())
    index.write_text(json.dumps({**meta, "bytes": meta["bytes"] - 1}))  # and the index agrees
    with pytest.raises(DataLossError, match="is damaged at byte 0"):
        list(source.cache(prefix))


def test_rows_of_a_file_cache_are_read_from_several_threads(tmp_path) -> None:
    import concurrent.futures

    prefix = str(tmp_path / "rows")
    values = np.arange(3000 * 5, dtype=np.float64).reshape(3000, 5)
    list(Dataset.from_tensor_slices(values).cache(prefix))
    access = Dataset.from_tensor_slices(values).cache(prefix)._random_access()  # no chunk read
    orders = [np.random.default_rng(seed).permutation(3000) for seed in range(8)]

    def read(order: np.ndarray) -> bool:
        return all(
            np.array_equal(access.gather(order[i : i + 100]), values[order[i : i + 100]])
            for i in range(0, 3000, 100)
        )

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert all(pool.map(read, orders))
