"""Tests of feedline/distribute/copy_mirroring.py: replicas on their own parameter copies train as
one replica on the global batch, and the module shows the primary copy outside ``run``.

``ReductionToOneDevice()`` gives logical CPU replicas their own copies, which is how the copy
path runs without GPUs; the CUDA tests run it across devices where there are GPUs.
"""

from __future__ import annotations

import doctest
from pathlib import Path
from typing import Any

import pytest
import torch

import feedline.distribute as fdist
import feedline.train
from feedline.distribute import copy_mirroring
from feedline.errors import FailedPreconditionError, InvalidArgumentError
from tests.distribute.test_mirroring import (
    GLOBAL_BATCH,
    _data,
    _model,
    assert_same,
    check_buffers_mean,
    train,
    train_on,
)

COPY_OPS = [
    pytest.param(fdist.ReductionToOneDevice(), id="reduce-to-first"),
    pytest.param(fdist.ReductionToOneDevice(reduce_to_device="cpu"), id="reduce-to-cpu"),
]
needs_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _copies(replicas: int, ops: fdist.ReductionToOneDevice) -> fdist.MirroredStrategy:
    return fdist.MirroredStrategy([f"cpu:{i}" for i in range(replicas)], cross_device_ops=ops)


def _linear(strategy: fdist.Strategy) -> tuple[torch.nn.Linear, torch.optim.SGD]:
    with strategy.scope():
        model = torch.nn.Linear(2, 1, bias=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    torch.nn.init.ones_(model.weight)
    return model, optimizer


# -- equivalence: N replicas on copies train as one replica --------------------------------
@pytest.mark.parametrize("ops", COPY_OPS)
def test_two_replicas_on_copies_equal_one_after_20_adam_steps(
    ops: fdist.ReductionToOneDevice,
) -> None:
    rows = GLOBAL_BATCH * 20
    assert_same(train(1, rows=rows), train_on(_copies(2, ops), rows=rows))


@pytest.mark.parametrize("ops", COPY_OPS)
@pytest.mark.parametrize("rows", [GLOBAL_BATCH * 2 + 1, GLOBAL_BATCH * 2 + 7])
def test_three_replicas_on_copies_with_partial_and_empty_batches_equal_one(
    ops: fdist.ReductionToOneDevice, rows: int
) -> None:
    # the last step has 1 (or 7) rows: replicas 1 and 2 get empty batches (or 2 and 2 rows)
    assert_same(train(1, rows=rows), train_on(_copies(3, ops), rows=rows))


@pytest.mark.parametrize("ops", COPY_OPS)
def test_buffers_on_copies_start_equal_and_end_as_the_replicas_mean(
    ops: fdist.ReductionToOneDevice,
) -> None:
    strategy = _copies(2, ops)
    norm, step, batches, starts = check_buffers_mean(strategy)
    strategy.run(step, args=(batches,))
    assert starts[2].item() == starts[3].item() == pytest.approx(4.0)
    assert norm.num_batches_tracked.item() == 2


def test_gradients_summed_over_copies_one_update_per_step() -> None:
    strategy = _copies(2, fdist.ReductionToOneDevice())
    model, optimizer = _linear(strategy)
    seen = []

    def step(x: torch.Tensor) -> None:
        seen.append(model.weight.detach().clone())
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    strategy.run(step, args=(fdist.PerReplica([torch.ones(1, 2), 2 * torch.ones(1, 2)]),))
    assert torch.equal(seen[0], seen[1])  # replica 1 did not see replica 0's update
    assert model.weight.tolist() == [[-2.0, -2.0]]  # gradients 1 + 2, one step of lr 1
    assert model.weight.grad.tolist() == [[3.0, 3.0]]  # the summed gradient, on the primary


def test_gradients_accumulate_across_runs_as_with_shared_parameters() -> None:
    """zero_grad clears once per step, in the first replica; a run without it accumulates."""

    def train_two_runs(strategy: fdist.Strategy) -> list[list[float]]:
        model, optimizer = _linear(strategy)
        inputs = fdist.PerReplica([torch.ones(1, 2), 2 * torch.ones(1, 2), 3 * torch.ones(1, 2)])

        def accumulate(x: torch.Tensor) -> None:
            optimizer.zero_grad()
            model(x).sum().backward()

        def accumulate_and_step(x: torch.Tensor) -> None:
            model(x).sum().backward()
            optimizer.step()

        strategy.run(accumulate, args=(inputs,))
        strategy.run(accumulate_and_step, args=(inputs,))
        return model.weight.tolist()

    shared = train_two_runs(fdist.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"]))
    copies = train_two_runs(_copies(3, fdist.ReductionToOneDevice()))
    assert shared == copies == [[-11.0, -11.0]]  # 1 - 2 * (1 + 2 + 3)


# -- the copies ------------------------------------------------------------------------------
def test_replicas_compute_on_distinct_storage_and_the_module_shows_the_primary() -> None:
    strategy = _copies(3, fdist.ReductionToOneDevice())
    model, optimizer = _linear(strategy)
    primary = model.weight.data_ptr()
    pointers = []

    def step(x: torch.Tensor) -> None:
        pointers.append(model.weight.data_ptr())
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    for _ in range(2):
        strategy.run(step, args=(torch.ones(1, 2),))
        assert model.weight.data_ptr() == primary  # outside run: the primary copy
    assert len(set(pointers[:3])) == 3
    assert pointers[0] == primary
    assert pointers[3:] == pointers[:3]  # the copies are kept from run to run


def test_every_copy_equals_the_primary_after_a_run() -> None:
    strategy = _copies(3, fdist.ReductionToOneDevice())
    model, optimizer = _linear(strategy)
    seen: list[torch.Tensor] = []

    def step(x: torch.Tensor) -> None:
        seen.append(model.weight.detach().clone())
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    inputs = fdist.PerReplica([torch.ones(1, 2), 2 * torch.ones(1, 2), 3 * torch.ones(1, 2)])
    for run in range(3):
        strategy.run(step, args=(inputs,))
        after = model.weight.detach().clone()
        strategy.run(lambda: seen.append(model.weight.detach().clone()))
        assert all(torch.equal(s, after) for s in seen[-3:]), run
    with torch.no_grad():  # a change of the primary between runs reaches every replica
        model.weight.fill_(7.0)
    strategy.run(lambda: seen.append(model.weight.detach().clone()))
    assert [s.tolist() for s in seen[-3:]] == [[[7.0, 7.0]]] * 3


def _adam_mlp(strategy: fdist.Strategy, seen: list) -> tuple[torch.nn.Module, Any, Any]:
    """``_model`` with Adam, and a step that records the parameters each replica starts from."""
    torch.manual_seed(0)
    with strategy.scope():
        model = _model()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="none")

    def step(inputs: tuple[torch.Tensor, torch.Tensor]) -> None:
        seen.append([p.detach().clone() for p in model.parameters()])
        optimizer.zero_grad()
        (loss_fn(model(inputs[0]), inputs[1]).sum() / GLOBAL_BATCH).backward()
        optimizer.step()

    return model, optimizer, step


def test_a_checkpoint_saved_on_copies_restores_into_every_copy(tmp_path: Path) -> None:
    strategy = _copies(2, fdist.ReductionToOneDevice())
    batches = list(strategy.experimental_distribute_dataset(_data(GLOBAL_BATCH * 5)))
    seen: list[list[torch.Tensor]] = []
    model, optimizer, step = _adam_mlp(strategy, seen)
    for inputs in batches[:3]:
        strategy.run(step, args=(inputs,))
    checkpoint = feedline.train.Checkpoint(model=model, optimizer=optimizer)
    path = checkpoint.save(tmp_path / "ckpt")
    saved = [p.detach().clone() for p in model.parameters()]
    for inputs in batches[3:]:
        strategy.run(step, args=(inputs,))
    assert not torch.equal(saved[0], model[0].weight)

    checkpoint.restore(path)
    assert_same(saved, [p.detach() for p in model.parameters()])  # the primary, outside run
    del seen[:]
    for inputs in batches[3:]:
        strategy.run(step, args=(inputs,))
    assert_same(saved, seen[0])  # replica 0 started from the restored values,
    assert_same(saved, seen[1])  # and so did replica 1's copy

    uninterrupted_model, _, uninterrupted_step = _adam_mlp(strategy, [])
    for inputs in batches:
        strategy.run(uninterrupted_step, args=(inputs,))
    assert_same(list(uninterrupted_model.parameters()), list(model.parameters()))


def test_an_error_in_a_replica_leaves_the_next_run_on_the_primary() -> None:
    strategy = _copies(2, fdist.ReductionToOneDevice())
    model, _ = _linear(strategy)
    primary = model.weight.data_ptr()

    def fail_in_replica_1() -> None:
        if fdist.get_replica_context().replica_id_in_sync_group == 1:
            raise ValueError("replica 1 failed")

    with pytest.raises(ValueError, match="replica 1 failed"):
        strategy.run(fail_in_replica_1)
    strategy.run(lambda: None)
    assert model.weight.data_ptr() == primary
    assert model.weight.tolist() == [[1.0, 1.0]]


# -- configuration and errors ----------------------------------------------------------------
def test_copies_only_where_asked_for_or_where_devices_differ() -> None:
    shared = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
    copies = _copies(2, fdist.ReductionToOneDevice())
    assert type(shared._mirroring).__name__ == "Mirroring"
    assert isinstance(copies._mirroring, copy_mirroring.CopyMirroring)


def test_cross_device_ops_must_be_reduction_to_one_device() -> None:
    with pytest.raises(TypeError, match="ReductionToOneDevice"):
        fdist.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops="nccl")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="unknown device"):
        fdist.ReductionToOneDevice(reduce_to_device="tpu:0")


