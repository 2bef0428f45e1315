"""Tests of feedline/distribute/strategy.py, mirrored.py and one_device.py: replicas, run,
reduce, gather, scopes and contexts."""

from __future__ import annotations

import doctest

import pytest
import torch

import feedline.distribute as fdist
from feedline.distribute import MirroredStrategy, OneDeviceStrategy, PerReplica, ReduceOp
from feedline.distribute import strategy as strategy_module
from feedline.errors import InvalidArgumentError


@pytest.fixture
def two() -> MirroredStrategy:
    return MirroredStrategy(["cpu:0", "cpu:1"])


def test_doctests() -> None:
    assert doctest.testmod(strategy_module).failed == 0


def test_replicas_and_devices(two: MirroredStrategy) -> None:
    assert two.num_replicas_in_sync == 2
    assert two.extended.worker_devices == ("cpu:0", "cpu:1")
    assert MirroredStrategy().num_replicas_in_sync >= 1
    assert OneDeviceStrategy("/cpu:0").num_replicas_in_sync == 1


def test_run_unwraps_per_replica_and_regroups(two: MirroredStrategy) -> None:
    seen = []

    def step(x: torch.Tensor, scale: int) -> tuple[torch.Tensor, int]:
        context = fdist.get_replica_context()
        seen.append((context.replica_id_in_sync_group, context.num_replicas_in_sync))
        return x * scale, context.replica_id_in_sync_group

    out = two.run(step, args=(PerReplica([torch.tensor([1]), torch.tensor([2])]), 10))
    assert seen == [(0, 2), (1, 2)]
    assert [t.tolist() for t in out[0].values] == [[10], [20]]
    assert out[1].values == (0, 1)


def test_run_with_one_replica_returns_plain_values() -> None:
    assert OneDeviceStrategy("cpu").run(lambda: 3) == 3


def test_seed_reduce_numbers(two: MirroredStrategy) -> None:
    # replica losses [2, 3] and [4, 5] averaged over the global batch of 4: 1.25 and 2.25
    losses = PerReplica([torch.tensor(1.25), torch.tensor(2.25)])
    assert two.reduce(ReduceOp.SUM, losses, axis=None).item() == 3.5
    assert two.reduce("mean", losses, axis=None).item() == 1.75


def test_reduce_along_an_axis_counts_empty_batches_as_nothing(two: MirroredStrategy) -> None:
    value = PerReplica([torch.tensor([1.0, 2.0, 3.0]), torch.tensor([], dtype=torch.float32)])
    assert two.reduce(ReduceOp.SUM, value, axis=0).item() == 6.0
    assert two.reduce(ReduceOp.MEAN, value, axis=0).item() == 2.0


def test_gather_and_local_results(two: MirroredStrategy) -> None:
    value = PerReplica([torch.tensor([[1, 2]]), torch.tensor([[3, 4], [5, 6]])])
    assert two.gather(value, axis=0).tolist() == [[1, 2], [3, 4], [5, 6]]
    assert len(two.experimental_local_results(value)) == 2
    assert two.experimental_local_results(7) == (7,)


def test_local_results_of_a_nested_result_give_one_structure_per_replica(
    two: MirroredStrategy,
) -> None:
    # TF: experimental_local_results maps over a nested result of run (a list, tuple or dict
    # of PerReplica), giving a tuple with the whole structure once per replica.
    def step() -> list[int]:
        replica = fdist.get_replica_context().replica_id_in_sync_group
        return [replica, replica * 10]

    assert two.experimental_local_results(two.run(step)) == ([0, 0], [1, 10])

    def named() -> dict[str, int]:
        return {"id": fdist.get_replica_context().replica_id_in_sync_group, "fixed": 5}

    assert two.experimental_local_results(two.run(named)) == (
        {"id": 0, "fixed": 5},
        {"id": 1, "fixed": 5},
    )
    assert two.experimental_local_results((1, 2)) == ((1, 2), (1, 2))
    one = OneDeviceStrategy("/cpu:0")
    assert one.experimental_local_results(one.run(lambda: [3, 4])) == ([3, 4],)


