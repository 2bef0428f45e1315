"""Tests of feedline/distribute/multi_worker.py with real worker processes on 127.0.0.1.

Each launch starts real processes (torchrun's environment or ``TF_CONFIG``) that join one gloo
process group; every process reports what it saw, and the tests compare literal per-worker
tables, as the seeds print them.
"""

from __future__ import annotations

import pytest
import torch

import feedline.data as fd
import feedline.distribute as fdist
from tests.distribute.test_mirroring import GLOBAL_BATCH, train, train_on
from tests.launcher import Processes, run, tf_config_envs, torchrun_envs

pytestmark = pytest.mark.timeout(180)

_PREAMBLE = """
import json, os, sys
import numpy as np
import torch
import feedline.data as fd
import feedline.distribute as fdist
import feedline.metrics
from tests.launcher import report

def lists(dist, strategy):
    return [[t.tolist() for t in strategy.experimental_local_results(s)] for s in dist]
"""


def test_two_workers_from_torchrun_env_shard_reduce_gather_and_agree_on_the_end() -> None:
    code = (
        _PREAMBLE
        + """
strategy = fdist.MultiWorkerMirroredStrategy()
resolver = strategy.cluster_resolver
rank = strategy.extended.worker_index
out = {"task": [resolver.task_type, resolver.task_id],
       "replicas": strategy.num_replicas_in_sync, "chief": strategy.extended.should_checkpoint}
out["steps"] = lists(strategy.experimental_distribute_dataset(fd.Dataset.range(12).batch(4)),
                     strategy)

# Uneven input: worker 0 has 5 batches, worker 1 has 2; both run 5 steps, no hang.
def uneven(ctx):
    return fd.Dataset.range(10 if ctx.input_pipeline_id == 0 else 4).batch(2)
out["uneven"] = lists(strategy.distribute_datasets_from_function(uneven), strategy)

value = torch.tensor([1.0, 2.0]) * (rank + 1)
out["sum"] = strategy.reduce("SUM", value, axis=None).tolist()
out["mean"] = strategy.reduce("MEAN", value, axis=0).item()
batch = torch.arange(3 * rank, dtype=torch.float32)          # worker 0 has an empty batch
out["gather"] = strategy.gather(batch, axis=0).tolist()
with strategy.scope():
    mean = feedline.metrics.Mean()
mean.update_state(torch.tensor([float(rank + 1)] * (rank + 1)))
out["metric"] = mean.result().item()

class Positives(feedline.metrics.Metric):  # written as Keras writes its metrics
    def __init__(self):
        super().__init__()
        self.count = self.add_weight(name="count", shape=(2,))
    def update_state(self, values):
        self.count.assign_add(torch.stack([(values > 0).sum(), (values <= 0).sum()]))
    def result(self):
        return self.count
with strategy.scope():
    positives = Positives()
positives.update_state(torch.tensor([1.0, -1.0, 2.0]) * (1 if rank == 0 else -1))
out["weights"] = [positives.result().tolist(), positives.count.value.tolist()]
out["local"] = [t.tolist() for t in strategy.experimental_local_results(value)]

# Gradient buckets start their all-reduce during backward, in order, before the step.
small = fdist.MultiWorkerMirroredStrategy(
    communication_options=fdist.experimental.CommunicationOptions(bytes_per_pack=64))
with small.scope():
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
def overlap_step(x):
    opt.zero_grad()
    net(x).sum().backward()
    started = small._mirroring._launched
    opt.step()
    return started
started = small.run(overlap_step, args=(torch.ones(2, 4) * (rank + 1),))
out["buckets"] = [len(small._mirroring._buckets), started]
out["bias_grad"] = net[1].bias.grad.tolist()
report(out)
"""
    )
    results = run(code, torchrun_envs(2))
    w0, w1 = results["rank:0"].result, results["rank:1"].result
    assert w0["task"] == ["worker", 0] and w1["task"] == ["worker", 1]
    assert w0["replicas"] == w1["replicas"] == 2
    assert (w0["chief"], w1["chief"]) == (True, False)
    assert w0["steps"] == [[[0, 1]], [[4, 5]], [[8, 9]]]
    assert w1["steps"] == [[[2, 3]], [[6, 7]], [[10, 11]]]
    assert w0["uneven"] == [[[0, 1]], [[2, 3]], [[4, 5]], [[6, 7]], [[8, 9]]]
    assert w1["uneven"] == [[[0, 1]], [[2, 3]], [[]], [[]], [[]]]
    for w in (w0, w1):
        assert w["sum"] == [3.0, 6.0]
        assert w["mean"] == pytest.approx((1 + 2 + 2 + 4) / 4)
        assert w["gather"] == [0.0, 1.0, 2.0]
        assert w["metric"] == pytest.approx((1 + 2 + 2) / 3)
        assert w["weights"][0] == [3.0, 3.0]  # summed over the workers when read
    assert w0["weights"][1] == [2.0, 1.0] and w1["weights"][1] == [1.0, 2.0]  # each its own
    assert w0["local"] == [[1.0, 2.0]] and w1["local"] == [[2.0, 4.0]]
    # Linear(4, 8) and Linear(8, 2) in 64-byte buckets: [b2], [w2], [b1], [w1]; all four were
    # sent while backward ran. The last bias's gradient is the sum over workers: 2 rows each.
    assert w0["buckets"] == w1["buckets"] == [4, 4]
    assert w0["bias_grad"] == w1["bias_grad"] == [4.0, 4.0]


