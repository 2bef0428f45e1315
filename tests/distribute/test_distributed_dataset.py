"""Tests of feedline/distribute/distributed_dataset.py and _steps.py: the seeds' tables."""

from __future__ import annotations

import pathlib
import pickle
from typing import Any

import numpy as np
import pytest
import torch

import feedline
import feedline.data as fd
from feedline.distribute import (
    InputOptions,
    InputReplicationMode,
    MirroredStrategy,
    PerReplica,
    PerReplicaSpec,
)
from feedline.distribute.experimental import distribute_dataset_for_worker
from feedline.errors import InvalidArgumentError, OutOfRangeError
from feedline.io import TFRecordWriter


def strategy(n: int) -> MirroredStrategy:
    return MirroredStrategy([f"cpu:{i}" for i in range(n)])


def table(n: int, dataset: fd.Dataset) -> list[list[list[int]]]:
    s = strategy(n)
    return [
        [t.tolist() for t in s.experimental_local_results(step)]
        for step in s.experimental_distribute_dataset(dataset)
    ]


def test_seed_rebatching_tables() -> None:
    assert table(2, fd.Dataset.range(6).batch(4)) == [[[0, 1], [2, 3]], [[4], [5]]]
    assert table(5, fd.Dataset.range(4).batch(4)) == [[[0], [1], [2], [3], []]]
    assert table(3, fd.Dataset.range(8).batch(4)) == [
        [[0, 1], [2, 3], []],
        [[4, 5], [6, 7], []],
    ]


def test_seed_get_next_as_optional_example() -> None:
    s = strategy(2)
    iterator = iter(s.experimental_distribute_dataset(fd.Dataset.range(9).batch(4)))
    printed = []
    for _ in range(5):
        optional = iterator.get_next_as_optional()
        if not optional.has_value():
            break
        results = s.run(lambda x: x, args=(optional.get_value(),))
        printed.append([t.tolist() for t in s.experimental_local_results(results)])
    assert printed == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8], []]]


def test_empty_batches_keep_trailing_shape_and_dtype() -> None:
    images = np.zeros((5, 28, 28, 1), np.float32)
    s = strategy(3)
    steps = list(s.experimental_distribute_dataset(fd.Dataset.from_tensor_slices(images).batch(5)))
    last = s.experimental_local_results(steps[-1])
    assert [tuple(t.shape) for t in last] == [(2, 28, 28, 1), (2, 28, 28, 1), (1, 28, 28, 1)]
    steps = list(s.experimental_distribute_dataset(fd.Dataset.from_tensor_slices(images).batch(2)))
    empty = s.experimental_local_results(steps[-1])[2]
    assert tuple(empty.shape) == (0, 28, 28, 1) and empty.dtype == torch.float32


def test_next_get_next_and_the_end() -> None:
    s = strategy(2)
    iterator = iter(s.experimental_distribute_dataset(fd.Dataset.range(4).batch(4)))
    assert isinstance(next(iterator), PerReplica)
    with pytest.raises(OutOfRangeError):
        iterator.get_next()
    with pytest.raises(StopIteration):
        next(iterator)


def test_iterable_once_per_epoch_any_number_of_times() -> None:
    dist = strategy(2).experimental_distribute_dataset(fd.Dataset.range(4).batch(2))
    assert len(list(dist)) == len(list(dist)) == 2


def test_element_spec() -> None:
    dataset = fd.Dataset.from_tensors(([1.0], [1.0])).repeat(100).batch(10)
    spec = strategy(2).experimental_distribute_dataset(dataset).element_spec
    per_replica = fd.TensorSpec((None, 1), np.float32)
    assert spec == (
        PerReplicaSpec(per_replica, per_replica),
        PerReplicaSpec(per_replica, per_replica),
    )
    assert strategy(1).experimental_distribute_dataset(dataset).element_spec == (
        per_replica,
        per_replica,
    )
    iterator = iter(strategy(2).experimental_distribute_dataset(dataset))
    assert iterator.element_spec == spec


