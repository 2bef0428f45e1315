"""``DistributedDataset`` and ``DistributedIterator``: input fed to replicas, step by step.

A distributed dataset is built from a *step source*: a feedline.data dataset whose elements are
steps, one NumPy element per local replica (see ``_steps``). The iterator turns each replica's
element into torch tensors on that replica's device and returns them as ``PerReplica`` values
(plain values with one replica). End of input is agreed, never guessed: while any worker has data,
replicas without data receive empty (size-0) batches with the right trailing shape and dtype.

In a ``feedline.train.Checkpoint`` an iterator saves every worker's position and, where every
worker reads the whole pipeline (one worker, or DATA sharding), the global pipeline's, so that a
checkpoint taken on N workers resumes on M (``_iterator_state``).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from feedline import structure
from feedline.data._device_feed import CopyBackend, DeviceFeed, Placed, on_host
from feedline.data.dataset import UNKNOWN_CARDINALITY, Dataset, DatasetIterator, Optional
from feedline.data.torch_loader import FeedlineIterableDataset
from feedline.distribute import _iterator_state, _shared_input
from feedline.distribute._devices import ReplicaDevice
from feedline.distribute._iterator_state import InputLayout
from feedline.distribute._steps import (
    GroupElementsDataset,
    SplitBatchesDataset,
    ZipReplicasDataset,
)
from feedline.distribute.input_context import InputContext, InputOptions, InputReplicationMode
from feedline.distribute.values import PerReplica, PerReplicaSpec, regroup
from feedline.errors import InvalidArgumentError, OutOfRangeError

Agree = Callable[[bool], bool]
Gather = Callable[[Any], list[Any]]


@dataclasses.dataclass(frozen=True)
class StepSource:
    """The steps this worker feeds its replicas, and what one replica's element looks like."""

    steps: Dataset
    replica_specs: tuple[Any, ...]
    layout: InputLayout

    @classmethod
    def from_global_batches(
        cls,
        dataset: Dataset,
        *,
        num_workers: int,
        worker_index: int,
        replicas_per_worker: int,
        options: InputOptions | None = None,
    ) -> StepSource:
        """Auto-shard over workers, cut global batches into per-replica slices, prefetch."""
        if options is not None and (
            options.experimental_replication_mode is InputReplicationMode.PER_REPLICA
        ):
            raise InvalidArgumentError(
                "InputReplicationMode.PER_REPLICA is only for distribute_datasets_from_function"
            )
        keep: range | None = range(0, replicas_per_worker)
        sharding, policy = "whole", None
        if num_workers > 1:
            from feedline.data.experimental import ShardMode, auto_shard

            chosen = dataset.options().experimental_distribute.auto_shard_policy
            policy = "AUTO" if chosen is None else chosen.name
            dataset, mode = auto_shard(dataset, num_workers, worker_index)
            first = worker_index * replicas_per_worker
            keep = range(first, first + replicas_per_worker) if mode is ShardMode.DATA else None
            sharding = mode.value
        steps = SplitBatchesDataset(
            dataset,
            num_workers * replicas_per_worker,
            replicas_per_worker,
            keep,
            worker=(num_workers, worker_index),
        )
        layout = InputLayout(sharding, num_workers, worker_index, replicas_per_worker, policy)
        # The layout of every whole or DATA source is prefetch(split(global pipeline)): the
        # global position of _iterator_state relies on it.
        return cls(steps.prefetch(replicas_per_worker), steps.element_spec, layout)

    @classmethod
    def from_function(
        cls,
        dataset_fn: Callable[[InputContext], Dataset],
        *,
        num_workers: int,
        worker_index: int,
        replicas_per_worker: int,
        num_replicas_in_sync: int,
        options: InputOptions | None = None,
    ) -> StepSource:
        """One pipeline per worker (each replica takes the next element) or per replica."""
        if not callable(dataset_fn):
            raise TypeError(f"dataset_fn must be callable, got {type(dataset_fn).__name__}")
        mode = options.experimental_replication_mode if options else InputReplicationMode.PER_WORKER
        if mode is InputReplicationMode.PER_REPLICA:
            first = worker_index * replicas_per_worker
            pipelines = tuple(
                _call(
                    dataset_fn, InputContext(num_replicas_in_sync, first + i, num_replicas_in_sync)
                )
                for i in range(replicas_per_worker)
            )
            steps: Dataset = ZipReplicasDataset(pipelines)
            sharding = "per_replica_function"
        else:
            context = InputContext(num_workers, worker_index, num_replicas_in_sync)
            steps = GroupElementsDataset(_call(dataset_fn, context), replicas_per_worker)
            sharding = "function"
        layout = InputLayout(sharding, num_workers, worker_index, replicas_per_worker)
        return cls(steps, steps.element_spec, layout)


