"""Cluster resolvers: which processes form the cluster, and which task this process is.

A cluster is described as TensorFlow describes it: a ``ClusterSpec`` of jobs (``chief``,
``worker``, ``ps``, ``evaluator``), each a list of ``host:port`` task addresses, and the task
(type, index) of the current process. A ``ClusterResolver`` finds both:

- ``TFConfigClusterResolver`` reads the ``TF_CONFIG`` environment variable,
- ``TorchrunClusterResolver`` reads the variables that ``torchrun`` sets (``RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR``, ...),
- ``SimpleClusterResolver`` holds what it is given.

``resolve()`` picks one the way strategies do, and ``sync_group()`` turns it into what
``torch.distributed`` needs for synchronous training: world size, rank and rendezvous address.

This module imports neither torch nor anything else outside the standard library (torch is
imported lazily, and only by ``num_accelerators``).

Example:
  >>> spec = ClusterSpec({"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"],
  ...                     "ps": ["p0:2222"]})
  >>> resolver = SimpleClusterResolver(spec, task_type="worker", task_id=1)
  >>> sync_group(resolver)
  SyncGroup(world_size=3, rank=2, rendezvous_host='c0', rendezvous_port=2222)
"""

from __future__ import annotations

import abc
import importlib
import importlib.util
import json
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from feedline.errors import FailedPreconditionError, InvalidArgumentError

__all__ = [
    "ClusterResolver",
    "ClusterSpec",
    "SimpleClusterResolver",
    "SyncGroup",
    "TFConfigClusterResolver",
    "TorchrunClusterResolver",
    "multi_worker_environment",
    "resolve",
    "sync_group",
]

_TF_CONFIG = "TF_CONFIG"
# The jobs that train synchronously, in rank order.
_SYNC_JOBS = ("chief", "worker")