def test_lazy_parameters_must_be_materialized_before_the_first_run() -> None:
    strategy = _copies(2, fdist.ReductionToOneDevice())
    with strategy.scope():
        model = torch.nn.LazyLinear(1)
    with pytest.raises(FailedPreconditionError, match="call the model once"):
        strategy.run(model, args=(torch.ones(1, 2),))


def test_doctests() -> None:
    results = doctest.testmod(copy_mirroring)
    assert results.attempted > 0 and results.failed == 0


# -- CUDA ------------------------------------------------------------------------------------
def _train_on_devices(devices: list[str], rows: int) -> list[torch.Tensor]:
    """``train_on`` with the model on the first device, where the primary copy lives."""
    strategy = fdist.MirroredStrategy(devices)
    torch.manual_seed(0)
    with strategy.scope():
        model = _model().to(strategy.extended.local_devices[0].torch_device)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="none")

    def step(inputs: tuple[torch.Tensor, torch.Tensor]) -> None:
        features, labels = inputs
        optimizer.zero_grad()
        loss = loss_fn(model(features), labels).sum() / GLOBAL_BATCH
        loss.backward()
        optimizer.step()

    for inputs in strategy.experimental_distribute_dataset(_data(rows)):
        strategy.run(step, args=(inputs,))
    return [p.detach().cpu() for p in model.parameters()]


