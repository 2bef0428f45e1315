"""What the data service's processes agree on: service names, incarnation ids, the workers of
this process, and the shapes of the messages they exchange.

The dispatcher (``dispatcher/``), the workers (``worker/``) and the consumers in a training
process (``client/``) never import one another's servers; they meet here. Every RPC is a frame
of ``feedline._net.wire`` whose header is a JSON object; the dataclasses below are those
headers, built by the side that sends and read (and checked) by the side that receives, so that
a field has one name and one type in one place.

Ids. A dispatcher draws a random *incarnation* at each start (kept across restarts by its
journal); every job, task and consumer id it makes is ``incarnation << INCARNATION_SHIFT |
counter``, so that workers and consumers recognise what belongs to an earlier life of a
restarted dispatcher (``incarnation_of``).
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from typing import Any, Self

from feedline._net.rpc import field
from feedline.errors import InvalidArgumentError

__all__ = [
    "DISPATCHER_SERVICE",
    "INCARNATION_SHIFT",
    "MAX_DATASET_BYTES",
    "WORKER_SERVICE",
    "incarnation_of",
    "local_worker_addresses",
    "new_incarnation",
    "register_local_worker",
    "unregister_local_worker",
]

#: The gRPC service of the dispatcher (``/feedline.service.Dispatcher/<Method>``).
DISPATCHER_SERVICE = "feedline.service.Dispatcher"
#: The gRPC service of a worker (``/feedline.service.Worker/GetElements``).
WORKER_SERVICE = "feedline.service.Worker"
#: The largest RegisterDataset request (the pickled dataset and its element spec). Every other
#: request is a small control message (``feedline._net.rpc.DEFAULT_MAX_REQUEST_BYTES``).
MAX_DATASET_BYTES = 256 << 20

#: Job, task and consumer ids are ``incarnation << INCARNATION_SHIFT | counter``.
INCARNATION_SHIFT = 32


def new_incarnation() -> int:
    """A random, non-zero dispatcher incarnation (31 bits: ids stay below 2**63)."""
    return secrets.randbits(31) | 1


def incarnation_of(some_id: int) -> int:
    """The incarnation of the dispatcher life that made the job, task or consumer ``some_id``."""
    return some_id >> INCARNATION_SHIFT


# -- the workers of this process ---------------------------------------------------------------
# A consumer with ``target_workers="LOCAL"`` reads only from workers running in its own process;
# a worker adds its address here when it serves and removes it when it stops.
_local_lock = threading.Lock()
_local_addresses: set[str] = set()


def local_worker_addresses() -> frozenset[str]:
    """The addresses of the workers running in this process (``target_workers="LOCAL"``)."""
    with _local_lock:
        return frozenset(_local_addresses)


def register_local_worker(address: str) -> None:
    """Marks ``address`` as a worker serving in this process."""
    with _local_lock:
        _local_addresses.add(address)


def unregister_local_worker(address: str) -> None:
    """Forgets ``address`` (a stopped worker); unknown addresses are ignored."""
    with _local_lock:
        _local_addresses.discard(address)


# -- messages to the dispatcher -----------------------------------------------------------------
# The requests of RegisterDataset, GetDatasetDef, GetElementSpec, GetOrCreateJob, ClientHeartbeat,
# ReleaseClient, WorkerHeartbeat and GetSplit, as the dispatcher reads them.

__all__ += [
    "TARGET_WORKERS",
    "ClientHeartbeatRequest",
    "GetDatasetDefRequest",
    "GetElementSpecRequest",
    "GetOrCreateJobRequest",
    "GetSplitRequest",
    "RegisterDatasetRequest",
    "ReleaseClientRequest",
    "WorkerHeartbeatRequest",
]

#: What ``target_workers`` a job may ask for.
TARGET_WORKERS = ("AUTO", "ANY", "LOCAL")


def _dataset_id(header: dict[str, Any]) -> str:
    """``header["dataset_id"]``, a string."""
    dataset_id = header.get("dataset_id")
    if not isinstance(dataset_id, str):
        raise InvalidArgumentError(f"dataset_id must be a string, got {dataset_id!r}")
    return dataset_id


def _ints(header: dict[str, Any], name: str) -> tuple[int, ...]:
    """``header[name]``, a list of ints (missing: empty)."""
    values = field(header, name, list, [])
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise InvalidArgumentError(
            f"malformed request: {name} must be a list of ints, got {values!r}"
        )
    return tuple(values)


@dataclasses.dataclass(frozen=True)
class RegisterDatasetRequest:
    """RegisterDataset: the facts of a dataset; its pickled description and its pickled element
    spec are the upload's two buffers.

    Attributes:
      compression: ``"AUTO"`` or None.
      cardinality: the dataset's cardinality (``-1``: infinite).
      split_plan: the JSON of its ``SplitPlan``, None when its source does not split.
      dataset_id: the id the client asks for; None lets the dispatcher choose.
    """

    compression: str | None
    cardinality: int
    split_plan: dict[str, Any] | None
    dataset_id: str | None = None

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self:
        """The request in ``header``.

        Raises:
          InvalidArgumentError: a field is missing, mistyped or out of range.
        """
        compression = field(header, "compression", (str, type(None)))
        if compression not in ("AUTO", None):
            raise InvalidArgumentError(f"compression must be 'AUTO' or None, got {compression!r}")
        cardinality = field(header, "cardinality", int)
        plan = field(header, "split_plan", (dict, type(None)))
        dataset_id = field(header, "dataset_id", (str, type(None)), None)
        if dataset_id is not None and not dataset_id:
            raise InvalidArgumentError("dataset_id must be a non-empty string")
        return cls(compression, cardinality, plan, dataset_id)

    def to_header(self) -> dict[str, Any]:
        """The header that carries this request."""
        return {
            "compression": self.compression,
            "cardinality": self.cardinality,
            "split_plan": self.split_plan,
            "dataset_id": self.dataset_id,
        }


@dataclasses.dataclass(frozen=True)
class GetDatasetDefRequest:
    """GetDatasetDef: a worker asks for the pickled dataset ``dataset_id``."""

    dataset_id: str

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self:
        """The request in ``header``.

        Raises:
          InvalidArgumentError: ``dataset_id`` is not a string.
        """
        return cls(_dataset_id(header))

    def to_header(self) -> dict[str, Any]:
        """The header that carries this request."""
        return {"dataset_id": self.dataset_id}


@dataclasses.dataclass(frozen=True)
class GetElementSpecRequest(GetDatasetDefRequest):
    """GetElementSpec: a consumer of ``from_dataset_id`` asks for the element spec and the
    cardinality of ``dataset_id``."""


@dataclasses.dataclass(frozen=True)
class GetOrCreateJobRequest:
    """GetOrCreateJob: a consumer joins the job of ``(job_name, iteration)``, or a new anonymous
    job when ``job_name`` is None.

    Attributes:
      dataset_id: the dataset the job reads.
      mode: its ``ShardingPolicy``, as an int.
      job_name: the name consumers share the job by, None for an anonymous job.
      iteration: which pass over the dataset of that name.
      num_consumers: the consumers of a round-robin read, None for other reads.
      target_workers: one of ``TARGET_WORKERS``.
      resume: a consumer's position from a checkpoint (``position``), checked by the
        dispatcher, or None.
    """

    dataset_id: str
    mode: int
    job_name: str | None
    iteration: int
    num_consumers: int | None
    target_workers: str
    resume: Any = None

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self:
        """The request in ``header``.

        Raises:
          InvalidArgumentError: a field is missing, mistyped or out of range.
        """
        mode = field(header, "mode", int)
        job_name = field(header, "job_name", (str, type(None)))
        iteration = field(header, "iteration", int)
        num_consumers = field(header, "num_consumers", (int, type(None)))
        target_workers = field(header, "target_workers", str)
        if target_workers not in TARGET_WORKERS:
            raise InvalidArgumentError(
                f"target_workers must be one of {TARGET_WORKERS}, got {target_workers!r}"
            )
        return cls(
            _dataset_id(header),
            mode,
            job_name,
            iteration,
            num_consumers,
            target_workers,
            header.get("resume"),
        )

    def to_header(self) -> dict[str, Any]:
        """The header that carries this request."""
        return {
            "dataset_id": self.dataset_id,
            "mode": self.mode,
            "job_name": self.job_name,
            "iteration": self.iteration,
            "num_consumers": self.num_consumers,
            "target_workers": self.target_workers,
            "resume": self.resume,
        }


@dataclasses.dataclass(frozen=True)
class ReleaseClientRequest:
    """ReleaseClient: consumer ``client_id`` is done with its job."""

    client_id: int

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self:
        """The request in ``header``.

        Raises:
          InvalidArgumentError: ``client_id`` is missing or not an int.
        """
        return cls(field(header, "client_id", int))

    def to_header(self) -> dict[str, Any]:
        """The header that carries this request."""
        return {"client_id": self.client_id}


@dataclasses.dataclass(frozen=True)
class ClientHeartbeatRequest:
    """ClientHeartbeat: a consumer asks for its job's view once it differs from ``version``.

    Attributes:
      client_id: the consumer.
      version: the version of the view it has (-1: none).
      wait_ms: how long the dispatcher may wait for news before answering.
      received: (exactly-once jobs) the offsets received since the last report, ``[[key,
        ranges], ...]``; checked by the dispatcher (``ledger.check_report``).
      holding: (exactly-once jobs) the keys of the splits it holds elements of.
      closed: (exactly-once jobs) the lost tasks it takes nothing more from; checked as
        ``received``.
    """

    client_id: int
    version: int = -1
    wait_ms: int = 0
    received: Any = dataclasses.field(default_factory=list)
    holding: list[Any] = dataclasses.field(default_factory=list)
    closed: Any = dataclasses.field(default_factory=list)

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self:
        """The request in ``header``.

        Raises:
          InvalidArgumentError: a field is missing or mistyped.
        """
        version = field(header, "version", int, -1)
        wait_ms = field(header, "wait_ms", int, 0)
        return cls(
            field(header, "client_id", int),
            version,
            wait_ms,
            header.get("received", []),
            field(header, "holding", list, []),
            header.get("closed", []),
        )

    def to_header(self) -> dict[str, Any]:
        """The header that carries this request; the report of an exactly-once job's consumer
        only when it has one."""
        header: dict[str, Any] = {
            "client_id": self.client_id,
            "version": self.version,
            "wait_ms": self.wait_ms,
        }
        if self.received or self.holding or self.closed:
            header.update(received=self.received, holding=self.holding, closed=self.closed)
        return header


@dataclasses.dataclass(frozen=True)
class WorkerHeartbeatRequest:
    """WorkerHeartbeat: a worker's liveness and news.

    Attributes:
      address: the worker's address, as consumers reach it.
      tags: its ``worker_tags``.
      current_tasks: the ids of the tasks it runs.
      finished_tasks: those of them whose input ended.
      failed_tasks: those that failed: ``{"task_id", "type", "message", "traceback"}`` each.
      draining: it drains before leaving: no new tasks for it.
      leaving: it leaves now.
      wait_ms: how long the dispatcher may wait for news before answering.
      task_stats: what each task served (``[task_id, elements, bytes]``), for the status page.
    """

    address: str
    tags: tuple[str, ...] = ()
    current_tasks: tuple[int, ...] = ()
    finished_tasks: tuple[int, ...] = ()
    failed_tasks: tuple[dict[str, Any], ...] = ()
    draining: bool = False
    leaving: bool = False
    wait_ms: int = 0
    task_stats: Any = None

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self:
        """The request in ``header``.

        Raises:
          InvalidArgumentError: a field is missing or mistyped, or a failed task is not a dict
            with an int ``task_id``.
        """
        address = field(header, "address", str)
        tags = field(header, "tags", list, [])
        if not all(isinstance(tag, str) for tag in tags):
            raise InvalidArgumentError(f"malformed request: tags must be strings, got {tags!r}")
        current = _ints(header, "current_tasks")
        finished = _ints(header, "finished_tasks")
        failed = field(header, "failed_tasks", list, [])
        for report in failed:
            if not isinstance(report, dict) or not isinstance(report.get("task_id"), int):
                raise InvalidArgumentError(f"malformed request: a failed task is {report!r}")
        return cls(
            address,
            tuple(tags),
            current,
            finished,
            tuple(failed),
            field(header, "draining", bool, False),
            field(header, "leaving", bool, False),
            field(header, "wait_ms", int, 0),
            header.get("task_stats"),
        )

    def to_header(self) -> dict[str, Any]:
        """The header that carries this request."""
        return {
            "address": self.address,
            "tags": list(self.tags),
            "current_tasks": list(self.current_tasks),
            "finished_tasks": list(self.finished_tasks),
            "failed_tasks": list(self.failed_tasks),
            "draining": self.draining,
            "leaving": self.leaving,
            "wait_ms": self.wait_ms,
            "task_stats": self.task_stats,
        }


@dataclasses.dataclass(frozen=True)
class GetSplitRequest:
    """GetSplit: a task of a DYNAMIC job asks for its next split.

    Attributes:
      job_id: the job.
      repetition: which repetition of the job's dataset the split is of.
      task_id: the asking task (None: a caller without a task).
      request: the task's request number, the same when a request whose reply was lost goes
        again (None: no retries are recognised).
      finished: (exactly-once jobs) ``(key, count)``: the task produced all ``count`` elements
        of split ``key``.
      handed_out: (exactly-once jobs) the splits whose every element the task handed to
        consumers since its last request.
    """

    job_id: int
    repetition: int
    task_id: int | None = None
    request: int | None = None
    finished: tuple[int, int] | None = None
    handed_out: tuple[int, ...] = ()

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self:
        """The request in ``header``.

        Raises:
          InvalidArgumentError: a field is missing or mistyped, ``finished`` is not ``[split
            key, count]`` or ``handed_out`` not a list of split keys.
        """
        job_id = field(header, "job_id", int)
        repetition = field(header, "repetition", int)
        task_id = field(header, "task_id", (int, type(None)), None)
        request = field(header, "request", (int, type(None)), None)
        finished = field(header, "finished", (list, type(None)), None)
        if finished is not None and (
            len(finished) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in finished)
        ):
            raise InvalidArgumentError(
                f"malformed request: finished must be [split key, count], got {finished!r}"
            )
        handed_out = field(header, "handed_out", list, [])
        if not all(isinstance(k, int) and not isinstance(k, bool) for k in handed_out):
            raise InvalidArgumentError(
                f"malformed request: handed_out must be a list of split keys, got {handed_out!r}"
            )
        return cls(
            job_id,
            repetition,
            task_id,
            request,
            None if finished is None else (finished[0], finished[1]),
            tuple(handed_out),
        )

    def to_header(self) -> dict[str, Any]:
        """The header that carries this request (what is None or empty is left out, which
        reads the same)."""
        header: dict[str, Any] = {"job_id": self.job_id}
        if self.task_id is not None:
            header["task_id"] = self.task_id
        if self.request is not None:
            header["request"] = self.request
        header["repetition"] = self.repetition
        if self.finished is not None:
            header["finished"] = list(self.finished)
        if self.handed_out:
            header["handed_out"] = list(self.handed_out)
        return header


# -- messages to a worker -----------------------------------------------------------------------
# What a worker reads: the GetElements request of a consumer, and the dispatcher's replies to
# its WorkerHeartbeat and GetSplit (its task definitions among them).


# -- messages to a consumer ---------------------------------------------------------------------
# What a consumer reads: the dispatcher's replies to GetOrCreateJob and ClientHeartbeat (a job's
# view) and a worker's reply to GetElements.