class ClusterSpec:
    """A cluster: tasks organised into named jobs (TensorFlow's ``tf.train.ClusterSpec``).

    Each job is a list of task addresses (task ``i`` at position ``i``) or a sparse mapping from
    task index to address, for a process that does not need to know every task. A ClusterSpec
    is immutable; ``jobs`` are sorted by name.

    Args:
      cluster: a mapping ``{job_name: [address, ...]}`` or ``{job_name: {task_index: address}}``
        (task indices may be integer strings, as JSON object keys are), or another
        ``ClusterSpec`` to copy.

    Raises:
      TypeError: ``cluster`` is not a mapping or a ClusterSpec, a job name or an address is not
        a string, or a job's tasks are neither a list nor a mapping.
      InvalidArgumentError: a task index is not a non-negative integer or appears twice.

    Example:
      >>> spec = ClusterSpec({"worker": ["w0:2222", "w1:2222"], "ps": {1: "p1:2222"}})
      >>> spec
      ClusterSpec({'ps': {1: 'p1:2222'}, 'worker': ['w0:2222', 'w1:2222']})
      >>> spec.jobs, spec.num_tasks("worker"), spec.task_indices("ps")
      (['ps', 'worker'], 2, [1])
      >>> spec.task_address("worker", 1), spec.job_tasks("ps")
      ('w1:2222', [None, 'p1:2222'])
    """

    def __init__(self, cluster: Mapping[str, Any] | ClusterSpec) -> None:
        if isinstance(cluster, ClusterSpec):
            self._jobs: dict[str, dict[int, str]] = {
                job: dict(tasks) for job, tasks in cluster._jobs.items()
            }
            return
        if not isinstance(cluster, Mapping):
            raise TypeError(
                "`cluster` must be a mapping from job names to lists of network addresses (or "
                f"to {{task_index: address}} mappings), or a ClusterSpec; got "
                f"{type(cluster).__name__}"
            )
        jobs: dict[str, dict[int, str]] = {}
        for job, tasks in cluster.items():
            if not isinstance(job, str):
                raise TypeError(f"job name {job!r} must be a string")
            if isinstance(tasks, Sequence) and not isinstance(tasks, str):
                by_index = dict(enumerate(tasks))
            elif isinstance(tasks, Mapping):
                by_index = {}
                for key, address in tasks.items():
                    index = _task_index(job, key)
                    if index in by_index:
                        raise InvalidArgumentError(
                            f"task index {index} appears twice in job {job!r}"
                        )
                    by_index[index] = address
            else:
                raise TypeError(
                    f"the tasks of job {job!r} must be a list of addresses or a mapping from "
                    f"task indices to addresses; got {type(tasks).__name__}"
                )
            for address in by_index.values():
                if not isinstance(address, str):
                    raise TypeError(f"task address {address!r} of job {job!r} must be a string")
            jobs[job] = dict(sorted(by_index.items()))
        self._jobs = dict(sorted(jobs.items()))

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClusterSpec):
            return NotImplemented
        return self._jobs == other._jobs

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ClusterSpec({self.as_dict()!r})"

    def as_dict(self) -> dict[str, list[str] | dict[int, str]]:
        """Each job's tasks: a list when its indices are ``0..n-1``, else ``{index: address}``.

        Example:
          >>> ClusterSpec({"worker": {0: "w0:1", 1: "w1:1"}, "ps": {2: "p2:1"}}).as_dict()
          {'ps': {2: 'p2:1'}, 'worker': ['w0:1', 'w1:1']}
        """
        result: dict[str, list[str] | dict[int, str]] = {}
        for job, tasks in self._jobs.items():
            if tasks and list(tasks) == list(range(len(tasks))):
                result[job] = list(tasks.values())
            else:
                result[job] = dict(tasks)
        return result

    @property
    def jobs(self) -> list[str]:
        """The job names of this cluster, sorted."""
        return list(self._jobs)

    def num_tasks(self, job_name: str) -> int:
        """The number of tasks defined in ``job_name``.

        Raises:
          InvalidArgumentError: (a ValueError) no job is named ``job_name``.
        """
        return len(self._job(job_name))

    def task_indices(self, job_name: str) -> list[int]:
        """The task indices defined in ``job_name``, sorted.

        Raises:
          InvalidArgumentError: (a ValueError) no job is named ``job_name``.
        """
        return list(self._job(job_name))

    def task_address(self, job_name: str, task_index: int) -> str:
        """The address of task ``task_index`` of ``job_name``.

        Raises:
          InvalidArgumentError: (a ValueError) no job is named ``job_name``, or it has no task
            ``task_index``.

        Example:
          >>> ClusterSpec({"worker": ["w0:2222"]}).task_address("worker", 3)  # doctest: +ELLIPSIS
          Traceback (most recent call last):
          ...
          feedline.errors.InvalidArgumentError: No task with index 3 in job 'worker' ...
        """
        tasks = self._job(job_name)
        try:
            return tasks[task_index]
        except KeyError:
            raise InvalidArgumentError(
                f"No task with index {task_index!r} in job {job_name!r} (its task indices are "
                f"{list(tasks)})"
            ) from None

    def job_tasks(self, job_name: str) -> list[str | None]:
        """The addresses of ``job_name`` as a list indexed by task; ``None`` where a sparse job
        defines no task (so the length may exceed ``num_tasks``).

        Raises:
          InvalidArgumentError: (a ValueError) no job is named ``job_name``.
        """
        tasks = self._job(job_name)
        result: list[str | None] = [None] * (max(tasks) + 1 if tasks else 0)
        for index, address in tasks.items():
            result[index] = address
        return result

    def _job(self, job_name: str) -> dict[int, str]:
        try:
            return self._jobs[job_name]
        except KeyError:
            raise InvalidArgumentError(
                f"No such job in cluster: {job_name!r} (its jobs are {self.jobs})"
            ) from None


class ClusterResolver(abc.ABC):
    """Finds the cluster and the current task (TensorFlow's ``ClusterResolver``).

    Subclasses implement ``cluster_spec()`` and ``master()`` and call ``super().__init__()``.
    ``task_type``, ``task_id`` and ``rpc_layer`` are settable properties; ``environment`` is
    ``""`` (no managed environment) unless a subclass says otherwise.
    """

    def __init__(self) -> None:
        self._task_type: str | None = None
        self._task_id: int | None = None
        self._rpc_layer: str | None = None

    @abc.abstractmethod
    def cluster_spec(self) -> ClusterSpec:
        """The cluster: every job and its task addresses."""

    @abc.abstractmethod
    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """The address of a task (this one unless ``task_type`` and ``task_id`` are given),
        prefixed with ``rpc_layer + "://"`` when an RPC layer is given or configured."""

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: Any = None
    ) -> dict[str, int]:
        """The accelerators per task, by device type: ``{"GPU": 2}``, or ``{}`` on a CPU machine.

        Counts the GPUs this process sees, and assumes every task has as many (as TensorFlow's
        strategies do). torch is imported here, never at module import; without torch the count
        is ``{}``. ``task_type``, ``task_id`` and ``config_proto`` are accepted for
        compatibility.
        """
        del task_type, task_id, config_proto
        count = _local_gpu_count()
        return {"GPU": count} if count else {}

    @property
    def task_type(self) -> str | None:
        """The job of the current task (``"worker"``, ``"chief"``, ``"ps"``, ...), or None."""
        return self._state("_task_type")

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """The index of the current task within its job, or None."""
        return self._state("_task_id")

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        """The protocol tasks talk over (``"grpc"``), or None when unset."""
        return self._state("_rpc_layer")

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer

    @property
    def environment(self) -> str:
        """The environment the cluster runs in; ``""`` for an ordinary one."""
        return ""

    def _state(self, name: str) -> Any:
        try:
            return self.__dict__[name]
        except KeyError:
            raise FailedPreconditionError(
                f"{type(self).__name__}.__init__ did not call super().__init__(), so "
                f"ClusterResolver state {name!r} was never set"
            ) from None


