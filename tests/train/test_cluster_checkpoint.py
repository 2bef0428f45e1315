"""Checkpoints in a cluster (feedline/train/_cluster.py, feedline/distribute/_iterator_state.py),
with real worker processes on 127.0.0.1: the chief writes, the others leave nothing, every
worker's input position is saved and restored, and a DATA-sharded epoch goes on over another
number of workers with no element lost or repeated."""

from __future__ import annotations

import os
import pathlib
import signal
from typing import Any

import pytest
import torch

import feedline.data as fd
import feedline.distribute as fdist
from feedline.errors import InvalidArgumentError
from feedline.metrics import Mean
from feedline.train import Checkpoint, latest_checkpoint
from feedline.train.checkpoint import load_state
from tests.launcher import Processes, run, torchrun_envs

pytestmark = pytest.mark.timeout(240)

_PREAMBLE = """
import json, os, sys
import numpy as np
import torch
import feedline.data as fd
import feedline.distribute as fdist
import feedline.metrics
from feedline.train import Checkpoint, CheckpointManager, latest_checkpoint
from feedline.train import checkpoint as checkpoint_module
from tests.launcher import report

folder = sys.argv[2]
strategy = fdist.MultiWorkerMirroredStrategy(
    communication_options=fdist.experimental.CommunicationOptions(timeout_seconds=60))
rank = strategy.extended.worker_index

def rows(step, strategy=strategy):
    return [t.tolist() for t in strategy.experimental_local_results(step)]

def with_policy(dataset, policy):
    options = fd.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return dataset.with_options(options)

def text_files():
    data = os.path.join(folder, "data")
    if rank == 0 and not os.path.isdir(data):
        os.makedirs(data + ".tmp")
        for i in range(4):
            with open(os.path.join(data + ".tmp", f"part-{i}.txt"), "w") as f:
                f.write("".join(f"{10 * i + j}\\n" for j in range(4)))
        os.replace(data + ".tmp", data)
    strategy.reduce("SUM", torch.tensor(0.0), axis=None)   # a barrier: the files exist
    files = fd.Dataset.list_files(os.path.join(data, "part-*.txt"), shuffle=False)
    return files.interleave(fd.TextLineDataset, cycle_length=1).map(
        lambda line: np.int64(int(line.item())))
"""

_SAVE_AND_RESTORE = (
    _PREAMBLE
    + """
written = []
dump = checkpoint_module.Checkpoint._dump
def spy(self, state, path):
    written.append(os.path.relpath(path, folder))
    dump(self, state, path)
checkpoint_module.Checkpoint._dump = spy

files = iter(strategy.experimental_distribute_dataset(text_files().batch(4)))
torch.manual_seed(rank)                    # different initialisations: the chief's wins
with strategy.scope():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    mean = feedline.metrics.Mean()            # its result is over both workers
checkpoint = Checkpoint(model=model, optimizer=optimizer, files=files, mean=mean)
manager = CheckpointManager(checkpoint, os.path.join(folder, "ckpt"), max_to_keep=2)

def step(batch):
    optimizer.zero_grad()
    x = batch.float().reshape(-1, 1).repeat(1, 2)
    (model(x) - 1).pow(2).sum().div(4).backward()
    optimizer.step()

def train(steps):
    seen = []
    for _ in range(steps):
        batch = next(files)  # a PerReplica of one component under several workers
        (local,) = strategy.experimental_local_results(batch)
        seen.append(local.tolist())
        strategy.run(step, args=(batch,))
        mean.update_state(local.float())
    return seen

out = {}
if sys.argv[1] == "save":
    out["before"] = train(2)
    out["path"] = os.path.relpath(manager.save(), folder)
    out["listing"] = sorted(os.listdir(os.path.join(folder, "ckpt")))
    out["written"] = written
    out["counter"] = checkpoint.save_counter
else:
    status = checkpoint.restore(latest_checkpoint(os.path.join(folder, "ckpt")))
    status.assert_consumed()
out["saved_weight"] = model.weight.detach().flatten().tolist()
out["saved_mean"] = mean.result().item()
out["rest"] = train(2)
out["weight"] = model.weight.detach().flatten().tolist()
out["mean"] = mean.result().item()
report(out)
"""
)


