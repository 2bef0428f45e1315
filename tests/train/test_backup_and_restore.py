"""Tests of feedline/train/backup_and_restore.py: under ``torchrun --max-restarts 1`` a real
``kill -9`` of one worker mid-epoch brings the group down and back up, and the group resumes
from the last backup, input position included, ending with an uninterrupted run's parameters."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import signal

import pytest
import torch

import feedline.distribute as fdist
from feedline.errors import InvalidArgumentError
from feedline.train import BackupAndRestore, Checkpoint, CheckpointManager, latest_checkpoint
from tests.launcher import Processes, Torchrun, free_port, run, torchrun_envs
from tests.train.training_job import Job

pytestmark = pytest.mark.timeout(300)

STEPS, SAVE_FREQ, KILL_AT = 30, 5, 13  # 16 steps an epoch: the kill is mid-epoch

_WORKER = f"""
import os, sys, time
import feedline.distribute as fdist
from feedline.train import BackupAndRestore
from tests.launcher import report
from tests.train.training_job import Job

folder = sys.argv[1]
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
strategy = fdist.MultiWorkerMirroredStrategy(
    communication_options=fdist.experimental.CommunicationOptions(timeout_seconds=60))
rank = strategy.extended.worker_index
job = Job(strategy)
backup_dir = os.path.join(folder, "backup")
with BackupAndRestore(job.checkpoint, backup_dir, save_freq={SAVE_FREQ}) as backup:
    start = backup.total_run_calls
    print(f"attempt {{attempt}} starts at step {{start}}")
    for step in range(backup.total_run_calls, {STEPS}):
        backup.run(job.step, next(job.iterator))
        if attempt == 0 and os.environ.get("KILL") == "1":
            time.sleep(0.05)
            if step == {KILL_AT} and rank == 1:
                with open(os.path.join(folder, "pid.tmp"), "w") as f:
                    f.write(str(os.getpid()))
                os.replace(os.path.join(folder, "pid.tmp"), os.path.join(folder, "pid"))
                time.sleep(60)        # killed here
report({{"attempt": attempt, "start": start, "weights": job.weights(),
         "backup_left": os.path.exists(backup_dir)}})
