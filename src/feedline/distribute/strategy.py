"""``Strategy``: the API every distribution strategy shares, and the default strategy.

A strategy owns its local replicas' devices. ``run`` calls a function once per local replica in
a replica context; ``reduce``, ``gather`` and ``experimental_local_results`` combine the results;
the ``distribute_*`` methods feed replicas from datasets. Subclasses set the devices and, for
several processes, the worker count and index.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

import optree
import torch

from feedline import config
from feedline.data.dataset import Dataset
from feedline.distribute import context
from feedline.distribute._devices import ReplicaDevice
from feedline.distribute._replica_group import ReplicaGroup
from feedline.distribute.distributed_dataset import DistributedDataset, StepSource
from feedline.distribute.input_context import InputContext, InputOptions, ValueContext
from feedline.distribute.mirroring import Mirroring, install_hooks
from feedline.distribute.values import (
    DistributedValues,
    PerReplica,
    ReduceOp,
    is_nested,
    regroup,
    select_replica,
)
from feedline.errors import FailedPreconditionError, InvalidArgumentError

if TYPE_CHECKING:
    from feedline.distribute.cluster_resolver import ClusterResolver


@dataclasses.dataclass
class RunOptions:
    """Options of ``Strategy.run`` (``tf.distribute.RunOptions``). Its fields tune TPU
    compilation in TensorFlow; feedline accepts them and they change nothing."""

    experimental_enable_dynamic_batch_size: bool = True
    experimental_bucketizing_dynamic_shape: bool = False
    experimental_xla_options: Any = None


class StrategyExtended:
    """Details of a strategy: its devices and where its replicas sit among all workers."""

    def __init__(
        self, devices: Sequence[ReplicaDevice], num_workers: int = 1, worker_index: int = 0
    ) -> None:
        self.local_devices = tuple(devices)
        self.num_workers = num_workers
        self.worker_index = worker_index
        self._owner: Strategy | None = None  # set by the strategy it belongs to
        #: The devices that hold the parameters: the local replicas' (mirrored parameters), or
        #: the parameter servers'.
        self.parameter_devices: tuple[str, ...] = self.worker_devices

    @property
    def worker_devices(self) -> tuple[str, ...]:
        """The local replicas' devices, e.g. ``('cpu:0', 'cpu:1')``."""
        return tuple(str(d) for d in self.local_devices)

    @property
    def first_replica_id(self) -> int:
        """The replica id (in the sync group) of this worker's first replica."""
        return self.worker_index * len(self.local_devices)

    @property
    def is_chief(self) -> bool:
        """Whether this worker is the chief (the ``chief`` task, else worker 0)."""
        return self.worker_index == 0

    @property
    def should_checkpoint(self) -> bool:
        """Whether this worker writes checkpoints (the chief alone, as in TensorFlow)."""
        return self.is_chief

    @property
    def should_save_summary(self) -> bool:
        """Whether this worker writes summaries (the chief alone)."""
        return self.is_chief

    @property
    def should_init(self) -> bool:
        """Whether this worker initialises variables (every worker: they are broadcast)."""
        return True

    @property
    def experimental_between_graph(self) -> bool:
        """Whether every worker runs its own copy of the program (several processes)."""
        return self.num_workers > 1

    def _in_multi_worker_mode(self) -> bool:
        return self.num_workers > 1

    def reduce_to(
        self, reduce_op: ReduceOp | str, value: Any, destinations: Any, options: Any = None
    ) -> Any:
        """``value`` combined across replicas (and workers), placed on ``destinations``
        (TensorFlow's ``StrategyExtended.reduce_to``): a ``PerReplica`` value holds the result
        on each of its replicas' devices (pass ``value`` itself for an all-reduce); a tensor or
        a device name (``"cpu:0"``, ``"cuda:1"``) gets one tensor on that device. In the
        cross-replica context: outside ``run``, or in the function of a ``merge_call``.
        ``options`` (a ``CommunicationOptions``) is accepted as TensorFlow's.

        Example:
          >>> import torch, feedline.distribute as fdist
          >>> strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
          >>> losses = strategy.run(lambda: torch.tensor(
          ...     float(fdist.get_replica_context().replica_id_in_sync_group + 1)))
          >>> strategy.extended.reduce_to("SUM", losses, destinations=losses)
          PerReplica:{
            0: tensor(3.),
            1: tensor(3.)
          }
          >>> strategy.extended.reduce_to("MEAN", losses, destinations="cpu:0")
          tensor(1.5000)

        Raises:
          RuntimeError: called in a replica context (inside ``run``).
          InvalidArgumentError: ``destinations`` is not a value, tensor or device.
        """
        return _placed(self._strategy.reduce(reduce_op, value), destinations)

    def batch_reduce_to(
        self,
        reduce_op: ReduceOp | str,
        value_destination_pairs: Sequence[tuple[Any, Any]],
        options: Any = None,
    ) -> list[Any]:
        """``reduce_to`` of each ``(value, destinations)`` pair, in order (TensorFlow's
        ``StrategyExtended.batch_reduce_to``).

        Example:
          >>> import torch, feedline.distribute as fdist
          >>> strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
          >>> a, b = strategy.run(lambda: (torch.tensor(1.0), torch.tensor([2.0, 3.0])))
          >>> strategy.extended.batch_reduce_to("SUM", [(a, "cpu:0"), (b, "cpu:0")])
          [tensor(2.), tensor([4., 6.])]
        """
        return [
            self.reduce_to(reduce_op, value, destinations, options)
            for value, destinations in value_destination_pairs
        ]

    @property
    def _strategy(self) -> Strategy:
        if self._owner is None:
            raise FailedPreconditionError("this StrategyExtended belongs to no strategy")
        return self._owner