class SimpleClusterResolver(ClusterResolver):
    """A resolver that returns what it was given (TensorFlow's ``SimpleClusterResolver``).

    Args:
      cluster_spec: the cluster.
      master: the address ``master()`` returns when no task is named.
      task_type: the current task's job.
      task_id: the current task's index.
      environment: returned by ``environment``.
      num_accelerators: returned by ``num_accelerators()``; None means ``{}``.
      rpc_layer: the default RPC layer of ``master()``.

    Raises:
      TypeError: ``cluster_spec`` is not a ClusterSpec or ``master`` is not a string.

    Example:
      >>> resolver = SimpleClusterResolver(ClusterSpec({"worker": ["w0:2222", "w1:2222"]}),
      ...                                  task_type="worker", task_id=0, rpc_layer="grpc")
      >>> resolver.master(), resolver.master("worker", 1), resolver.num_accelerators()
      ('', 'grpc://w1:2222', {})
    """

    def __init__(
        self,
        cluster_spec: ClusterSpec,
        master: str = "",
        task_type: str | None = None,
        task_id: int | None = None,
        environment: str = "",
        num_accelerators: Mapping[str, int] | None = None,
        rpc_layer: str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(cluster_spec, ClusterSpec):
            raise TypeError(
                f"cluster_spec must be a ClusterSpec, got {type(cluster_spec).__name__}; wrap a "
                "dict as ClusterSpec({...})"
            )
        if not isinstance(master, str):
            raise TypeError(f"master must be a string, got {type(master).__name__}")
        self._cluster_spec = cluster_spec
        self._master = master
        self._task_type = task_type
        self._task_id = task_id
        self._environment = environment
        self._num_accelerators = dict(num_accelerators) if num_accelerators is not None else None
        self._rpc_layer = rpc_layer

    def cluster_spec(self) -> ClusterSpec:
        """The ClusterSpec given at construction."""
        return self._cluster_spec

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """The named task's address if ``task_type`` and ``task_id`` are given, else the
        ``master`` given at construction; prefixed with the RPC layer if there is one."""
        if task_type is not None and task_id is not None:
            address = self._cluster_spec.task_address(task_type, task_id)
        else:
            address = self._master
        return _format_master(address, rpc_layer or self.rpc_layer)

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: Any = None
    ) -> dict[str, int]:
        """The ``num_accelerators`` given at construction, or ``{}``."""
        del task_type, task_id, config_proto
        return dict(self._num_accelerators or {})

    @property
    def environment(self) -> str:
        """The ``environment`` given at construction."""
        return self._environment


class _TFConfig(NamedTuple):
    """``TF_CONFIG``, parsed and checked."""

    cluster: ClusterSpec
    task_type: str | None
    task_index: int | None
    rpc_layer: str | None
    environment: str | None