"""


def test_kill_9_under_torchrun_restarts_from_the_last_backup_exactly(
    tmp_path: pathlib.Path,
) -> None:
    whole = run(_WORKER, torchrun_envs(2), argv=[str(tmp_path / "whole")])
    expected = whole["rank:0"].result["weights"]

    folder = tmp_path / "killed"
    with Processes(
        _WORKER,
        [("torchrun", {"KILL": "1"})],
        argv=[str(folder)],
        torchrun=Torchrun(nproc_per_node=2, max_restarts=1),
        timeout=240,
    ) as procs:
        procs.wait_for(folder / "pid")
        os.kill(int((folder / "pid").read_text()), signal.SIGKILL)
        results = procs.wait()
        reports = procs.reports()
        printed = procs.worker_outputs("torchrun")
    assert results["torchrun"].returncode == 0, results["torchrun"].describe()
    assert printed == {
        (0, 0): "attempt 0 starts at step 0\n",
        (0, 1): "attempt 0 starts at step 0\n",
        (1, 0): "attempt 1 starts at step 10\n",
        (1, 1): "attempt 1 starts at step 10\n",
    }
    for rank in range(2):
        result = reports[f"rank:{rank}"]
        assert (result["attempt"], result["start"]) == (1, 10)
        assert result["weights"] == expected  # bit for bit
        assert result["backup_left"] is False  # deleted once training ended


def test_backups_every_save_freq_steps_restore_and_are_deleted_at_the_end(
    tmp_path: pathlib.Path,
) -> None:
    strategy = fdist.MirroredStrategy(["cpu:0"])
    job = Job(strategy)
    backup = BackupAndRestore(job.checkpoint, tmp_path, save_freq=4)
    for _ in range(10):
        backup.run(job.step, next(job.iterator))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-8"]
    # A failed run: the with-block raises, the backup stays.
    job = Job(strategy)
    with pytest.raises(RuntimeError), BackupAndRestore(job.checkpoint, tmp_path, 4) as backup:
        assert backup.total_run_calls == 8
        raise RuntimeError("the loop failed")
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-8"]
    # A run that ends: the backup is deleted.
    with BackupAndRestore(job.checkpoint, tmp_path, 4) as backup:
        for _ in range(backup.total_run_calls, 12):
            backup.run(job.step, next(job.iterator))
    assert not tmp_path.exists()
    # The steps restored continue the same run: same batches, same parameters.
    one = Job(strategy)
    for _ in range(12):
        one.step(next(one.iterator))
    assert one.weights() == job.weights()


def test_run_commits_the_input_of_each_step_that_returned(tmp_path: pathlib.Path) -> None:
    from feedline.data import Dataset
    from feedline.data.experimental import CommittedIterator

    steps = CommittedIterator(iter(Dataset.range(8).batch(2)))
    plain = iter(Dataset.range(8))
    backup = BackupAndRestore(Checkpoint(), tmp_path, save_freq=100)

    def step(iterator: CommittedIterator, other: object, fail: bool = False) -> list[int]:
        batch = [int(x) for x in next(iterator)]
        if fail:
            raise RuntimeError("the step failed")
        return batch

    assert backup.run(step, steps, plain) == [0, 1]
    with pytest.raises(RuntimeError, match="the step failed"):
        backup.run(step, steps, plain, fail=True)  # took [2, 3] and did not commit it
    restarted = CommittedIterator(iter(Dataset.range(8).batch(2)))
    restarted.set_state(steps.get_state())
    assert [int(x) for x in next(restarted)] == [2, 3]
    assert int(next(plain)) == 0  # an iterator that does not count steps is left alone


def test_run_goes_on_when_the_dispatcher_released_the_steps_consumer(
    tmp_path: pathlib.Path,
) -> None:
    # A service consumer that acknowledges on commit, released by the dispatcher during a step
    # (as one whose process was paused past client_timeout_ms): run() returns, the step's batch
    # went back to the job and comes again, the iterator joined the job again.
    from feedline import service
    from feedline.data import Dataset
    from tests.service.procs import release_consumer

    config = service.DispatcherConfig(work_dir=str(tmp_path / "work"), fault_tolerant_mode=True)
    dispatcher = service.DispatchServer(config)
    address = dispatcher.target.split("://")[1]
    worker = service.WorkerServer(service.WorkerConfig(dispatcher_address=address))
    try:
        dataset = Dataset.range(24).apply(
            service.distribute(
                "distributed_epoch", dispatcher.target, job_name="steps", acknowledge="on_commit"
            )
        )
        iterator = iter(dataset)
        backup = BackupAndRestore(Checkpoint(), tmp_path / "backup", save_freq=100)
        trained: list[int] = []

        def step(iterator: object, release: bool) -> None:
            trained.append(int(next(iterator)))  # type: ignore[call-overload]
            if release:
                release_consumer(dispatcher.target, iterator)

        with backup:
            for count in range(100):
                try:
                    backup.run(step, iterator, count == 5)
                except StopIteration:
                    break
        assert backup.total_run_calls == 25  # 24 steps and the one whose input came again
        again = trained[5]
        assert trained.count(again) == 2 and sorted(set(trained)) == list(range(24))
    finally:
        worker.stop()
        dispatcher.stop()


def test_a_backup_on_a_store_with_storage_options() -> None:
    from tests.conftest import credential_checked_s3, new_s3_user_options

    with credential_checked_s3() as (bucket, check_credentials):
        options = new_s3_user_options()
        check_credentials()
        job = Job(fdist.MirroredStrategy(["cpu:0"]))
        backup = BackupAndRestore(
            job.checkpoint, f"{bucket}/backup", save_freq=2, storage_options=options
        )
        for _ in range(5):
            backup.run(job.step, next(job.iterator))
        job = Job(fdist.MirroredStrategy(["cpu:0"]))
        with BackupAndRestore(
            job.checkpoint, f"{bucket}/backup", 2, storage_options=options
        ) as backup:
            assert backup.total_run_calls == 4  # restored from the store
        assert latest_checkpoint(f"{bucket}/backup", storage_options=options) is None
        manager = CheckpointManager(job.checkpoint, f"{bucket}/other", storage_options=options)
        with pytest.raises(InvalidArgumentError, match="give the storage_options to the"):
            BackupAndRestore(manager, None, 2, storage_options=options)


def test_save_freq_must_count_steps(tmp_path: pathlib.Path) -> None:
    for bad in (0, "epoch", 2.5, True):
        with pytest.raises(InvalidArgumentError, match="save_freq must be a positive number"):
            BackupAndRestore(Checkpoint(), tmp_path, save_freq=bad)  # type: ignore[arg-type]


_NOT_SHARED = """
import os, sys
import torch
import feedline.distribute as fdist
from feedline.errors import FailedPreconditionError
from feedline.train import BackupAndRestore, Checkpoint
from tests.launcher import report

strategy = fdist.MultiWorkerMirroredStrategy()
own = os.path.join(sys.argv[1], f"machine-{strategy.extended.worker_index}")
os.makedirs(own)
os.chdir(own)                      # as if each worker had a disk of its own
try:
    BackupAndRestore(Checkpoint(step=torch.zeros(())), "backup", save_freq=10)