def test_one_replica_per_worker_feeds_per_replica_values_and_spec() -> None:
    # TF wraps input in PerReplica whenever the strategy is in multi-worker mode, even with one
    # local replica: element_spec is a PerReplicaSpec and each step a PerReplica of one tensor.
    code = (
        _PREAMBLE
        + """
from feedline.distribute import PerReplica, PerReplicaSpec
strategy = fdist.MultiWorkerMirroredStrategy()
dataset = fd.Dataset.from_tensor_slices(np.arange(8, dtype=np.float32)).batch(4)
dist = strategy.experimental_distribute_dataset(dataset)
spec = dist.element_spec
step = next(iter(dist))
from_fn = strategy.distribute_datasets_from_function(lambda ctx: dataset)
out = {
    "spec": isinstance(spec, PerReplicaSpec) and [repr(s) for s in spec.specs],
    "iterator_spec": iter(dist).element_spec == spec,
    "step": isinstance(step, PerReplica) and [t.tolist() for t in step.values],
    "run": strategy.run(lambda x: x * 2, args=(step,)).tolist(),
    "fn_spec": isinstance(from_fn.element_spec, PerReplicaSpec),
}
report(out)
"""
    )
    results = run(code, torchrun_envs(2))
    w0, w1 = results["rank:0"].result, results["rank:1"].result
    assert w0["spec"] == w1["spec"] == ["TensorSpec(shape=(None,), dtype=float32)"]
    assert w0["iterator_spec"] and w1["iterator_spec"] and w0["fn_spec"] and w1["fn_spec"]
    assert w0["step"] == [[0.0, 1.0]] and w1["step"] == [[2.0, 3.0]]
    assert w0["run"] == [0.0, 2.0] and w1["run"] == [4.0, 6.0]