def _call(dataset_fn: Callable[[InputContext], Dataset], context: InputContext) -> Dataset:
    dataset = dataset_fn(context)
    if not isinstance(dataset, Dataset):
        raise TypeError(
            f"dataset_fn must return a feedline.data.Dataset, got {type(dataset).__name__}; "
            "build the dataset inside the function and return it"
        )
    return dataset


class DistributedDataset:
    """Input distributed over replicas: iterate it (once per epoch, as often as you like).

    It is not a ``Dataset``: transform the dataset before distributing it.
    """

    def __init__(
        self,
        source: StepSource,
        devices: Sequence[ReplicaDevice],
        options: InputOptions | None,
        agree: Agree,
        gather: Gather | None = None,
        always_wrap: bool = False,
        copy_backend: CopyBackend | None = None,
    ) -> None:
        self._source = source
        self._copy_backend = copy_backend  # None: CUDA's, when a step first goes to a GPU
        # TensorFlow wraps every step in PerReplica (and the spec in PerReplicaSpec) whenever
        # the strategy is in multi-worker mode, even with one local replica.
        self._always_wrap = always_wrap or len(source.replica_specs) > 1
        self._devices = tuple(devices)
        self._options = options or InputOptions()
        self._agree = agree
        self._gather: Gather = gather or (lambda obj: [obj])

    @property
    def element_spec(self) -> Any:
        """One replica's spec, or a ``PerReplicaSpec`` per leaf with several replicas or
        several workers (``MultiWorkerMirroredStrategy`` with one replica per worker gives
        ``PerReplicaSpec(TensorSpec(...))``, as in TensorFlow)."""
        specs = self._source.replica_specs
        if not self._always_wrap:
            return specs[0]
        return structure.map_spec(lambda *leaves: PerReplicaSpec(*leaves), *specs)

    def __iter__(self) -> DistributedIterator:
        return DistributedIterator(self)

    def as_torch(self) -> FeedlineIterableDataset:
        """This input as a ``torch.utils.data.IterableDataset`` (for a ``DataLoader`` with
        ``batch_size=None``), its checkpoints those of its iterators; see ``Dataset.as_torch``."""
        return FeedlineIterableDataset(self)

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_") and hasattr(Dataset, name):
            raise AttributeError(
                f"DistributedDataset has no attribute {name!r}: it is not a Dataset; apply "
                f"{name}() to the dataset before distributing it"
            )
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"<DistributedDataset devices={[str(d) for d in self._devices]}>"