except FailedPreconditionError as error:
    report(str(error))
"""


def test_a_backup_dir_that_only_the_chief_sees_is_an_error_at_construction(
    tmp_path: pathlib.Path,
) -> None:
    results = run(_NOT_SHARED, torchrun_envs(2), argv=[str(tmp_path)])
    for result in results.values():
        assert result.result.startswith(
            "backup_dir 'backup' is not shared by every worker: worker 1 cannot see the file"
        )
    assert not os.listdir(tmp_path / "machine-0" / "backup")  # the probe is removed


def test_a_backup_of_another_model_or_optimizer_names_what_differs(
    tmp_path: pathlib.Path,
) -> None:
    BackupAndRestore(Checkpoint(model=torch.nn.Linear(3, 2)), tmp_path, 1).run(lambda: None)
    with pytest.raises(
        InvalidArgumentError, match=r"'weight' has shape \(2, 3\) in the checkpoint and \(4, 3\)"
    ):
        BackupAndRestore(Checkpoint(model=torch.nn.Linear(3, 4)), tmp_path, 1)

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    Checkpoint(optimizer=optimizer).write(tmp_path / "adam")
    wider = torch.nn.Linear(3, 5)
    with pytest.raises(InvalidArgumentError) as raised:
        Checkpoint(model=wider, optimizer=torch.optim.Adam(wider.parameters())).read(
            tmp_path / "adam"
        )
    assert (
        "'optimizer' (Adam) from " in str(raised.value)
        and "parameter 0 (model.weight) has shape (5, 3) here, but its 'exp_avg' in the "
        "checkpoint has shape (2, 3)"
        in str(raised.value)
    )


def test_backups_on_s3_resume_a_run_and_are_deleted_at_the_end(s3_bucket: str) -> None:
    from feedline import _fs

    backup_dir = f"{s3_bucket}/backup"
    strategy = fdist.MirroredStrategy(["cpu:0"])
    job = Job(strategy)
    backup = BackupAndRestore(job.checkpoint, backup_dir, save_freq=4)
    for _ in range(10):
        backup.run(job.step, next(job.iterator))
    assert _fs.list_names(backup_dir, "test") == ["checkpoint", "ckpt-8"]
    # A restarted process resumes from step 8 on the store, input position included.
    job = Job(strategy)
    with BackupAndRestore(job.checkpoint, backup_dir, 4) as backup:
        assert backup.total_run_calls == 8
        for _ in range(backup.total_run_calls, 12):
            backup.run(job.step, next(job.iterator))
    assert _fs.list_names(s3_bucket, "test") == []  # the backup is deleted, index first
    one = Job(strategy)
    for _ in range(12):
        one.step(next(one.iterator))
    assert one.weights() == job.weights()


ROWS, GLOBAL, ELASTIC_FREQ, LOSE_AT = 360, 12, 4, 9

_ELASTIC = f"""
import json, os, pathlib, sys, time
import torch
import feedline.data as fd
import feedline.distribute as fdist
from feedline.train import BackupAndRestore, Checkpoint
from tests.launcher import report

folder = pathlib.Path(sys.argv[1])
strategy = fdist.MultiWorkerMirroredStrategy(
    communication_options=fdist.experimental.CommunicationOptions(timeout_seconds=30))
rank, workers = strategy.extended.worker_index, strategy.extended.num_workers
with strategy.scope():
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
dataset = fd.Dataset.range({ROWS}).batch({GLOBAL})
options = fd.Options()
options.experimental_distribute.auto_shard_policy = fd.experimental.AutoShardPolicy.DATA
iterator = iter(strategy.experimental_distribute_dataset(dataset.with_options(options)))
checkpoint = Checkpoint(model=model, optimizer=optimizer, iterator=iterator)

def replica_step(batch):
    optimizer.zero_grad()
    loss = model(batch.to(torch.float32)[:, None]).sum() / {GLOBAL}
    loss.backward()
    optimizer.step()
    return loss.detach()

def train_step(batch):
    return strategy.reduce("SUM", strategy.run(replica_step, args=(batch,)), axis=None)

log = open(folder / f"log-{{workers}}-{{rank}}.jsonl", "a")
with BackupAndRestore(checkpoint, folder / "backup", save_freq={ELASTIC_FREQ}) as backup:
    start = step = backup.total_run_calls
    for batch in iterator:
        backup.run(train_step, batch)
        ids = [i for part in strategy.experimental_local_results(batch) for i in part.tolist()]
        log.write(json.dumps([step, ids]) + "\\n")
        log.flush()
        if workers == 3 and step == {LOSE_AT}:
            (folder / f"agent-{{rank}}").write_text(str(os.getppid()))
            for _ in range(600):       # until the test has taken one node away
                if (folder / "lost").exists():
                    break
                time.sleep(0.05)
        step += 1
