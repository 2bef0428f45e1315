"""Tests of feedline/data/ops/save.py, load.py and _snapshot_format.py: ``Dataset.save`` and
``Dataset.load`` (and their ``data.experimental`` forms)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap
from typing import Any

import numpy as np
import pytest

from feedline.data import Dataset, TensorSpec
from feedline.data import experimental as exp
from feedline.data.ops import _snapshot_format as fmt
from feedline.data.ops.load import LoadDataset, SnapshotShardDataset
from feedline.errors import DataLossError, InvalidArgumentError, NotFoundError
from tests.data.checkpoint_utils import assert_sequences_equal, checkpoint_test

REPO = pathlib.Path(__file__).resolve().parents[2]
_SCRATCH = tempfile.TemporaryDirectory(prefix="feedline-test-save-")


def _mixed(n: int = 9) -> Dataset:
    """Nested elements of several dtypes and varying shapes, byte and unicode strings."""

    def make(x: Any) -> Any:
        k = int(x)
        return (
            x,
            {
                "f32": np.arange(k, dtype=np.float32),
                "f64": np.full((2, k % 3), k, np.float64),
                "i32": np.int32(-k),
                "flag": np.array(k % 2 == 0),
                "raw": np.array([b"a\x00" * k, b""], dtype=object),
                "text": np.array("é" * k),
            },
        )

    return Dataset.range(n).map(make)


def _list(ds: Dataset) -> list[Any]:
    return list(ds)


def _chunks(path: pathlib.Path) -> list[pathlib.Path]:
    return sorted(path.rglob(f"*{fmt.CHUNK_SUFFIX}"))


# -- round trips ------------------------------------------------------------------------------


def test_round_trip_of_nested_mixed_elements_in_order(tmp_path: pathlib.Path) -> None:
    ds = _mixed()
    ds.save(str(tmp_path / "s"))
    loaded = Dataset.load(str(tmp_path / "s"))
    assert loaded.element_spec == ds.element_spec
    assert loaded.cardinality() == 9
    assert_sequences_equal(_list(loaded), _list(ds), "loaded")


def test_the_example_of_the_tensorflow_documentation(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "saved_data")
    exp.save(Dataset.range(2), path)
    assert [x.tolist() for x in exp.load(path)] == [0, 1]


@pytest.mark.parametrize("compression", [None, "NONE", "GZIP", "gzip", "LZ4"])
def test_compression_round_trips(tmp_path: pathlib.Path, compression: str | None) -> None:
    ds = _mixed(5)
    ds.save(str(tmp_path), compression=compression)
    assert_sequences_equal(_list(Dataset.load(str(tmp_path), compression=compression)), _list(ds))
    assert_sequences_equal(_list(Dataset.load(str(tmp_path))), _list(ds))


def test_compression_shrinks_repetitive_data(tmp_path: pathlib.Path) -> None:
    ds = Dataset.range(3).map(lambda x: np.zeros(20000, np.int64))
    sizes = {}
    for codec in ("NONE", "GZIP", "LZ4"):
        ds.save(str(tmp_path / codec), compression=codec, shard_func=lambda x: np.int64(0))
        sizes[codec] = sum(p.stat().st_size for p in _chunks(tmp_path / codec))
    assert sizes["GZIP"] < sizes["NONE"] / 10 and sizes["LZ4"] < sizes["NONE"] / 10


def test_unsupported_compression_lists_the_supported_ones(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"unsupported compression 'BZIP2'.*'GZIP'"):
        Dataset.range(2).save(str(tmp_path), compression="BZIP2")
    try:
        import snappy  # noqa: F401
    except ImportError:
        with pytest.raises(InvalidArgumentError, match="python-snappy"):
            Dataset.range(2).save(str(tmp_path), compression="SNAPPY")


def test_load_with_another_compression_is_an_error(tmp_path: pathlib.Path) -> None:
    Dataset.range(2).save(str(tmp_path), compression="GZIP")
    with pytest.raises(InvalidArgumentError, match="saved with compression 'GZIP'"):
        Dataset.load(str(tmp_path), compression="LZ4")


def test_an_empty_dataset_round_trips(tmp_path: pathlib.Path) -> None:
    Dataset.range(0).save(str(tmp_path))
    loaded = Dataset.load(str(tmp_path))
    assert loaded.cardinality() == 0 and _list(loaded) == []
    assert loaded.element_spec == TensorSpec((), np.int64)


def test_many_elements_fill_several_chunks(tmp_path: pathlib.Path) -> None:
    n = fmt.CHUNK_ROWS * 2 + 5
    Dataset.range(n).save(str(tmp_path), shard_func=lambda x: np.int64(0))
    assert len(_chunks(tmp_path)) == 3
    assert [int(x) for x in Dataset.load(str(tmp_path))] == list(range(n))


# -- shard_func and reader_func -------------------------------------------------------------


def test_shard_func_picks_the_shard_files(tmp_path: pathlib.Path) -> None:
    Dataset.range(10).save(str(tmp_path), shard_func=lambda x: x % 3)
    shards = sorted({p.parent.name for p in _chunks(tmp_path)})
    assert shards == ["shard_00000", "shard_00001", "shard_00002"]
    flat = Dataset.load(str(tmp_path), reader_func=lambda datasets: datasets.flat_map(lambda d: d))
    assert [int(x) for x in flat] == [0, 3, 6, 9, 1, 4, 7, 2, 5, 8]


def test_a_single_shard_as_in_the_tensorflow_documentation(tmp_path: pathlib.Path) -> None:
    Dataset.range(5).save(str(tmp_path), shard_func=lambda x: np.int64(0))
    assert {p.parent.name for p in _chunks(tmp_path)} == {"shard_00000"}
    assert [int(x) for x in Dataset.load(str(tmp_path))] == [0, 1, 2, 3, 4]


def test_the_default_sharding_is_round_robin_and_loads_in_order(tmp_path: pathlib.Path) -> None:
    from feedline.data.autotune import cpu_budget

    ds = Dataset.range(20)
    ds.save(str(tmp_path))
    shards = {p.parent.name for p in _chunks(tmp_path)}
    assert len(shards) == min(20, cpu_budget(ds.options()))
    assert [int(x) for x in Dataset.load(str(tmp_path))] == list(range(20))


def test_shard_func_must_return_a_non_negative_integer_scalar(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidArgumentError, match="non-negative int64 scalar"):
        Dataset.range(3).save(str(tmp_path / "a"), shard_func=lambda x: np.float32(1))
    with pytest.raises(InvalidArgumentError, match="non-negative int64 scalar"):
        Dataset.range(3).save(str(tmp_path / "b"), shard_func=lambda x: -x - 1)
    with pytest.raises(NotFoundError):  # nothing finished was left behind
        Dataset.load(str(tmp_path / "a"))


def test_reader_func_gets_the_shard_datasets(tmp_path: pathlib.Path) -> None:
    Dataset.range(12).save(str(tmp_path), shard_func=lambda x: x % 4)

    def reader_func(datasets: Dataset) -> Dataset:
        assert datasets.cardinality() == 4
        datasets = datasets.shuffle(4, seed=1)
        return datasets.interleave(lambda x: x, num_parallel_calls=2)

    loaded = Dataset.load(str(tmp_path), reader_func=reader_func)
    values = [int(x) for x in loaded]
    assert sorted(values) == list(range(12)) and values != list(range(12))
    assert loaded.cardinality() == -2  # what the reader's dataset knows: unknown


def test_reader_func_must_return_a_dataset(tmp_path: pathlib.Path) -> None:
    Dataset.range(2).save(str(tmp_path))
    with pytest.raises(TypeError, match="reader_func must return a Dataset"):
        Dataset.load(str(tmp_path), reader_func=lambda datasets: [1])  # type: ignore[arg-type,return-value]


# -- element_spec ---------------------------------------------------------------------------


def test_a_given_element_spec_must_fit_the_saved_one(tmp_path: pathlib.Path) -> None:
    ds = Dataset.range(3).map(lambda x: (x, np.zeros(2, np.float32)))
    ds.save(str(tmp_path))
    spec = (TensorSpec((), np.int64), TensorSpec((None,), np.float32))
    assert Dataset.load(str(tmp_path), element_spec=spec).element_spec == spec
    assert len(_list(Dataset.load(str(tmp_path), element_spec=ds.element_spec))) == 3
    for wrong in (
        (TensorSpec((), np.int32), TensorSpec((2,), np.float32)),
        (TensorSpec((), np.int64), TensorSpec((3,), np.float32)),
        TensorSpec((), np.int64),
    ):
        with pytest.raises(InvalidArgumentError, match="does not match the spec of the elements"):
            Dataset.load(str(tmp_path), element_spec=wrong)


def test_namedtuple_elements_round_trip(tmp_path: pathlib.Path) -> None:
    import collections

    Point = collections.namedtuple("Point", ["x", "y"])
    ds = Dataset.range(3).map(lambda v: Point(v, v * 2))
    ds.save(str(tmp_path))
    loaded = _list(Dataset.load(str(tmp_path)))
    assert [tuple(int(a) for a in p) for p in loaded] == [(0, 0), (1, 2), (2, 4)]
    assert loaded[0]._fields == ("x", "y")


# -- unfinished and missing snapshots -------------------------------------------------------


def test_loading_a_missing_path_is_not_found(tmp_path: pathlib.Path) -> None:
    with pytest.raises(NotFoundError, match="does not exist"):
        Dataset.load(str(tmp_path / "nothing"))


def test_loading_an_unfinished_snapshot_is_not_found(tmp_path: pathlib.Path) -> None:
    Dataset.range(3).save(str(tmp_path))
    os.remove(tmp_path / fmt.DONE)
    with pytest.raises(NotFoundError, match="holds no finished snapshot"):
        Dataset.load(str(tmp_path))
    with pytest.raises(NotFoundError, match="no distributed_save is writing one"):
        Dataset.load(str(tmp_path), wait=True)


def test_wait_reads_a_finished_snapshot(tmp_path: pathlib.Path) -> None:
    Dataset.range(3).save(str(tmp_path))
    assert [int(x) for x in Dataset.load(str(tmp_path), wait=True)] == [0, 1, 2]


def test_a_save_that_fails_leaves_no_snapshot(tmp_path: pathlib.Path) -> None:
    def fail_at_5(x: Any) -> Any:
        if int(x) == 5:
            raise ValueError("boom")
        return x

    with pytest.raises(ValueError, match="boom"):
        Dataset.range(10).map(fail_at_5).save(str(tmp_path))
    with pytest.raises(NotFoundError):
        Dataset.load(str(tmp_path))
    assert _chunks(tmp_path) == []


def test_saving_again_replaces_the_snapshot(tmp_path: pathlib.Path) -> None:
    Dataset.range(3).save(str(tmp_path))
    Dataset.range(10, 12).save(str(tmp_path))
    assert [int(x) for x in Dataset.load(str(tmp_path))] == [10, 11]
    runs = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(runs) == 1  # the old run's files are gone


def _run(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


_KILLED_SAVE = """
    import os
    from feedline.data import Dataset

    path, log, kill_at, args = {path!r}, {log!r}, {kill_at}, {args}

    def step(x):
        with open(log, "a") as f:
            f.write(f"{{int(x)}}\\n")
        if int(x) == kill_at:
            os._exit(17)  # the writing process dies, without any cleanup
        return x * 10

    Dataset.range(100).map(step).save(path, shard_func=lambda x: x % 3, checkpoint_args=args)
