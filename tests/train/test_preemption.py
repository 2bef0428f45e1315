"""Tests of feedline/train/preemption.py: a real SIGTERM to one of two worker
processes makes both save at one step and exit with code 42; restarted, they end with the
parameters of an uninterrupted run, bit for bit."""

from __future__ import annotations

import os
import pathlib
import signal
import time

import pytest
import torch

import feedline.distribute as fdist
from feedline.distribute.cluster_resolver import ClusterSpec, SimpleClusterResolver
from feedline.distribute.experimental import PreemptionCheckpointHandler, TerminationConfig
from feedline.errors import FailedPreconditionError, InvalidArgumentError
from feedline.train import Checkpoint, CheckpointManager
from feedline.train.checkpoint import load_state
from tests.launcher import Processes, run, torchrun_envs
from tests.train.training_job import Job

pytestmark = pytest.mark.timeout(240)

STEPS = 40

_WORKER = f"""
import os, sys, time
import feedline.distribute as fdist
from feedline.distribute.experimental import PreemptionCheckpointHandler
from tests.launcher import report
from tests.train.training_job import Job

folder, mode = sys.argv[1], sys.argv[2]
strategy = fdist.MultiWorkerMirroredStrategy(
    communication_options=fdist.experimental.CommunicationOptions(timeout_seconds=60))
job = Job(strategy)
handler = PreemptionCheckpointHandler(
    strategy.cluster_resolver, job.checkpoint, os.path.join(folder, "ckpt"))
start = handler.total_run_calls
for step in range(handler.total_run_calls, {STEPS}):
    handler.run(job.step, next(job.iterator))
    if mode == "interrupt":
        time.sleep(0.05)              # slow enough for the signal to land mid-run
        if step == 10 and strategy.extended.worker_index == 1:
            open(os.path.join(folder, "step-10"), "w").close()
report({{"start": start, "weights": job.weights()}})
"""


def test_sigterm_to_one_worker_saves_every_worker_at_one_step_and_resumes_exactly(
    tmp_path: pathlib.Path,
) -> None:
    uninterrupted = run(_WORKER, torchrun_envs(2), argv=[str(tmp_path / "whole"), "run"])
    expected = uninterrupted["rank:0"].result["weights"]
    assert uninterrupted["rank:1"].result["weights"] == expected

    folder = tmp_path / "interrupted"
    with Processes(_WORKER, torchrun_envs(2), argv=[str(folder), "interrupt"]) as procs:
        procs.wait_for(folder / "step-10")
        procs.send("rank:1", signal.SIGTERM)
        stopped = procs.wait()
    # Both saved at the agreed step and exited with TensorFlow's restart code.
    assert [stopped[f"rank:{i}"].returncode for i in range(2)] == [42, 42], "\n".join(
        r.describe() for r in stopped.values()
    )
    assert all(r.result is None for r in stopped.values())
    names = sorted(os.listdir(folder / "ckpt"))
    assert names[0] == "checkpoint" and len(names) == 2
    saved_at = int(names[1].removeprefix("ckpt-"))
    assert 11 <= saved_at < STEPS

    resumed = run(_WORKER, torchrun_envs(2), argv=[str(folder), "resume"])
    for rank in range(2):
        result = resumed[f"rank:{rank}"].result
        assert result["start"] == saved_at
        assert result["weights"] == expected  # bit for bit


def _job_and_handler(
    folder: pathlib.Path | str, **config: object
) -> tuple[Job, PreemptionCheckpointHandler]:
    strategy = fdist.MirroredStrategy(["cpu:0"])
    job = Job(strategy)
    resolver = SimpleClusterResolver(ClusterSpec({"worker": ["127.0.0.1:1"]}), "", "worker", 0)
    handler = PreemptionCheckpointHandler(
        resolver, job.checkpoint, folder, TerminationConfig(**config)
    )
    return job, handler


class _Exit(Exception):
    pass


def _raise_exit() -> None:
    raise _Exit


def _run_until_preempted(
    folder: pathlib.Path | str, steps_before_notice: int
) -> tuple[Job, PreemptionCheckpointHandler]:
    """A handler whose watcher function notices a termination after ``steps_before_notice``
    steps, run until its ``exit_fn`` ends the loop."""
    noticed = False
    job, handler = _job_and_handler(
        folder, termination_watcher_fn=lambda: noticed, exit_fn=_raise_exit
    )
    for _ in range(steps_before_notice):
        handler.run(job.step, next(job.iterator))
    noticed = True
    with pytest.raises(_Exit):
        for _ in range(100):
            handler.run(job.step, next(job.iterator))
            time.sleep(0.05)  # the watcher is polled every second
    return job, handler