class TFConfigClusterResolver(ClusterResolver):
    """A resolver that reads the ``TF_CONFIG`` environment variable, as TensorFlow's does.

    ``TF_CONFIG`` is a JSON object::

      {"cluster": {"chief": ["host:port"], "worker": ["host:port", ...], "ps": [...]},
       "task": {"type": "worker", "index": 0},
       "rpc_layer": "grpc",          # optional
       "environment": "cloud"}       # optional

    It is read again on every call, so a change of the variable is seen at once; a missing
    variable means an empty cluster and no task. A malformed value raises
    ``InvalidArgumentError`` naming the field: not JSON, ``cluster`` not an object, an address
    that is not ``host:port`` (IPv6 hosts in brackets: ``[::1]:2222``), ``task.type`` not a job
    of the cluster (an ``evaluator`` may be left out of the cluster, as TensorFlow allows), or
    ``task.index`` out of range for its job.

    Args:
      task_type: overrides ``task.type`` of ``TF_CONFIG``.
      task_id: overrides ``task.index``.
      rpc_layer: overrides ``rpc_layer``.
      environment: overrides ``environment``.

    Example:
      >>> os.environ["TF_CONFIG"] = json.dumps({
      ...     "cluster": {"worker": ["localhost:12345", "localhost:23456"],
      ...                 "ps": ["localhost:34567"]},
      ...     "task": {"type": "worker", "index": 0}})
      >>> resolver = TFConfigClusterResolver()
      >>> resolver.cluster_spec()
      ClusterSpec({'ps': ['localhost:34567'], 'worker': ['localhost:12345', 'localhost:23456']})
      >>> resolver.task_type, resolver.task_id, resolver.master(), resolver.master(rpc_layer="grpc")
      ('worker', 0, 'localhost:12345', 'grpc://localhost:12345')
      >>> del os.environ["TF_CONFIG"]
    """

    def __init__(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
        environment: str | None = None,
    ) -> None:
        super().__init__()
        self._task_type = task_type
        self._task_id = task_id
        self._rpc_layer = rpc_layer
        self._environment = environment

    def cluster_spec(self) -> ClusterSpec:
        """The ``cluster`` of ``TF_CONFIG`` (empty when it is unset or has no cluster)."""
        return _load_tf_config().cluster

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """The address of a task, by default this one, as ``rpc_layer://host:port`` (or
        ``host:port`` when no RPC layer is given or in ``TF_CONFIG``).

        As in TensorFlow, the answer is ``""`` when the cluster is empty or has a single task.

        Raises:
          InvalidArgumentError: the task is unknown (not in ``TF_CONFIG`` and not given).
        """
        spec = self.cluster_spec()
        if not spec or (len(spec.jobs) == 1 and spec.num_tasks(spec.jobs[0]) == 1):
            return ""
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        if task_type is None or task_id is None:
            raise InvalidArgumentError(
                "master() needs a task: TF_CONFIG has no 'task' with 'type' and 'index', and "
                "no task_type and task_id were given"
            )
        return _format_master(spec.task_address(task_type, task_id), rpc_layer or self.rpc_layer)

    @property
    def task_type(self) -> str | None:
        """The ``task_type`` given, else ``task.type`` of ``TF_CONFIG``, else None."""
        if self._state("_task_type") is not None:
            return str(self._task_type)
        return _load_tf_config().task_type

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        """The ``task_id`` given, else ``task.index`` of ``TF_CONFIG``, else None."""
        if self._state("_task_id") is not None:
            return int(self._task_id)  # type: ignore[arg-type]
        return _load_tf_config().task_index

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        """The ``rpc_layer`` given, else that of ``TF_CONFIG``, else None."""
        if self._state("_rpc_layer") is not None:
            return self._rpc_layer
        return _load_tf_config().rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer

    @property
    def environment(self) -> str:
        """The ``environment`` given, else that of ``TF_CONFIG``, else ``""``."""
        if self._environment is not None:
            return self._environment
        return _load_tf_config().environment or ""