def test_element_spec_keeps_exact_static_per_replica_batch() -> None:
    # TF 2.21 prints these for range(8).batch(4, drop_remainder=True):
    #   1 replica:  TensorSpec(shape=(4,), dtype=tf.int64)
    #   2 replicas: PerReplicaSpec(TensorSpec(shape=(2,), ...), TensorSpec(shape=(2,), ...))
    #   3 replicas: PerReplicaSpec(TensorSpec(shape=(None,), ...) x 3)  (4 rows do not divide)
    exact = fd.Dataset.range(8).batch(4, drop_remainder=True)
    spec = {n: strategy(n).experimental_distribute_dataset(exact).element_spec for n in (1, 2, 3)}
    assert spec[1] == fd.TensorSpec((4,), np.int64)
    assert spec[2] == PerReplicaSpec(*[fd.TensorSpec((2,), np.int64)] * 2)
    assert spec[3] == PerReplicaSpec(*[fd.TensorSpec((None,), np.int64)] * 3)
    unknown = strategy(2).experimental_distribute_dataset(fd.Dataset.range(8).batch(4))
    assert unknown.element_spec == PerReplicaSpec(*[fd.TensorSpec((None,), np.int64)] * 2)
    steps = [[t.tolist() for t in step.values] for step in strategy(2).distribute_dataset(exact)]
    assert steps == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]


def test_element_spec_of_the_seed_from_generator_is_static() -> None:
    # The seed's from_generator, its elements of shape [4] split over 2 replicas: TF 2.21 gives
    # PerReplicaSpec(TensorSpec(shape=(2,), dtype=tf.float32), TensorSpec(shape=(2,), ...)).
    def input_gen():
        while True:
            yield np.random.rand(4).astype(np.float32)

    dataset = fd.Dataset.from_generator(input_gen, output_signature=fd.TensorSpec([4], np.float32))
    dist = strategy(2).experimental_distribute_dataset(dataset)
    assert dist.element_spec == PerReplicaSpec(*[fd.TensorSpec((2,), np.float32)] * 2)
    assert [tuple(t.shape) for t in next(iter(dist)).values] == [(2,), (2,)]


def test_element_spec_over_workers_splits_by_all_replicas() -> None:
    # The split is over num_workers * replicas_per_worker slices of the global batch.
    def spec(dataset: fd.Dataset, workers: int, replicas: int) -> Any:
        return distribute_dataset_for_worker(
            dataset, num_workers=workers, worker_index=0, replicas_per_worker=replicas
        ).element_spec

    batch_8 = fd.Dataset.range(16).batch(8, drop_remainder=True)
    assert spec(batch_8, 2, 1) == fd.TensorSpec((4,), np.int64)
    assert spec(batch_8, 2, 2) == PerReplicaSpec(*[fd.TensorSpec((2,), np.int64)] * 2)
    assert spec(batch_8, 3, 1) == fd.TensorSpec((None,), np.int64)
    batch_4 = fd.Dataset.range(16).batch(4, drop_remainder=True)
    assert spec(batch_4, 2, 2) == PerReplicaSpec(*[fd.TensorSpec((1,), np.int64)] * 2)
    assert spec(batch_4, 3, 2) == PerReplicaSpec(*[fd.TensorSpec((None,), np.int64)] * 2)
    pairs = fd.Dataset.from_tensor_slices((np.zeros((8, 3), np.float32), np.arange(8)))
    assert spec(pairs.batch(4, drop_remainder=True), 2, 1) == (
        fd.TensorSpec((2, 3), np.float32),
        fd.TensorSpec((2,), np.int64),
    )


def _worker_steps(dataset: fd.Dataset, workers: int, worker: int, replicas: int) -> list[Any]:
    dist = distribute_dataset_for_worker(
        dataset, num_workers=workers, worker_index=worker, replicas_per_worker=replicas
    )
    return [[t.tolist() for t in step.values] for step in dist]


def _off(dataset: fd.Dataset) -> fd.Dataset:
    options = fd.Options()
    options.experimental_distribute.auto_shard_policy = fd.AutoShardPolicy.OFF
    return dataset.with_options(options)


