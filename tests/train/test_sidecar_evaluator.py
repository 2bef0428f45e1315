"""Tests of feedline/train/sidecar_evaluator.py: a real training process writes checkpoints while
the evaluator in the test process evaluates each one."""

from __future__ import annotations

import doctest
import json
import logging
import os
import pathlib
import threading
import time

import numpy as np
import pytest
import torch

import feedline.data as fd
import feedline.train
from feedline.distribute.cluster_resolver import TFConfigClusterResolver
from feedline.errors import InvalidArgumentError, NotFoundError
from feedline.metrics import Mean, MeanMetricWrapper
from feedline.train import Checkpoint, CheckpointManager, sidecar_evaluator
from feedline.train.sidecar_evaluator import Evaluation, SidecarEvaluator
from tests.launcher import Processes, tf_config_envs

# The training job: a chief that sets its one weight to k (and its learning rate to k / 10)
# before checkpoint k. It waits for the evaluator's marker of checkpoints 1-3 (so each is
# evaluated), then writes 4-6 back to back (the evaluator may skip some, as TensorFlow's does).
TRAINER = """
import os, pathlib, sys, time
import torch
import feedline.train
from feedline.distribute.cluster_resolver import TFConfigClusterResolver
from tests.launcher import report

resolver = TFConfigClusterResolver()
assert (resolver.task_type, resolver.task_id) == ("chief", 0), resolver.task_type
directory = os.environ["CHECKPOINT_DIR"]   # a local path or a URL (s3://...)
markers = pathlib.Path(os.environ["MARKER_DIR"])
model = torch.nn.Linear(1, 1, bias=False)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
checkpoint = feedline.train.Checkpoint(model=model, optimizer=optimizer)
manager = feedline.train.CheckpointManager(checkpoint, directory, max_to_keep=2)
for k in range(1, 7):
    with torch.no_grad():
        model.weight.fill_(float(k))
    optimizer.param_groups[0]["lr"] = k / 10
    manager.save()
    deadline = time.monotonic() + 30
    while k <= 3 and not (markers / f"evaluated-{k}").exists():
        if time.monotonic() > deadline:
            sys.exit(f"checkpoint {k} was not evaluated in 30 s")
        time.sleep(0.01)
report([os.path.basename(path) for path in manager.checkpoints])
"""

# Four examples x = 1, 2, 3, 4 with label 0, in batches of 2: a weight w predicts w * x, so
# the mean absolute error is 2.5 * w.
X = np.array([[1.0], [2.0], [3.0], [4.0]], dtype=np.float32)
Y = np.zeros((4, 1), dtype=np.float32)


def mae() -> MeanMetricWrapper:
    return MeanMetricWrapper(lambda y_true, y_pred: (y_pred - y_true).abs(), name="mae")


