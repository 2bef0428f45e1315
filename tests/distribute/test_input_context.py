"""Tests of feedline/distribute/input_context.py."""

from __future__ import annotations

import pytest

from feedline.distribute import InputContext, InputOptions, InputReplicationMode, ValueContext
from feedline.errors import InvalidArgumentError


def test_per_replica_batch_size() -> None:
    context = InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4)
    assert context.get_per_replica_batch_size(64) == 16
    with pytest.raises(ValueError, match=r"global batch size \(10\) is not divisible by .*\(4\)"):
        context.get_per_replica_batch_size(10)


def test_bad_contexts_and_options() -> None:
    with pytest.raises(InvalidArgumentError, match="input_pipeline_id 2"):
        InputContext(num_input_pipelines=2, input_pipeline_id=2)
    per_replica = InputReplicationMode.PER_REPLICA
    with pytest.raises(InvalidArgumentError, match="cannot both be True"):
        InputOptions(experimental_place_dataset_on_device=True, experimental_fetch_to_device=True)
    # As TensorFlow's: fetching to the device is on unless turned off, and placing the dataset
    # on the device needs PER_REPLICA input with fetching off.
    assert InputOptions().experimental_fetch_to_device is True
    with pytest.raises(InvalidArgumentError, match="cannot both be True"):
        InputOptions(
            experimental_place_dataset_on_device=True, experimental_replication_mode=per_replica
        )
    with pytest.raises(
        InvalidArgumentError, match="needs experimental_replication_mode PER_REPLICA"
    ):
        InputOptions(experimental_place_dataset_on_device=True, experimental_fetch_to_device=False)
    placed = InputOptions(False, per_replica, True)
    assert placed.experimental_place_dataset_on_device and not placed.fetch_to_device
    with pytest.raises(InvalidArgumentError, match="buffer_size must be >= 1"):
        InputOptions(experimental_per_replica_buffer_size=0)
    assert ValueContext(1, 2).replica_id_in_sync_group == 1


@pytest.mark.parametrize(
    ("typed", "mode"),
    [
        ("PER_REPLICA", InputReplicationMode.PER_REPLICA),
        ("per_worker", InputReplicationMode.PER_WORKER),
        (InputReplicationMode.PER_REPLICA, InputReplicationMode.PER_REPLICA),
    ],
)
def test_replication_mode_accepts_its_name(typed: object, mode: InputReplicationMode) -> None:
    options = InputOptions(experimental_replication_mode=typed)
    assert options.experimental_replication_mode is mode


def test_a_wrong_replication_mode_names_the_members() -> None:
    with pytest.raises(InvalidArgumentError, match="experimental_replication_mode") as caught:
        InputOptions(experimental_replication_mode="PER_HOST")
    assert "InputReplicationMode.PER_WORKER, InputReplicationMode.PER_REPLICA" in str(caught.value)