class DistributedIterator:
    """Steps of a ``DistributedDataset``: ``next`` (StopIteration at the end), ``get_next``
    (OutOfRangeError), ``get_next_as_optional``; ``get_state``/``set_state`` save and restore
    the position (the steps already moved to devices included)."""

    def __init__(self, dataset: DistributedDataset) -> None:
        self._dataset = dataset
        self._steps: DatasetIterator = iter(dataset._source.steps)
        self._devices = dataset._devices
        self._to_device = dataset._options.fetch_to_device
        self._depth = dataset._options.experimental_per_replica_buffer_size
        self._ahead: collections.deque[tuple[tuple[Any, ...], Any]] = collections.deque()
        self._feed: DeviceFeed | None = None
        self._last_real: Any = None  # empty batches take its trailing shape and dtype
        self._finished = False
        # Agreeing on the end costs a collective per step; where every worker knows it has the
        # same number of steps (or an infinite input), they end together without it. The
        # decision comes from the gathered counts, so every worker makes the same one.
        count = dataset._source.steps.cardinality()
        self._agree_each_step = (
            count == UNKNOWN_CARDINALITY or len(set(dataset._gather(count))) != 1
        )
        if _shared_input.reads_shared_input(dataset._source.steps, self._layout.num_workers):
            layout = self._layout
            _shared_input.start(
                self.get_state, layout.num_workers, layout.worker_index, dataset._gather,
                self._set_own_state,
            )  # fmt: skip

    @property
    def element_spec(self) -> Any:
        return self._dataset.element_spec

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self) -> Any:
        if self._uses_cuda:
            while len(self._ahead) < self._depth + 1:
                step = self._host_step()
                if step is None:
                    break
                self._ahead.append((step, self._place(step)))
            if not self._ahead:
                raise StopIteration
            _, placed = self._ahead.popleft()
            return placed.ready()
        step = self._host_step()
        if step is None:
            raise StopIteration
        return self._place(step)

    def get_next(self) -> Any:
        try:
            return next(self)
        except StopIteration:
            raise OutOfRangeError("end of the distributed dataset") from None

    def get_next_as_optional(self) -> Optional:
        try:
            return Optional(next(self), self.element_spec)
        except StopIteration:
            return Optional.empty(self.element_spec)

    # -- steps -----------------------------------------------------------------------------
    def _host_step(self) -> tuple[Any, ...] | None:
        """The next step as NumPy elements, empty ones filled in; None once all workers ended."""
        if self._finished:
            return None
        try:
            step: tuple[Any, ...] | None = self._steps._next()
        except StopIteration:
            step = None
        if not (self._dataset._agree(step is not None) if self._agree_each_step else step):
            self._finished = True
            return None
        if step is None:
            step = (None,) * len(self._devices)
        return self._fill_empty(step)

    def _fill_empty(self, step: tuple[Any, ...]) -> tuple[Any, ...]:
        real = next((part for part in step if part is not None), None)
        if real is not None:
            self._last_real = real
        if all(part is not None for part in step):
            return step
        if self._last_real is not None:
            empty = structure.slice_element(self._last_real, slice(0, 0))
        else:
            empty = structure.empty_like_spec(self._dataset._source.replica_specs[0])
        return tuple(empty if part is None else part for part in step)

    @property
    def _uses_cuda(self) -> bool:
        return self._to_device and any(d.kind == "cuda" for d in self._devices)

    def _place(self, step: tuple[Any, ...]) -> Any:
        if self._uses_cuda:
            return self._place_on_devices(step)
        if all(_is_flat_numeric(part) for part in step):
            # The common case on CPU replicas, without the general structure walk.
            if not self._dataset._always_wrap:
                return tuple(_host_tensor(a) for a in step[0])
            return tuple(
                PerReplica(tuple(_host_tensor(a) for a in leaves))
                for leaves in zip(*step, strict=True)
            )
        parts = [structure.map_structure(_to_tensor, part) for part in step]
        return regroup(parts, always_wrap=self._dataset._always_wrap)

    def _place_on_devices(self, step: tuple[Any, ...]) -> Placed:
        """Queues the copies of each replica's part to its device (``DeviceFeed``); the result's
        ``ready()`` gives the step once each replica's compute stream waits for its copy."""
        if self._feed is None:
            options = self._dataset._source.steps.options().experimental_distribute
            self._feed = DeviceFeed(
                buffer_count=options.pinned_buffer_count,
                depth=self._depth + 1,
                spec=self._dataset._source.replica_specs[0],
                backend=self._dataset._copy_backend,
            )
        parts = [
            self._feed.put(part, device.torch_device) if device.kind == "cuda" else on_host(part)
            for part, device in zip(step, self._devices, strict=True)
        ]
        return Placed.join(
            parts, lambda each: regroup(each, always_wrap=self._dataset._always_wrap)
        )

    # -- checkpoints -----------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """This worker's position (no other worker takes part)."""
        return {
            "steps": self._steps.get_state(),
            "ahead": [step for step, _ in self._ahead],
            "finished": self._finished,
        }

    def checkpoint_state(self) -> dict[str, Any]:
        """What a ``Checkpoint`` saves: every worker's position and, where it applies, the
        global pipeline's. Under several workers this is a collective: every worker calls it.
        (This and the next two methods are ``feedline._checkpointable.Checkpointable``.)"""
        return _iterator_state.gather(self.get_state(), self._layout, self._dataset._gather)

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Restores what ``checkpoint_state`` saved: ``set_state`` takes both forms."""
        self.set_state(state)

    def check_restorable(self, state: Any) -> str | None:
        """Why ``state`` (from a checkpoint) cannot position this iterator, or None."""
        return _iterator_state.restorable(state, self._layout)

    @property
    def _layout(self) -> InputLayout:
        return self._dataset._source.layout

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores a position: this worker's (``get_state``) or a checkpoint's (this worker's
        entry, or the global position re-split over this iterator's workers)."""
        if _iterator_state.is_saved_form(state):
            problem = _iterator_state.restorable(state, self._layout)
            if problem is not None:
                raise InvalidArgumentError(f"cannot restore the distributed iterator: {problem}")
            workers = state["workers"]
            state = _iterator_state.local_state(state, self._layout)
            # Input the workers share (a data service job) resumes from every worker's share.
            layout = self._layout
            _shared_input.restore(
                state, workers, layout.num_workers, layout.worker_index, self._dataset._gather,
                self._set_own_state,
            )  # fmt: skip
            return
        self._set_own_state(state)

    def _set_own_state(self, state: dict[str, Any]) -> None:
        self._steps.set_state(state["steps"])
        self._ahead = collections.deque((step, self._place(step)) for step in state["ahead"])
        self._finished = bool(state["finished"])

    def close(self) -> None:
        self._steps.close()
        self._ahead.clear()
        if self._feed is not None:
            self._feed.close()


def _is_flat_numeric(part: Any) -> bool:
    return type(part) is tuple and all(
        isinstance(a, np.ndarray) and a.dtype.kind not in "OSU" for a in part
    )


def _host_tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def _to_tensor(array: Any) -> Any:
    """A NumPy leaf as a host torch tensor (zero-copy where torch may write the memory).
    Strings stay NumPy arrays."""
    array = np.asarray(array)
    if array.dtype.kind in "OSU":
        return array
    return _host_tensor(array)
