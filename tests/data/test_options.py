"""Tests of feedline/data/options.py."""

from __future__ import annotations

import pytest

from feedline.data import Dataset, Options
from feedline.data.experimental import AutoShardPolicy
from feedline.errors import InvalidArgumentError


def test_seed_snippet_sets_the_auto_shard_policy() -> None:
    dataset = Dataset.from_tensors(([1.0], [1.0])).repeat(64).batch(16)
    options = Options()
    options.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA
    dataset = dataset.with_options(options)
    assert dataset.options().experimental_distribute.auto_shard_policy == AutoShardPolicy.DATA
    assert len(list(dataset)) == 4


def test_later_options_win_field_by_field() -> None:
    first = Options()
    first.deterministic = False
    first.autotune.ram_budget = 1000
    second = Options()
    second.deterministic = True
    ds = Dataset.range(3).with_options(first).with_options(second)
    merged = ds.options()
    assert merged.deterministic is True and merged.autotune.ram_budget == 1000


def test_options_flow_downstream_and_merge_across_inputs() -> None:
    a = Options()
    a.threading.private_threadpool_size = 2
    left = Dataset.range(3).with_options(a)
    assert left.map(lambda x: x).batch(2).options().threading.private_threadpool_size == 2


def test_invalid_values_are_refused() -> None:
    options = Options()
    with pytest.raises(
        InvalidArgumentError, match=r"auto_shard_policy must be a member of AutoShardPolicy"
    ):
        options.experimental_distribute.auto_shard_policy = 17
    with pytest.raises(InvalidArgumentError, match="deterministic must be a bool"):
        options.deterministic = "yes"
    with pytest.raises(AttributeError, match="no option 'typo'"):
        options.typo = 1
    with pytest.raises(InvalidArgumentError):
        Dataset.range(3).with_options({"deterministic": True})


@pytest.mark.parametrize(
    ("typed", "policy"),
    [
        ("DATA", AutoShardPolicy.DATA),
        ("data", AutoShardPolicy.DATA),
        ("OFF", AutoShardPolicy.OFF),
        ("Hint", AutoShardPolicy.HINT),
        (1, AutoShardPolicy.FILE),
        (AutoShardPolicy.AUTO, AutoShardPolicy.AUTO),
    ],
)
def test_auto_shard_policy_accepts_what_users_type(typed: object, policy: AutoShardPolicy) -> None:
    options = Options()
    options.experimental_distribute.auto_shard_policy = typed
    assert options.experimental_distribute.auto_shard_policy is policy
    dataset = Dataset.range(4).with_options(options)
    assert dataset.options().experimental_distribute.auto_shard_policy is policy


@pytest.mark.parametrize("typed", ["DAT", "AutoShardPolicy.DATA", True, 2.0])
def test_a_wrong_policy_names_the_members(typed: object) -> None:
    options = Options()
    with pytest.raises(InvalidArgumentError) as caught:
        options.experimental_distribute.auto_shard_policy = typed
    message = str(caught.value)
    assert "AutoShardPolicy.DATA" in message and "'OFF'" in message and repr(typed) in message


def test_experimental_deterministic_alias() -> None:
    options = Options()
    options.experimental_deterministic = False
    assert options.deterministic is False