def test_workers_batch_sizes_rotate_so_that_each_global_step_has_the_global_batch() -> None:
    # TF's batch_sizes_for_worker(7, 2 workers, 2 replicas): worker 0 [2, 2, 2, 1], worker 1
    # [2, 1, 2, 2]; each worker rebatches its own rows with them (rows flow across its input
    # batches), two per step, so that every global step takes 7 rows:
    #   step 1: worker 0 [A0 A1] [A2 A3], worker 1 [B0 B1] [B2]      (4 + 3)
    #   step 2: worker 0 [A4 A5] [A6],    worker 1 [B3 B4] [B5 B6]   (3 + 4)
    dataset = _off(fd.Dataset.range(14).batch(7))
    assert _worker_steps(dataset, 2, 0, 2) == [
        [[0, 1], [2, 3]],
        [[4, 5], [6]],
        [[7, 8], [9, 10]],
        [[11, 12], [13]],
    ]
    assert _worker_steps(dataset, 2, 1, 2) == [
        [[0, 1], [2]],
        [[3, 4], [5, 6]],
        [[7, 8], [9]],
        [[10, 11], [12, 13]],
    ]
    # Balanced sizes (TF's rule: any two differ by at most one): 5 over 2 workers x 2 replicas
    # is [2, 1, 1, 1] on worker 0 and [1, 1, 2, 1] on worker 1.
    five = _off(fd.Dataset.range(5).batch(5))
    assert _worker_steps(five, 2, 0, 2) == [[[0, 1], [2]], [[3], [4]]]
    assert _worker_steps(five, 2, 1, 2) == [[[0], [1]], [[2, 3], [4]]]


def test_seed_order_restoration_with_enumerate() -> None:
    s = strategy(2)
    dataset = fd.Dataset.range(24).enumerate().batch(6)
    predictions = {}
    for indices, values in s.experimental_distribute_dataset(dataset):
        results = s.run(lambda i, x: (i, x * 2), args=(indices, values))
        for i, v in zip(
            s.experimental_local_results(results[0]),
            s.experimental_local_results(results[1]),
            strict=True,
        ):
            predictions.update(zip(i.tolist(), v.tolist(), strict=True))
    assert predictions == {i: 2 * i for i in range(24)}


def test_seed_from_generator_example() -> None:
    def input_gen():
        while True:
            yield np.random.rand(4)

    s = strategy(2)
    dataset = fd.Dataset.from_generator(
        input_gen, output_types=(feedline.float32), output_shapes=feedline.TensorShape([4])
    )
    iterator = iter(s.experimental_distribute_dataset(dataset.batch(4)))
    for _ in range(4):
        result = s.run(lambda x: x, args=(next(iterator),))
        assert [tuple(t.shape) for t in result.values] == [(2, 4), (2, 4)]


def test_distribute_datasets_from_function_seed_snippet() -> None:
    global_batch_size = 16
    s = strategy(2)
    contexts = []

    def dataset_fn(input_context):
        contexts.append(input_context)
        batch_size = input_context.get_per_replica_batch_size(global_batch_size)
        dataset = fd.Dataset.from_tensors(([1.0], [1.0])).repeat(64).batch(16)
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        dataset = dataset.batch(batch_size)
        return dataset.prefetch(2)

    steps = list(s.distribute_datasets_from_function(dataset_fn))
    assert contexts[0].num_replicas_in_sync == 2 and contexts[0].num_input_pipelines == 1
    # 4 batches of 16 rows, batched again by 8: one element of 4 batches, for replica 0 only
    assert len(steps) == 1
    shapes = [tuple(t.shape) for t in steps[0][0].values]
    assert shapes == [(4, 16, 1), (0, 16, 1)]


def test_from_function_partial_step_gets_empty_batches() -> None:
    s = strategy(2)
    dist = s.distribute_datasets_from_function(lambda ctx: fd.Dataset.range(6).batch(2))
    assert [[t.tolist() for t in s.experimental_local_results(x)] for x in dist] == [
        [[0, 1], [2, 3]],
        [[4, 5], []],
    ]


def test_per_replica_pipelines() -> None:
    s = strategy(2)
    options = InputOptions(experimental_replication_mode=InputReplicationMode.PER_REPLICA)
    dist = s.distribute_datasets_from_function(
        lambda ctx: fd.Dataset.range(
            ctx.input_pipeline_id * 10, ctx.input_pipeline_id * 10 + 2
        ).batch(1),
        options,
    )
    assert [[t.tolist() for t in s.experimental_local_results(x)] for x in dist] == [
        [[0], [10]],
        [[1], [11]],
    ]


def test_host_tensors_without_fetch_to_device() -> None:
    s = strategy(2)
    options = InputOptions(experimental_fetch_to_device=False)
    step = next(iter(s.experimental_distribute_dataset(fd.Dataset.range(4).batch(4), options)))
    assert all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in step.values)