def test_the_chief_writes_and_every_worker_restores_its_own_position(
    tmp_path: pathlib.Path,
) -> None:
    saved = run(_SAVE_AND_RESTORE, torchrun_envs(2), argv=["save", str(tmp_path)])
    w0, w1 = saved["rank:0"].result, saved["rank:1"].result
    # FILE sharding: worker 0 reads files 0 and 2, worker 1 files 1 and 3.
    assert w0["before"] == [[0, 1], [2, 3]] and w0["rest"] == [[20, 21], [22, 23]]
    assert w1["before"] == [[10, 11], [12, 13]] and w1["rest"] == [[30, 31], [32, 33]]
    # The chief wrote the checkpoint; worker 1 wrote to a temporary folder, since removed.
    assert w0["written"] == ["ckpt/ckpt-1"]
    assert w1["written"] == ["ckpt/workertemp_1/ckpt-1"]
    assert w0["listing"] == w1["listing"] == ["checkpoint", "ckpt-1"]
    assert w0["path"] == w1["path"] == "ckpt/ckpt-1"
    assert w0["counter"] == w1["counter"] == 1
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["checkpoint", "ckpt-1"]

    # One entry per worker, gathered to the chief's file.
    iterator = load_state(tmp_path / "ckpt" / "ckpt-1")["objects"]["files"]
    assert (iterator["sharding"], iterator["policy"], iterator["num_workers"]) == (
        "files",
        "AUTO",
        2,
    )
    assert len(iterator["workers"]) == 2 and iterator["global"] is None
    # A metric saves its value over both workers: (0+1+2+3 + 10+11+12+13) / 8.
    assert w0["saved_mean"] == w1["saved_mean"] == 6.5
    alone = Mean()
    Checkpoint(mean=alone).restore(tmp_path / "ckpt" / "ckpt-1").expect_partial()
    assert alone.result().item() == 6.5

    # New processes restore the model, the optimizer and each worker's own input position.
    restored = run(_SAVE_AND_RESTORE, torchrun_envs(2), argv=["restore", str(tmp_path)])
    for rank, before in enumerate((w0, w1)):
        after = restored[f"rank:{rank}"].result
        assert after["saved_weight"] == w0["saved_weight"]
        assert after["rest"] == before["rest"]
        assert after["weight"] == before["weight"]  # bit for bit
        assert after["saved_mean"] == 6.5 and after["mean"] == before["mean"] == 16.5


_SPLIT = (
    _PREAMBLE
    + """
from feedline.data.experimental import AutoShardPolicy
ordered = with_policy(fd.Dataset.range(36).batch(6), AutoShardPolicy.DATA)
shuffled = with_policy(
    fd.Dataset.range(240).shuffle(240, seed=7).map(lambda x: x * 1, num_parallel_calls=2)
    .batch(12).prefetch(2), AutoShardPolicy.DATA)
iterators = {
    "ordered": iter(strategy.experimental_distribute_dataset(ordered)),
    "shuffled": iter(strategy.experimental_distribute_dataset(shuffled)),
    "files": iter(strategy.experimental_distribute_dataset(text_files().batch(2))),
}
out = {}
if sys.argv[1] == "save":
    out["ordered"] = [rows(next(iterators["ordered"])) for _ in range(2)]
    out["shuffled"] = [rows(next(iterators["shuffled"])) for _ in range(7)]
    next(iterators["files"])
    Checkpoint(**iterators).save(os.path.join(folder, "ckpt"))
else:
    path = latest_checkpoint(folder)
    try:
        Checkpoint(files=iterators.pop("files")).restore(path)
    except ValueError as error:
        out["files_error"] = str(error)
    Checkpoint(**iterators).restore(path).assert_existing_objects_matched().expect_partial()
    for name, iterator in iterators.items():
        out[name] = [rows(step) for step in iterator]
report(out)
"""
)


