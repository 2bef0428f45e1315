"""Tests of feedline/distribute/context.py: replica contexts and their collectives
(``ReplicaContext.all_reduce`` / ``all_gather`` / ``merge_call``) over the local replicas of
one process and across real worker processes."""

from __future__ import annotations

import doctest
from typing import Any

import pytest
import torch

import feedline.distribute as fdist
from feedline.distribute import context as context_module
from feedline.errors import FailedPreconditionError
from tests.launcher import run, torchrun_envs


def _context() -> fdist.ReplicaContext:
    context = fdist.get_replica_context()
    assert context is not None
    return context


def test_collectives_with_one_replica_reduce_over_that_replica() -> None:
    strategy = fdist.OneDeviceStrategy("cpu")

    def step() -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        context = _context()
        value = torch.tensor([1.0, 3.0])
        gathered = context.all_gather({"x": torch.tensor([[5, 6]])}, axis=0)
        return context.all_reduce("SUM", value), context.all_reduce("MEAN", value), gathered

    total, mean, gathered = strategy.run(step)
    assert total.tolist() == [1.0, 3.0] and mean.tolist() == [1.0, 3.0]
    assert gathered["x"].tolist() == [[5, 6]]


@pytest.mark.parametrize("replicas", [2, 3])
def test_all_reduce_gives_every_replica_the_sum_and_mean(replicas: int) -> None:
    strategy = fdist.MirroredStrategy([f"cpu:{i}" for i in range(replicas)])
    # replica r holds [r + 1, 10 * (r + 1)]
    values = fdist.PerReplica([torch.tensor([r + 1.0, 10.0 * (r + 1)]) for r in range(replicas)])

    def step(x: torch.Tensor) -> tuple[Any, ...]:
        context = _context()
        total = context.all_reduce(fdist.ReduceOp.SUM, x)
        mean = context.all_reduce("mean", x)
        count = context.all_reduce("SUM", torch.tensor(1))
        return (
            total.tolist(),
            mean.tolist(),
            int(count),
            context.replica_id_in_sync_group,
            context.num_replicas_in_sync,
        )

    results = strategy.experimental_local_results(strategy.run(step, args=(values,)))
    n = replicas
    expected_sum = [n * (n + 1) / 2, 10 * n * (n + 1) / 2]
    for replica, (total, mean, count, replica_id, in_sync) in enumerate(results):
        assert total == expected_sum
        assert mean == pytest.approx([s / n for s in expected_sum])
        assert (count, replica_id, in_sync) == (n, replica, n)


def test_all_reduce_of_nested_structures_as_tensorflow_documents_it() -> None:
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
    values = [{"a": 1, "b": [40, 1]}, {"a": 3, "b": [2, 98]}]

    def step() -> tuple[Any, Any]:
        context = _context()
        mine = values[context.replica_id_in_sync_group]
        total = context.all_reduce("SUM", mine)
        mean = context.all_reduce("MEAN", mine)
        return (
            {"a": total["a"].item(), "b": [b.item() for b in total["b"]]},
            {"a": mean["a"].item(), "b": [b.item() for b in mean["b"]]},
        )

    for total, mean in strategy.experimental_local_results(strategy.run(step)):
        assert total == {"a": 4, "b": [42, 99]}
        assert mean == {"a": 2.0, "b": [21.0, 49.5]}


def test_each_replica_gets_its_own_copy_of_the_result() -> None:
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])

    def step() -> float:
        context = _context()
        total = context.all_reduce("SUM", torch.tensor(1.0))
        total.add_(context.replica_id_in_sync_group * 100)  # replica 1's change stays its own
        context.all_reduce("SUM", torch.tensor(0.0))  # a hand-over after replica 1's change
        return total.item()

    assert strategy.experimental_local_results(strategy.run(step)) == (2.0, 102.0)