_POLICY_TABLES = """
import tempfile
from feedline.data.experimental import AutoShardPolicy

def with_policy(ds, policy):
    options = fd.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return ds.with_options(options)

strategy = fdist.MultiWorkerMirroredStrategy(devices=["cpu:0", "cpu:1"])
rank = strategy.extended.worker_index
out = {"replicas": strategy.num_replicas_in_sync, "task": strategy.cluster_resolver.task_type}
folder = os.environ["FEEDLINE_TEST_RESULT_DIR"]
paths = []
for i in range(4):
    path = os.path.join(folder, f"part-{i}.txt")
    if rank == 0:
        with open(path + ".tmp", "w") as f:
            f.write("".join(f"{10 * i + j}\\n" for j in range(4)))
        os.replace(path + ".tmp", path)
    paths.append(path)
strategy.reduce("SUM", torch.tensor(0.0), axis=None)   # a barrier: the files exist
files = fd.Dataset.list_files(os.path.join(folder, "part-*.txt"), shuffle=False)
lines = files.interleave(fd.TextLineDataset, cycle_length=1).map(
    lambda line: np.int64(int(line.item())))
tables = {
    "DATA": with_policy(fd.Dataset.range(16).batch(8), AutoShardPolicy.DATA),
    "OFF": with_policy(fd.Dataset.range(8).batch(4), AutoShardPolicy.OFF),
    "FILE": with_policy(lines.batch(4), AutoShardPolicy.FILE),
    "FILE7": with_policy(lines.batch(7), AutoShardPolicy.FILE),
    "AUTO": with_policy(lines.batch(4), AutoShardPolicy.AUTO),
    "HINT": with_policy(
        fd.Dataset.range(16).shard(fd.experimental.SHARD_HINT, fd.experimental.SHARD_HINT)
        .batch(4), AutoShardPolicy.HINT),
}
for name, ds in tables.items():
    out[name] = lists(strategy.experimental_distribute_dataset(ds), strategy)
report(out)
"""


def test_two_workers_with_two_replicas_each_follow_every_auto_shard_policy() -> None:
    results = run(_PREAMBLE + _POLICY_TABLES, tf_config_envs({"chief": 1, "worker": 1}))
    chief, worker = results["chief:0"].result, results["worker:0"].result
    assert chief["replicas"] == worker["replicas"] == 4
    assert (chief["task"], worker["task"]) == ("chief", "worker")
    # DATA: each global batch of 8 in 4 slices of 2; worker i keeps slices 2i, 2i+1.
    assert chief["DATA"] == [[[0, 1], [2, 3]], [[8, 9], [10, 11]]]
    assert worker["DATA"] == [[[4, 5], [6, 7]], [[12, 13], [14, 15]]]
    # The other policies keep every slice of the worker's own batches, 2 replicas per step.
    # OFF: every worker reads everything; a batch of 4 over 4 replicas is one row each.
    assert chief["OFF"] == worker["OFF"] == [[[0], [1]], [[2], [3]], [[4], [5]], [[6], [7]]]
    # FILE (and AUTO, which finds the files): worker i reads files i and i + 2.
    assert chief["FILE"] == [[[0], [1]], [[2], [3]], [[20], [21]], [[22], [23]]]
    assert worker["FILE"] == [[[10], [11]], [[12], [13]], [[30], [31]], [[32], [33]]]
    assert chief["AUTO"] == chief["FILE"] and worker["AUTO"] == worker["FILE"]
    # FILE with a global batch of 7: TF's batch_sizes_for_worker gives the chief [2, 2, 2, 1]
    # and the worker [2, 1, 2, 2]; each rebatches its 8 rows with them, so each global step
    # takes 7 rows (4 + 3, then 3 + 4) until the rows run out.
    assert chief["FILE7"] == [[[0, 1], [2, 3]], [[20, 21], [22]], [[23], []]]
    assert worker["FILE7"] == [[[10, 11], [12]], [[13, 30], [31, 32]], [[33], []]]
    # HINT: shard(SHARD_HINT, SHARD_HINT) becomes shard(2, i).
    assert chief["HINT"] == [[[0], [2]], [[4], [6]], [[8], [10]], [[12], [14]]]
    assert worker["HINT"] == [[[1], [3]], [[5], [7]], [[9], [11]], [[13], [15]]]


_TRAIN = """
from tests.distribute.test_mirroring import train_on
devices = [f"cpu:{i}" for i in range(int(sys.argv[1]))]
strategy = fdist.MultiWorkerMirroredStrategy(devices=devices)
params = train_on(strategy, rows=int(sys.argv[2]))
report([p.flatten().tolist() for p in params])
"""