def test_a_data_sharded_epoch_saved_on_two_workers_goes_on_over_three_and_one(
    tmp_path: pathlib.Path,
) -> None:
    before = run(_SPLIT, torchrun_envs(2), argv=["save", str(tmp_path)])
    assert before["rank:0"].result["ordered"] == [[[0, 1, 2]], [[6, 7, 8]]]
    assert before["rank:1"].result["ordered"] == [[[3, 4, 5]], [[9, 10, 11]]]
    after = run(_SPLIT, torchrun_envs(3), argv=["restore", str(tmp_path)])
    workers = [after[f"rank:{i}"].result for i in range(3)]
    # The epoch goes on at the third global batch, cut in three.
    assert [w["ordered"] for w in workers] == [
        [[[12, 13]], [[18, 19]], [[24, 25]], [[30, 31]]],
        [[[14, 15]], [[20, 21]], [[26, 27]], [[32, 33]]],
        [[[16, 17]], [[22, 23]], [[28, 29]], [[34, 35]]],
    ]
    # Through a shuffle buffer, a parallel map and prefetches: every element exactly once, and
    # the global batches after the restore are those of an uninterrupted run.
    consumed = [
        row
        for w in (before["rank:0"].result, before["rank:1"].result, *workers)
        for step in w["shuffled"]
        for row in step[0]
    ]
    assert sorted(consumed) == list(range(240))
    expected = _global_batches(_shuffled())[7:]
    resumed = [
        sorted(row for w in workers for row in w["shuffled"][t][0]) for t in range(len(expected))
    ]
    assert resumed == [sorted(batch) for batch in expected]
    # FILE sharding cannot move to three workers, and says so.
    for w in workers:
        message = w["files_error"]
        assert "the position was saved on 2 workers x 1 replica" in message
        assert "sharded by FILE" in message and "AutoShardPolicy.AUTO" in message
        assert "runs on 3 workers x 1 replica" in message
        assert "resumes only on the same 2 workers x 1 replica" in message

    # And on one process with two replicas, each global batch cut in two.
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
    ordered = iter(strategy.experimental_distribute_dataset(_ordered()))
    shuffled = iter(strategy.experimental_distribute_dataset(_shuffled()))
    Checkpoint(ordered=ordered, shuffled=shuffled).restore(
        latest_checkpoint(tmp_path)
    ).expect_partial()
    assert [_rows(strategy, s) for s in ordered] == [
        [[12, 13, 14], [15, 16, 17]],
        [[18, 19, 20], [21, 22, 23]],
        [[24, 25, 26], [27, 28, 29]],
        [[30, 31, 32], [33, 34, 35]],
    ]
    assert [[row for part in _rows(strategy, s) for row in part] for s in shuffled] == expected


def _with_data_policy(dataset: fd.Dataset) -> fd.Dataset:
    options = fd.Options()
    options.experimental_distribute.auto_shard_policy = fd.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def _ordered() -> fd.Dataset:
    return _with_data_policy(fd.Dataset.range(36).batch(6))


def _shuffled() -> fd.Dataset:
    dataset = fd.Dataset.range(240).shuffle(240, seed=7).map(lambda x: x * 1, num_parallel_calls=2)
    return _with_data_policy(dataset.batch(12).prefetch(2))


def _rows(strategy: fdist.Strategy, step: Any) -> list[list[int]]:
    return [t.tolist() for t in strategy.experimental_local_results(step)]


def _global_batches(dataset: fd.Dataset) -> list[list[int]]:
    """The global batches as a distributed iterator over one replica sees them."""
    strategy = fdist.MirroredStrategy(["cpu:0"])
    return [step.tolist() for step in strategy.experimental_distribute_dataset(dataset)]


_ONE_AND_TWO = (
    _PREAMBLE
    + """
from tests.train.test_cluster_checkpoint import linear_and_adam, _ordered
model, optimizer = linear_and_adam(strategy)
iterator = iter(strategy.experimental_distribute_dataset(_ordered()))
Checkpoint(model=model, optimizer=optimizer, iterator=iterator).restore(
    latest_checkpoint(folder)).assert_consumed()
report({"weight": model.weight.detach().flatten().tolist(),
        "steps": [rows(step) for step in iterator]})
"""
)


def linear_and_adam(strategy: fdist.Strategy) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A model and an optimizer with state, made under ``strategy``'s scope."""
    torch.manual_seed(3)
    with strategy.scope():
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    return model, optimizer