def test_distribute_values_from_function(two: MirroredStrategy) -> None:
    def value_fn(context: fdist.ValueContext) -> int:
        return context.replica_id_in_sync_group * 10 + context.num_replicas_in_sync

    assert two.experimental_distribute_values_from_function(value_fn).values == (2, 12)


def test_scopes_and_contexts(two: MirroredStrategy) -> None:
    assert not fdist.in_cross_replica_context()
    assert fdist.get_replica_context().num_replicas_in_sync == 1  # the default strategy
    with two.scope():
        assert fdist.get_strategy() is two
        assert fdist.in_cross_replica_context()
        assert fdist.get_replica_context() is None
        assert two.run(lambda: fdist.in_cross_replica_context()) is False  # one object
    assert fdist.get_strategy() is not two
    other = MirroredStrategy(["cpu:0"])
    with (
        two.scope(),
        pytest.raises(InvalidArgumentError, match="inside the scope of another"),
        other.scope(),
    ):
        pass


def test_mismatched_per_replica_is_an_error(two: MirroredStrategy) -> None:
    with pytest.raises(InvalidArgumentError, match="3 components"):
        two.reduce("sum", PerReplica([1, 2, 3]), axis=None)


def test_run_returns_a_result_that_is_one_object_on_every_replica_as_it_is(
    two: MirroredStrategy,
) -> None:
    # TensorFlow's run: "one common object if the returned values are the same object".
    captured = torch.ones(2)
    assert two.run(lambda: 4) == 4
    assert two.run(lambda: captured) is captured
    assert two.run(lambda: None) is None
    mixed = two.run(lambda: (captured, fdist.get_replica_context().replica_id_in_sync_group))
    assert mixed[0] is captured and mixed[1].values == (0, 1)
    assert two.experimental_local_results(two.run(lambda: captured)) == (captured,)


@pytest.mark.parametrize("args", [torch.ones(1, 3), "ab", {"x": 1}])
def test_run_refuses_args_that_are_not_a_tuple_or_list(two: MirroredStrategy, args: object) -> None:
    # run(fn, args=(x)) without the comma would unpack x over the arguments.
    with pytest.raises(ValueError, match="positional args must be a list or tuple"):
        two.run(lambda *a: a, args=args)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kwargs must be a dict"):
        two.run(lambda **k: k, kwargs=[("x", 1)])  # type: ignore[arg-type]
    assert two.run(lambda x: x, args=[1], options=fdist.RunOptions()) == 1
    with pytest.raises(TypeError, match="options must be a RunOptions"):
        two.run(lambda: 1, options={"x": 1})  # type: ignore[arg-type]


def test_reduce_and_all_reduce_refuse_values_of_different_shapes(two: MirroredStrategy) -> None:
    # The partial batch of range(5).batch(4) over two replicas: [4] and []. Adding would
    # broadcast [4] + [] to [] and lose the 4; TensorFlow refuses, and axis=0 reduces it.
    from feedline.data import Dataset

    batches = iter(two.experimental_distribute_dataset(Dataset.range(5).batch(4)))
    next(batches)
    last = next(batches)
    with pytest.raises(InvalidArgumentError, match=r"different shapes \(\(1,\), \(0,\)\)"):
        two.reduce("SUM", last, axis=None)
    assert two.reduce("SUM", last, axis=0).item() == 4
    with pytest.raises(InvalidArgumentError, match="different shapes"):
        two.reduce("SUM", PerReplica([torch.ones(2), torch.ones(1)]), axis=None)

    def step() -> torch.Tensor:
        replica = fdist.get_replica_context()
        value = torch.ones(2 if replica.replica_id_in_sync_group == 0 else 1)
        return replica.all_reduce("SUM", value)

    with pytest.raises(InvalidArgumentError, match="all_reduce: the replicas' values have"):
        two.run(step)


def test_reduce_along_several_axes(two: MirroredStrategy) -> None:
    value = PerReplica([torch.ones(2, 3), torch.full((2, 3), 2.0)])
    assert two.reduce("SUM", value, axis=(0, 1)).item() == 18.0
    assert two.reduce("MEAN", value, axis=[0, 1]).item() == 1.5
    assert two.reduce("MEAN", value, axis=1).tolist() == [1.5, 1.5]


