"""Tests of feedline/distribute/values.py."""

from __future__ import annotations

import pytest
import torch

from feedline.data import TensorSpec
from feedline.distribute import MirroredStrategy, PerReplica, PerReplicaSpec, ReduceOp
from feedline.distribute.values import regroup, select_replica
from feedline.errors import InvalidArgumentError


def test_per_replica_repr() -> None:
    value = PerReplica([torch.tensor([0, 1]), torch.tensor([2, 3])])
    assert repr(value) == "PerReplica:{\n  0: tensor([0, 1]),\n  1: tensor([2, 3])\n}"
    assert len(value.values) == 2


def test_select_and_regroup() -> None:
    args = (PerReplica([1, 2]), "shared", {"k": PerReplica(["a", "b"])})
    assert select_replica(args, 1) == (2, "shared", {"k": "b"})
    grouped = regroup([(1, {"x": 10}), (2, {"x": 20})])
    assert grouped[0].values == (1, 2) and grouped[1]["x"].values == (10, 20)
    assert regroup([5]) == 5


def test_select_replica_of_sequences_is_optree_s_map() -> None:
    # Tuples and lists of per-replica values and leaves take a path without optree; every
    # structure gives what optree's map gives, its types kept.
    import collections

    import optree

    def by_optree(value: object, replica: int) -> object:
        return optree.tree_map(
            lambda v: v.values[replica] if isinstance(v, PerReplica) else v,
            value,
            is_leaf=lambda v: isinstance(v, PerReplica),
            none_is_leaf=True,
        )

    pair = collections.namedtuple("pair", "a b")
    t = torch.tensor([1.0])
    values = [
        (PerReplica([t, t + 1]), PerReplica([0, 1])),
        ((PerReplica([t, t + 1]), [PerReplica(["a", "b"]), None, []]), 3.5, "s"),
        [PerReplica([1, 2]), (t,), ()],
        (pair(PerReplica([1, 2]), 3), {"k": PerReplica([4, 5])}),  # optree's part
        [[PerReplica([None, (1, 2)])]],
        (),
    ]
    for value in values:
        for replica in (0, 1):
            got, expected = select_replica(value, replica), by_optree(value, replica)
            assert got == expected and type(got) is type(expected)
            assert optree.tree_structure(got, none_is_leaf=True) == optree.tree_structure(
                expected, none_is_leaf=True
            )
    assert select_replica(PerReplica([1, 2]), 1) == 2
    assert select_replica((), 0) == ()


def test_reduce_op_parsing() -> None:
    assert ReduceOp.parse("sum") is ReduceOp.SUM and ReduceOp.parse("MEAN") is ReduceOp.MEAN
    assert ReduceOp.parse("SUM") is ReduceOp.SUM and ReduceOp.parse(ReduceOp.MEAN) is ReduceOp.MEAN
    for wrong in ("max", "ReduceOp.SUM", 0, None):
        with pytest.raises(InvalidArgumentError, match="reduce_op") as caught:
            ReduceOp.parse(wrong)
        assert "ReduceOp.SUM, ReduceOp.MEAN" in str(caught.value)
    assert issubclass(InvalidArgumentError, ValueError)  # ``except ValueError`` still catches it


def test_strategy_reduce_takes_the_strings_tensorflow_takes() -> None:
    strategy = MirroredStrategy(["cpu:0", "cpu:1"])
    losses = PerReplica([torch.tensor(1.0), torch.tensor(2.5)])
    assert strategy.reduce("SUM", losses, axis=None).item() == 3.5
    assert strategy.reduce("MEAN", losses, axis=None).item() == 1.75


def test_per_replica_spec() -> None:
    spec = PerReplicaSpec(TensorSpec((None, 1), "float32"), TensorSpec((None, 1), "float32"))
    assert repr(spec).startswith("PerReplicaSpec(TensorSpec(shape=(None, 1), dtype=float32)")
    assert spec == PerReplicaSpec(*spec.specs)