def test_iterator_state_restores_exactly() -> None:
    s = strategy(3)
    dataset = fd.Dataset.range(40).shuffle(40, seed=1).batch(5)
    iterator = iter(s.experimental_distribute_dataset(dataset))
    next(iterator)
    state = pickle.loads(pickle.dumps(iterator.get_state()))
    rest = [[t.tolist() for t in x.values] for x in iterator]
    restored = iter(s.experimental_distribute_dataset(dataset))
    restored.set_state(state)
    assert [[t.tolist() for t in x.values] for x in restored] == rest


def test_bad_input_says_what_to_do() -> None:
    s = strategy(2)
    dist = s.experimental_distribute_dataset(fd.Dataset.range(4).batch(2))
    with pytest.raises(AttributeError, match="not a Dataset; apply map"):
        dist.map(lambda x: x)
    with pytest.raises(InvalidArgumentError, match="already distributed"):
        s.experimental_distribute_dataset(dist)
    with pytest.raises(TypeError, match=r"feedline\.data\.Dataset"):
        s.experimental_distribute_dataset([1, 2, 3])
    with pytest.raises(
        InvalidArgumentError, match=r"not batched.*dataset.batch\(global_batch_size\)"
    ):
        s.experimental_distribute_dataset(fd.Dataset.range(4))
    with pytest.raises(TypeError, match=r"dataset_fn must return a feedline\.data\.Dataset"):
        s.distribute_datasets_from_function(lambda ctx: [1, 2])
    one = strategy(1).experimental_distribute_dataset(fd.Dataset.range(3))  # one replica: fine
    assert [t.item() for t in one] == [0, 1, 2]


# -- FILE auto-sharding of readers made inside interleave / flat_map, worker by worker ---------


def _seed_files(tmp_path: pathlib.Path) -> tuple[list[str], list[str]]:
    """The seed's two files, as text and as TFRecord: [0..5] and [6..11]."""
    text, records = [], []
    for k, values in enumerate((range(0, 6), range(6, 12))):
        path = tmp_path / f"file{k}.txt"
        path.write_text("".join(f"{v}\n" for v in values))
        text.append(str(path))
        records.append(str(tmp_path / f"file{k}.tfrecord"))
        with TFRecordWriter(records[-1]) as writer:
            for v in values:
                writer.write(str(v).encode())
    return text, records


def _worker_tables(dataset: fd.Dataset, policy: fd.AutoShardPolicy | None) -> list[Any]:
    if policy is not None:
        options = fd.Options()
        options.experimental_distribute.auto_shard_policy = policy
        dataset = dataset.with_options(options)
    return [
        [
            step.tolist()
            for step in distribute_dataset_for_worker(dataset, num_workers=2, worker_index=w)
        ]
        for w in range(2)
    ]


@pytest.mark.parametrize("policy", [None, fd.AutoShardPolicy.AUTO, fd.AutoShardPolicy.FILE])
def test_seed_file_table_with_readers_made_inside_interleave(
    tmp_path: pathlib.Path, policy: fd.AutoShardPolicy | None
) -> None:
    # TF 2.21, 2 workers x 1 replica, global batch 4, FILE (and AUTO, which finds the files):
    #   worker 0: [0, 1], [2, 3], [4], [5]      worker 1: [6, 7], [8, 9], [10], [11]
    seed_table = [[[0, 1], [2, 3], [4], [5]], [[6, 7], [8, 9], [10], [11]]]
    text, records = _seed_files(tmp_path)

    def to_int(line: np.ndarray) -> int:
        return int(line.item())

    pipelines = {
        "from_tensor_slices(paths).interleave(lambda p: TextLineDataset(p))": (
            fd.Dataset.from_tensor_slices(text).interleave(
                lambda p: fd.TextLineDataset(p), cycle_length=1
            )
        ),
        "list_files(...).interleave(TFRecordDataset)": (
            fd.Dataset.list_files(str(tmp_path / "*.tfrecord"), shuffle=False).interleave(
                fd.TFRecordDataset, cycle_length=1
            )
        ),
        "from_tensor_slices(paths).flat_map(TFRecordDataset)": (
            fd.Dataset.from_tensor_slices(records).flat_map(fd.TFRecordDataset)
        ),
    }
    for name, lines in pipelines.items():
        assert _worker_tables(lines.map(to_int).batch(4), policy) == seed_table, name


