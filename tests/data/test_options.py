"""Tests of feedline/data/options.py."""

from __future__ import annotations

import dataclasses
import os
import threading

import numpy as np
import pytest

from feedline.data import AUTOTUNE, Dataset, Options, ThreadingOptions
from feedline.data.autotune import cpu_budget
from feedline.data.experimental import AutoShardPolicy, AutotuneAlgorithm, ExternalStatePolicy
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
    with pytest.raises(TypeError, match="deterministic must be of type bool"):
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


@pytest.mark.parametrize("typed", ["DAT", "AutoShardPolicy.DATA", 17])
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


# Every field of TensorFlow 2.21's tf.data.Options and its groups, with a value of its type.
TENSORFLOW_FIELDS = {
    "": {
        "dataset_name": "train",
        "deterministic": False,
        "experimental_external_state_policy": ExternalStatePolicy.IGNORE,
        "experimental_slack": True,
        "experimental_symbolic_checkpoint": True,
        "experimental_warm_start": True,
        "framework_type": ["keras"],
    },
    "autotune": {
        "autotune_algorithm": AutotuneAlgorithm.STAGE_BASED,
        "cpu_budget": 3,
        "enabled": False,
        "initial_parallelism": 4,
        "min_parallelism": 2,
        "ram_budget": 1 << 20,
    },
    "experimental_distribute": {"auto_shard_policy": AutoShardPolicy.OFF, "num_devices": 2},
    "experimental_optimization": {
        name: True
        for name in (
            "apply_default_optimizations",
            "filter_fusion",
            "filter_parallelization",
            "inject_prefetch",
            "map_and_batch_fusion",
            "map_and_filter_fusion",
            "map_fusion",
            "map_parallelization",
            "noop_elimination",
            "parallel_batch",
            "seq_interleave_prefetch",
            "shuffle_and_repeat_fusion",
        )
    },
    "experimental_service": {"pinned": True},
    "threading": {"max_intra_op_parallelism": 1, "private_threadpool_size": 0},
}
FIELDS = [
    (group, name, value)
    for group, fields in TENSORFLOW_FIELDS.items()
    for name, value in fields.items()
]


def _owner(options: Options, group: str) -> object:
    return getattr(options, group) if group else options


def test_the_fields_are_tensorflows() -> None:
    options = Options()
    for group, fields in TENSORFLOW_FIELDS.items():
        declared = {f.name for f in dataclasses.fields(_owner(options, group))}  # type: ignore[arg-type]
        # feedline's own: for the data service, and for the device feed
        declared -= {"service_timeout_ms", "pinned_buffer_count"}
        if not group:
            declared -= set(TENSORFLOW_FIELDS)
        assert declared == set(fields), group


@pytest.mark.parametrize(("group", "name", "value"), FIELDS)
def test_every_tensorflow_field_is_settable_merged_and_read_back(
    group: str, name: str, value: object
) -> None:
    options = Options()
    assert getattr(_owner(options, group), name) is None  # unset until set
    setattr(_owner(options, group), name, value)
    other = Options()  # sets a different field, which must not erase this one
    other.experimental_slack = name != "experimental_slack" or None
    merged = Dataset.range(2).with_options(options).with_options(other).options()
    assert getattr(_owner(merged, group), name) == value
    later = Options()
    setattr(_owner(later, group), name, value)
    assert Options().merge(later) == later


@pytest.mark.parametrize(("group", "name", "value"), FIELDS)
def test_a_value_of_the_wrong_type_is_a_type_error(group: str, name: str, value: object) -> None:
    wrong = 1.5 if not isinstance(value, float) else "x"
    with pytest.raises(TypeError, match=rf"{name} must be of type"):
        setattr(_owner(Options(), group), name, wrong)


def test_bools_are_not_ints_and_ints_are_not_bools() -> None:
    options = Options()
    with pytest.raises(TypeError, match="cpu_budget must be of type int"):
        options.autotune.cpu_budget = True
    with pytest.raises(TypeError, match="enabled must be of type bool"):
        options.autotune.enabled = 1
    with pytest.raises(TypeError, match="list of str"):
        options.framework_type = ["keras", 2]
    with pytest.raises(TypeError, match="experimental_optimization must be of type"):
        options.experimental_optimization = {"map_fusion": True}


def test_the_experimental_threading_alias_is_the_threading_group() -> None:
    options = Options()
    options.experimental_threading.private_threadpool_size = 3
    assert options.threading.private_threadpool_size == 3
    replacement = ThreadingOptions()
    replacement.max_intra_op_parallelism = 1
    options.experimental_threading = replacement
    assert options.threading is replacement


def test_optimization_options_are_accepted_and_change_nothing() -> None:
    options = Options()
    options.experimental_optimization.apply_default_optimizations = False
    options.experimental_optimization.map_and_batch_fusion = False
    ds = Dataset.range(10).map(lambda x: x * 2).batch(4).with_options(options)
    assert [b.tolist() for b in ds] == [[0, 2, 4, 6], [8, 10, 12, 14], [16, 18]]


def _first_map_thread(initial: int | None, minimum: int | None = None) -> str:
    options = Options()
    options.autotune.initial_parallelism = initial
    options.autotune.min_parallelism = minimum
    ds = Dataset.range(1).map(
        lambda x: np.array(threading.current_thread().name), num_parallel_calls=AUTOTUNE
    )
    return next(iter(ds.with_options(options))).item().decode()


def test_initial_parallelism_is_where_an_autotuned_map_starts() -> None:
    # Unset, an autotuned map starts inline, in the consumer's thread; with an initial
    # parallelism it maps the first element on its pool already.
    assert _first_map_thread(None) == threading.current_thread().name
    assert _first_map_thread(2) != threading.current_thread().name
    assert _first_map_thread(None, minimum=1) != threading.current_thread().name


def test_private_threadpool_size_zero_means_the_number_of_cores() -> None:
    options = Options()
    options.threading.private_threadpool_size = 0
    assert cpu_budget(options) == len(os.sched_getaffinity(0))
    options.threading.private_threadpool_size = 2
    assert cpu_budget(options) == 2
    with pytest.raises(InvalidArgumentError, match=">= 0"):
        options.threading.private_threadpool_size = -1


def test_pinned_buffer_count_is_checked_and_merged() -> None:
    options = Options()
    assert options.experimental_distribute.pinned_buffer_count is None  # ahead + 2
    options.experimental_distribute.pinned_buffer_count = 6
    with pytest.raises(InvalidArgumentError, match="pinned_buffer_count must be an int >= 1"):
        options.experimental_distribute.pinned_buffer_count = 0
    with pytest.raises(TypeError, match="pinned_buffer_count must be of type int"):
        options.experimental_distribute.pinned_buffer_count = 2.5  # type: ignore[assignment]
    assert Options().merge(options).experimental_distribute.pinned_buffer_count == 6
