"""A small elastic training job that the elastic tests and benchmark run in worker processes.

Each worker trains a small MLP under an elastic ``MultiWorkerMirroredStrategy``; the batch of
step ``s`` is a function of ``s`` alone (rows ``rank::world_size`` of it on each worker), so a
redone step trains on the same rows. The loop is the hand-written one the docs show: on a
``MembershipChangedError`` it calls ``strategy.reform`` and runs the step again unless the group
committed it. Every ``CHECK_EVERY`` steps the workers agree (``strategy.reduce``) whether the
test asked them to stop (the file ``STOP_FILE`` exists), so that all stop at the same step.
Progress goes to ``PROGRESS_DIR/<name>`` (the step, the generation, the world size) and the
result to ``report``.

With ``INPUT=rows``, ``INPUT=stream`` or ``INPUT=saved`` (and ``LOOP=backup``) the input is a
``GlobalBatches`` of element ids (``global_input``): by index, as a shuffled stream, or by
place in the snapshot at ``SNAPSHOT`` (which ``distributed_save`` of ``saved_ids`` may still be
writing). The model then has one
more parameter, ``seen``, whose gradient is 1 at the ids a worker trained on: all-reduced with
the others, it is the step's whole global batch, which each worker appends to
``PROGRESS_DIR/<name>.steps`` once the step committed there.
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import feedline.distribute as fdist
from feedline.data import Dataset
from feedline.distribute.elastic import ElasticClusterResolver
from feedline.distribute.global_batches import GlobalBatches
from feedline.errors import MembershipChangedError
from feedline.train import BackupAndRestore, Checkpoint

CHECK_EVERY = 5
MODEL_MADE = 0.0
GLOBAL_BATCH = 24
ELEMENTS = 240  # the ids of global_input: ten global batches a pass


def batch(step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True).sin()
    return x[rank::world_size], y[rank::world_size]


def features(element_id: Any) -> dict[str, Any]:
    """The element of ``element_id``: its features are a function of the id alone."""
    x = np.random.default_rng(int(element_id)).standard_normal(8).astype(np.float32)
    return {"id": np.int64(element_id), "x": x}


def saved_ids(pause_s: float) -> Dataset:
    """The ids ``range(ELEMENTS)``, each ``pause_s`` in the making: what ``INPUT=saved`` reads
    once ``distributed_save`` wrote it."""
    return Dataset.range(ELEMENTS).map(functools.partial(_slowly, pause_s))


def _slowly(pause_s: float, element_id: Any) -> Any:
    time.sleep(pause_s)
    return element_id


def global_input(kind: str, snapshot: str | None = None) -> GlobalBatches:
    """The global batches of the ids ``range(ELEMENTS)``, pass after pass in a new order:
    read by index (``rows``: a permutation per pass), as a stream (``stream``: a seeded
    shuffle buffer in the pipeline) or by place in the snapshot ``snapshot`` (``saved``: its
    streams in their order each pass)."""
    ids = Dataset.range(ELEMENTS)
    if kind == "saved":  # in the saved order, so that the first pass is read while written
        loaded = Dataset.load(snapshot or os.environ["SNAPSHOT"], wait=True)
        return GlobalBatches(loaded, GLOBAL_BATCH, map_func=features, epochs=1000, timeout_s=120)
    if kind == "rows":
        return GlobalBatches(ids, GLOBAL_BATCH, shuffle_seed=5, map_func=features, epochs=1000)
    stream = ids.shuffle(64, seed=5).repeat()
    return GlobalBatches(stream, GLOBAL_BATCH, map_func=features)


def main(name: str) -> dict[str, Any]:
    started = time.monotonic()
    resolver = ElasticClusterResolver(
        min_workers=int(os.environ.get("MIN_WORKERS", "1")),
        settle_seconds=float(os.environ.get("SETTLE_SECONDS", "0.3")),
        timeout_seconds=float(os.environ.get("ELASTIC_TIMEOUT", "60")),
    )
    strategy = fdist.MultiWorkerMirroredStrategy(resolver)
    elastic = strategy.elastic
    assert elastic is not None
    admitted = time.monotonic()
    torch.manual_seed(int(os.environ.get("SEED", "0")))
    with strategy.scope():
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        if os.environ.get("INPUT"):
            model.register_parameter("seen", torch.nn.Parameter(torch.zeros(ELEMENTS)))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    global MODEL_MADE
    MODEL_MADE = time.monotonic() - admitted

    def replica(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        loss = ((model(x) - y) ** 2).sum() / GLOBAL_BATCH
        loss.backward()
        optimizer.step()
        return loss

    if os.environ.get("INPUT"):
        return _with_global_batches(name, strategy, model, optimizer, started, admitted)
    if os.environ.get("LOOP") == "backup":
        return _with_backup(name, strategy, model, optimizer, replica, started, admitted)
    progress = Path(os.environ["PROGRESS_DIR"]) / name
    stop_file = Path(os.environ["STOP_FILE"])
    delay = float(os.environ.get("STEP_SECONDS", "0.02"))
    step = first_step = elastic.step
    attempts = failures = 0
    first_commit: float | None = None
    changes: list[dict[str, Any]] = []
    while True:
        before = elastic.committed
        attempts += 1
        try:
            x, y = batch(step, elastic.rank, elastic.world_size)
            strategy.run(replica, (x, y))
            step += 1
            if first_commit is None:
                first_commit = time.monotonic()
            if changes and "resumed_s" not in changes[-1]:
                changes[-1]["resumed_s"] = time.monotonic() - changes[-1].pop("failed_at")
            if step % CHECK_EVERY == 0 and _stop_agreed(strategy, stop_file):
                break
        except MembershipChangedError as error:
            failures += 1
            mine = step + (1 if elastic.committed > before else 0)
            t0 = time.monotonic()
            if changes and "failed_at" in changes[-1]:  # it failed again before a step
                changes[-1]["resumed_s"] = None
                changes[-1].pop("failed_at")
            step = strategy.reform(mine)
            changes.append(
                {
                    "reason": error.reason,
                    "from": error.generation,
                    "to": elastic.generation.number,
                    "world_size": elastic.world_size,
                    "mine": mine,
                    "agreed": step,
                    "reform_s": time.monotonic() - t0,
                    "failed_at": t0,
                }
            )
        _progress(progress, step, elastic)
        time.sleep(delay)
    return _result(step, model, optimizer, elastic, started, admitted, first_commit) | {
        "attempts": attempts,
        "failures": failures,
        "changes": changes,
        "first_step": first_step,
    }


def _stop_agreed(strategy: Any, stop_file: Path) -> bool:
    """Whether any worker sees ``stop_file`` (a ``strategy.reduce``: all answer alike)."""
    flag = torch.tensor(float(stop_file.exists()))
    return bool(strategy.reduce("SUM", flag, axis=None).item() > 0)


def read_progress(directory: Path, name: str) -> dict[str, int]:
    """What worker ``name`` last wrote to ``directory/name`` (``_progress``: replaced whole)."""
    path = directory / name
    return json.loads(path.read_text()) if path.exists() else {"step": -1, "gen": 0, "world": 0}


def job_env(directory: Path, store_port: int, **settings: str) -> dict[str, str]:
    """The environment of a worker of a job whose files are in ``directory`` and whose
    membership store listens on ``store_port``, with ``settings`` (``LOOP``, ``INPUT``,
    ``MIN_WORKERS``, ...) on top."""
    directory.mkdir(exist_ok=True)
    return {
        "BACKUP_DIR": str(directory / "backup"),
        "FEEDLINE_ELASTIC_STORE": f"127.0.0.1:{store_port}",
        "PROGRESS_DIR": str(directory),
        "STOP_FILE": str(directory / "stop"),
        **settings,
    }


def reference_batches(kind: str, steps: int, snapshot: str | None = None) -> list[list[int]]:
    """The ids of the first ``steps`` global batches of ``global_input(kind, snapshot)``,
    sorted, as one reader reads them."""
    batches = global_input(kind, snapshot)
    return [sorted(int(x) for x in batches.local_batch(s, 0, 1)["id"]) for s in range(steps)]


def logged_steps(directory: Path) -> dict[str, list[tuple[int, list[int]]]]:
    """Per worker, the steps it logged as committed and their global batches, in order."""
    return {
        path.stem: [(e["step"], e["ids"]) for e in map(json.loads, path.read_text().splitlines())]
        for path in directory.glob("*.steps")
    }


def _progress(path: Path, step: int, elastic: Any) -> None:
    state = {"step": step, "gen": elastic.generation.number, "world": elastic.world_size}
    path.with_suffix(".tmp").write_text(json.dumps(state))
    path.with_suffix(".tmp").replace(path)


def _result(
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    elastic: Any,
    started: float,
    admitted: float,
    first_commit: float | None,
) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "step": step,
        "committed": elastic.committed,
        "params": [p.detach().reshape(-1).tolist() for p in model.parameters()],
        "moments": [s["exp_avg"].reshape(-1).tolist() for s in optimizer.state.values()],
        "generation": elastic.generation.number,
        "world_size": elastic.world_size,
        "startup_s": admitted - started,
        "first_commit_s": None if first_commit is None else first_commit - admitted,
        "model_s": MODEL_MADE,
    }


def _with_backup(
    name: str,
    strategy: Any,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    replica: Any,
    started: float,
    admitted: float,
) -> dict[str, Any]:
    """The loop of the docs: ``BackupAndRestore.run`` absorbs every membership change."""
    elastic = strategy.elastic
    checkpoint = Checkpoint(model=model, optimizer=optimizer)
    backup = BackupAndRestore(checkpoint, os.environ["BACKUP_DIR"], save_freq=50)
    progress = Path(os.environ["PROGRESS_DIR"]) / name
    stop_file = Path(os.environ["STOP_FILE"])
    delay = float(os.environ.get("STEP_SECONDS", "0.02"))
    calls = 0
    first_step = backup.total_run_calls  # 0, or the group's count for a worker that joined
    generations = [elastic.generation.number]
    first_commit: float | None = None

    def train_step(step: int) -> bool:
        x, y = batch(step, elastic.rank, elastic.world_size)
        strategy.run(replica, (x, y))
        return step % CHECK_EVERY == CHECK_EVERY - 1 and _stop_agreed(strategy, stop_file)

    with backup:
        while True:
            calls += 1
            stop = backup.run(train_step, backup.total_run_calls)
            if first_commit is None:
                first_commit = time.monotonic()
            if elastic.generation.number != generations[-1]:
                generations.append(elastic.generation.number)
            _progress(progress, backup.total_run_calls, elastic)
            if stop:
                break
            time.sleep(delay)
    step = backup.total_run_calls
    result = _result(step, model, optimizer, elastic, started, admitted, first_commit)
    return result | {"calls": calls, "first_step": first_step, "generations": generations}


def _with_global_batches(
    name: str,
    strategy: Any,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    started: float,
    admitted: float,
) -> dict[str, Any]:
    """``BackupAndRestore.run`` over a ``GlobalBatches``: each committed step appends the
    global batch it trained on (``seen``'s all-reduced gradient) to ``<name>.steps``."""
    elastic = strategy.elastic
    batches = global_input(os.environ["INPUT"])
    seen = model.get_parameter("seen")
    backup = BackupAndRestore(
        Checkpoint(model=model, optimizer=optimizer), os.environ["BACKUP_DIR"], save_freq=100
    )
    progress = Path(os.environ["PROGRESS_DIR"]) / name
    stop_file = Path(os.environ["STOP_FILE"])
    delay = float(os.environ.get("STEP_SECONDS", "0.02"))
    first_commit: float | None = None

    def with_seen(x: torch.Tensor, y: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        marks = (seen * torch.zeros(ELEMENTS).index_fill_(0, ids, 1.0)).sum()
        loss = ((model(x) - y) ** 2).sum() / GLOBAL_BATCH + marks - marks.detach()
        loss.backward()
        optimizer.step()
        return loss

    def train_step(iterator: GlobalBatches) -> bool:
        local = next(iterator)
        step = iterator.step  # the group's, after a change
        ids = torch.as_tensor(local["id"])
        x = torch.as_tensor(local["x"])
        strategy.run(with_seen, (x, x.sum(dim=1, keepdim=True).sin(), ids))
        assert seen.grad is not None
        trained = torch.nonzero(seen.grad).reshape(-1).tolist()
        with progress.with_suffix(".steps").open("a") as log:
            log.write(json.dumps({"step": step, "ids": trained, "local": len(ids)}) + "\n")
        return step % CHECK_EVERY == CHECK_EVERY - 1 and _stop_agreed(strategy, stop_file)

    with backup:
        while True:
            stop = backup.run(train_step, batches)
            if first_commit is None:
                first_commit = time.monotonic()
            _progress(progress, backup.total_run_calls, elastic)
            if stop:
                break
            time.sleep(delay)
    step = backup.total_run_calls
    return _result(step, model, optimizer, elastic, started, admitted, first_commit) | {
        "batches_step": batches.step
    }