def test_an_interleave_without_readers_shards_by_data(tmp_path: pathlib.Path) -> None:
    # No reader in the function: AUTO falls back to DATA (each worker keeps its slice).
    text, _ = _seed_files(tmp_path)
    values = fd.Dataset.from_tensor_slices(text).interleave(
        lambda p: fd.Dataset.range(6), cycle_length=1
    )
    assert _worker_tables(values.batch(4), None) == [
        [[0, 1], [4, 5], [2, 3]],
        [[2, 3], [0, 1], [4, 5]],
    ]


# -- replicas on GPUs, through the device feed (a stand-in backend plays CUDA) --------------------


def _on_fake_gpus(
    dataset: fd.Dataset, replicas: int, backend: Any, options: InputOptions | None = None
) -> Any:
    from feedline.distribute._devices import ReplicaDevice
    from feedline.distribute.distributed_dataset import DistributedDataset, StepSource

    source = StepSource.from_global_batches(
        dataset, num_workers=1, worker_index=0, replicas_per_worker=replicas, options=options
    )
    devices = [ReplicaDevice("cuda", i) for i in range(replicas)]
    return DistributedDataset(source, devices, options, lambda has: has, copy_backend=backend)


def _values(step: Any) -> Any:
    if isinstance(step, PerReplica):
        return [_values(v) for v in step.values]
    if isinstance(step, tuple):
        return tuple(_values(v) for v in step)
    return step.tolist()


def test_gpu_replicas_get_what_cpu_replicas_get_through_reused_pinned_buffers() -> None:
    from tests.data.fake_device import LateBackend

    dataset = fd.Dataset.range(30).map(lambda x: (x, x * 0.5)).batch(4)
    backend = LateBackend()
    on_gpus = [_values(step) for step in _on_fake_gpus(dataset, 2, backend)]
    on_cpus = [_values(step) for step in strategy(2).experimental_distribute_dataset(dataset)]
    assert on_gpus == on_cpus
    # 8 steps x 2 replicas, one copy each; 2 rings of (1 + 1 ahead) + 2 buffers, reused
    assert backend.copies == 16 and backend.allocations == 8
    assert backend.compute_waits == 16


def test_pinned_buffer_count_of_a_distributed_dataset() -> None:
    from feedline.data._device_feed import HostBackend

    options = fd.Options()
    options.experimental_distribute.pinned_buffer_count = 5
    backend = HostBackend()
    ds = fd.Dataset.range(40).batch(4).with_options(options)
    assert len(list(_on_fake_gpus(ds, 2, backend))) == 10
    assert backend.allocations == 10


def test_gpu_replica_checkpoints_are_unchanged() -> None:
    from feedline.data._device_feed import HostBackend
    from tests.data.fake_device import LateBackend

    dataset = fd.Dataset.range(22).shuffle(22, seed=3).batch(4)
    options = InputOptions(experimental_per_replica_buffer_size=2)
    expected = [_values(s) for s in _on_fake_gpus(dataset, 2, HostBackend(), options)]
    iterator = iter(_on_fake_gpus(dataset, 2, LateBackend(), options))
    for step in range(len(expected) + 1):
        state = pickle.loads(pickle.dumps(iterator.get_state()))
        assert set(state) == {"steps", "ahead", "finished"}
        restored = iter(_on_fake_gpus(dataset, 2, LateBackend(), options))
        restored.set_state(state)
        assert [_values(s) for s in restored] == expected[step:], f"restored at step {step}"
        if step < len(expected):
            assert _values(next(iterator)) == expected[step]


def test_a_cpu_replica_beside_gpu_replicas_stays_on_the_host() -> None:
    from feedline.data._device_feed import HostBackend
    from feedline.distribute._devices import ReplicaDevice
    from feedline.distribute.distributed_dataset import DistributedDataset, StepSource

    backend = HostBackend()
    source = StepSource.from_global_batches(
        fd.Dataset.range(8).batch(4), num_workers=1, worker_index=0, replicas_per_worker=2
    )
    devices = [ReplicaDevice("cuda", 0), ReplicaDevice("cpu", 0)]
    steps = list(DistributedDataset(source, devices, None, lambda has: has, copy_backend=backend))
    assert [_values(step) for step in steps] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert backend.copies == 2  # the GPU replica's parts only