@pytest.mark.parametrize(
    ("replicas", "rows"),
    [
        (1, GLOBAL_BATCH * 20),
        # 20 steps, the last with 1 row: worker 1's replicas get only empty batches.
        (2, GLOBAL_BATCH * 19 + 1),
    ],
)
def test_workers_train_exactly_as_one_replica_on_the_global_batch(replicas: int, rows: int) -> None:
    results = run(_PREAMBLE + _TRAIN, torchrun_envs(2), argv=[str(replicas), str(rows)])
    expected = [p.flatten() for p in train(1, rows=rows)]
    for result in results.values():
        for got, want in zip(result.result, expected, strict=True):
            torch.testing.assert_close(torch.tensor(got), want, rtol=1e-5, atol=1e-6)
    assert results["rank:0"].result == results["rank:1"].result  # one identical update
    assert not torch.equal(expected[0], train(1, rows=rows, steps=18)[0].flatten())


def test_a_peer_that_dies_mid_run_makes_the_others_fail_naming_it() -> None:
    code = (
        _PREAMBLE
        + """
from feedline.errors import UnavailableError
strategy = fdist.MultiWorkerMirroredStrategy(
    communication_options=fdist.experimental.CommunicationOptions(timeout_seconds=20))
rank = strategy.extended.worker_index
dist = iter(strategy.experimental_distribute_dataset(fd.Dataset.range(1000).batch(2)))
try:
    for step in range(100):
        strategy.reduce("SUM", next(dist), axis=0)   # a collective every step, as training has
        if rank == 1 and step == 3:
            os.kill(os.getpid(), 9)
except UnavailableError as error:
    report({"step": step, "error": str(error)})
"""
    )
    with Processes(code, tf_config_envs({"worker": 2}), timeout=90) as procs:
        results = procs.wait()
    survivor = results["worker:0"]
    assert results["worker:1"].returncode == -9
    assert survivor.returncode == 0, survivor.describe()
    assert survivor.result["step"] in (3, 4, 5)
    assert "worker 1 (127.0.0.1:" in survivor.result["error"]


def test_a_worker_alone_fails_within_the_timeout_naming_the_rendezvous() -> None:
    code = (
        _PREAMBLE
        + """
from feedline.errors import UnavailableError
try:
    fdist.MultiWorkerMirroredStrategy(
        communication_options=fdist.experimental.CommunicationOptions(timeout_seconds=3))
except UnavailableError as error:
    report(str(error))
"""
    )
    envs = tf_config_envs({"worker": 2})
    results = run(code, envs[1:], timeout=60)  # worker 0, the rendezvous, never starts
    message = results["worker:1"].result
    address = envs[0][1]["TF_CONFIG"].split('"worker": ["')[1].split('"')[0]
    assert f"rendezvous address {address}" in message
    assert "within 3 s" in message


def test_single_worker_without_a_cluster_trains_alone() -> None:
    strategy = fdist.MultiWorkerMirroredStrategy()
    assert strategy.num_replicas_in_sync == 1
    assert strategy.cluster_resolver is not None
    assert strategy.extended.should_checkpoint
    steps = [
        s.tolist() for s in strategy.experimental_distribute_dataset(fd.Dataset.range(6).batch(4))
    ]
    assert steps == [[0, 1, 2, 3], [4, 5]]
    one = train(1, rows=GLOBAL_BATCH * 3)
    alone = train_on(fdist.MultiWorkerMirroredStrategy(), rows=GLOBAL_BATCH * 3)
    for p, q in zip(one, alone, strict=True):
        torch.testing.assert_close(q, p)


def test_communication_options_validate() -> None:
    options = fdist.experimental.CommunicationOptions(implementation="ring")
    assert options.implementation is fdist.experimental.CommunicationImplementation.RING
    with pytest.raises(ValueError, match="bytes_per_pack must be >= 0"):
        fdist.experimental.CommunicationOptions(bytes_per_pack=-1)
    with pytest.raises(ValueError, match="timeout_seconds must be positive"):
        fdist.experimental.CommunicationOptions(timeout_seconds=0)
    with pytest.raises(ValueError, match="AUTO, RING, NCCL"):
        fdist.experimental.CommunicationOptions(implementation="MPI")