def _placed(reduced: torch.Tensor, destinations: Any) -> Any:
    """``reduced`` on ``destinations`` (``StrategyExtended.reduce_to``)."""
    if isinstance(destinations, DistributedValues):
        return PerReplica([reduced.to(torch.as_tensor(d).device) for d in destinations.values])
    if isinstance(destinations, torch.Tensor):
        return reduced.to(destinations.device)
    try:
        device = ReplicaDevice.parse(destinations)
    except InvalidArgumentError:
        raise InvalidArgumentError(
            "destinations must be a PerReplica value, a tensor or a device name such as "
            f"'cpu:0', got {type(destinations).__name__}"
        ) from None
    return reduced.to(device.torch_device)


class Strategy:
    """Distributes computation and input over replicas (``tf.distribute.Strategy``)."""

    def __init__(self, extended: StrategyExtended) -> None:
        self.extended = extended
        extended._owner = self  # reduce_to and batch_reduce_to reduce through it
        if not isinstance(self, _DefaultStrategy):  # logical devices are fixed from now on
            config._mark_initialized()

    @property
    def cluster_resolver(self) -> ClusterResolver | None:
        """The cluster this strategy spans; None for single-worker strategies, as in TF."""
        return None

    # -- replicas --------------------------------------------------------------------------
    @property
    def num_replicas_in_sync(self) -> int:
        """Replicas across all workers that step together."""
        return len(self.extended.local_devices) * self.extended.num_workers

    @property
    def _num_local(self) -> int:
        return len(self.extended.local_devices)

    @property
    def mirrors_replicas(self) -> bool:
        """Whether models and optimizers made in this scope are mirrored (several replicas)."""
        return self._num_local > 1

    @functools.cached_property
    def _mirroring(self) -> Mirroring:
        return Mirroring(self)

    @contextmanager
    def scope(self) -> Iterator[Strategy]:
        """Makes this the current strategy: ``get_strategy()`` returns it, and models and
        optimizers created inside are mirrored over its replicas (see ``mirroring``)."""
        if self.mirrors_replicas:
            install_hooks()
        with context.strategy_scope(self):
            yield self

    def mirror(self, *objects: Any) -> Any:
        """Mirrors modules and optimizers made outside ``scope()``, as if made inside; returns
        the object (or the tuple of them)."""
        if self.mirrors_replicas:
            install_hooks()
            for obj in objects:
                self._mirroring.mirror(obj)
        return objects[0] if len(objects) == 1 else objects

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict | None = None,
        options: RunOptions | None = None,
    ) -> Any:
        """Calls ``fn`` once per local replica, in replica order, each in its replica context.

        ``PerReplica`` values in ``args``/``kwargs`` are replaced by the replica's own component;
        other values are passed to every replica. Returns the per-replica results as
        ``PerReplica`` values (a plain value with one replica); a result that is the same
        object on every replica (a captured tensor, None) is returned as it is, as in
        TensorFlow. ``args`` must be a tuple or list (``args=(x,)``, not ``args=(x)``);
        ``options`` (a ``RunOptions``) changes nothing.

        A function that calls no collective runs for one replica after another in this thread.
        Once replica 0 calls one of its ``ReplicaContext``'s collectives (``all_reduce``,
        ``all_gather``, ``merge_call``), the other replicas run in threads of their own, one
        at a time, handing over at each collective, each on its own gradients, buffers and
        parameter data; every replica must then call the same collectives in the same order.
        """
        if not callable(fn):
            raise TypeError(f"run expects a callable, got {type(fn).__name__}")
        _check_run_arguments(args, kwargs, options)
        self._check_not_mixed("run")
        kwargs = kwargs or {}
        mirroring = self._mirroring if self.mirrors_replicas else None
        if mirroring is not None:
            install_hooks()

        def call(group: ReplicaGroup, local: int) -> Any:
            replica_id = self.extended.first_replica_id + local
            with context.replica_scope(self, replica_id, group), self._device_scope(local):
                return fn(*select_replica(tuple(args), local), **select_replica(kwargs, local))

        try:
            results = ReplicaGroup(self._num_local, call, mirroring).run()
        except BaseException:
            if mirroring is not None:
                mirroring.abort_run()  # no half step: the next run starts clean
            raise
        if mirroring is not None:
            mirroring.offer_results(results)
            mirroring.after_run()
        return regroup(results, merge_same=True)

    def _check_not_mixed(self, what: str) -> None:
        """RuntimeError where another strategy is in scope (TensorFlow's "mixing" error)."""
        current = context.strategy_in_scope()
        if current is not None and current is not self:
            raise RuntimeError(
                f"Mixing different tf.distribute.Strategy objects: {type(self).__name__}.{what} "
                f"was called in the scope of another strategy ({type(current).__name__}); "
                "call it outside that scope, or use the strategy in scope"
            )

    def _require_cross_replica(self, what: str) -> None:
        """RuntimeError inside ``run`` (a replica context) or another strategy's scope."""
        self._check_not_mixed(what)
        if context.current_replica() is not None:
            raise RuntimeError(
                f"{type(self).__name__}.{what} can only be called in the cross-replica context "
                f"(outside strategy.run); in a replica's function use "
                f"get_replica_context().{'all_gather' if what == 'gather' else 'all_reduce'}"
            )

    @contextmanager
    def _device_scope(self, local: int) -> Iterator[None]:
        device = self.extended.local_devices[local]
        if device.kind == "cuda":
            with torch.cuda.device(device.index):
                yield
        else:
            yield

    def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
        """The components of ``value`` on this worker's replicas, in replica order.

        A nested structure (what ``run`` returns for a function that returns a list, tuple or
        dict) gives the structure once per replica, each ``PerReplica`` leaf replaced by that
        replica's component, as TensorFlow does: ``run`` of a function returning
        ``[replica_id, 1]`` on two replicas gives ``([0, 1], [1, 1])``. A single value that is
        not per-replica gives ``(value,)``.
        """
        if isinstance(value, DistributedValues):
            return value.values
        if is_nested(value):
            return tuple(select_replica(value, local) for local in range(self._num_local))
        return (value,)

    def reduce(
        self, reduce_op: ReduceOp | str, value: Any, axis: int | None = None
    ) -> torch.Tensor:
        """Combines ``value`` across replicas (and workers) into one tensor.

        With ``axis``, each replica's value is first reduced along it; ``MEAN`` then divides by
        the number of elements along that axis over all replicas, so empty (size-0) batches
        count for nothing. A value that is not per-replica counts as every replica's value.

        Across workers, the scalar tensors a ``run`` returned (a per-replica loss) are summed
        with that step's gradients, in the same all-reduce: their reduce right after the run
        (without ``axis``, before the next run) waits for nothing.
        """
        self._require_cross_replica("reduce")
        op = ReduceOp.parse(reduce_op)
        parts = [torch.as_tensor(v) for v in self._replica_values(value)]
        target = parts[0].device
        axes = _axes(axis)
        reduced = parts if axes is None else [p.sum(dim=axes) for p in parts]
        _check_same_shapes(
            [r.shape for r in reduced], "reduce" if axes is None else f"reduce along axis {axis}"
        )
        if axis is None and self.mirrors_replicas:
            summed = self._mirroring.summed_in_run(parts)
        else:
            summed = None
        if summed is not None:  # the last run's results, summed with its gradients
            if op is ReduceOp.SUM:
                return summed
            return summed / torch.tensor(float(self.num_replicas_in_sync), dtype=summed.dtype)
        total = functools.reduce(torch.add, [r.to(target) for r in reduced])
        if op is ReduceOp.SUM:
            return self._sum_across_workers(total)
        if not torch.is_floating_point(total):
            total = total.to(torch.float32)
        if axes is None:
            count = len(parts)
        else:
            count = sum(math.prod(p.shape[a] for a in axes) for p in parts)
        # One collective for both: the total's elements, then the count.
        count_part = torch.tensor([float(count)], dtype=total.dtype, device=target)
        both = self._sum_across_workers(torch.cat([total.reshape(-1), count_part]))
        return both[:-1].reshape(total.shape) / both[-1]

    def gather(self, value: Any, axis: int) -> torch.Tensor:
        """The replicas' components of ``value`` concatenated along ``axis`` (in the
        cross-replica context; ``get_replica_context().all_gather`` inside ``run``)."""
        self._require_cross_replica("gather")
        parts = [torch.as_tensor(v) for v in self._replica_values(value)]
        target = parts[0].device
        return self._all_gather(torch.cat([p.to(target) for p in parts], dim=axis), axis)

    def _replica_all_reduce(self, reduce_op: ReduceOp, values: list[Any]) -> list[Any]:
        """``ReplicaContext.all_reduce``: every local replica's ``values`` (alike structures)
        summed, then summed over workers (and divided for ``MEAN``); one result per replica,
        on its value's device."""

        def reduce_leaf(*leaves: Any) -> list[torch.Tensor]:
            parts = [torch.as_tensor(leaf) for leaf in leaves]
            _check_same_shapes([p.shape for p in parts], "all_reduce")
            target = parts[0].device
            if len(parts) == 1:
                total = parts[0].clone()
            else:
                total = functools.reduce(torch.add, [p.to(target) for p in parts])
            total = self._sum_across_workers(total)
            if reduce_op is ReduceOp.MEAN:
                if not torch.is_floating_point(total):
                    total = total.to(torch.float32)
                total = total / self.num_replicas_in_sync
            return _per_replica_copies(total, parts)

        return _per_replica_results(reduce_leaf, values)

    def _replica_all_gather(self, axis: int, values: list[Any]) -> list[Any]:
        """``ReplicaContext.all_gather``: the local replicas' ``values`` concatenated along
        ``axis``, then gathered over workers; one result per replica, on its value's device."""

        def gather_leaf(*leaves: Any) -> list[torch.Tensor]:
            parts = [torch.as_tensor(leaf) for leaf in leaves]
            target = parts[0].device
            local = torch.cat([p.to(target) for p in parts], dim=axis)
            return _per_replica_copies(self._all_gather(local, axis), parts)

        return _per_replica_results(gather_leaf, values)

    def _replica_values(self, value: Any) -> list[Any]:
        if isinstance(value, DistributedValues):
            if len(value.values) != self._num_local:
                raise InvalidArgumentError(
                    f"the value has {len(value.values)} components, but this strategy has "
                    f"{self._num_local} local replicas"
                )
            return list(value.values)
        return [value] * self._num_local

    def _sum_across_workers(self, value: torch.Tensor) -> torch.Tensor:
        """The sum of every worker's ``value``; one worker has nothing to add."""
        return value

    def _all_gather(self, local: torch.Tensor, axis: int) -> torch.Tensor:
        return local

    # -- input -----------------------------------------------------------------------------
    def experimental_distribute_dataset(
        self, dataset: Dataset, options: InputOptions | None = None
    ) -> DistributedDataset:
        """Splits each global batch of ``dataset`` over the replicas; see ``DistributedDataset``."""
        _check_dataset(dataset, "experimental_distribute_dataset")
        source = StepSource.from_global_batches(
            dataset,
            num_workers=self.extended.num_workers,
            worker_index=self.extended.worker_index,
            replicas_per_worker=self._num_local,
            options=options,
        )
        return self._feed(source, options)

    distribute_dataset = experimental_distribute_dataset

    def distribute_datasets_from_function(
        self, dataset_fn: Callable[[InputContext], Dataset], options: InputOptions | None = None
    ) -> DistributedDataset:
        """Calls ``dataset_fn`` per input pipeline and feeds each replica its elements as they
        are: no batching, sharding or prefetching is added."""
        source = StepSource.from_function(
            dataset_fn,
            num_workers=self.extended.num_workers,
            worker_index=self.extended.worker_index,
            replicas_per_worker=self._num_local,
            num_replicas_in_sync=self.num_replicas_in_sync,
            options=options,
        )
        return self._feed(source, options)

    experimental_distribute_datasets_from_function = distribute_datasets_from_function

    def _feed(self, source: StepSource, options: InputOptions | None) -> DistributedDataset:
        """The replicas' input from ``source``'s steps."""
        return DistributedDataset(
            source,
            self.extended.local_devices,
            options,
            self._agree,
            self._all_gather_objects,
            always_wrap=self._always_wrap_input(),
        )

    def experimental_distribute_values_from_function(
        self, value_fn: Callable[[ValueContext], Any]
    ) -> Any:
        """``PerReplica`` of ``value_fn(ValueContext(replica_id, num_replicas_in_sync))``."""
        values = []
        for local in range(self._num_local):
            replica_id = self.extended.first_replica_id + local
            with self._device_scope(local):
                values.append(value_fn(ValueContext(replica_id, self.num_replicas_in_sync)))
        return values[0] if len(values) == 1 else PerReplica(values)

    distribute_values_from_function = experimental_distribute_values_from_function

    def _always_wrap_input(self) -> bool:
        """Whether input steps are PerReplica even with one local replica (TF wraps them under
        a synchronous multi-worker strategy)."""
        return False

    def _agree(self, local_has_data: bool) -> bool:
        """Whether any worker still has data; with one worker, this worker's answer."""
        return local_has_data

    def _all_gather_objects(self, obj: Any) -> list[Any]:
        """Every worker's picklable ``obj`` in worker order; with one worker, ``[obj]``."""
        return [obj]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} devices={list(self.extended.worker_devices)}>"


