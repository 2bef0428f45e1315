"""Tests of feedline/distribute/_shared_service_jobs.py: a ``MultiWorkerMirroredStrategy``
cluster whose workers share one exactly-once ``distributed_epoch`` job of a real fault-tolerant
dispatcher, under ``torchrun --max-restarts 1`` and ``BackupAndRestore``. A real ``kill -9`` of
one trainer mid-epoch restarts the group from the last backup; the elements that the committed
steps trained on are then every element of the epoch, each once."""

from __future__ import annotations

import json
import os
import pathlib
import signal

import pytest

from tests.launcher import Torchrun, run, torchrun_envs
from tests.service.procs import ServiceProcesses

pytestmark = pytest.mark.timeout(240)

ELEMENTS, BATCH, SAVE_FREQ = 480, 8, 5

_TRAINER = f"""
import json, os, sys, time
import torch
import feedline.data as fd
import feedline.distribute as fdist
from feedline.service import distribute
from feedline.train import BackupAndRestore, Checkpoint
from tests.launcher import report

folder, target = sys.argv[1], os.environ["FEEDLINE_TARGET"]
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
strategy = fdist.MultiWorkerMirroredStrategy(
    communication_options=fdist.experimental.CommunicationOptions(timeout_seconds=30))
rank = strategy.extended.worker_index

def dataset_fn(context):
    return (fd.Dataset.range({ELEMENTS})
            .apply(distribute("distributed_epoch", target, job_name="shared"))
            .batch({BATCH}))

if os.environ["API"] == "function":
    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
else:  # every worker reads its own pipeline: AUTO sharding leaves a shared job whole
    iterator = iter(strategy.experimental_distribute_dataset(dataset_fn(None)))
with strategy.scope():
    weight = torch.nn.Parameter(torch.zeros(()))
checkpoint = Checkpoint(weight=weight, iterator=iterator)

def replica_step(batch):
    return (weight + batch.to(torch.float32)).sum()

def train_step(batch):
    return strategy.reduce("SUM", strategy.run(replica_step, args=(batch,)), axis=None)

log = open(os.path.join(folder, f"log-{{rank}}-{{attempt}}.jsonl"), "a")
with BackupAndRestore(checkpoint, os.path.join(folder, "backup"), save_freq={SAVE_FREQ}) as backup:
    start = step = backup.total_run_calls
    for batch in iterator:
        backup.run(train_step, batch)     # returned on every worker: the step committed
        ids = [i for part in strategy.experimental_local_results(batch) for i in part.tolist()]
        log.write(json.dumps([step, ids]) + "\\n")
        log.flush()
        if attempt == 0 and step == int(os.environ["KILL_AT"]) and rank == 1:
            with open(os.path.join(folder, "pid.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.replace(os.path.join(folder, "pid.tmp"), os.path.join(folder, "pid"))
            time.sleep(60)                 # killed here
        step += 1
report({{"attempt": attempt, "start": start, "steps": step}})
"""


def _committed(folder: pathlib.Path, rank: int, restarted_at: int) -> list[int]:
    """The element ids that rank's committed steps trained on: attempt 0's steps before the
    backup that attempt 1 restored, then attempt 1's."""
    ids: list[int] = []
    for attempt in (0, 1):
        for line in (folder / f"log-{rank}-{attempt}.jsonl").read_text().splitlines():
            step, batch = json.loads(line)
            if attempt == 1 or step < restarted_at:
                ids.extend(batch)
    return ids


@pytest.mark.parametrize(
    ("kill_at", "api"),
    [(13, "function"), (3, "distribute_dataset")],
    ids=["after-a-backup", "before-the-first-backup"],
)
def test_a_kill_9_mid_epoch_trains_on_every_element_of_a_shared_job_once(
    tmp_path: pathlib.Path, kill_at: int, api: str
) -> None:
    with ServiceProcesses(timeout=200) as cluster:
        cluster.start_dispatcher("--fault-tolerant", "--work-dir", str(tmp_path / "dispatcher"))
        cluster.start_worker()
        procs = cluster.run(
            _TRAINER,
            [("torchrun", {"KILL_AT": str(kill_at), "API": api})],
            argv=[str(tmp_path)],
            torchrun=Torchrun(nproc_per_node=2, max_restarts=1),
            timeout=180,
        )
        procs.wait_for(tmp_path / "pid", timeout=120)
        os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
        results = procs.wait()
        reports = procs.reports()
    assert results["torchrun"].returncode == 0, results["torchrun"].describe()
    starts = {reports[f"rank:{rank}"]["start"] for rank in range(2)}
    assert {reports[f"rank:{rank}"]["attempt"] for rank in range(2)} == {1}
    assert starts == {(kill_at // SAVE_FREQ) * SAVE_FREQ}
    restarted_at = starts.pop()
    trained = _committed(tmp_path, 0, restarted_at) + _committed(tmp_path, 1, restarted_at)
    assert sorted(trained) == list(range(ELEMENTS))


_SAVE_THEN_RESTORE = f"""
import itertools, os, sys
import feedline.data as fd
import feedline.distribute as fdist
from feedline.service import distribute
from feedline.train import Checkpoint
from tests.launcher import report

folder, steps = sys.argv[1], int(sys.argv[2])
strategy = fdist.MultiWorkerMirroredStrategy(
    communication_options=fdist.experimental.CommunicationOptions(timeout_seconds=30))
dataset_fn = lambda context: (fd.Dataset.range({ELEMENTS})
    .apply(distribute("distributed_epoch", os.environ["FEEDLINE_TARGET"], job_name="shared"))
    .batch({BATCH}))
if os.environ["API"] == "function":
    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
else:  # OFF: each worker reads the shared job, its steps prefetched (read ahead of the job)
    iterator = iter(strategy.experimental_distribute_dataset(dataset_fn(None)))
checkpoint = Checkpoint(iterator=iterator)
if steps == 0:
    checkpoint.restore(os.path.join(folder, "ckpt-1"))
ids = []
for batch in itertools.islice(iterator, steps or None):
    ids += [i for part in strategy.experimental_local_results(batch) for i in part.tolist()]
if steps:
    checkpoint.save(os.path.join(folder, "ckpt"))
report(ids)
"""


@pytest.mark.parametrize(
    ("api", "after"), [("function", 3), ("function", 1), ("distribute_dataset", 3)]
)
def test_a_shared_job_saved_on_two_workers_resumes_on_any_number(
    tmp_path: pathlib.Path, api: str, after: int
) -> None:
    """Saved on 2 workers, resumed on 3 or 1: each element once. Through
    ``experimental_distribute_dataset`` the workers had read steps ahead of the job (their
    prefetch), which the restore deals out among the new workers."""
    with ServiceProcesses(timeout=120) as cluster:
        cluster.start_dispatcher("--fault-tolerant", "--work-dir", str(tmp_path / "dispatcher"))
        cluster.start_worker()
        env = {"FEEDLINE_TARGET": cluster.target, "API": api}
        before = run(_SAVE_THEN_RESTORE, torchrun_envs(2), argv=[str(tmp_path), "7"], env=env)
        rest = run(_SAVE_THEN_RESTORE, torchrun_envs(after), argv=[str(tmp_path), "0"], env=env)
    read = [i for results in (before, rest) for r in results.values() for i in r.result]
    per_step = BATCH if api == "function" else BATCH // 2  # a global batch over 2 workers
    assert sum(len(r.result) for r in before.values()) == 2 * 7 * per_step
    assert sorted(read) == list(range(ELEMENTS))