def test_a_notice_from_the_watcher_function_saves_then_exit_fn_runs(
    tmp_path: pathlib.Path,
) -> None:
    job, handler = _run_until_preempted(tmp_path, 3)
    assert handler.total_run_calls > 3
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", f"ckpt-{handler.total_run_calls}"]
    weights = job.weights()

    # A new handler restores the step count, the model and the input position.
    job, handler = _job_and_handler(tmp_path, termination_watcher_fn=lambda: False)
    assert job.weights() == weights
    saved = load_state(tmp_path / f"ckpt-{handler.total_run_calls}")
    assert saved["objects"]["checkpointed_runs"].item() == handler.total_run_calls


def test_a_grace_period_saves_at_once_trains_on_then_saves_and_exits(
    tmp_path: pathlib.Path,
) -> None:
    saves: list[int] = []
    noticed = False
    job, handler = _job_and_handler(
        tmp_path,
        termination_watcher_fn=lambda: noticed,
        exit_fn=_raise_exit,
        grace_period=1.5,
        save_fn=lambda: saves.append(handler.total_run_calls),
    )
    noticed = True
    started = time.monotonic()
    with pytest.raises(_Exit):
        for _ in range(1000):
            handler.run(job.step, next(job.iterator))
            time.sleep(0.02)
    assert len(saves) == 2 and saves[1] > saves[0]
    assert 1.5 <= time.monotonic() - started < 10
    assert not os.listdir(tmp_path)  # save_fn saved instead of the checkpoint


def test_configuration_and_cluster_errors(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidArgumentError, match="grace_period must be a number of seconds"):
        TerminationConfig(grace_period=-1)
    with pytest.raises(InvalidArgumentError, match="exit_fn must be callable"):
        TerminationConfig(exit_fn=42)  # type: ignore[arg-type]
    two = SimpleClusterResolver(
        ClusterSpec({"worker": ["127.0.0.1:1", "127.0.0.1:2"]}), "", "worker", 0
    )
    with pytest.raises(FailedPreconditionError, match="names 2 workers, but this process"):
        PreemptionCheckpointHandler(two, Checkpoint(), tmp_path)
    one = SimpleClusterResolver(ClusterSpec({"worker": ["127.0.0.1:1"]}), "", "worker", 0)
    with pytest.raises(InvalidArgumentError, match="needs checkpoint_dir"):
        PreemptionCheckpointHandler(one, Checkpoint())
    manager = CheckpointManager(Checkpoint(), tmp_path / "a")
    with pytest.raises(InvalidArgumentError, match="give one of them"):
        PreemptionCheckpointHandler(one, manager, tmp_path / "b")
    with pytest.raises(TypeError, match=r"saves a feedline\.train\.Checkpoint"):
        PreemptionCheckpointHandler(one, object(), tmp_path)  # type: ignore[arg-type]
    checkpoint = Checkpoint(checkpointed_runs=torch.zeros(2))
    with pytest.raises(InvalidArgumentError, match="already holds a Tensor"):
        PreemptionCheckpointHandler(
            one, checkpoint, tmp_path, TerminationConfig(termination_watcher_fn=lambda: False)
        )


def test_sigterm_is_watched_only_from_the_main_thread(tmp_path: pathlib.Path) -> None:
    import threading

    one = SimpleClusterResolver(ClusterSpec({"worker": ["127.0.0.1:1"]}), "", "worker", 0)
    errors: list[BaseException] = []

    def make() -> None:
        try:
            PreemptionCheckpointHandler(one, Checkpoint(), tmp_path)
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=make)
    thread.start()
    thread.join(timeout=30)
    assert len(errors) == 1 and isinstance(errors[0], FailedPreconditionError)
    assert "termination_watcher_fn" in str(errors[0])


def test_the_documented_kubernetes_policy_restarts_on_the_handlers_exit_code() -> None:
    from feedline.train import preemption

    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "fault_tolerance.md").read_text()
    assert f"values: [{preemption.RESTART_EXIT_CODE}]" in doc
    assert preemption.RESTART_EXIT_CODE == 42  # TensorFlow's


_FAILING_WORKER = """
import sys
import torch
import feedline.distribute as fdist
from feedline.distribute.experimental import PreemptionCheckpointHandler
from feedline.errors import UnavailableError
from feedline.train import Checkpoint
from tests.launcher import report

strategy = fdist.MultiWorkerMirroredStrategy(
    communication_options=fdist.experimental.CommunicationOptions(timeout_seconds=30))
rank = strategy.extended.worker_index
handler = PreemptionCheckpointHandler(
    strategy.cluster_resolver, Checkpoint(step=torch.zeros(())), sys.argv[1])
try:
    with handler.watch_preemption_scope():
        for step in range(10):
            if rank == 1 and step == 3:
                raise ValueError("a corrupt batch at step 3")
            handler.run(lambda: strategy.reduce("SUM", torch.tensor(1.0), axis=None))
except UnavailableError as error:
    report(str(error))
"""