@pytest.mark.parametrize("store", ["local", "s3"])
def test_evaluates_each_checkpoint_of_a_training_process(
    store: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    if store == "s3":  # the trainer writes to the server on loopback; the evaluator reads it
        checkpoints = f"{request.getfixturevalue('s3_bucket')}/checkpoints"
    else:
        checkpoints = str(tmp_path / "checkpoints")
    model = torch.nn.Linear(1, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    seen: list[tuple[int | None, float, float, int]] = []

    def record(evaluation: Evaluation) -> None:
        lr = optimizer.param_groups[0]["lr"]
        seen.append((evaluation.number, evaluation.metrics["mae"], lr, evaluation.steps))
        (markers / f"evaluated-{evaluation.number}").touch()

    evaluator = SidecarEvaluator(
        model,
        fd.Dataset.from_tensor_slices((X, Y)).batch(2),
        checkpoints,
        max_evaluations=6,
        metrics=[mae()],
        optimizer=optimizer,
        callbacks=[record],
        poll_interval=0.01 if store == "local" else 0.05,
        timeout=80,
    )
    env = {"CHECKPOINT_DIR": checkpoints, "MARKER_DIR": str(markers)}
    with Processes(TRAINER, tf_config_envs({"chief": 1}), env=env, timeout=90) as procs:
        # A trainer that fails stops the evaluator at once, so its error shows without a wait.
        done = threading.Event()

        def stop_if_trainer_failed() -> None:
            while not done.wait(0.1):
                if procs.poll("chief:0") not in (None, 0):
                    evaluator.stop()
                    return

        watcher = threading.Thread(target=stop_if_trainer_failed, daemon=True)
        watcher.start()
        try:
            evaluations = evaluator.start()
        finally:
            done.set()
            watcher.join(timeout=5)
        results = procs.wait()
    assert results["chief:0"].ok, results["chief:0"].describe()
    assert results["chief:0"].result == ["ckpt-5", "ckpt-6"]  # max_to_keep=2 pruned the rest

    # Checkpoint k holds weight k and learning rate k / 10: each evaluation saw its own.
    assert seen[:3] == [(1, 2.5, 0.1, 2), (2, 5.0, 0.2, 2), (3, 7.5, 0.3, 2)]
    numbers = [number for number, *_ in seen]
    assert numbers == sorted(set(numbers)) and numbers[-1] == 6, numbers
    for number, value, lr, steps in seen:
        assert (value, lr, steps) == (2.5 * number, pytest.approx(number / 10), 2)
    assert [(e.number, e.metrics) for e in evaluations] == [(n, {"mae": v}) for n, v, *_ in seen]
    assert evaluations == evaluator.evaluations
    assert evaluations[-1].checkpoint == f"{checkpoints}/ckpt-6"


def save_weights(directory: pathlib.Path, weights: list[float]) -> list[str]:
    """Checkpoints ckpt-1, ckpt-2, ... of a 1x1 linear model with these weights."""
    model = torch.nn.Linear(1, 1, bias=False)
    manager = CheckpointManager(Checkpoint(model=model), directory, max_to_keep=None)
    paths = []
    for weight in weights:
        with torch.no_grad():
            model.weight.fill_(weight)
        paths.append(manager.save())
    return paths


def evaluator_on(directory: pathlib.Path | str, data=None, **kwargs) -> SidecarEvaluator:
    kwargs.setdefault("metrics", [mae()])
    kwargs.setdefault("poll_interval", 0.01)
    kwargs.setdefault("timeout", 5)
    data = [(torch.from_numpy(X), torch.from_numpy(Y))] if data is None else data
    return SidecarEvaluator(torch.nn.Linear(1, 1, bias=False), data, directory, **kwargs)


def test_takes_the_latest_checkpoint_and_skips_older_ones(tmp_path: pathlib.Path) -> None:
    save_weights(tmp_path, [1.0, 2.0, 3.0])
    evaluations = evaluator_on(tmp_path, max_evaluations=3).start()
    assert [(e.number, e.metrics, e.steps) for e in evaluations] == [(3, {"mae": 7.5}, 1)]


def test_storage_options_reach_a_store_that_refuses_the_environments_keys() -> None:
    from tests.conftest import credential_checked_s3, new_s3_user_options

    with credential_checked_s3() as (bucket, check_credentials):
        options = new_s3_user_options()
        check_credentials()
        model = torch.nn.Linear(1, 1, bias=False)
        manager = CheckpointManager(
            Checkpoint(model=model), f"{bucket}/run", storage_options=options
        )
        for weight in (1.0, 2.0):
            with torch.no_grad():
                model.weight.fill_(weight)
            manager.save()
        evaluator = evaluator_on(f"{bucket}/run", max_evaluations=2, storage_options=options)
        evaluations = evaluator.start()
    assert [(e.checkpoint, e.metrics) for e in evaluations] == [
        (f"{bucket}/run/ckpt-2", {"mae": 5.0})
    ]


def test_a_later_start_goes_on_with_newer_checkpoints(tmp_path: pathlib.Path) -> None:
    save_weights(tmp_path, [1.0])
    evaluator = evaluator_on(tmp_path, timeout=0.05)
    assert [e.number for e in evaluator.start()] == [1]
    assert evaluator.start() == []  # nothing new
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(4.0)
    CheckpointManager(Checkpoint(model=model), tmp_path).save()
    assert [(e.number, e.metrics) for e in evaluator.start()] == [(2, {"mae": 10.0})]
    assert [e.number for e in evaluator.evaluations] == [1, 2]


def test_steps_evaluates_the_first_batches_of_a_fresh_pass(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    save_weights(tmp_path, [1.0])
    batches: list[list[int]] = []
    total = Mean(name="total")

    def eval_step(batch: torch.Tensor) -> None:
        assert isinstance(batch, torch.Tensor)  # NumPy arrays arrive as tensors
        batches.append(batch.tolist())
        total.update_state(batch)

    data = fd.Dataset.range(10).batch(2)
    evaluator = evaluator_on(
        tmp_path, data, steps=2, metrics=total, eval_step=eval_step, timeout=0.05
    )
    evaluator.start()
    save_weights(tmp_path, [1.0])  # ckpt-2
    evaluator.start()
    assert batches == [[0, 1], [2, 3], [0, 1], [2, 3]]
    assert [(e.metrics, e.steps) for e in evaluator.evaluations] == [({"total": 1.5}, 2)] * 2

    batches.clear()
    evaluator = evaluator_on(
        tmp_path, data, steps=7, max_evaluations=2, metrics=[], eval_step=eval_step
    )
    with caplog.at_level(logging.WARNING, logger=sidecar_evaluator.__name__):
        (evaluation,) = evaluator.start()
    assert evaluation.steps == 5 and len(batches) == 5
    assert "ran out after 5 of steps=7 batches" in caplog.text


def test_sample_weights_and_logged_results(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    save_weights(tmp_path, [2.0])
    weights = torch.tensor([1.0, 0.0, 0.0, 1.0])  # examples x = 1 and x = 4
    data = [(torch.from_numpy(X), torch.from_numpy(Y), weights)]
    with caplog.at_level(logging.INFO, logger=sidecar_evaluator.__name__):
        (evaluation,) = evaluator_on(tmp_path, data, max_evaluations=1).start()
    assert evaluation.metrics == {"mae": 5.0}
    assert "evaluated ckpt-1 on 1 batches: mae=5" in caplog.text
    assert "ckpt-1 is checkpoint 1, max_evaluations=1: SidecarEvaluator stops" in caplog.text


def test_model_mode_is_restored_and_gradients_are_off(tmp_path: pathlib.Path) -> None:
    save_weights(tmp_path, [1.0])
    modes: list[tuple[bool, bool]] = []
    model = torch.nn.Linear(1, 1, bias=False)

    def eval_step(batch: object) -> None:
        modes.append((model.training, torch.is_grad_enabled()))

    SidecarEvaluator(model, [0], tmp_path, max_evaluations=1, eval_step=eval_step).start()
    assert modes == [(False, False)] and model.training


def test_timeout_and_stop_end_the_wait(tmp_path: pathlib.Path) -> None:
    start = time.monotonic()
    assert evaluator_on(tmp_path, timeout=0.2).start() == []
    assert 0.2 <= time.monotonic() - start < 3

    evaluator = evaluator_on(tmp_path, timeout=None, poll_interval=0.05)
    timer = threading.Timer(0.2, evaluator.stop)
    timer.start()
    start = time.monotonic()
    assert evaluator.start() == []
    assert time.monotonic() - start < 3
    timer.join(timeout=5)


def test_a_checkpoint_pruned_before_its_restore_is_looked_for_again(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_weights(tmp_path, [3.0])
    original = Checkpoint.restore
    calls: list[str] = []

    def restore_once_gone(self, save_path):
        calls.append(os.path.basename(save_path))
        if len(calls) == 1:
            raise NotFoundError(f"no checkpoint file at {save_path}", name=str(save_path))
        return original(self, save_path)

    monkeypatch.setattr(Checkpoint, "restore", restore_once_gone)
    evaluations = evaluator_on(tmp_path, max_evaluations=1).start()
    assert calls == ["ckpt-1", "ckpt-1"]
    assert [e.metrics for e in evaluations] == [{"mae": 7.5}]


def test_checkpoint_that_does_not_fit_raises(tmp_path: pathlib.Path) -> None:
    wide = torch.nn.Linear(2, 1, bias=False)
    CheckpointManager(Checkpoint(model=wide), tmp_path / "wide").save()
    with pytest.raises(InvalidArgumentError, match="shape"):
        evaluator_on(tmp_path / "wide").start()

    net = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        net.weight.fill_(2.0)
    CheckpointManager(Checkpoint(net=net), tmp_path / "net").save()
    with pytest.raises(NotFoundError, match=r"objects without an entry in the file: \['model'\]"):
        evaluator_on(tmp_path / "net").start()
    model = torch.nn.Linear(1, 1, bias=False)
    data = [(torch.from_numpy(X), torch.from_numpy(Y))]
    evaluator = SidecarEvaluator(
        model, data, tmp_path / "net", max_evaluations=1, metrics=mae(),
        checkpoint=Checkpoint(net=model), poll_interval=0.01, timeout=5,
    )  # fmt: skip
    assert [e.metrics for e in evaluator.start()] == [{"mae": 5.0}]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"steps": 0}, InvalidArgumentError, "steps must be a positive int or None; got 0"),
        ({"steps": 1.5}, InvalidArgumentError, "steps must be .* got 1.5"),
        ({"max_evaluations": -1}, InvalidArgumentError, "max_evaluations must be .* got -1"),
        ({"metrics": []}, InvalidArgumentError, "give metrics .* or an eval_step"),
        ({"metrics": [mae(), mae()]}, InvalidArgumentError, "two metrics are named 'mae'"),
        ({"metrics": {"a": "accuracy"}}, TypeError, "metric 'a' is a str, not a feedline"),
        ({"poll_interval": 0}, InvalidArgumentError, "poll_interval must be > 0 seconds; got 0"),
        ({"timeout": -1}, InvalidArgumentError, "timeout must be >= 0 seconds, or None"),
        ({"checkpoint": {"model": 1}}, TypeError, "must be a feedline.train.Checkpoint, got dict"),
    ],
)
def test_bad_arguments(tmp_path: pathlib.Path, kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        evaluator_on(tmp_path, **kwargs)


def test_bad_model_and_batches(tmp_path: pathlib.Path) -> None:
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module, got function"):
        SidecarEvaluator(lambda x: x, [], tmp_path, metrics=mae())
    save_weights(tmp_path, [1.0])
    with pytest.raises(InvalidArgumentError, match=r"got a Tensor: give eval_step\(batch\)"):
        evaluator_on(tmp_path, [torch.ones(2, 1)]).start()
    with pytest.raises(InvalidArgumentError, match="got a tuple of 4 parts"):
        evaluator_on(tmp_path, [(1, 2, 3, 4)]).start()


def test_evaluator_task_of_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}
    # TensorFlow leaves the evaluator out of the cluster; naming it there is accepted too.
    for jobs in (cluster, {**cluster, "evaluator": ["127.0.0.1:2224"]}):
        config = {"cluster": jobs, "task": {"type": "evaluator", "index": 0}}
        monkeypatch.setenv("TF_CONFIG", json.dumps(config))
        resolver = TFConfigClusterResolver()
        assert (resolver.task_type, resolver.task_id) == ("evaluator", 0)
        assert resolver.cluster_spec().jobs == sorted(jobs)


def test_exported_and_doctests() -> None:
    assert feedline.train.SidecarEvaluator is SidecarEvaluator
    assert "SidecarEvaluator" in feedline.train.__all__
    assert "SidecarEvaluator" in dir(feedline.train)
    results = doctest.testmod(sidecar_evaluator, optionflags=doctest.ELLIPSIS)
    assert results.attempted > 0 and results.failed == 0