report({{"workers": workers, "start": start, "steps": step, "weight": float(model.weight)}})
"""


def test_a_lost_node_resumes_on_fewer_workers_with_the_input_re_sharded_exactly(
    tmp_path: pathlib.Path,
) -> None:
    # node0's agent hosts the rendezvous store; the others only connect to it: all start at once.
    # The first round waits up to 15 s for the third (a round of two, then a restart for the
    # late one, timed out a full run's agents); the round after the loss waits as long.
    host = Torchrun(
        nproc_per_node=1, max_restarts=2, port=free_port(), nnodes="2:3", is_host=True,
        last_call_timeout=15,
    )  # fmt: skip

    def nodes(torchrun: Torchrun, *names: str) -> Processes:
        return Processes(
            _ELASTIC, [(n, {}) for n in names], argv=[str(tmp_path)], torchrun=torchrun,
            timeout=200,
        )  # fmt: skip

    guest = dataclasses.replace(host, is_host=False)
    with nodes(host, "node0") as first, nodes(guest, "node1", "node2") as others:
        for rank in range(3):
            others.wait_for(tmp_path / f"agent-{rank}", timeout=120)
        others.send("node2", signal.SIGKILL)  # the machine is gone: agent and worker
        (tmp_path / "lost").write_text("node2")
        results = {**first.wait(), **others.wait()}
        reports = {**first.reports(), **others.reports()}
    survivors = ["node0", "node1"]
    assert all(results[name].returncode == 0 for name in survivors), "\n".join(
        results[name].describe() for name in survivors
    )
    assert sorted(reports) == ["rank:0", "rank:1"]  # the two workers left
    final = [reports["rank:0"], reports["rank:1"]]
    assert [(r["workers"], r["start"], r["steps"]) for r in final] == [(2, 8, 30)] * 2
    # Each step moves the weight by -lr * sum(global batch) / GLOBAL, whatever the weight: the
    # restored weight plus the steps after it is every element's part, each once.
    assert final[0]["weight"] == final[1]["weight"]
    assert final[0]["weight"] == pytest.approx(-0.001 * sum(range(ROWS)) / GLOBAL, abs=1e-4)
    trained = []
    for rank in range(3):
        for line in (tmp_path / f"log-3-{rank}.jsonl").read_text().splitlines():
            step, ids = json.loads(line)
            if step < 8:  # the steps the restored backup holds
                trained += ids
    for rank in range(2):
        trained += [
            i
            for line in (tmp_path / f"log-2-{rank}.jsonl").read_text().splitlines()
            for i in json.loads(line)[1]
        ]
    assert sorted(trained) == list(range(ROWS))


_BELOW_MIN = """
import os, pathlib, sys, time
import torch
import feedline.distribute as fdist

folder = pathlib.Path(sys.argv[1])
strategy = fdist.MultiWorkerMirroredStrategy(
    communication_options=fdist.experimental.CommunicationOptions(timeout_seconds=30))
(folder / f"ready-{strategy.extended.worker_index}").write_text("")
for step in range(1000):
    strategy.reduce("SUM", strategy.run(lambda: torch.tensor(1.0)), axis=None)
    time.sleep(0.05)
"""


def test_fewer_nodes_than_the_minimum_end_the_job_after_the_rendezvous_timeout(
    tmp_path: pathlib.Path,
) -> None:
    # node0's agent hosts the rendezvous store; node1's only connects to it, so both start at
    # once and meet well within the join timeout, which then ends the job once node1 is gone.
    host = Torchrun(
        nproc_per_node=1, max_restarts=2, port=free_port(), nnodes="2:2", join_timeout=8,
        is_host=True,
    )  # fmt: skip

    def nodes(name: str, torchrun: Torchrun) -> Processes:
        return Processes(_BELOW_MIN, [(name, {})], argv=[str(tmp_path)], torchrun=torchrun)

    with nodes("node0", host) as first:
        with nodes("node1", dataclasses.replace(host, is_host=False)) as second:
            for rank in range(2):
                second.wait_for(tmp_path / f"ready-{rank}", timeout=120)
            second.send("node1", signal.SIGKILL)
            code = first.wait_exit("node0", timeout=90)
            printed = first.worker_outputs("node0", "stderr")
        launcher = first.output("node0", "stderr")
    assert code not in (0, None)  # ended, with an error
    assert "RendezvousTimeoutError" in launcher
    # The worker left says which worker is gone, not just that a collective failed.
    error = next(line for line in printed[(0, 0)].splitlines() if "UnavailableError" in line)
    assert "stopped answering: worker" in error or "host worker 0 (rank 0) is unreachable" in error