"""


def test_a_killed_save_is_not_finished_and_a_rerun_completes(tmp_path: pathlib.Path) -> None:
    path, log = str(tmp_path / "s"), str(tmp_path / "log")
    killed = _run(_KILLED_SAVE.format(path=path, log=log, kill_at=60, args=None))
    assert killed.returncode == 17, killed.stderr
    assert list((tmp_path / "s").rglob(fmt.METADATA))  # a run was started, never finished
    with pytest.raises(NotFoundError):
        Dataset.load(path)
    done = _run(_KILLED_SAVE.format(path=path, log=log, kill_at=-1, args=None))
    assert done.returncode == 0, done.stderr
    assert sorted(int(x) for x in Dataset.load(path)) == list(range(0, 1000, 10))
    assert len([p for p in (tmp_path / "s").iterdir() if p.is_dir()]) == 1


def test_checkpoint_args_resume_a_killed_save(tmp_path: pathlib.Path) -> None:
    path, log = str(tmp_path / "s"), str(tmp_path / "log")
    args = {"directory": str(tmp_path / "ckpt"), "checkpoint_interval": 25, "max_to_keep": 2}
    killed = _run(_KILLED_SAVE.format(path=path, log=log, kill_at=60, args=args))
    assert killed.returncode == 17, killed.stderr
    with pytest.raises(NotFoundError):
        Dataset.load(path)
    log2 = str(tmp_path / "log2")
    done = _run(_KILLED_SAVE.format(path=path, log=log2, kill_at=-1, args=args))
    assert done.returncode == 0, done.stderr
    calls = [int(line) for line in pathlib.Path(log2).read_text().split()]
    # Resumed after the checkpoint at 50 elements (the map also runs on 0 and 1 to learn its
    # output spec).
    assert [c for c in calls if c > 1] == list(range(50, 100))
    loaded = Dataset.load(path, reader_func=lambda datasets: datasets.flat_map(lambda d: d))
    expected = [v * 10 for r in range(3) for v in range(100) if v % 3 == r]
    assert [int(x) for x in loaded] == expected
    assert not (tmp_path / "ckpt" / "save-progress.ckpt").exists()


def test_checkpoint_args_are_checked(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidArgumentError, match="needs 'directory'"):
        Dataset.range(2).save(str(tmp_path), checkpoint_args={"checkpoint_interval": 5})
    with pytest.raises(InvalidArgumentError, match=r"unknown checkpoint_args \['every'\]"):
        Dataset.range(2).save(str(tmp_path), checkpoint_args={"directory": "d", "every": 5})
    with pytest.raises(InvalidArgumentError, match="checkpoint_interval must be a positive"):
        Dataset.range(2).save(
            str(tmp_path), checkpoint_args={"directory": "d", "checkpoint_interval": -1}
        )


# -- damage ---------------------------------------------------------------------------------


def _saved(tmp_path: pathlib.Path, compression: str | None = None) -> pathlib.Path:
    _mixed(6).save(str(tmp_path), compression=compression, shard_func=lambda x, _: x % 2)
    return tmp_path


@pytest.mark.parametrize("compression", [None, "GZIP"])
@pytest.mark.parametrize("where", [3, 40, -6, -1])
def test_a_flipped_byte_is_data_loss(
    tmp_path: pathlib.Path, compression: str | None, where: int
) -> None:
    chunk = _chunks(_saved(tmp_path, compression))[0]
    data = bytearray(chunk.read_bytes())
    data[where] ^= 0x10
    chunk.write_bytes(bytes(data))
    with pytest.raises(DataLossError, match="is damaged") as info:
        _list(Dataset.load(str(tmp_path)))
    assert info.value.filename == str(chunk)


def test_a_truncated_chunk_is_data_loss(tmp_path: pathlib.Path) -> None:
    chunk = _chunks(_saved(tmp_path))[1]
    for size in (len(chunk.read_bytes()) - 3, 10):
        chunk.write_bytes(chunk.read_bytes()[:size])
        with pytest.raises(DataLossError, match="damaged"):
            _list(Dataset.load(str(tmp_path)))


def test_a_missing_chunk_is_data_loss(tmp_path: pathlib.Path) -> None:
    os.remove(_chunks(_saved(tmp_path))[0])
    with pytest.raises(DataLossError, match="is missing"):
        _list(Dataset.load(str(tmp_path)))


def test_damaged_metadata_is_data_loss(tmp_path: pathlib.Path) -> None:
    _saved(tmp_path)
    done = tmp_path / fmt.DONE
    done.write_text(done.read_text().replace('"elements": 6', '"elements": 7'))
    with pytest.raises(DataLossError, match="checksum does not match"):
        Dataset.load(str(tmp_path))
    done.write_text("{not json")
    with pytest.raises(DataLossError, match="is damaged"):
        Dataset.load(str(tmp_path))


# -- checkpoints ----------------------------------------------------------------------------


def _loaded(name: str, build: Any, shard_func: Any = None, reader_func: Any = None) -> Any:
    path = os.path.join(_SCRATCH.name, name)

    def factory() -> Dataset:
        if not fmt.is_finished(path):
            build().save(path, shard_func=shard_func)
        return Dataset.load(path, reader_func=reader_func)

    return factory


def _one_shard() -> Dataset:
    """The reader of one shard (what ``reader_func`` receives the datasets of), over chunks of
    several groups of element shapes."""
    path = os.path.join(_SCRATCH.name, "one_shard")
    if not fmt.is_finished(path):
        _mixed(11).save(path, shard_func=lambda x, _: np.int64(0))
    finished = fmt.read_finished(path, "test")
    (shard,) = finished.shards
    directory = fmt.shard_dir(finished.run_dir, shard.shard)
    return SnapshotShardDataset(directory, shard.chunks, finished.element_spec)


test_checkpointing = checkpoint_test(
    __name__,
    shard=_one_shard,
    load_default=_loaded("default", lambda: Dataset.range(13)),
    load_nested=_loaded("nested", lambda: _mixed(7)),
    load_shuffled_shards=_loaded(
        "shuffled",
        lambda: Dataset.range(11),
        shard_func=lambda x: x % 3,
        reader_func=lambda d: d.shuffle(3, seed=5).interleave(lambda x: x, cycle_length=2),
    ),
)


def test_load_is_a_dataset_of_its_reader(tmp_path: pathlib.Path) -> None:
    Dataset.range(4).save(str(tmp_path))
    loaded = Dataset.load(str(tmp_path))
    assert isinstance(loaded, LoadDataset) and len(loaded.inputs) == 1
    assert len(loaded) == 4


def test_load_is_rebuilt_over_another_reader(tmp_path: pathlib.Path) -> None:
    Dataset.range(4).save(str(tmp_path / "a"))
    Dataset.range(10, 13).save(str(tmp_path / "b"))
    a, b = Dataset.load(str(tmp_path / "a")), Dataset.load(str(tmp_path / "b"))
    copy = a._with_inputs(b.inputs)
    assert [int(x) for x in copy] == [10, 11, 12]
    assert [int(x) for x in a] == [0, 1, 2, 3]