def test_all_gather_concatenates_in_replica_order() -> None:
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"])
    rows = fdist.PerReplica([torch.tensor([[r, r]]) for r in range(3)])

    def step(x: torch.Tensor) -> tuple[list, list]:
        context = _context()
        gathered = context.all_gather({"rows": x, "cols": x.T}, axis=0)
        along_1 = context.all_gather(x, axis=1)
        return gathered["rows"].tolist(), along_1.tolist()

    for rows_0, along_1 in strategy.experimental_local_results(strategy.run(step, args=(rows,))):
        assert rows_0 == [[0, 0], [1, 1], [2, 2]]
        assert along_1 == [[0, 0, 1, 1, 2, 2]]


def test_merge_call_runs_once_in_the_cross_replica_context() -> None:
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
    calls = []

    def merge(strategy_: fdist.Strategy, value: Any, shared: str) -> Any:
        calls.append((fdist.in_cross_replica_context(), shared, type(value).__name__))
        total = strategy_.reduce("SUM", value)
        # a PerReplica result gives each replica its own component
        return fdist.PerReplica([total + 1, total + 2])

    def step() -> float:
        context = _context()
        mine = torch.tensor(float(context.replica_id_in_sync_group + 1))
        return context.merge_call(merge, args=(mine,), kwargs={"shared": "same"}).item()

    assert strategy.experimental_local_results(strategy.run(step)) == (4.0, 5.0)
    assert calls == [(True, "same", "PerReplica")]


def test_merge_call_without_a_strategy_calls_the_function_with_the_default_strategy() -> None:
    context = fdist.get_replica_context()  # the default strategy's replica context
    assert context is not None

    def merge(strategy: fdist.Strategy, value: int) -> tuple[str, bool, int]:
        return type(strategy).__name__, fdist.in_cross_replica_context(), value + 1

    assert context.merge_call(merge, args=(1,)) == ("_DefaultStrategy", True, 2)
    assert not fdist.in_cross_replica_context()


def test_collectives_outside_run_with_several_replicas_are_an_error() -> None:
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
    outside = fdist.ReplicaContext(strategy, 0)
    with pytest.raises(FailedPreconditionError, match=r"2 replicas.*inside the function"):
        outside.all_reduce("SUM", torch.tensor(1.0))


def test_doctests() -> None:
    failures, _ = doctest.testmod(context_module)
    assert failures == 0


_WORKER_CODE = """
import torch
import feedline.distribute as fdist
from tests.launcher import report

devices = {devices!r}
strategy = fdist.MultiWorkerMirroredStrategy(devices=devices)
rank = strategy.extended.worker_index

def step(x):
    context = fdist.get_replica_context()
    total = context.all_reduce("SUM", {{"v": x, "n": torch.tensor(1)}})
    mean = context.all_reduce(fdist.ReduceOp.MEAN, x)
    gathered = context.all_gather(x[None], axis=0)
    return total["v"].tolist(), int(total["n"]), mean.tolist(), gathered.tolist(), \\
        context.replica_id_in_sync_group

# replica r (over all workers) holds [r + 1, 2 * (r + 1)]
local = len(devices)
values = [torch.tensor([1.0, 2.0]) * (rank * local + i + 1) for i in range(local)]
with strategy.scope():
    result = strategy.run(step, args=(fdist.PerReplica(values) if local > 1 else values[0],))
report([list(r) for r in strategy.experimental_local_results(result)] if local > 1
       else [list(result)])
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("devices", [["cpu"], ["cpu:0", "cpu:1"]], ids=["one", "two-local"])
def test_all_reduce_and_all_gather_inside_run_across_two_workers(devices: list[str]) -> None:
    results = run(_WORKER_CODE.format(devices=devices), torchrun_envs(2))
    replicas = 2 * len(devices)
    scale = list(range(1, replicas + 1))
    for rank in (0, 1):
        rows = results[f"rank:{rank}"].result
        assert len(rows) == len(devices)
        for local, (total, count, mean, gathered, replica) in enumerate(rows):
            assert total == [sum(scale), 2.0 * sum(scale)] and count == replicas
            assert mean == pytest.approx([sum(scale) / replicas, 2 * sum(scale) / replicas])
            assert gathered == [[s, 2.0 * s] for s in scale]
            assert replica == rank * len(devices) + local
