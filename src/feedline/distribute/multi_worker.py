"""``MultiWorkerMirroredStrategy``: synchronous replicas across processes and machines.

Every worker process runs the same program. The cluster comes from a cluster resolver
(``TF_CONFIG``, torchrun's environment, or one given explicitly); the workers join one
``torch.distributed`` process group (gloo on CPU, NCCL on GPU) whose rendezvous is the chief's
address (else worker 0's). On top of it, feedline keeps the seeds' semantics:

* ``experimental_distribute_dataset`` auto-shards the dataset over workers by its
  ``AutoShardPolicy`` and cuts each global batch into per-replica slices;
* end of data is agreed: each step all-reduces whether any worker still has data, so a worker
  whose shard ends first feeds its replicas empty batches and every worker stops at the same step;
* models and optimizers made under ``scope()`` are mirrored over every replica of every worker
  (``collective_mirroring``); ``reduce``, ``gather`` and ``feedline.metrics`` results are global.

Example (``torchrun --nproc-per-node 2 train.py``)::

    strategy = MultiWorkerMirroredStrategy()
    dist = strategy.experimental_distribute_dataset(fd.Dataset.range(12).batch(4))
    for step in dist:      # worker 0: [0, 1], [4, 5], [8, 9]; worker 1: [2, 3], [6, 7], [10, 11]
        ...
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from feedline.distribute import cluster_resolver as resolvers
from feedline.distribute._devices import ReplicaDevice, parse_devices
from feedline.distribute.collective import DEFAULT_TIMEOUT_SECONDS, Collective
from feedline.distribute.collective_mirroring import CollectiveMirroring
from feedline.distribute.elastic import ElasticClusterResolver, ElasticCollective, Generation
from feedline.distribute.mirroring import Mirroring
from feedline.distribute.strategy import RunOptions, Strategy, StrategyExtended
from feedline.errors import FailedPreconditionError, InvalidArgumentError, MembershipChangedError


class CommunicationImplementation(enum.Enum):
    """Which collectives carry the all-reduces: AUTO (NCCL on GPUs, else gloo), RING (gloo's
    ring all-reduce), NCCL."""

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"

    @classmethod
    def parse(cls, value: CommunicationImplementation | str) -> CommunicationImplementation:
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        raise InvalidArgumentError(
            f"implementation must be a CommunicationImplementation (AUTO, RING, NCCL), got "
            f"{value!r}"
        )


@dataclasses.dataclass(frozen=True)
class CommunicationOptions:
    """How workers communicate (``tf.distribute.experimental.CommunicationOptions``).

    Args:
      bytes_per_pack: the size of one gradient bucket; 0 lets feedline choose (25 MiB).
      timeout_seconds: how long a rendezvous or a collective waits for the slowest worker
        before it fails; None means 300 s.
      implementation: AUTO, RING (gloo) or NCCL.
    """

    bytes_per_pack: int = 0
    timeout_seconds: float | None = None
    implementation: CommunicationImplementation | str = CommunicationImplementation.AUTO

    def __post_init__(self) -> None:
        if isinstance(self.bytes_per_pack, bool) or not isinstance(self.bytes_per_pack, int):
            raise InvalidArgumentError(
                f"bytes_per_pack must be an int, got {self.bytes_per_pack!r}"
            )
        if self.bytes_per_pack < 0:
            raise InvalidArgumentError(f"bytes_per_pack must be >= 0, got {self.bytes_per_pack}")
        if self.timeout_seconds is not None and not self.timeout_seconds > 0:
            raise InvalidArgumentError(
                f"timeout_seconds must be positive or None, got {self.timeout_seconds!r}"
            )
        object.__setattr__(
            self, "implementation", CommunicationImplementation.parse(self.implementation)
        )


class MultiWorkerMirroredStrategy(Strategy):
    """Synchronous training on every replica of every worker process.

    Args:
      cluster_resolver: where the cluster is described; None reads ``TF_CONFIG``, else
        torchrun's environment, else trains as a single worker.
      communication_options: a ``CommunicationOptions``.
      devices: this worker's replicas; None means one GPU per process where CUDA is available
        (``cuda:LOCAL_RANK``), else one CPU replica. Logical CPU replicas (``["cpu:0",
        "cpu:1"]``) give several replicas per worker on one machine.

    Raises:
      UnavailableError: the workers could not meet within ``timeout_seconds``; the message
        names the rendezvous address and every worker's address.
    """

    def __init__(
        self,
        cluster_resolver: resolvers.ClusterResolver | None = None,
        communication_options: CommunicationOptions | None = None,
        *,
        devices: Sequence[str] | None = None,
    ) -> None:
        self._resolver = resolvers.resolve(cluster_resolver)
        self._options = communication_options or CommunicationOptions()
        local = parse_devices(list(devices)) if devices is not None else _default_devices()
        self._collective: Collective | None = None
        self._elastic: ElasticCollective | None = None
        if isinstance(self._resolver, ElasticClusterResolver):
            backend = _backend(self._options.implementation, local)  # type: ignore[arg-type]
            device = (
                torch.device("cuda", torch.cuda.current_device())
                if backend == "nccl"
                else torch.device("cpu")
            )
            self._elastic = self._collective = ElasticCollective(self._resolver, backend, device)
            self._elastic.on_reform.append(self._after_reform)
            super().__init__(
                StrategyExtended(
                    local, num_workers=self._elastic.world_size, worker_index=self._elastic.rank
                )
            )
            return
        world_size, rank, host, port = resolvers.sync_group(self._resolver)
        torchrun = isinstance(self._resolver, resolvers.TorchrunClusterResolver)
        warning = resolvers.shared_store_warning(os.environ) if torchrun and rank == 0 else None
        if warning is not None:
            logging.getLogger(__name__).warning(warning)
        if world_size > 1:
            self._collective = Collective(
                rank=rank,
                world_size=world_size,
                host=host,
                port=port,
                backend=_backend(self._options.implementation, local),  # type: ignore[arg-type]
                timeout_seconds=self._options.timeout_seconds or DEFAULT_TIMEOUT_SECONDS,
                addresses=_addresses(self._resolver, world_size),
                use_env=torchrun,
            )
        super().__init__(StrategyExtended(local, num_workers=world_size, worker_index=rank))

    @property
    def cluster_resolver(self) -> resolvers.ClusterResolver:
        return self._resolver

    @property
    def communication_options(self) -> CommunicationOptions:
        return self._options

    @property
    def mirrors_replicas(self) -> bool:
        return self._elastic is not None or self.num_replicas_in_sync > 1

    # -- elastic membership ----------------------------------------------------------------
    @property
    def elastic(self) -> ElasticCollective | None:
        """The elastic group (its ``generation``, ``committed`` steps), or None when the
        cluster is fixed (no ``ElasticClusterResolver``)."""
        return self._elastic

    def reform(self, step: int | None = None) -> int:
        """After a ``MembershipChangedError``: meets the workers that remain, and any that
        asked to join, in a new process group, and returns the training loop's step count
        that the group agrees on (that of the worker with the most committed steps, which
        the next ``strategy.run`` gives every worker its parameters and optimizer state).

        Args:
          step: this worker's loop step count, counting the failed step if this worker
            committed it (``strategy.elastic.committed`` rose); None: the committed steps.

        Raises:
          FailedPreconditionError: the strategy is not elastic, or the job's lineage differs.
          UnavailableError: fewer than ``min_workers`` met within the resolver's timeout.
        """
        elastic = self._elastic
        if elastic is None:
            raise FailedPreconditionError(
                "strategy.reform() needs an elastic MultiWorkerMirroredStrategy (made with an "
                "ElasticClusterResolver)"
            )
        elastic.reform(elastic.committed if step is None else step)
        return elastic.step

    def _after_reform(self, generation: Generation) -> None:
        self.extended.num_workers = generation.world_size
        self.extended.worker_index = generation.rank
        if "_mirroring" in self.__dict__:
            self._mirroring.forget_synced()  # type: ignore[attr-defined]

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict | None = None,
        options: RunOptions | None = None,
    ) -> Any:
        if self._elastic is None:
            return super().run(fn, args, kwargs, options)
        self._elastic.boundary()
        try:
            return super().run(fn, args, kwargs, options)
        except MembershipChangedError:
            self._mirroring.abort_run()  # the update of a failed step is never applied
            raise

    @functools.cached_property
    def _mirroring(self) -> Mirroring:
        if self._collective is None:
            return Mirroring(self)
        return CollectiveMirroring(self, self._collective, self._options.bytes_per_pack)

    # -- across workers --------------------------------------------------------------------
    def _sum_across_workers(self, value: torch.Tensor) -> torch.Tensor:
        if self._collective is None:
            return value
        return self._collective.all_reduce_sum(value)

    def _all_gather(self, local: torch.Tensor, axis: int) -> torch.Tensor:
        if self._collective is None:
            return local
        return self._collective.all_gather(local, axis)

    def _always_wrap_input(self) -> bool:
        return self.extended._in_multi_worker_mode()

    def _agree(self, local_has_data: bool) -> bool:
        if self._collective is None:
            return local_has_data
        return self._collective.agree(local_has_data)

    def _all_gather_objects(self, obj: Any) -> list[Any]:
        if self._collective is None:
            return [obj]
        return self._collective.all_gather_object(obj, "gathering every worker's input state")

    def __repr__(self) -> str:
        return (
            f"<MultiWorkerMirroredStrategy worker {self.extended.worker_index} of "
            f"{self.extended.num_workers}, devices={list(self.extended.worker_devices)}>"
        )


def _default_devices() -> tuple[ReplicaDevice, ...]:
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        return (ReplicaDevice("cuda", local_rank % torch.cuda.device_count()),)
    return (ReplicaDevice("cpu", 0),)


def _backend(
    implementation: CommunicationImplementation, devices: tuple[ReplicaDevice, ...]
) -> str:
    cuda = any(d.kind == "cuda" for d in devices)
    if implementation is CommunicationImplementation.NCCL:
        if not cuda:
            raise InvalidArgumentError(
                "CommunicationImplementation.NCCL needs CUDA replicas; this worker's replicas "
                f"are {[str(d) for d in devices]}: use AUTO or RING on CPU"
            )
        return "nccl"
    if implementation is CommunicationImplementation.RING or not cuda:
        return "gloo"
    torch.cuda.set_device(devices[0].index)
    return "nccl"


def _addresses(resolver: Any, world_size: int) -> list[str]:
    """Each rank's address as the cluster spec names it (for error messages)."""
    try:
        spec = resolver.cluster_spec()
        names = [
            spec.task_address(job, i)
            for job in ("chief", "worker")
            if job in spec.jobs
            for i in spec.task_indices(job)
        ]
    except (ValueError, KeyError, AttributeError):
        return []
    return names if len(names) == world_size and all(names) else []


class ExperimentalMultiWorkerMirroredStrategy(MultiWorkerMirroredStrategy):
    """``tf.distribute.experimental.MultiWorkerMirroredStrategy``: the same strategy with the
    signature TensorFlow keeps under ``experimental``, ``(communication, cluster_resolver)``.

    Args:
      communication: a ``CommunicationImplementation`` (``CollectiveCommunication``) or its
        name.
      cluster_resolver: as ``MultiWorkerMirroredStrategy``'s.
      devices: as ``MultiWorkerMirroredStrategy``'s.
    """

    def __init__(
        self,
        communication: CommunicationImplementation | str = CommunicationImplementation.AUTO,
        cluster_resolver: resolvers.ClusterResolver | None = None,
        *,
        devices: Sequence[str] | None = None,
    ) -> None:
        super().__init__(
            cluster_resolver, CommunicationOptions(implementation=communication), devices=devices
        )