def test_single_process_strategy_warns_when_the_environment_names_a_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "TF_CONFIG",
        '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '
        '"task": {"type": "worker", "index": 0}}',
    )
    with pytest.warns(UserWarning, match="2 workers.*MultiWorkerMirroredStrategy"):
        fdist.MirroredStrategy(["cpu:0"])


_THREE_WORKERS = """
strategy = fdist.MultiWorkerMirroredStrategy()
rank = strategy.extended.worker_index
out = {"replica_id": strategy.experimental_distribute_values_from_function(
    lambda ctx: ctx.replica_id_in_sync_group)}
options = fd.Options()
options.experimental_distribute.auto_shard_policy = fd.experimental.AutoShardPolicy.DATA
data = fd.Dataset.range(12).batch(6).with_options(options)
out["DATA"] = lists(strategy.experimental_distribute_dataset(data), strategy)

folder = os.environ["FEEDLINE_TEST_RESULT_DIR"]
if rank == 0:
    for i in range(4):
        with open(os.path.join(folder, f"part-{i}.tmp"), "w") as f:
            f.write("".join(f"{10 * i + j}\\n" for j in range(4)))
        os.replace(os.path.join(folder, f"part-{i}.tmp"), os.path.join(folder, f"part-{i}.txt"))
strategy.reduce("SUM", torch.tensor(0.0), axis=None)   # a barrier: the files exist
files = fd.Dataset.list_files(os.path.join(folder, "part-*.txt"), shuffle=False)
lines = files.interleave(fd.TextLineDataset, cycle_length=1).map(
    lambda line: np.int64(int(line.item())))
out["FILE"] = lists(strategy.experimental_distribute_dataset(lines.batch(3)), strategy)

# Buffers: BatchNorm's running statistics end identical on every worker.
torch.manual_seed(rank)          # different initialisations: the chief's must win
with strategy.scope():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
def step(x):
    optimizer.zero_grad()
    model(x).pow(2).sum().backward()
    optimizer.step()
for i in range(3):
    strategy.run(step, args=(torch.randn(8, 4) + rank,))
bn = model[1]
out["buffers"] = [bn.running_mean.tolist(), bn.running_var.tolist(),
                  int(bn.num_batches_tracked)]
out["weight"] = model[0].weight.flatten().tolist()
report(out)
"""


def test_three_workers_shard_by_data_and_files_and_keep_buffers_identical() -> None:
    results = run(_PREAMBLE + _THREE_WORKERS, tf_config_envs({"worker": 3}))
    workers = [results[f"worker:{i}"].result for i in range(3)]
    assert [w["replica_id"] for w in workers] == [0, 1, 2]
    assert [w["DATA"] for w in workers] == [
        [[[0, 1]], [[6, 7]]],
        [[[2, 3]], [[8, 9]]],
        [[[4, 5]], [[10, 11]]],
    ]
    # FILE over 4 files: worker 0 reads files 0 and 3, the others one each; the end of data is
    # agreed, so every worker runs as many steps as worker 0, with empty batches at the end.
    steps = [w["FILE"] for w in workers]
    assert len({len(s) for s in steps}) == 1
    rows = sorted(row for s in steps for step in s for row in step[0])
    assert rows == [10 * i + j for i in range(4) for j in range(4)]
    assert {row // 10 for step in steps[0] for row in step[0]} == {0, 3}
    assert steps[1][-1] == [[]] and steps[2][-1] == [[]]
    assert workers[0]["buffers"] == workers[1]["buffers"] == workers[2]["buffers"]
    assert workers[0]["buffers"][2] == 3
    assert workers[0]["weight"] == workers[1]["weight"] == workers[2]["weight"]