def _per_replica_copies(result: torch.Tensor, parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """``result`` for each replica: the first gets it, the others a copy on their value's
    device, so that no replica's change reaches another's."""
    return [result] + [result.to(p.device, copy=True) for p in parts[1:]]


def _per_replica_results(
    combine_leaf: Callable[..., list[torch.Tensor]], values: list[Any]
) -> list[Any]:
    """Applies ``combine_leaf`` to the replicas' leaves, position by position; returns each
    replica's structure of results."""
    leaves, treedef = optree.tree_flatten(values[0], none_is_leaf=True)
    columns = [leaves] + [optree.tree_leaves(v, none_is_leaf=True) for v in values[1:]]
    combined = [combine_leaf(*column) for column in zip(*columns, strict=True)]
    return [
        optree.tree_unflatten(treedef, [results[local] for results in combined])
        for local in range(len(values))
    ]


def warn_if_in_cluster(strategy: Strategy) -> None:
    """Warns that a single-process strategy trains alone where ``TF_CONFIG`` or torchrun's
    environment names several workers (a ported script that forgot to switch strategy)."""
    from feedline.distribute.cluster_resolver import multi_worker_environment

    workers = multi_worker_environment()
    if workers > 1:
        warnings.warn(
            f"the environment (TF_CONFIG or torchrun) names {workers} workers, but "
            f"{type(strategy).__name__} trains in this process alone; use "
            "feedline.distribute.MultiWorkerMirroredStrategy to train with all of them",
            UserWarning,
            stacklevel=3,
        )


def _check_dataset(dataset: Any, method: str) -> None:
    if isinstance(dataset, DistributedDataset):
        raise InvalidArgumentError(
            f"{method}: the dataset is already distributed; distribute the feedline.data.Dataset "
            "it came from once"
        )
    if not isinstance(dataset, Dataset):
        raise TypeError(f"{method} expects a feedline.data.Dataset, got {type(dataset).__name__}")


class _DefaultStrategy(Strategy):
    """The strategy in effect outside any scope: one replica on the CPU (or current GPU)."""

    @contextmanager
    def scope(self) -> Iterator[Strategy]:
        yield self


@functools.cache
def default_strategy() -> Strategy:
    return _DefaultStrategy(StrategyExtended((ReplicaDevice("cpu", 0),)))


context.set_default_strategy(default_strategy)


def get_strategy() -> Strategy:
    """The strategy in scope, or the default one-replica strategy."""
    return context.get_strategy()


# The scope that experimental_set_strategy entered and has not left.
_set_scope: AbstractContextManager[Strategy] | None = None


def experimental_set_strategy(strategy: Strategy | None) -> None:
    """Makes ``strategy`` current as ``with strategy.scope():`` would, until the next call;
    None goes back to the default strategy (``tf.distribute.experimental_set_strategy``).
    Like a scope, it holds for this thread.

    Raises:
      RuntimeError: called inside a ``with strategy.scope()`` block.
    """
    global _set_scope
    if context.strategy_in_scope() is not None and _set_scope is None:
        raise RuntimeError(
            "experimental_set_strategy must not be called inside a strategy's scope; leave the "
            "`with strategy.scope():` block first"
        )
    if _set_scope is not None:
        scope, _set_scope = _set_scope, None
        scope.__exit__(None, None, None)
    if strategy is not None:
        scope = strategy.scope()
        scope.__enter__()
        _set_scope = scope


def _check_run_arguments(args: Any, kwargs: Any, options: Any) -> None:
    if not isinstance(args, list | tuple):
        raise ValueError(
            f"positional args must be a list or tuple, got {type(args).__name__} (a single "
            "argument is args=(x,), not args=(x))"
        )
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ValueError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    if options is not None and not isinstance(options, RunOptions):
        raise TypeError(f"options must be a RunOptions or None, got {type(options).__name__}")


def _axes(axis: Any) -> tuple[int, ...] | None:
    """``reduce``'s ``axis``: None, an int, or a tuple or list of ints (TensorFlow's forms)."""
    if axis is None:
        return None
    if isinstance(axis, list | tuple):
        return tuple(int(a) for a in axis)
    return (int(axis),)


def _check_same_shapes(shapes: Sequence[torch.Size], what: str) -> None:
    """InvalidArgumentError unless every replica's value has one shape: adding broadcasts."""
    if any(shape != shapes[0] for shape in shapes[1:]):
        listed = ", ".join(str(tuple(shape)) for shape in shapes)
        raise InvalidArgumentError(
            f"{what}: the replicas' values have different shapes ({listed}); they must be the "
            "same on every replica (a partial batch: reduce with axis=0, or gather)"
        )