def test_reduce_and_gather_only_in_the_cross_replica_context(two: MirroredStrategy) -> None:
    one = torch.tensor(1.0)
    with pytest.raises(RuntimeError, match="reduce can only be called in the cross-replica"):
        two.run(lambda: two.reduce("SUM", one, axis=None))
    with pytest.raises(RuntimeError, match=r"get_replica_context\(\)\.all_gather"):
        two.run(lambda: two.gather(one.reshape(1), axis=0))
    # merge_call's function runs in the cross-replica context, where reduce is allowed.
    merged = two.run(
        lambda: fdist.get_replica_context().merge_call(
            lambda strategy, v: strategy.reduce("SUM", v, axis=None), args=(one,)
        )
    )
    assert float(merged) == 2.0  # the one result every replica got
    other = MirroredStrategy(["cpu:0", "cpu:1"])
    with two.scope(), pytest.raises(RuntimeError, match="Mixing different"):
        other.run(lambda: 1)
    with two.scope(), pytest.raises(RuntimeError, match="Mixing different"):
        other.reduce("SUM", one, axis=None)


def test_extended_reduce_to_places_the_reduced_value_on_its_destinations(
    two: MirroredStrategy,
) -> None:
    values = two.run(
        lambda: torch.tensor(float(fdist.get_replica_context().replica_id_in_sync_group + 1))
    )
    mirrored = two.extended.reduce_to(ReduceOp.SUM, values, destinations=values)
    assert isinstance(mirrored, PerReplica) and [float(v) for v in mirrored.values] == [3.0, 3.0]
    assert float(two.extended.reduce_to("MEAN", values, "cpu:1")) == 1.5
    assert float(two.extended.reduce_to("SUM", values, torch.zeros(()))) == 3.0
    pairs = [(values, "cpu:0"), (PerReplica([torch.ones(2), torch.ones(2)]), values)]
    first, second = two.extended.batch_reduce_to("SUM", pairs)
    assert float(first) == 3.0 and [v.tolist() for v in second.values] == [[2.0, 2.0]] * 2
    # In a merge_call's function (the cross-replica context), each replica gets its component.
    got = two.run(
        lambda: fdist.get_replica_context().merge_call(
            lambda strategy, v: strategy.extended.reduce_to("SUM", v, v),
            args=(torch.tensor(float(fdist.get_replica_context().replica_id_in_sync_group)),),
        )
    )
    assert float(got) == 1.0  # the same on both replicas: run returns it once
    with pytest.raises(RuntimeError, match="cross-replica context"):
        two.run(lambda: two.extended.reduce_to("SUM", torch.tensor(1.0), "cpu:0"))
    with pytest.raises(InvalidArgumentError, match="destinations must be"):
        two.extended.reduce_to("SUM", values, destinations=3)
    assert two.extended.parameter_devices == ("cpu:0", "cpu:1")


def test_experimental_set_strategy(two: MirroredStrategy) -> None:
    try:
        fdist.experimental_set_strategy(two)
        assert fdist.get_strategy() is two and fdist.in_cross_replica_context()
        other = MirroredStrategy(["cpu:0"])
        fdist.experimental_set_strategy(other)  # replaces the first
        assert fdist.get_strategy() is other
    finally:
        fdist.experimental_set_strategy(None)
    assert not fdist.has_strategy()
    with two.scope(), pytest.raises(RuntimeError, match="inside a strategy's scope"):
        fdist.experimental_set_strategy(two)


def test_collectives_accept_communication_options(two: MirroredStrategy) -> None:
    options = fdist.experimental.CommunicationOptions()

    def step() -> list[torch.Tensor]:
        replica = fdist.get_replica_context()
        mine = torch.tensor([float(replica.replica_id_in_sync_group)])
        return [
            replica.all_reduce("SUM", mine, options=options),
            replica.all_gather(mine, axis=0, options=options),
        ]

    for total, gathered in two.experimental_local_results(two.run(step)):
        assert total.tolist() == [1.0] and gathered.tolist() == [0.0, 1.0]