def test_a_checkpoint_moves_between_one_process_and_a_cluster(tmp_path: pathlib.Path) -> None:
    # Two workers save model, optimizer and two iterators (DATA and FILE sharded).
    code = (
        _PREAMBLE
        + """
from tests.train.test_cluster_checkpoint import linear_and_adam, _ordered
model, optimizer = linear_and_adam(strategy)
data = iter(strategy.experimental_distribute_dataset(_ordered()))
files = iter(strategy.experimental_distribute_dataset(text_files().batch(2)))
def step(batch):
    optimizer.zero_grad()
    model(batch.float().reshape(-1, 1).repeat(1, 3)).sum().backward()
    optimizer.step()
for _ in range(2):
    strategy.run(step, args=(next(data),))
    next(files)
Checkpoint(model=model, optimizer=optimizer, data=data, files=files).save(
    os.path.join(folder, "ckpt"))
report(model.weight.detach().flatten().tolist())
"""
    )
    saved = run(code, torchrun_envs(2), argv=["save", str(tmp_path)])
    path = latest_checkpoint(tmp_path)
    assert path is not None

    # Into one process: model and optimizer; the DATA iterator goes on with the global batches.
    strategy = fdist.MirroredStrategy(["cpu:0"])
    model, optimizer = linear_and_adam(strategy)
    data = iter(strategy.experimental_distribute_dataset(_ordered()))
    Checkpoint(model=model, optimizer=optimizer, data=data).restore(path).expect_partial()
    assert model.weight.detach().flatten().tolist() == saved["rank:0"].result
    assert optimizer.state_dict()["state"][0]["step"].item() == 2
    assert [s.tolist() for s in data] == [list(range(6 * b, 6 * b + 6)) for b in range(2, 6)]
    # The FILE-sharded iterator cannot be used here: an error before anything changes.
    fresh, fresh_optimizer = linear_and_adam(strategy)
    files = iter(strategy.experimental_distribute_dataset(fd.Dataset.range(8).batch(2)))
    with pytest.raises(InvalidArgumentError) as raised:
        Checkpoint(model=fresh, optimizer=fresh_optimizer, files=files).restore(path)
    message = str(raised.value)
    assert message.startswith(f"cannot restore 'files' (DistributedIterator) from {path}: ")
    assert "saved on 2 workers x 1 replica (input sharded by FILE" in message
    assert "runs on 1 worker x 1 replica (input read whole by one worker)" in message
    assert fresh.weight.detach().flatten().tolist() != saved["rank:0"].result
    assert next(files).tolist() == [0, 1]

    # And back: one process saves after one step of three replicas; two workers go on.
    three = fdist.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"])
    model, optimizer = linear_and_adam(three)
    iterator = iter(three.experimental_distribute_dataset(_ordered()))
    next(iterator)
    Checkpoint(model=model, optimizer=optimizer, iterator=iterator).save(tmp_path / "one" / "c")
    resumed = run(_ONE_AND_TWO, torchrun_envs(2), argv=["restore", str(tmp_path / "one")])
    assert resumed["rank:0"].result["steps"] == [[[6, 7, 8]], [[12, 13, 14]], [[18, 19, 20]],
                                                 [[24, 25, 26]], [[30, 31, 32]]]  # fmt: skip
    assert resumed["rank:1"].result["steps"] == [[[9, 10, 11]], [[15, 16, 17]], [[21, 22, 23]],
                                                 [[27, 28, 29]], [[33, 34, 35]]]  # fmt: skip
    for result in resumed.values():
        assert result.result["weight"] == model.weight.detach().flatten().tolist()


_KILLED_WHILE_SAVING = (
    _PREAMBLE
    + """
import time
from feedline.errors import UnavailableError

class Slow:
    \"\"\"Pickles slowly on the chief, once armed, so that it can be killed mid-write.\"\"\"
    armed = False
    def get_state(self):
        return self
    def set_state(self, state):
        pass
    def __reduce__(self):
        if Slow.armed and rank == 0:
            open(os.path.join(folder, "writing"), "w").close()
            time.sleep(60)
        return (dict, ())                  # read back as {}: any process can load the file

weight = torch.zeros(3)
checkpoint = Checkpoint(weight=weight, slow=Slow())
manager = CheckpointManager(checkpoint, os.path.join(folder, "ckpt"))
weight += 1
manager.save()
weight += 1
Slow.armed = True
try:
    manager.save()
except UnavailableError as error:
    report(str(error))
"""
)


def test_a_chief_killed_while_saving_leaves_the_last_checkpoint_whole(
    tmp_path: pathlib.Path,
) -> None:
    with Processes(
        _KILLED_WHILE_SAVING,
        torchrun_envs(2),
        argv=["save", str(tmp_path)],
        timeout=150,
    ) as procs:
        procs.wait_for(tmp_path / "writing")
        procs.send("rank:0", signal.SIGKILL)
        results = procs.wait()
    assert results["rank:0"].returncode == -9
    assert results["rank:1"].returncode == 0, results["rank:1"].describe()
    assert "worker 0 (" in results["rank:1"].result
    directory = tmp_path / "ckpt"
    names = sorted(os.listdir(directory))
    assert [name for name in names if not name.startswith(".")] == ["checkpoint", "ckpt-1"]
    hidden = [name for name in names if name.startswith(".")]
    assert len(hidden) == 1 and hidden[0].startswith(".ckpt-2.") and hidden[0].endswith(".tmp")
    assert latest_checkpoint(directory) == str(directory / "ckpt-1")
    weight = torch.zeros(3)
    Checkpoint(weight=weight).restore(latest_checkpoint(directory)).expect_partial()
    assert weight.tolist() == [1.0, 1.0, 1.0]


