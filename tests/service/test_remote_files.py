"""The data service over files in an object store: a real S3-compatible server on loopback
(``tests/conftest.py``), a real dispatcher and worker processes that read the objects
themselves (they find the store through the same ``AWS_ENDPOINT_URL`` as the consumer)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable

import cloudpickle
import pytest

from feedline.data import Dataset, TFRecordDataset
from feedline.data.auto_shard import ShardMode, auto_shard
from feedline.data.options import AutoShardPolicy
from feedline.io import TFRecordWriter
from feedline.service import ShardingPolicy, distribute
from feedline.service.splits import SplitCursor, split_plan
from feedline.service.worker.split_source import with_split_source
from tests.launcher import free_port
from tests.service.conftest import Cluster
from tests.service.procs import ServiceProcesses

pytestmark = pytest.mark.timeout(180)


def _objects(bucket: str, files: int = 6, per_file: int = 5) -> list[bytes]:
    records = []
    for k in range(files):
        with TFRecordWriter(f"{bucket}/shards/part-{k:02d}.tfrecord") as writer:
            for j in range(per_file):
                record = b"%d.%d" % (k, j)
                writer.write(record)
                records.append(record)
    return records


def _pipeline(bucket: str) -> Dataset:
    files = Dataset.list_files(f"{bucket}/shards/part-*.tfrecord", shuffle=False)
    return files.interleave(TFRecordDataset, cycle_length=2)


def test_dynamic_splits_of_remote_files_give_every_record_once(s3_bucket: str) -> None:
    records = _objects(s3_bucket)
    with ServiceProcesses() as cluster:
        cluster.start_dispatcher()
        cluster.start_worker()
        cluster.start_worker()
        dataset = _pipeline(s3_bucket).apply(distribute(ShardingPolicy.DYNAMIC, cluster.target))
        got = [x.item() for x in dataset]
    assert sorted(got) == sorted(records)


@pytest.mark.parametrize("policy", [ShardingPolicy.FILE, ShardingPolicy.FILE_OR_DATA])
def test_static_sharding_of_remote_files_reads_every_record_once(
    s3_bucket: str, policy: ShardingPolicy
) -> None:
    """Two real workers read whole objects each (FILE_OR_DATA takes FILE where the dataset reads
    files), every record once."""
    records = _objects(s3_bucket)
    ports = [free_port(), free_port()]
    with ServiceProcesses() as cluster:
        cluster.start_dispatcher("--worker-addresses", ",".join(f"127.0.0.1:{p}" for p in ports))
        for port in ports:
            cluster.start_worker("--worker-address", f"127.0.0.1:{port}", port=port)
        dataset = _pipeline(s3_bucket).apply(distribute(policy, cluster.target))
        got = [x.item() for x in dataset]
    assert sorted(got) == sorted(records)
    assert auto_shard(_pipeline(s3_bucket), 2, 0, AutoShardPolicy.AUTO)[1] == ShardMode.FILES


def test_static_shards_of_remote_files_are_whole_objects_per_worker(s3_bucket: str) -> None:
    """What each of two workers reads under FILE sharding of a shuffled, seeded listing: its
    own objects, whole (the same on every run, as list_files' seed fixes the order)."""
    _objects(s3_bucket)
    files = Dataset.list_files(f"{s3_bucket}/shards/part-*.tfrecord", seed=3)
    shards = [
        auto_shard(files.interleave(TFRecordDataset), 2, index, AutoShardPolicy.FILE)[0]
        for index in range(2)
    ]
    by_worker = [sorted({x.item().split(b".")[0] for x in shard}) for shard in shards]
    assert by_worker == [[b"0", b"2", b"4"], [b"1", b"3", b"5"]]


def test_a_reader_given_urls_is_split_several_objects_at_a_time(
    s3_bucket: str, make_cluster: Callable[..., Cluster]
) -> None:
    """A TFRecordDataset given 40 URLs, DYNAMIC over one worker: splits of 2 objects (40 //
    16), each read whole, every record once; a fault-tolerant dispatcher gives the same."""
    records = _objects(s3_bucket, files=40, per_file=2)
    urls = [f"{s3_bucket}/shards/part-{k:02d}.tfrecord" for k in range(40)]
    plan = split_plan(TFRecordDataset(urls))
    assert SplitCursor.start(plan, 0, 1).split_size == 2
    for config in ({}, {"work_dir": tempfile.mkdtemp(), "fault_tolerant_mode": True}):
        cluster = make_cluster(1, **config)
        dataset = (
            TFRecordDataset(urls)
            .map(lambda x: x)
            .apply(distribute(ShardingPolicy.DYNAMIC, cluster.target))
        )
        got = [x.item() for x in dataset]
        assert sorted(got) == sorted(records), config


class _Splits:
    """A split provider that hands out the given splits, then none."""

    def __init__(self, *splits: list[int]) -> None:
        self._splits = iter(splits)

    def next_split(self, repetition: int) -> list[int] | None:
        return next(self._splits, None)


def test_a_worker_never_lists_the_store_again(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listing travels with the dataset: what a worker makes of it (its DYNAMIC split
    source, its FILE shard) names the objects with the store out of reach."""
    import s3fs

    _objects(s3_bucket)
    shipped = cloudpickle.dumps(Dataset.list_files(f"{s3_bucket}/shards/*.tfrecord", seed=1))
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing there
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        files = cloudpickle.loads(shipped)
        assert split_plan(files).num_units == 6
        names = [x.item() for x in with_split_source(files, _Splits([4, 5], [0]))]
        shard = auto_shard(files, 3, 1, AutoShardPolicy.FILE)[0]
        shard_names = sorted(x.item() for x in shard)
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    url = f"{s3_bucket}/shards/part-0%d.tfrecord".encode()
    assert names == [url % 4, url % 5, url % 0]
    assert shard_names == [url % 1, url % 4]
