"""Tests of feedline/train/backup_and_restore.py: under ``torchrun --max-restarts 1`` a real
``kill -9`` of one worker mid-epoch brings the group down and back up, and the group resumes
from the last backup, input position included, ending with an uninterrupted run's parameters."""

from __future__ import annotations

import os
import pathlib
import signal

import pytest
import torch

import feedline.distribute as fdist
from feedline.errors import InvalidArgumentError
from feedline.train import BackupAndRestore, Checkpoint
from tests.launcher import Processes, Torchrun, run, torchrun_envs
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