def test_an_error_in_the_scope_on_one_worker_is_named_by_the_others(
    tmp_path: pathlib.Path,
) -> None:
    with Processes(_FAILING_WORKER, torchrun_envs(2), argv=[str(tmp_path)], timeout=90) as procs:
        results = procs.wait()
    assert results["rank:1"].returncode == 1
    assert "ValueError: a corrupt batch at step 3" in results["rank:1"].stderr
    message = results["rank:0"].result
    assert results["rank:0"].returncode == 0 and message is not None
    assert "worker 1 (" in message and "failed: ValueError: a corrupt batch at step 3" in message


_PER_WORKER_DIRECTORY = """
import os, sys, threading, time
import torch
import feedline.distribute as fdist
from feedline.distribute.experimental import PreemptionCheckpointHandler, TerminationConfig
from feedline.train import Checkpoint, CheckpointManager
from tests.launcher import report

folder = sys.argv[1]
strategy = fdist.MultiWorkerMirroredStrategy(
    communication_options=fdist.experimental.CommunicationOptions(timeout_seconds=60))
resolver = strategy.cluster_resolver
task_id = resolver.task_id

# TensorFlow's guide: the chief writes to checkpoint_dir, every other worker to a directory of
# its own, checkpoint_dir/workertemp_<task_id>.
def write_dirpath(dirpath, task_id):
    if task_id == 0:
        return dirpath
    temp = os.path.join(dirpath, f"workertemp_{task_id}")
    os.makedirs(temp, exist_ok=True)
    return temp

class Stop(Exception):
    pass

def stop():
    raise Stop

def handler_for(notice):
    weights = torch.zeros(3)
    checkpoint = Checkpoint(weights=weights)
    manager = CheckpointManager(
        checkpoint, write_dirpath(os.path.join(folder, "ckpt"), task_id), max_to_keep=1)
    handler = PreemptionCheckpointHandler(
        resolver, manager,
        termination_config=TerminationConfig(termination_watcher_fn=notice.is_set, exit_fn=stop))
    return weights, handler

notice = threading.Event()
weights, handler = handler_for(notice)
steps = 0
try:
    for step in range(handler.total_run_calls, 100):
        handler.run(lambda: weights.add_(strategy.reduce("SUM", torch.ones(3), axis=None)))
        steps += 1
        if step == 2 and task_id == 1:
            notice.set()
        time.sleep(0.05)
except Stop:
    pass
saved = handler.total_run_calls
weights_after, resumed = handler_for(threading.Event())
report({"saved": saved, "weights": weights.tolist(), "restored_runs": resumed.total_run_calls,
        "restored": weights_after.tolist()})
"""


def test_non_chief_workers_may_give_a_manager_of_their_own_temporary_directory(
    tmp_path: pathlib.Path,
) -> None:
    # TF's MultiWorkerMirroredStrategy guide gives non-chief workers a CheckpointManager of
    # ckpt/workertemp_<task_id>; the handler saves where the chief's manager says and every
    # worker restores the chief's checkpoint.
    results = run(_PER_WORKER_DIRECTORY, torchrun_envs(2), argv=[str(tmp_path)], timeout=120)
    chief, worker = results["rank:0"].result, results["rank:1"].result
    assert chief["saved"] == worker["saved"] >= 3
    assert chief["weights"] == worker["weights"] == [2.0 * chief["saved"]] * 3
    for result in (chief, worker):
        assert result["restored_runs"] == chief["saved"]
        assert result["restored"] == chief["weights"]
    assert f"ckpt-{chief['saved']}" in os.listdir(tmp_path / "ckpt")


def test_a_notice_saves_to_s3_and_a_new_handler_restores_from_it(s3_bucket: str) -> None:
    from feedline import _fs

    directory = f"{s3_bucket}/preempted"
    job, handler = _run_until_preempted(directory, 1)
    saved_at = handler.total_run_calls
    assert _fs.list_names(directory, "test") == ["checkpoint", f"ckpt-{saved_at}"]
    weights = job.weights()
    job, handler = _job_and_handler(directory, termination_watcher_fn=lambda: False)
    assert (handler.total_run_calls, job.weights()) == (saved_at, weights)
