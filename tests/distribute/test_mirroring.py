"""Tests of feedline/distribute/mirroring.py: N replicas train as one on the global batch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import feedline.data as fd
import feedline.distribute as fdist
import feedline.nn as fnn
from feedline.errors import FailedPreconditionError

GLOBAL_BATCH = 64


def _data(rows: int) -> fd.Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 10)).astype(np.float32)
    y = rng.integers(0, 3, rows)
    return fd.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def train(replicas: int, rows: int, steps: int | None = None) -> list[torch.Tensor]:
    strategy = fdist.MirroredStrategy([f"cpu:{i}" for i in range(replicas)])
    return train_on(strategy, rows, steps)


def train_on(
    strategy: fdist.Strategy,
    rows: int,
    steps: int | None = None,
    own_all_reduce: bool = False,
    reduce_loss: bool = False,
    sgd: bool = False,
) -> list[torch.Tensor]:
    """The parameters after training ``_model`` with Adam on ``rows`` rows under ``strategy``
    (also run by the multi-worker tests in every worker process); ``own_all_reduce`` sums the
    gradients in the step with ``ReplicaContext.all_reduce`` before the optimizer steps,
    ``reduce_loss`` all-reduces the loss after backward (the gradients stay the built-in
    path's); ``sgd`` trains with SGD instead, whose steps scale with the gradient (Adam's
    hardly change when every gradient is doubled)."""
    torch.manual_seed(0)
    with strategy.scope():
        model = _model()
        optimizer: torch.optim.Optimizer = (
            torch.optim.SGD(model.parameters(), lr=0.5)
            if sgd
            else torch.optim.Adam(model.parameters(), lr=0.01)
        )
    loss_fn = torch.nn.CrossEntropyLoss(reduction="none")

    def step(inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        features, labels = inputs
        optimizer.zero_grad()
        per_example = loss_fn(model(features), labels)
        loss = fnn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
        loss.backward()
        context = fdist.get_replica_context()
        assert context is not None
        if reduce_loss:
            context.all_reduce("SUM", loss.detach())
        if own_all_reduce:
            params = list(model.parameters())
            for param, total in zip(
                params, context.all_reduce("SUM", [p.grad for p in params]), strict=True
            ):
                param.grad = total
        optimizer.step()
        return loss

    dist = strategy.experimental_distribute_dataset(_data(rows))
    for i, inputs in enumerate(dist):
        if steps is not None and i == steps:
            break
        strategy.run(step, args=(inputs,))
    return [p.detach().clone() for p in model.parameters()]


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)


def test_two_replicas_equal_one_after_20_adam_steps() -> None:
    one = train(1, rows=GLOBAL_BATCH * 20)
    two = train(2, rows=GLOBAL_BATCH * 20)
    assert_same(one, two)
    assert not torch.equal(one[0], train(1, rows=GLOBAL_BATCH * 20, steps=19)[0])  # it moved


def test_three_replicas_with_partial_and_empty_batches_equal_one() -> None:
    # 2 full batches, then one row: replicas 1 and 2 get empty batches in the last step.
    rows = GLOBAL_BATCH * 2 + 1
    assert_same(train(1, rows=rows), train(3, rows=rows))
    rows = GLOBAL_BATCH * 2 + 7
    assert_same(train(1, rows=rows), train(3, rows=rows))


def test_replicas_see_identical_parameters_and_one_update_per_step() -> None:
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = torch.nn.Linear(2, 1, bias=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    torch.nn.init.ones_(model.weight)
    seen = []

    def step(x: torch.Tensor) -> None:
        seen.append(model.weight.detach().clone())
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    strategy.run(step, args=(fdist.PerReplica([torch.ones(1, 2), 2 * torch.ones(1, 2)]),))
    assert torch.equal(seen[0], seen[1])  # replica 1 did not see replica 0's update
    # gradients summed over replicas (1 + 2 per weight), one step of lr 1
    assert model.weight.tolist() == [[-2.0, -2.0]]


def test_buffers_start_equal_and_end_as_the_replicas_mean() -> None:
    check_buffers_mean(fdist.MirroredStrategy(["cpu:0", "cpu:1"]))


def check_buffers_mean(strategy: fdist.Strategy) -> tuple[Any, ...]:
    """One run of a BatchNorm over 2 replicas: both start from the same buffers and end with
    their mean; returns ``(norm, step, batches, starts)`` for further runs."""
    with strategy.scope():
        norm = torch.nn.BatchNorm1d(1, momentum=1.0)  # running_mean := the batch mean
    batches = fdist.PerReplica([torch.full((4, 1), 2.0), torch.full((4, 1), 6.0)])
    starts = []

    def step(x: torch.Tensor) -> None:
        starts.append(norm.running_mean.clone())
        norm(x)

    strategy.run(step, args=(batches,))
    assert torch.equal(starts[0], starts[1])
    assert norm.running_mean.item() == pytest.approx(4.0)
    assert norm.num_batches_tracked.item() == 1
    return norm, step, batches, starts


def test_model_made_outside_the_scope_is_a_clear_error() -> None:
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
    outside = torch.nn.Linear(2, 1)
    with pytest.raises(FailedPreconditionError, match=r"strategy\.scope\(\)"):
        strategy.run(outside, args=(torch.ones(1, 2),))
    strategy.mirror(outside)  # the explicit way for objects made elsewhere
    assert len(strategy.run(outside, args=(torch.ones(1, 2),)).values) == 2
    loss_fn = torch.nn.MSELoss()  # no parameters: nothing to mirror, always allowed
    strategy.run(loss_fn, args=(torch.ones(1), torch.zeros(1)))


def test_stepping_a_mirrored_optimizer_outside_run_is_a_clear_error() -> None:
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.Adam(model.parameters())
    with pytest.raises(
        FailedPreconditionError, match=r"inside the function you pass to strategy\.run"
    ):
        optimizer.step()


def test_one_replica_strategies_do_not_mirror() -> None:
    strategy = fdist.MirroredStrategy(["cpu:0"])
    with strategy.scope():
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()  # an ordinary optimizer


def test_an_error_in_a_replica_drops_the_steps_of_that_run() -> None:
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = torch.nn.Linear(2, 1, bias=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    torch.nn.init.ones_(model.weight)

    def step(fail: bool) -> None:
        optimizer.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        if fail and fdist.get_replica_context().replica_id_in_sync_group == 1:
            raise ValueError("replica 1 failed")

    with pytest.raises(ValueError, match="replica 1 failed"):
        strategy.run(step, args=(True,))
    assert torch.equal(model.weight, torch.ones(1, 2))  # the failed run took no step
    strategy.run(step, args=(False,))
    # One step of the summed gradient (2 replicas x ones), not two: the failed run left nothing.
    assert torch.equal(model.weight, torch.full((1, 2), -1.0))


# -- replicas handing over at collectives: each computes on its own state ------------------
SHARED_AND_COPIES = [
    pytest.param(None, id="shared"),
    pytest.param(fdist.ReductionToOneDevice(), id="copies"),
]


@pytest.mark.parametrize("ops", SHARED_AND_COPIES)
@pytest.mark.parametrize("replicas", [2, 3])
def test_own_gradient_all_reduce_trains_as_the_built_in_path_and_one_replica(
    replicas: int, ops: fdist.ReductionToOneDevice | None
) -> None:
    # 4 full batches, then 7 rows: with 3 replicas, replica 2 gets an empty batch at the end.
    rows = GLOBAL_BATCH * 4 + 7
    devices = [f"cpu:{i}" for i in range(replicas)]
    one = train_on(fdist.MirroredStrategy(["cpu:0"]), rows=rows, sgd=True)
    built_in = train_on(fdist.MirroredStrategy(devices, cross_device_ops=ops), rows, sgd=True)
    own = train_on(
        fdist.MirroredStrategy(devices, cross_device_ops=ops),
        rows=rows,
        own_all_reduce=True,
        sgd=True,
    )
    assert_same(one, built_in)
    assert_same(one, own)
    assert not torch.equal(one[0], train_on(fdist.MirroredStrategy(["cpu:0"]), rows)[0])


@pytest.mark.parametrize("ops", SHARED_AND_COPIES)
def test_at_a_collective_each_replica_sees_its_own_gradients_and_parameters(
    ops: fdist.ReductionToOneDevice | None,
) -> None:
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=ops)
    with strategy.scope():
        model = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.ones_(model.weight)
    seen: dict[str, list[list[float]]] = {"grad": [], "total": [], "start": [], "end": []}

    def step(x: torch.Tensor) -> None:
        context = fdist.get_replica_context()
        assert context is not None
        seen["start"].append(model.weight.flatten().tolist())
        model(x).sum().backward()
        assert model.weight.grad is not None
        seen["grad"].append(model.weight.grad.flatten().tolist())
        total = context.all_reduce("SUM", model.weight.grad)
        seen["total"].append(total.flatten().tolist())
        with torch.no_grad():
            model.weight.sub_(total)  # an update by hand, in every replica, on its own copy
        context.all_reduce("SUM", torch.tensor(0.0))  # replica 1 runs after 0 updated
        seen["end"].append(model.weight.flatten().tolist())
        model.weight.grad = None

    batches = fdist.PerReplica([torch.ones(1, 2), 2 * torch.ones(1, 2)])
    strategy.run(step, args=(batches,))
    assert seen["start"] == [[1.0, 1.0], [1.0, 1.0]]
    assert seen["grad"] == [[1.0, 1.0], [2.0, 2.0]]  # its own, not the running total
    assert seen["total"] == [[3.0, 3.0], [3.0, 3.0]]
    assert seen["end"] == [[-2.0, -2.0], [-2.0, -2.0]]  # one update each, not two
    assert model.weight.tolist() == [[-2.0, -2.0]]
    seen = {key: [] for key in seen}
    strategy.run(step, args=(batches,))
    assert seen["start"] == [[-2.0, -2.0], [-2.0, -2.0]]
    assert model.weight.tolist() == [[-5.0, -5.0]]


@pytest.mark.parametrize("ops", SHARED_AND_COPIES)
def test_at_a_collective_each_replica_keeps_its_own_buffers(
    ops: fdist.ReductionToOneDevice | None,
) -> None:
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=ops)
    with strategy.scope():
        norm = torch.nn.BatchNorm1d(1, momentum=1.0)  # running_mean := the batch mean
    starts, afters = [], []

    def step(x: torch.Tensor) -> None:
        context = fdist.get_replica_context()
        assert context is not None
        starts.append(norm.running_mean.item())
        norm(x)
        context.all_reduce("SUM", torch.tensor(0.0))
        afters.append(norm.running_mean.item())

    strategy.run(step, args=(fdist.PerReplica([torch.full((4, 1), 2.0), torch.full((4, 1), 6.0)]),))
    assert starts == [0.0, 0.0]  # replica 1 starts from the step's buffers, not replica 0's
    assert afters == [2.0, 6.0]
    assert norm.running_mean.item() == pytest.approx(4.0)
    assert norm.num_batches_tracked.item() == 1


@pytest.mark.parametrize("ops", SHARED_AND_COPIES)
def test_an_error_after_a_collective_drops_the_steps_of_that_run(
    ops: fdist.ReductionToOneDevice | None,
) -> None:
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=ops)
    with strategy.scope():
        model = torch.nn.Linear(2, 1, bias=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    torch.nn.init.ones_(model.weight)
    storage = model.weight.data_ptr()

    def step(fail: bool) -> None:
        context = fdist.get_replica_context()
        assert context is not None
        optimizer.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        model.weight.grad = context.all_reduce("SUM", model.weight.grad)
        optimizer.step()
        if fail and context.replica_id_in_sync_group == 1:
            raise ValueError("replica 1 failed")

    with pytest.raises(ValueError, match="replica 1 failed"):
        strategy.run(step, args=(True,))
    assert model.weight.data_ptr() == storage  # the module shows the first replica's tensors
    assert model.weight.tolist() == [[1.0, 1.0]]  # and the failed run took no step
    strategy.run(step, args=(False,))
    # one step of the all-reduced gradient (2 replicas x ones), used as it is
    assert model.weight.tolist() == [[-1.0, -1.0]]