@needs_two_gpus
def test_two_gpus_equal_one_gpu() -> None:
    rows = GLOBAL_BATCH * 10 + 3
    one = _train_on_devices(["cuda:0"], rows)
    two = _train_on_devices(["cuda:0", "cuda:1"], rows)
    for p, q in zip(one, two, strict=True):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)


@needs_cuda
def test_a_gpu_and_a_cpu_replica_equal_one_gpu() -> None:
    rows = GLOBAL_BATCH * 10 + 3
    one = _train_on_devices(["cuda:0"], rows)
    mixed = _train_on_devices(["cuda:0", "cpu:0"], rows)
    for p, q in zip(one, mixed, strict=True):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)


@needs_cuda
def test_a_model_off_the_first_device_is_a_clear_error() -> None:
    strategy = fdist.MirroredStrategy(["cuda:0", "cpu:0"])
    with strategy.scope():
        model = torch.nn.Linear(2, 1)  # on the CPU, but replica 0 computes on cuda:0
    with pytest.raises(FailedPreconditionError, match=r"model\.to\('cuda:0'\)"):
        strategy.run(model, args=(torch.ones(1, 2),))


def test_a_parameter_shared_by_two_modules_is_one_copy_and_one_gradient() -> None:
    def train_tied(strategy: fdist.Strategy) -> list[list[float]]:
        with strategy.scope():
            first, second = torch.nn.Linear(2, 2, bias=False), torch.nn.Linear(2, 2, bias=False)
            second.weight = first.weight
            model = torch.nn.Sequential(first, second)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.nn.init.eye_(first.weight)

        def step(x: torch.Tensor) -> None:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()

        strategy.run(step, args=(fdist.PerReplica([torch.ones(1, 2), 2 * torch.ones(1, 2)]),))
        return first.weight.tolist()

    shared = train_tied(fdist.MirroredStrategy(["cpu:0", "cpu:1"]))
    assert train_tied(_copies(2, fdist.ReductionToOneDevice())) == shared
