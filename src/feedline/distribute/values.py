"""Values that differ per replica: ``DistributedValues``, ``PerReplica`` and their spec."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import optree

from feedline._enums import parse_member
from feedline.structure import TensorSpec


class ReduceOp(enum.Enum):
    """How ``strategy.reduce`` combines replicas' values."""

    SUM = "SUM"
    MEAN = "MEAN"

    @classmethod
    def parse(cls, op: ReduceOp | str) -> ReduceOp:
        """A member from a member or its name, as TensorFlow accepts (``"SUM"``, ``"MEAN"``;
        any case).

        Raises:
          InvalidArgumentError: (a ``ValueError``) for anything else.
        """
        return parse_member(cls, op, "reduce_op")


class DistributedValues:
    """A value with one component per local replica; ``values`` in replica order."""

    def __init__(self, values: Sequence[Any]) -> None:
        self._values = tuple(values)

    @property
    def values(self) -> tuple[Any, ...]:
        return self._values

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        lines = ",\n".join(f"  {i}: {value!r}" for i, value in enumerate(self._values))
        return f"{type(self).__name__}:{{\n{lines}\n}}"


class PerReplica(DistributedValues):
    """One value per replica, e.g. each replica's share of a global batch.

    Example:
      >>> import torch
      >>> PerReplica([torch.tensor([0, 1]), torch.tensor([2, 3])])
      PerReplica:{
        0: tensor([0, 1]),
        1: tensor([2, 3])
      }
    """


class PerReplicaSpec:
    """The spec of a ``PerReplica``: one ``TensorSpec`` per replica."""

    def __init__(self, *specs: TensorSpec) -> None:
        self._specs = specs

    @property
    def specs(self) -> tuple[TensorSpec, ...]:
        return self._specs

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PerReplicaSpec) and other._specs == self._specs

    def __hash__(self) -> int:
        return hash(self._specs)

    def __repr__(self) -> str:
        return f"PerReplicaSpec({', '.join(map(repr, self._specs))})"


def is_leaf(value: Any) -> bool:
    return isinstance(value, DistributedValues)


def is_nested(value: Any) -> bool:
    """Whether ``value`` is a structure (tuple, list, dict, namedtuple) rather than one leaf."""
    return not optree.tree_is_leaf(value, is_leaf=is_leaf, none_is_leaf=True)


def select_replica(value: Any, replica: int) -> Any:
    """``value`` with every ``DistributedValues`` replaced by replica ``replica``'s component."""
    if isinstance(value, DistributedValues):
        return value.values[replica]
    if type(value) is tuple or type(value) is list:  # a step's arguments: no tree_map
        selected = _select_in_sequence(value, replica)
        if selected is not None:
            return selected
    return optree.tree_map(
        lambda v: v.values[replica] if isinstance(v, DistributedValues) else v,
        value,
        is_leaf=is_leaf,
        none_is_leaf=True,
    )


def _select_in_sequence(value: tuple[Any, ...] | list[Any], replica: int) -> Any:
    """``select_replica`` of a tuple or list (of those exact types) that holds only
    distributed values, leaves and more such tuples and lists; None for anything else (a
    dict, a namedtuple), which ``optree`` maps."""
    selected = []
    for item in value:
        if isinstance(item, DistributedValues):
            item = item.values[replica]
        elif type(item) is tuple or type(item) is list:
            item = _select_in_sequence(item, replica)
            if item is None:
                return None
        elif not optree.tree_is_leaf(item, none_is_leaf=True):
            return None
        selected.append(item)
    return tuple(selected) if type(value) is tuple else selected


def regroup(results: Sequence[Any], always_wrap: bool = False, merge_same: bool = False) -> Any:
    """Per-replica results (one structure each) as one structure of ``PerReplica`` leaves;
    one replica's result as it is, unless ``always_wrap`` (a multi-worker strategy's input).

    With ``merge_same`` (``strategy.run``'s results, as in TensorFlow), a leaf that is the same
    object on every replica (a captured tensor, a constant, the None of a step that returns
    nothing) is that object, not a ``PerReplica``.
    """
    if len(results) == 1 and not always_wrap:
        return results[0]
    leaf = _same_or_per_replica if merge_same else _per_replica
    if all(optree.tree_is_leaf(r, none_is_leaf=True) for r in results):  # a loss each
        return leaf(*results)
    try:
        return optree.tree_map(leaf, *results, none_is_leaf=True)
    except ValueError:
        return PerReplica(results)  # replicas returned differently shaped structures


def _per_replica(*values: Any) -> PerReplica:
    return PerReplica(values)


def _same_or_per_replica(*values: Any) -> Any:
    first = values[0]
    if all(v is first for v in values):
        return first
    return PerReplica(values)