class TorchrunClusterResolver(ClusterResolver):
    """A resolver for processes started by ``torchrun`` (or a launcher that sets its variables).

    Every process is a ``"worker"`` task with ``task_id = RANK``. The cluster spec is
    ``{"worker": [...]}`` with ``WORLD_SIZE`` tasks, but torchrun tells a process only one
    address: the rendezvous address ``MASTER_ADDR:MASTER_PORT``, hosted on rank 0's node. So task
    0's address is ``MASTER_ADDR:MASTER_PORT`` and every other task's address is ``""``
    (unknown); ``master()`` returns the rendezvous address, and ``master("worker", i)`` raises
    for ``i > 0``. The raw values are the properties ``rank``, ``world_size``, ``local_rank``,
    ``local_world_size``, ``group_rank``, ``master_addr`` and ``master_port``.

    The variables are read once, at construction. ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` are required (as ``torch.distributed``'s ``env://`` requires them);
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and ``GROUP_RANK`` are optional (None when unset).

    Raises:
      InvalidArgumentError: a required variable is missing, or a variable is not an integer in
        its range (the message names the variable and its value).

    Example:
      >>> env = {"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
      >>> os.environ.update(env)
      >>> resolver = TorchrunClusterResolver()
      >>> resolver.cluster_spec()
      ClusterSpec({'worker': ['10.0.0.1:29500', '', '']})
      >>> resolver.task_type, resolver.task_id, resolver.master()
      ('worker', 1, '10.0.0.1:29500')
      >>> for name in env:
      ...     del os.environ[name]
    """

    def __init__(self) -> None:
        super().__init__()
        self._world_size = _int_variable("WORLD_SIZE", minimum=1)
        self._rank = _int_variable("RANK", minimum=0, below=self._world_size)
        self._local_world_size = _optional_int_variable("LOCAL_WORLD_SIZE", minimum=1)
        self._local_rank = _optional_int_variable(
            "LOCAL_RANK", minimum=0, below=self._local_world_size
        )
        self._group_rank = _optional_int_variable("GROUP_RANK", minimum=0)
        self._master_addr = os.environ.get("MASTER_ADDR", "")
        if not self._master_addr:
            raise InvalidArgumentError(
                "environment variable MASTER_ADDR is not set: torchrun's rendezvous host is "
                "needed (torchrun sets it; without torchrun set it to rank 0's host)"
            )
        self._master_port = _int_variable("MASTER_PORT", minimum=1, below=65536)
        self._task_type = "worker"
        self._task_id = self._rank

    def cluster_spec(self) -> ClusterSpec:
        """``{"worker": [MASTER_ADDR:MASTER_PORT, "", ...]}`` with ``WORLD_SIZE`` tasks; ``""``
        marks an address that torchrun does not tell."""
        rendezvous = _join_address(self._master_addr, self._master_port)
        return ClusterSpec({"worker": [rendezvous] + [""] * (self._world_size - 1)})

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """The rendezvous address ``MASTER_ADDR:MASTER_PORT`` (the address of worker 0).

        Raises:
          InvalidArgumentError: a task other than worker 0 is named; torchrun does not tell its
            address.
        """
        rendezvous = _join_address(self._master_addr, self._master_port)
        address = rendezvous
        if task_type is not None and task_id is not None:
            address = self.cluster_spec().task_address(task_type, task_id)
            if not address:
                raise InvalidArgumentError(
                    f"torchrun does not tell the address of {task_type} {task_id}; only rank 0's "
                    f"rendezvous address ({rendezvous}) is known"
                )
        return _format_master(address, rpc_layer or self.rpc_layer)

    @property
    def rank(self) -> int:
        """``RANK``: this process's rank among all ``WORLD_SIZE`` processes."""
        return self._rank

    @property
    def world_size(self) -> int:
        """``WORLD_SIZE``: the number of processes."""
        return self._world_size

    @property
    def local_rank(self) -> int | None:
        """``LOCAL_RANK``: this process's rank on its node, or None when unset."""
        return self._local_rank

    @property
    def local_world_size(self) -> int | None:
        """``LOCAL_WORLD_SIZE``: the number of processes on this node, or None when unset."""
        return self._local_world_size

    @property
    def group_rank(self) -> int | None:
        """``GROUP_RANK``: the rank of this node, or None when unset."""
        return self._group_rank

    @property
    def master_addr(self) -> str:
        """``MASTER_ADDR``: the rendezvous host."""
        return self._master_addr

    @property
    def master_port(self) -> int:
        """``MASTER_PORT``: the rendezvous port."""
        return self._master_port


class SyncGroup(NamedTuple):
    """The processes that train synchronously, as ``torch.distributed`` needs them.

    Attributes:
      world_size: the number of processes in the group.
      rank: this process's rank in it.
      rendezvous_host: the host all of them meet at (the store's host).
      rendezvous_port: its port; 0 for a group of one, which needs no rendezvous.
    """

    world_size: int
    rank: int
    rendezvous_host: str
    rendezvous_port: int


