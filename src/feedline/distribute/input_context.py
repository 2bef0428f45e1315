"""What ``distribute_*`` functions are told and take: ``InputContext``, ``ValueContext``,
``InputOptions``."""

from __future__ import annotations

import dataclasses
import enum

from feedline._enums import parse_member
from feedline.errors import InvalidArgumentError


class InputReplicationMode(enum.Enum):
    """PER_WORKER: one input pipeline per worker, shared by its replicas. PER_REPLICA: one
    pipeline per replica (``distribute_datasets_from_function`` only)."""

    PER_WORKER = "PER_WORKER"
    PER_REPLICA = "PER_REPLICA"


@dataclasses.dataclass(frozen=True)
class InputContext:
    """What ``dataset_fn`` of ``distribute_datasets_from_function`` is told about its pipeline.

    Example:
      >>> InputContext(num_replicas_in_sync=2).get_per_replica_batch_size(64)
      32
    """

    num_input_pipelines: int = 1
    input_pipeline_id: int = 0
    num_replicas_in_sync: int = 1

    def __post_init__(self) -> None:
        if self.num_input_pipelines < 1 or self.num_replicas_in_sync < 1:
            raise InvalidArgumentError(f"an InputContext needs positive counts, got {self}")
        if not 0 <= self.input_pipeline_id < self.num_input_pipelines:
            raise InvalidArgumentError(
                f"input_pipeline_id {self.input_pipeline_id} is outside [0, "
                f"{self.num_input_pipelines})"
            )

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """``global_batch_size`` divided by the replicas in sync; it must divide evenly."""
        if global_batch_size % self.num_replicas_in_sync:
            raise ValueError(
                f"the global batch size ({global_batch_size}) is not divisible by "
                f"num_replicas_in_sync ({self.num_replicas_in_sync}); use a multiple of "
                f"{self.num_replicas_in_sync}"
            )
        return global_batch_size // self.num_replicas_in_sync


@dataclasses.dataclass(frozen=True)
class ValueContext:
    """What ``value_fn`` of ``experimental_distribute_values_from_function`` is told."""

    replica_id_in_sync_group: int = 0
    num_replicas_in_sync: int = 1


@dataclasses.dataclass(frozen=True)
class InputOptions:
    """How distributed input reaches the replicas.

    Attributes:
      experimental_fetch_to_device: move each replica's batch to its device (on CUDA through
        the device's ring of reusable pinned buffers and a copy stream of its own, prefetched
        ahead of the step; ``Options.experimental_distribute.pinned_buffer_count`` sizes the
        ring); False keeps it on the host. None (the default) reads back as True, as in
        TensorFlow.
      experimental_replication_mode: an ``InputReplicationMode`` or its name (``"PER_REPLICA"``);
        PER_REPLICA only for ``distribute_datasets_from_function``.
      experimental_place_dataset_on_device: accepted for compatibility; feedline's pipelines
        always run on the host. As in TensorFlow it needs the PER_REPLICA mode and
        ``experimental_fetch_to_device=False``.
      experimental_per_replica_buffer_size: batches each replica keeps ready on its device.
    """

    experimental_fetch_to_device: bool | None = None
    experimental_replication_mode: InputReplicationMode = InputReplicationMode.PER_WORKER
    experimental_place_dataset_on_device: bool = False
    experimental_per_replica_buffer_size: int = 1

    def __post_init__(self) -> None:
        mode = parse_member(
            InputReplicationMode,
            self.experimental_replication_mode,
            "experimental_replication_mode",
        )
        object.__setattr__(self, "experimental_replication_mode", mode)
        if self.experimental_fetch_to_device is None:
            object.__setattr__(self, "experimental_fetch_to_device", True)
        if self.experimental_place_dataset_on_device:
            if self.experimental_fetch_to_device:
                raise InvalidArgumentError(
                    "experimental_place_dataset_on_device and experimental_fetch_to_device cannot "
                    "both be True (experimental_fetch_to_device is True unless set to False)"
                )
            if mode is not InputReplicationMode.PER_REPLICA:
                raise InvalidArgumentError(
                    "experimental_place_dataset_on_device needs experimental_replication_mode "
                    f"PER_REPLICA, got {mode.name}"
                )
        if self.experimental_per_replica_buffer_size < 1:
            raise InvalidArgumentError(
                "experimental_per_replica_buffer_size must be >= 1, got "
                f"{self.experimental_per_replica_buffer_size}"
            )

    @property
    def fetch_to_device(self) -> bool:
        return self.experimental_fetch_to_device is not False