_FAILED_WRITE = (
    _PREAMBLE
    + """
from feedline.errors import UnknownError
if rank == 0:
    def disk_full(path, write):
        raise OSError(28, "No space left on device")
    checkpoint_module.atomic_write = disk_full
checkpoint = Checkpoint(step=torch.zeros(()))
try:
    checkpoint.save(os.path.join(folder, "ckpt"))
except (OSError, UnknownError) as error:
    report({"type": type(error).__name__, "message": str(error),
            "counter": checkpoint.save_counter, "listing": sorted(os.listdir(folder))})
"""
)


def test_a_write_that_fails_on_the_chief_raises_on_every_worker(tmp_path: pathlib.Path) -> None:
    results = run(_FAILED_WRITE, torchrun_envs(2), argv=["save", str(tmp_path)])
    chief, worker = results["rank:0"].result, results["rank:1"].result
    assert chief["type"] == "OSError" and "No space left on device" in chief["message"]
    assert worker["type"] == "UnknownError"
    assert worker["message"] == (
        f"checkpoint {tmp_path}/ckpt-1 was not saved: worker 0: OSError: [Errno 28] No space "
        "left on device. Every worker raises this error, so that none goes on as if the "
        "checkpoint existed"
    )
    assert chief["counter"] == worker["counter"] == 0
    assert chief["listing"] == worker["listing"] == []  # no file, no index, no temporary folder


_ON_S3 = """
import sys
import torch
import feedline.distribute as fdist
from feedline import _fs
from feedline.train import BackupAndRestore, Checkpoint, CheckpointManager, latest_checkpoint
from tests.launcher import report

directory = sys.argv[1]
strategy = fdist.MultiWorkerMirroredStrategy(
    communication_options=fdist.experimental.CommunicationOptions(timeout_seconds=60))
rank = strategy.extended.worker_index
torch.manual_seed(rank)                    # different initialisations: the chief's wins
model = torch.nn.Linear(2, 1)
own = model.weight.tolist()
manager = CheckpointManager(Checkpoint(model=model), f"{directory}/run", max_to_keep=2)
paths = [manager.save() for _ in range(3)]
fresh = torch.nn.Linear(2, 1)
Checkpoint(model=fresh).restore(latest_checkpoint(f"{directory}/run"))
with BackupAndRestore(Checkpoint(model=fresh), f"{directory}/backup", save_freq=1) as backup:
    backup.run(lambda: None)
    backed_up = _fs.list_names(f"{directory}/backup", "test")
strategy.reduce("SUM", torch.tensor(0.0), axis=None)   # a barrier: every worker has listed
report({"own": own, "paths": paths, "restored": fresh.weight.tolist(),
        "checkpoints": manager.checkpoints, "backed_up": backed_up})
"""


def test_two_workers_save_to_s3_the_chief_writes_and_every_worker_restores(
    s3_bucket: str,
) -> None:
    from feedline import _fs

    results = run(_ON_S3, torchrun_envs(2), argv=[s3_bucket])
    chief, worker = results["rank:0"].result, results["rank:1"].result
    run_dir = f"{s3_bucket}/run"
    assert chief["paths"] == worker["paths"] == [f"{run_dir}/ckpt-{n}" for n in (1, 2, 3)]
    assert (
        chief["checkpoints"] == worker["checkpoints"] == [f"{run_dir}/ckpt-2", f"{run_dir}/ckpt-3"]
    )
    assert chief["own"] != worker["own"]
    assert chief["restored"] == worker["restored"] == chief["own"]
    # Only the chief's files: no workertemp_1 folder, no probe of the shared check.
    assert _fs.list_names(run_dir, "test") == ["checkpoint", "ckpt-2", "ckpt-3"]
    assert chief["backed_up"] == ["checkpoint", "ckpt-1"]
    assert _fs.list_names(s3_bucket, "test") == ["run"]  # the backup was deleted at the end