def sync_group(resolver: ClusterResolver) -> SyncGroup:
    """The synchronous-training group of ``resolver``'s cluster, and this task's rank in it.

    The group is the ``chief`` task (if any) then the ``worker`` tasks, in that order; ``ps`` and
    ``evaluator`` tasks are not in it. The chief has rank 0 and worker ``i`` has rank
    ``i + 1`` with a chief, ``i`` without. The group meets at the chief's address, else at
    worker 0's (for torchrun that is ``MASTER_ADDR:MASTER_PORT``). An empty cluster (no
    ``TF_CONFIG``, no torchrun) is a group of one: ``SyncGroup(1, 0, "127.0.0.1", 0)``.

    For ``{"chief": [c0], "worker": [w0, w1], "ps": [p0]}``::

      chief 0:  SyncGroup(3, 0, c0's host, c0's port)
      worker 0: SyncGroup(3, 1, c0's host, c0's port)
      worker 1: SyncGroup(3, 2, c0's host, c0's port)
      ps 0:     InvalidArgumentError

    Raises:
      InvalidArgumentError: the task is not in the group (a ``ps`` or ``evaluator``, or no
        task at all), the cluster has no chief or worker, more than one chief, sparse task
        indices in a synchronous job, or a rendezvous address that is not ``host:port``.

    Example:
      >>> spec = ClusterSpec({"worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"]})
      >>> sync_group(SimpleClusterResolver(spec, task_type="worker", task_id=1))
      SyncGroup(world_size=2, rank=1, rendezvous_host='w0', rendezvous_port=2222)
    """
    spec = resolver.cluster_spec()
    if not spec:
        return SyncGroup(1, 0, "127.0.0.1", 0)
    counts = _sync_job_counts(spec)
    if not any(counts.values()):
        raise InvalidArgumentError(
            f"the cluster has no chief or worker task to train synchronously: {spec}"
        )
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type is None or task_id is None:
        raise InvalidArgumentError(
            f"the current task is unknown (task_type={task_type!r}, task_id={task_id!r}); "
            "set 'task' in TF_CONFIG or pass task_type and task_id to the cluster resolver"
        )
    if task_type not in _SYNC_JOBS:
        raise InvalidArgumentError(
            f"task {task_type!r} {task_id} is not in the synchronous training group, which is "
            "the chief then the workers; ps and evaluator tasks do not train in sync"
        )
    if not 0 <= task_id < counts[task_type]:
        raise InvalidArgumentError(
            f"task index {task_id} is out of range for job {task_type!r} with "
            f"{counts[task_type]} tasks"
        )
    rank = task_id + (counts["chief"] if task_type == "worker" else 0)
    leader = "chief" if counts["chief"] else "worker"
    host, port = _split_address(spec.task_address(leader, 0), f"the address of {leader} 0")
    return SyncGroup(sum(counts.values()), rank, host, port)


def shared_store_warning(environ: Mapping[str, str]) -> str | None:
    """What a worker says when torchrun's environment ``environ`` may leave a later node
    waiting for ever, or None.

    torch's c10d rendezvous shares its agent's store with the workers unless
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``; an agent that then joins a later round of the
    rendezvous (a node added, or one replacing a lost node) waits for ever for the first round's
    store (pytorch#135712). Workers see the sharing (``TORCHELASTIC_USE_AGENT_STORE``), not the
    rendezvous: they speak up where the job restarts (``--max-restarts`` > 0) and spans nodes or
    names a rendezvous (a run id other than torchrun's default ``none``), unless it is
    ``--standalone``'s own (``localhost`` and a random run id): no other node joins that one.
    """
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    try:
        restarts = int(environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
        nodes = int(environ.get("GROUP_WORLD_SIZE", "1"))
    except ValueError:
        return None
    run_id = environ.get("TORCHELASTIC_RUN_ID", "none")
    if restarts < 1 or (nodes < 2 and (run_id == "none" or _standalone(environ, run_id))):
        return None
    return (
        "torchrun's agents share their rendezvous store with the workers: an agent that joins "
        "a later round of the rendezvous (a node added under --nnodes MIN:MAX, or one that "
        "replaces a lost node) will wait for ever (pytorch#135712). Launch with `feedline "
        "torchrun` instead of `torchrun`, or set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 where the "
        "agents start"
    )


def _standalone(environ: Mapping[str, str], run_id: str) -> bool:
    """Whether the rendezvous is ``torchrun --standalone``'s: on ``localhost``, named by a
    random UUID."""
    try:
        uuid.UUID(run_id)
    except ValueError:
        return False
    return environ.get("MASTER_ADDR") == "localhost"


def resolve(cluster_resolver: ClusterResolver | None = None) -> ClusterResolver:
    """The cluster resolver a strategy uses when given ``cluster_resolver`` (None: find one).

    In order: ``cluster_resolver`` itself; a ``TFConfigClusterResolver`` when ``TF_CONFIG`` is
    set and its cluster is not empty; a ``TorchrunClusterResolver`` when ``RANK`` and
    ``WORLD_SIZE`` are set; else a single process, as TensorFlow's strategies see it without
    ``TF_CONFIG``: ``SimpleClusterResolver(ClusterSpec({}))``, with task_type and task_id None.

    Raises:
      TypeError: ``cluster_resolver`` is not a ClusterResolver.
      InvalidArgumentError: ``TF_CONFIG`` or torchrun's variables are malformed.

    Example:
      >>> resolver = resolve()  # a plain ``python train.py``
      >>> resolver.cluster_spec(), resolver.task_type, resolver.task_id
      (ClusterSpec({}), None, None)
    """
    if cluster_resolver is not None:
        if not isinstance(cluster_resolver, ClusterResolver):
            raise TypeError(
                "cluster_resolver must be a feedline.distribute.cluster_resolver."
                f"ClusterResolver, got {type(cluster_resolver).__name__}"
            )
        return cluster_resolver
    if _load_tf_config().cluster:
        return TFConfigClusterResolver()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return TorchrunClusterResolver()
    return SimpleClusterResolver(ClusterSpec({}))


def multi_worker_environment() -> int:
    """The number of training processes that the environment names: the chief and worker tasks
    of a non-empty ``TF_CONFIG`` cluster, else torchrun's ``WORLD_SIZE``, else 1.

    A single-process strategy uses it to warn that it trains alone in a multi-worker job.

    Raises:
      InvalidArgumentError: ``TF_CONFIG`` is malformed or ``WORLD_SIZE`` is not a positive
        integer.

    Example:
      >>> multi_worker_environment()  # neither TF_CONFIG nor torchrun
      1
    """
    spec = _load_tf_config().cluster
    if spec:
        return sum(_sync_job_counts(spec).values())
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _int_variable("WORLD_SIZE", minimum=1)
    return 1


def _sync_job_counts(spec: ClusterSpec) -> dict[str, int]:
    """Tasks of the chief and worker jobs, checked to be dense, with at most one chief."""
    counts = {}
    for job in _SYNC_JOBS:
        indices = spec.task_indices(job) if job in spec.jobs else []
        if indices != list(range(len(indices))):
            raise InvalidArgumentError(
                f"job {job!r} has task indices {indices}; synchronous training needs tasks "
                f"0..n-1 with none missing"
            )
        counts[job] = len(indices)
    if counts["chief"] > 1:
        raise InvalidArgumentError(
            f"the cluster has {counts['chief']} chief tasks; there can be at most one"
        )
    return counts


def _load_tf_config() -> _TFConfig:
    """Reads ``TF_CONFIG`` (unset or blank: empty) and checks every field it uses."""
    raw = os.environ.get(_TF_CONFIG, "")
    if not raw.strip():
        return _TFConfig(ClusterSpec({}), None, None, None, None)
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as error:
        start = raw[:60] + ("..." if len(raw) > 60 else "")
        raise InvalidArgumentError(
            f"TF_CONFIG is not valid JSON ({error.msg} at char {error.pos}); it starts with "
            f"{start!r}"
        ) from None
    if not isinstance(config, dict):
        raise InvalidArgumentError(
            f"TF_CONFIG must be a JSON object with 'cluster' and 'task', got "
            f"{type(config).__name__}"
        )
    cluster = config.get("cluster", {})
    if not isinstance(cluster, dict):
        raise InvalidArgumentError(
            "TF_CONFIG field 'cluster' must be an object mapping job names to lists of "
            f"'host:port' addresses, got {type(cluster).__name__}: {cluster!r}"
        )
    try:
        spec = ClusterSpec(cluster)
    except (TypeError, InvalidArgumentError) as error:
        raise InvalidArgumentError(f"TF_CONFIG field 'cluster' is malformed: {error}") from None
    for job in spec.jobs:
        for index in spec.task_indices(job):
            _split_address(
                spec.task_address(job, index), f"TF_CONFIG field 'cluster.{job}[{index}]'"
            )
    task = config.get("task", {})
    if not isinstance(task, dict):
        raise InvalidArgumentError(
            "TF_CONFIG field 'task' must be an object like {'type': 'worker', 'index': 0}, got "
            f"{task!r}"
        )
    task_type = task.get("type")
    if task_type is not None and not isinstance(task_type, str):
        raise InvalidArgumentError(
            f"TF_CONFIG field 'task.type' must be a job name, got {task_type!r}"
        )
    task_index = None if task.get("index") is None else _tf_config_index(task["index"])
    if spec and task_type is not None:
        _check_task(spec, task_type, task_index)
    return _TFConfig(
        spec,
        task_type,
        task_index,
        _optional_string(config, "rpc_layer"),
        _optional_string(config, "environment"),
    )


def _check_task(spec: ClusterSpec, task_type: str, task_index: int | None) -> None:
    if task_type not in spec.jobs:
        # TensorFlow lets an evaluator stay out of the cluster it evaluates.
        if task_type == "evaluator":
            return
        raise InvalidArgumentError(
            f"TF_CONFIG field 'task.type' is {task_type!r}, which is not a job of 'cluster' "
            f"(its jobs are {spec.jobs})"
        )
    if task_index is None:
        raise InvalidArgumentError(
            f"TF_CONFIG field 'task.index' is missing (task.type is {task_type!r})"
        )
    if task_index not in spec.task_indices(task_type):
        raise InvalidArgumentError(
            f"TF_CONFIG field 'task.index': task index {task_index} is out of range for job "
            f"{task_type!r} with {spec.num_tasks(task_type)} tasks"
        )


def _tf_config_index(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidArgumentError(
            f"TF_CONFIG field 'task.index' must be an integer, got {value!r}"
        )
    try:
        index = int(value)
    except ValueError:
        raise InvalidArgumentError(
            f"TF_CONFIG field 'task.index' must be an integer, got {value!r}"
        ) from None
    if index < 0:
        raise InvalidArgumentError(f"TF_CONFIG field 'task.index' must be >= 0, got {index}")
    return index


def _optional_string(config: dict[str, Any], key: str) -> str | None:
    value = config.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidArgumentError(f"TF_CONFIG field {key!r} must be a string, got {value!r}")
    return value


def _task_index(job: str, key: object) -> int:
    if isinstance(key, bool) or not isinstance(key, int | str):
        raise InvalidArgumentError(f"task index {key!r} of job {job!r} must be an integer")
    try:
        index = int(key)
    except ValueError:
        raise InvalidArgumentError(
            f"task index {key!r} of job {job!r} must be an integer"
        ) from None
    if index < 0:
        raise InvalidArgumentError(f"task index {index} of job {job!r} must be >= 0")
    return index


def _split_address(address: str, what: str) -> tuple[str, int]:
    """``"host:port"`` (``"[v6]:port"``) as ``(host, port)``; ``what`` names it in errors."""
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        host = ""  # an IPv6 host must be in brackets
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidArgumentError(
            f"{what} is {address!r}, which is not a 'host:port' address (port 0-65535; an IPv6 "
            "host in brackets, as '[::1]:2222')"
        )
    return host, int(port)


def _join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _format_master(address: str, rpc_layer: str | None) -> str:
    """``rpc_layer://address``; an empty address (no master) stays empty."""
    return f"{rpc_layer}://{address}" if rpc_layer and address else address


def _int_variable(name: str, *, minimum: int, below: int | None = None) -> int:
    """The integer environment variable ``name``, checked to be in ``[minimum, below)``."""
    raw = os.environ.get(name, "")
    if not raw:
        raise InvalidArgumentError(
            f"environment variable {name} is not set; torchrun sets RANK, WORLD_SIZE, "
            "MASTER_ADDR and MASTER_PORT (set them yourself when starting processes another "
            "way)"
        )
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgumentError(
            f"environment variable {name}={raw!r} is not an integer"
        ) from None
    if value < minimum or (below is not None and value >= below):
        upper = f" and < {below}" if below is not None else ""
        raise InvalidArgumentError(
            f"environment variable {name}={value} is out of range: it must be >= {minimum}{upper}"
        )
    return value


def _optional_int_variable(name: str, *, minimum: int, below: int | None = None) -> int | None:
    """Like ``_int_variable``, but None when ``name`` is unset."""
    if not os.environ.get(name):
        return None
    return _int_variable(name, minimum=minimum, below=below)


def _local_gpu_count() -> int:
    """The GPUs torch sees; 0 without torch. torch is imported only here."""
    torch = sys.modules.get("torch")
    if torch is None:
        if importlib.util.find_spec("torch") is None:
            return 0
        torch = importlib.import_module("torch")
    return int(torch.cuda.device_count())
