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
from collections.abc import Mapping, Sequence
from typing import Any, Self

from feedline._net.rpc import field, is_int64
from feedline.errors import InvalidArgumentError
from feedline.service.config import ShardingPolicy
from feedline.service.ledger import tag_runs

__all__ = [
    "DISPATCHER_SERVICE",
    "INCARNATION_SHIFT",
    "MAX_DATASET_BYTES",
    "MAX_PINS",
    "TARGET_WORKERS",
    "WORKER_SERVICE",
    "ClientHeartbeatRequest",
    "DatasetDefReply",
    "ElementSpecReply",
    "ElementsReply",
    "GetDatasetDefRequest",
    "GetElementSpecRequest",
    "GetElementsRequest",
    "GetOrCreateJobRequest",
    "GetSplitReply",
    "GetSplitRequest",
    "HeartbeatReply",
    "InputWait",
    "JobLoad",
    "JobView",
    "JoinReply",
    "LoadReply",
    "PinSplitVersionRequest",
    "PinSplitVersionsRequest",
    "RegisterDatasetReply",
    "RegisterDatasetRequest",
    "ReleaseClientRequest",
    "SplitVersionsRequest",
    "StreamView",
    "TaskDef",
    "TaskLoad",
    "TaskView",
    "WorkerHeartbeatReply",
    "WorkerHeartbeatRequest",
    "WorkerLoad",
    "incarnation_of",
    "local_worker_addresses",
    "new_incarnation",
    "object_versions",
    "register_local_worker",
    "split_versions_from_reply",
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
    if not all(isinstance(v, int) and not isinstance(v, bool) and is_int64(v) for v in values):
        raise InvalidArgumentError(
            f"malformed request: {name} must be a list of ints (64-bit), got {values!r:.200}"
        )
    return tuple(values)


#: The longest worker address and tag a dispatcher takes.
_MAX_ADDRESS_CHARS = 1024
_MAX_TAG_CHARS = 256
_MAX_TAGS = 256


def _text(value: str, name: str, max_chars: int) -> str:
    """``value`` if it is printable text (no control characters, no lone surrogates) of at most
    ``max_chars`` characters, which a status page and a journal can hold."""
    if len(value) > max_chars or not value.isprintable():
        raise InvalidArgumentError(
            f"malformed request: {name} must be printable text of at most {max_chars} "
            f"characters, got {value!r:.100}"
        )
    return value


#: The longest object URL and version a split's pin takes.
_MAX_URL_CHARS = 4096
_MAX_VERSION_CHARS = 1024


def _version(value: Any, what: str) -> str | int:
    """An object's version (``_fs.object_version``): printable text or an int64."""
    if isinstance(value, str):
        return _text(value, what, _MAX_VERSION_CHARS)
    if type(value) is int and is_int64(value):
        return value
    raise InvalidArgumentError(
        f"malformed message: {what} must be an object's version (text or an int), "
        f"got {value!r:.100}"
    )


def object_versions(value: Any, what: str = "versions") -> dict[str, str | int]:
    """``value`` as the versions of objects of a store, URL -> version (text or an int64), as
    messages and saved positions carry them.

    Raises:
      InvalidArgumentError: ``value`` is not such a mapping.
    """
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(
            f"malformed message: {what} must map object URLs to versions, got {value!r:.100}"
        )
    return {
        _text(str(url), "url", _MAX_URL_CHARS): _version(version, "version")
        for url, version in value.items()
    }


_MAX_REQUEST_ID_CHARS = 64


def _request_id(header: dict[str, Any]) -> str | None:
    """A request's optional ``request_id``: printable, at most 64 characters."""
    request_id = field(header, "request_id", (str, type(None)), None)
    return None if request_id is None else _text(request_id, "request_id", _MAX_REQUEST_ID_CHARS)


def _worker_address(header: dict[str, Any]) -> str:
    """``header["address"]``: where consumers reach a worker (``host:port``), non-empty."""
    address = _text(field(header, "address", str), "address", _MAX_ADDRESS_CHARS)
    if not address.strip():
        raise InvalidArgumentError(
            "malformed request: address must be where consumers reach the worker ('host:port'), "
            f"got {address!r}"
        )
    return address


def _number(value: Any) -> bool:
    """Whether ``value`` is a finite, non-negative int or float (not a bool)."""
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("inf")
    )


#: The most pipeline stages a task's load names, and the longest name kept.
_MAX_STAGES = 64
_MAX_STAGE_CHARS = 200


@dataclasses.dataclass(frozen=True)
class TaskLoad:
    """What a worker's task did since it started (cumulative), for the dispatcher's estimate of
    the workers the jobs need (``dispatcher.demand``) and for ``feedline diagnose``.

    On the wire ``[task_id, produced, busy_s, wall_s, fill, {stage: seconds}]``.

    Attributes:
      task_id: the task.
      produced: elements its producer put into the buffer.
      busy_s: seconds its producer spent making them (not waiting for room in the buffer).
      wall_s: seconds since it started (until its input ended).
      fill: how full its buffer is now, 0..1.
      stages: seconds spent in each stage of its pipeline, by the stage's name (its own time,
        without its inputs'), where the worker measures them.

    Example:
      >>> TaskLoad.from_wire([7, 10, 0.5, 1.0, 0.25, {"map": 0.4}]).busy_s
      0.5
    """

    task_id: int
    produced: int
    busy_s: float
    wall_s: float
    fill: float
    stages: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_wire(cls, row: Any) -> TaskLoad:
        """The load in ``row``.

        Raises:
          InvalidArgumentError: ``row`` is not such a list.
        """
        if (
            not isinstance(row, list)
            or len(row) != 6
            or type(row[0]) is not int
            or not is_int64(row[0])
            or type(row[1]) is not int
            or not all(_number(v) for v in row[1:5])
            or not isinstance(row[5], dict)
            or len(row[5]) > _MAX_STAGES
            or not all(
                isinstance(k, str) and len(k) <= _MAX_STAGE_CHARS and _number(v)
                for k, v in row[5].items()
            )
        ):
            raise InvalidArgumentError(
                "malformed request: a task_load item is [task_id, produced, busy_s, wall_s, "
                f"fill, {{stage: seconds}}] of non-negative numbers, got {row!r:.200}"
            )
        return cls(row[0], row[1], float(row[2]), float(row[3]), float(row[4]), dict(row[5]))

    def to_wire(self) -> list[Any]:
        """The load as a heartbeat carries it."""
        return [
            self.task_id, self.produced, self.busy_s, self.wall_s, self.fill, dict(self.stages)
        ]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class InputWait:
    """How long a consumer's training steps waited for input, since it started reading
    (cumulative). On the wire ``[steps, waited_s, wall_s]``.

    Attributes:
      steps: elements it took (each a training step's input).
      waited_s: seconds its steps spent waiting for them.
      wall_s: seconds since its first step asked for input.

    Example:
      >>> InputWait.from_wire([100, 2.5, 10.0])
      InputWait(steps=100, waited_s=2.5, wall_s=10.0)
    """

    steps: int
    waited_s: float
    wall_s: float

    @classmethod
    def from_wire(cls, row: Any) -> InputWait | None:
        """The report in ``row`` (None: none).

        Raises:
          InvalidArgumentError: ``row`` is not such a list.
        """
        if row is None:
            return None
        if (
            not isinstance(row, list)
            or len(row) != 3
            or type(row[0]) is not int
            or not all(_number(v) for v in row)
        ):
            raise InvalidArgumentError(
                "malformed request: input_wait is [steps, waited_s, wall_s] of non-negative "
                f"numbers, got {row!r:.200}"
            )
        return cls(row[0], float(row[1]), float(row[2]))

    def to_wire(self) -> list[Any]:
        """The report as a heartbeat carries it."""
        return [self.steps, self.waited_s, self.wall_s]


@dataclasses.dataclass(frozen=True)
class RegisterDatasetRequest:
    """RegisterDataset: the facts of a dataset; its pickled description and its element
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
      cross_trainer: the consumers are trainers that each read every element of the job
        (``CrossTrainerCache``): the workers keep what one trainer read for the others.
      trainer_id: the trainer this consumer reads as, in a cross-trainer job (a fault-tolerant
        dispatcher counts what each trainer received, ``ledger``).
      request_id: the join's id, the same in each retry of it (None: none): the dispatcher
        answers a join it already served with the same consumer, so that a retried join (its
        reply lost to a restart) neither adds a consumer nor starts another job.
      commits: the consumers acknowledge an element when the training step that used it
        commits (``acknowledge="on_commit"``; a fault-tolerant dispatcher's DYNAMIC job).
      trainer_splits: a trainer restored from its checkpoint: the offsets of each split that
        its position says it returned, ``[[key, [[start, stop], ...]], ...]``; None for a
        trainer not restored (and every other consumer).
    """

    dataset_id: str
    mode: int
    job_name: str | None
    iteration: int
    num_consumers: int | None
    target_workers: str
    resume: Any = None
    cross_trainer: bool = False
    trainer_id: str | None = None
    request_id: str | None = None
    commits: bool = False
    trainer_splits: list[list[Any]] | None = None

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self:
        """The request in ``header``.

        Raises:
          InvalidArgumentError: a field is missing, mistyped or out of range.
        """
        mode = field(header, "mode", int)
        if mode not in set(ShardingPolicy):
            raise InvalidArgumentError(
                f"malformed request: mode {mode} is none of {[int(m) for m in ShardingPolicy]}"
            )
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
            field(header, "cross_trainer", bool, False),
            field(header, "trainer_id", (str, type(None)), None),
            _request_id(header),
            field(header, "commits", bool, False),
            _trainer_splits(header),
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
            **({"cross_trainer": True} if self.cross_trainer else {}),
            **({"trainer_id": self.trainer_id} if self.trainer_id is not None else {}),
            **({"request_id": self.request_id} if self.request_id is not None else {}),
            **({"commits": True} if self.commits else {}),
            **({"trainer_splits": self.trainer_splits} if self.trainer_splits is not None else {}),
        }


def _trainer_splits(header: dict[str, Any]) -> list[list[Any]] | None:
    """``header["trainer_splits"]``: ``[[key, ranges], ...]`` checked, or None."""
    value = field(header, "trainer_splits", (list, type(None)), None)
    if value is None:
        return None
    splits: list[list[Any]] = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2 and _is_count(item[0])) or not (
            isinstance(item[1], list)
            and all(
                isinstance(pair, list) and len(pair) == 2 and all(map(_is_count, pair))
                for pair in item[1]
            )
        ):
            raise InvalidArgumentError(
                "malformed request: trainer_splits must be [[key, [[start, stop], ...]], ...], "
                f"got {item!r:.100}"
            )
        splits.append([item[0], [list(pair) for pair in item[1]]])
    return splits


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


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
class SplitVersionsRequest:
    """SplitVersions: consumer ``client_id`` of an exactly-once job saves its position, and asks
    for the object versions that the splits ``keys`` (those it returned part of) are held to
    (``PinSplitVersionRequest``). The reply, ``{"versions": [[key, {url: version}], ...]}``
    (``split_versions_from_reply``), names the splits that hold any."""

    client_id: int
    keys: tuple[int, ...]

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self:
        """The request in ``header``.

        Raises:
          InvalidArgumentError: ``client_id`` or ``keys`` is missing or mistyped.
        """
        return cls(field(header, "client_id", int), _ints(header, "keys"))

    def to_header(self) -> dict[str, Any]:
        """The header that carries this request."""
        return {"client_id": self.client_id, "keys": list(self.keys)}


def split_versions_from_reply(header: dict[str, Any]) -> dict[int, dict[str, str | int]]:
    """The versions of a SplitVersions reply: split key -> URL -> version.

    Raises:
      InvalidArgumentError: a malformed reply.
    """
    versions: dict[int, dict[str, str | int]] = {}
    for row in field(header, "versions", list, []):
        if not (isinstance(row, list) and len(row) == 2 and type(row[0]) is int):
            raise InvalidArgumentError(
                f"malformed reply: versions is a list of [split key, {{url: version}}], got "
                f"{row!r:.100}"
            )
        versions[row[0]] = object_versions(row[1], f"the versions of split {row[0]}")
    return versions


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
      input_wait: how long its steps waited for input so far (None: not measured).
      committed: (jobs acknowledged on commit) the offsets its committed steps used, as
        ``received``.
      flushed: (jobs acknowledged on commit) the last flush round it reported everything it
        received for (``HeartbeatReply.flush``), 0 if none.
    """

    client_id: int
    version: int = -1
    wait_ms: int = 0
    received: Any = dataclasses.field(default_factory=list)
    holding: list[Any] = dataclasses.field(default_factory=list)
    closed: Any = dataclasses.field(default_factory=list)
    input_wait: InputWait | None = None
    committed: Any = dataclasses.field(default_factory=list)
    flushed: int = 0

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
            InputWait.from_wire(header.get("input_wait")),
            header.get("committed", []),
            field(header, "flushed", int, 0),
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
        if self.input_wait is not None:
            header["input_wait"] = self.input_wait.to_wire()
        if self.committed:
            header["committed"] = self.committed
        if self.flushed:
            header["flushed"] = self.flushed
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
      task_load: what each task's producer did (``TaskLoad``), for the dispatcher's estimate
        of the workers the jobs need and for ``feedline diagnose``.
      instance: a random id of the worker's process (its ``WorkerServer``), the same in each
        of its heartbeats: a new one at a known address is a worker that restarted there
        (None: not said).
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
    task_load: tuple[TaskLoad, ...] = ()
    instance: int | None = None

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self:
        """The request in ``header``.

        Raises:
          InvalidArgumentError: a field is missing or mistyped, or a failed task is not a dict
            with an int ``task_id``.
        """
        address = _worker_address(header)
        instance = header.get("instance")
        if instance is not None and (type(instance) is not int or not is_int64(instance)):
            raise InvalidArgumentError(
                f"malformed request: instance must be an int64, got {instance!r:.100}"
            )
        tags = field(header, "tags", list, [])
        if len(tags) > _MAX_TAGS or not all(isinstance(tag, str) for tag in tags):
            raise InvalidArgumentError(
                f"malformed request: tags must be at most {_MAX_TAGS} strings, got {tags!r:.200}"
            )
        for tag in tags:
            _text(tag, "a tag", _MAX_TAG_CHARS)
        current = _ints(header, "current_tasks")
        finished = _ints(header, "finished_tasks")
        failed = field(header, "failed_tasks", list, [])
        for report in failed:
            task_id = report.get("task_id") if isinstance(report, dict) else None
            if type(task_id) is not int or not is_int64(task_id):
                raise InvalidArgumentError(
                    f"malformed request: a failed task is {report!r:.200}; failed_tasks holds "
                    "objects with an int task_id"
                )
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
            tuple(TaskLoad.from_wire(row) for row in field(header, "task_load", list, [])),
            instance,
        )

    def to_header(self) -> dict[str, Any]:
        """The header that carries this request."""
        header: dict[str, Any] = {
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
        if self.task_load:
            header["task_load"] = [load.to_wire() for load in self.task_load]
        if self.instance is not None:
            header["instance"] = self.instance
        return header


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
      wait_ms: (exactly-once jobs) while the job's splits are all out and not done, how long
        the dispatcher may wait for one to come back or all to be done before it answers
        ``wait`` (0: at once). A task asks to wait only while it holds no split it has not
        handed out whole, whose news its next request would carry.
    """

    job_id: int
    repetition: int
    task_id: int | None = None
    request: int | None = None
    finished: tuple[int, int] | None = None
    handed_out: tuple[int, ...] = ()
    wait_ms: int = 0

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
            or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 and is_int64(x)
                for x in finished
            )
        ):
            raise InvalidArgumentError(
                f"malformed request: finished must be [split key, count], got {finished!r}"
            )
        handed_out = field(header, "handed_out", list, [])
        if not all(
            isinstance(k, int) and not isinstance(k, bool) and is_int64(k) for k in handed_out
        ):
            raise InvalidArgumentError(
                f"malformed request: handed_out must be a list of split keys, got {handed_out!r}"
            )
        wait_ms = field(header, "wait_ms", int, 0)
        if wait_ms < 0:
            raise InvalidArgumentError(f"malformed request: wait_ms must be >= 0, got {wait_ms}")
        return cls(
            job_id,
            repetition,
            task_id,
            request,
            None if finished is None else (finished[0], finished[1]),
            tuple(handed_out),
            wait_ms,
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
        if self.wait_ms:
            header["wait_ms"] = self.wait_ms
        return header


@dataclasses.dataclass(frozen=True)
class PinSplitVersionRequest:
    """PinSplitVersion: a task of an exactly-once job opened object ``url`` of split ``key``
    as ``version``, before handing out any element of it. The dispatcher keeps the first
    version pinned for each object of a split (journaled), so that the split run again after
    its worker was lost reads the same one (``GetSplitReply.versions``); its reply,
    ``{"version": ...}``, is the version the split is held to.

    Attributes:
      job_id: the job.
      task_id: the task running the split.
      key: the split's key.
      url: the object, as the pipeline names it.
      version: the version the task opened.
    """

    job_id: int
    task_id: int
    key: int
    url: str
    version: str | int

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self:
        """The request in ``header``.

        Raises:
          InvalidArgumentError: a field is missing or mistyped.
        """
        return cls(
            field(header, "job_id", int),
            field(header, "task_id", int),
            field(header, "key", int),
            _text(field(header, "url", str), "url", _MAX_URL_CHARS),
            _version(header.get("version"), "version"),
        )

    def to_header(self) -> dict[str, Any]:
        """The header that carries this request."""
        return dataclasses.asdict(self)


#: The most objects one PinSplitVersions names (a split holds at most 1,024 files).
MAX_PINS = 1024


@dataclasses.dataclass(frozen=True)
class PinSplitVersionsRequest:
    """PinSplitVersions: ``PinSplitVersion`` of several objects of split ``key`` in one call,
    journaled together: those a task knows it opens as these versions (the objects of the
    split that the dataset's source listed, ``list_files``, with their versions), sent when a
    run opens the first of them. Its reply, ``{"versions": {url: version}}``, is the version
    each object is held to.

    Attributes:
      job_id: the job.
      task_id: the task running the split.
      key: the split's key.
      versions: URL -> the version the task opens, at most ``MAX_PINS`` of them.
    """

    job_id: int
    task_id: int
    key: int
    versions: dict[str, str | int]

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self:
        """The request in ``header``.

        Raises:
          InvalidArgumentError: a field is missing or mistyped, or too many objects.
        """
        versions = object_versions(field(header, "versions", dict), "versions")
        if len(versions) > MAX_PINS:
            raise InvalidArgumentError(
                f"malformed request: PinSplitVersions names at most {MAX_PINS} objects, got "
                f"{len(versions)}"
            )
        return cls(
            field(header, "job_id", int),
            field(header, "task_id", int),
            field(header, "key", int),
            versions,
        )

    def to_header(self) -> dict[str, Any]:
        """The header that carries this request."""
        return dataclasses.asdict(self)


# -- messages to a worker -----------------------------------------------------------------------
# What a worker reads: the GetElements request of a consumer, and the dispatcher's replies to
# its WorkerHeartbeat and GetSplit (its task definitions among them).


@dataclasses.dataclass(frozen=True)
class GetElementsRequest:
    """A consumer's ``GetElements`` request to a worker, in one of two shapes.

    First come, first served (``consumer_index is None``): ``consumer`` (the client id),
    ``consumers`` (the job's consumers, as the client knows them), ``held`` (the elements it
    received and has not returned yet), ``max_elements`` and ``max_bytes`` (what one reply may
    carry). Round robin: ``consumer_index``, ``round`` (the round the consumer reads) and
    ``max_elements`` (how many consecutive rounds from it one reply may carry: the first is
    waited for, those after it only if they are complete). A first come, first served consumer
    that keeps several requests to a task in flight numbers them (``seq``, from 0 for each
    task): the worker hands out elements to a consumer's requests in that order. Both
    carry ``wait_ms`` (how long the request may wait for elements) and, from a consumer on the
    worker's host, ``shm`` (the offer of its shared-memory arena, checked by ``shm``).

    Example:
      >>> request = GetElementsRequest.from_header({"task_id": 7, "consumer_index": 1, "round": 3})
      >>> request.consumer_index, request.round, request.wait_ms
      (1, 3, 500)
      >>> request.to_header()
      {'task_id': 7, 'consumer_index': 1, 'round': 3, 'wait_ms': 500}
    """

    task_id: int
    wait_ms: int = 500
    consumer: int = 0
    consumers: int = 1
    held: int = 0
    max_elements: int = 1
    max_bytes: int = 8 << 20
    consumer_index: int | None = None
    round: int | None = None
    shm: Any = None
    #: A trainer of a cross-trainer job (``CrossTrainerCache``): its id, the position in the
    #: task's stream of the next element it wants, and the elements of the stream it returned.
    trainer_id: str | None = None
    index: int = 0
    returned: int = 0
    seq: int | None = None

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> GetElementsRequest:
        """The request in ``header``.

        Raises:
          InvalidArgumentError: a field is missing (``task_id``) or of the wrong type.
        """
        return cls(
            task_id=field(header, "task_id", int),
            wait_ms=field(header, "wait_ms", int, 500),
            consumer=field(header, "consumer", int, 0),
            consumers=field(header, "consumers", int, 1),
            held=field(header, "held", int, 0),
            max_elements=field(header, "max_elements", int, 1),
            max_bytes=field(header, "max_bytes", int, 8 << 20),
            consumer_index=field(header, "consumer_index", int, None),
            round=field(header, "round", int, None),
            shm=header.get("shm"),
            trainer_id=field(header, "trainer_id", (str, type(None)), None),
            index=field(header, "index", int, 0),
            returned=field(header, "returned", int, 0),
            seq=field(header, "seq", int, None),
        )

    def to_header(self) -> dict[str, Any]:
        """The header a consumer sends."""
        header: dict[str, Any] = {"task_id": self.task_id}
        if self.consumer_index is None and self.round is None:
            header.update(
                consumer=self.consumer,
                consumers=self.consumers,
                held=self.held,
                max_elements=self.max_elements,
                max_bytes=self.max_bytes,
            )
            if self.seq is not None:
                header["seq"] = self.seq
        else:
            header.update(consumer_index=self.consumer_index, round=self.round)
            if self.max_elements != 1:
                header["max_elements"] = self.max_elements
        header["wait_ms"] = self.wait_ms
        if self.shm is not None:
            header["shm"] = self.shm
        if self.trainer_id is not None:
            header.update(trainer_id=self.trainer_id, index=self.index, returned=self.returned)
        return header

    def round_position(self) -> tuple[int, int]:
        """``(consumer_index, round)`` of a round-robin request.

        Raises:
          InvalidArgumentError: the request lacks one of them (a first come, first served one).
        """
        if self.consumer_index is None:
            raise InvalidArgumentError("malformed request: field 'consumer_index' is missing")
        if self.round is None:
            raise InvalidArgumentError("malformed request: field 'round' is missing")
        return self.consumer_index, self.round


@dataclasses.dataclass(frozen=True)
class TaskDef:
    """A task the dispatcher assigns a worker: its part of a job.

    Attributes:
      task_id: the task (an id of the dispatcher's incarnation, ``incarnation_of``).
      job_id: its job.
      dataset_id: the job's registered dataset, fetched with ``GetDatasetDef``.
      fingerprint: the dataset's content fingerprint ("" when unknown): what workers cache it by.
      mode: the job's sharding policy.
      worker_index: this task's worker among the job's ``num_workers`` (static sharding).
      num_workers: the job's workers.
      num_consumers: round robin among that many consumers; None: first come, first served.
      skip: elements of the task's stream that a resumed consumer received already.
      exactly_once: the job hands out its splits exactly once (``ledger``).
      shared: a named job whose consumers share the task's elements.
      cross_trainer: a cross-trainer job: every trainer reads every element of the task, which
        keeps them for the trainers behind (``worker.trainer_cache``).
    """

    task_id: int
    job_id: int
    dataset_id: str
    mode: ShardingPolicy
    worker_index: int
    num_workers: int
    num_consumers: int | None = None
    fingerprint: str = ""
    skip: int = 0
    exactly_once: bool = False
    shared: bool = False
    cross_trainer: bool = False

    @classmethod
    def from_header(cls, header: Any) -> TaskDef:
        """The task definition ``header`` (an item of a heartbeat reply's ``new_tasks``).

        Raises:
          InvalidArgumentError: a field is missing or of the wrong type, or an unknown mode.
        """
        if not isinstance(header, dict):
            raise InvalidArgumentError(f"malformed reply: a task is {header!r:.200}")
        mode = field(header, "mode", int)
        if mode not in set(ShardingPolicy):
            raise InvalidArgumentError(
                f"malformed reply: task mode {mode} is none of {[int(m) for m in ShardingPolicy]}"
            )
        return cls(
            task_id=field(header, "task_id", int),
            job_id=field(header, "job_id", int),
            dataset_id=field(header, "dataset_id", str),
            mode=ShardingPolicy(mode),
            worker_index=field(header, "worker_index", int),
            num_workers=field(header, "num_workers", int),
            num_consumers=field(header, "num_consumers", (int, type(None)), None),
            fingerprint=field(header, "fingerprint", str, ""),
            skip=field(header, "skip", int, 0),
            exactly_once=field(header, "exactly_once", bool, False),
            shared=field(header, "shared", bool, False),
            cross_trainer=field(header, "cross_trainer", bool, False),
        )

    def to_header(self) -> dict[str, Any]:
        """The definition as the dispatcher sends it."""
        return {
            "task_id": self.task_id,
            "job_id": self.job_id,
            "dataset_id": self.dataset_id,
            "fingerprint": self.fingerprint,
            "mode": int(self.mode),
            "worker_index": self.worker_index,
            "num_workers": self.num_workers,
            "num_consumers": self.num_consumers,
            "skip": self.skip,
            "exactly_once": self.exactly_once,
            "shared": self.shared,
            **({"cross_trainer": True} if self.cross_trainer else {}),
        }


@dataclasses.dataclass(frozen=True)
class WorkerHeartbeatReply:
    """The dispatcher's reply to a ``WorkerHeartbeat``: what the worker must start and end.

    Attributes:
      incarnation: the dispatcher's life (None from one that does not say).
      new_tasks: tasks to start.
      delete_tasks: tasks whose job ended; ``task_errors`` has the error report of those whose
        job failed, which their consumers get.
      lost_tasks: tasks of an earlier life of the dispatcher.
      retry_after_ms: the dispatcher answered at once instead of waiting for news (too many
        heartbeats wait there): the worker waits this long on its side before the next one.
      dropped_tasks: tasks the dispatcher counts as lost with this worker, which it dropped
        (it missed its heartbeats) while it lived on: the worker stops them and answers their
        consumers that they are gone.
    """

    incarnation: int | None
    new_tasks: tuple[TaskDef, ...] = ()
    delete_tasks: tuple[int, ...] = ()
    task_errors: Mapping[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    lost_tasks: tuple[int, ...] = ()
    retry_after_ms: int = 0
    dropped_tasks: tuple[int, ...] = ()

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> WorkerHeartbeatReply:
        """The reply in ``header``.

        Raises:
          InvalidArgumentError: a field is missing or of the wrong type.
        """
        errors = field(header, "task_errors", dict, {})
        task_errors: dict[int, dict[str, Any]] = {}
        for key, report in errors.items():
            if not (isinstance(key, str) and key.isdigit() and isinstance(report, dict)):
                raise InvalidArgumentError(
                    f"malformed reply: task_errors maps task ids to reports, got {errors!r:.200}"
                )
            task_errors[int(key)] = report
        return cls(
            incarnation=field(header, "incarnation", (int, type(None)), None),
            new_tasks=tuple(TaskDef.from_header(t) for t in field(header, "new_tasks", list)),
            delete_tasks=_ints(header, "delete_tasks"),
            task_errors=task_errors,
            lost_tasks=_ints(header, "lost_tasks"),
            retry_after_ms=field(header, "retry_after_ms", int, 0),
            dropped_tasks=_ints(header, "dropped_tasks"),
        )

    def to_header(self) -> dict[str, Any]:
        """The reply as the dispatcher sends it: the lists after ``new_tasks`` only when not
        empty."""
        header: dict[str, Any] = {
            "incarnation": self.incarnation,
            "new_tasks": [task.to_header() for task in self.new_tasks],
        }
        if self.delete_tasks:
            header["delete_tasks"] = list(self.delete_tasks)
        if self.task_errors:
            header["task_errors"] = {str(t): r for t, r in self.task_errors.items()}
        if self.lost_tasks:
            header["lost_tasks"] = list(self.lost_tasks)
        if self.retry_after_ms:
            header["retry_after_ms"] = self.retry_after_ms
        if self.dropped_tasks:
            header["dropped_tasks"] = list(self.dropped_tasks)
        return header


@dataclasses.dataclass(frozen=True)
class DatasetDefReply:
    """The dispatcher's reply to ``GetDatasetDef``; the pickled dataset is its one buffer.

    Attributes:
      compression: how the dataset's elements travel, ``"AUTO"`` or None.
      split_plan: the JSON of the dataset's ``SplitPlan``, None when its source does not split.
    """

    compression: str | None
    split_plan: dict[str, Any] | None

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> DatasetDefReply:
        """The reply in ``header``.

        Raises:
          InvalidArgumentError: a field is missing or of the wrong type.
        """
        return cls(
            field(header, "compression", (str, type(None))),
            field(header, "split_plan", (dict, type(None))),
        )

    def to_header(self) -> dict[str, Any]:
        """The reply as the dispatcher sends it."""
        return {"compression": self.compression, "split_plan": self.split_plan}


@dataclasses.dataclass(frozen=True)
class GetSplitReply:
    """The dispatcher's reply to ``GetSplit``: the next split of a DYNAMIC task.

    Attributes:
      split: the split's unit indices; None: no more (or, with ``wait``, none yet).
      key: in an exactly-once job, the split's key (its position in the job's splits).
      skip: in an exactly-once job, the offsets of the split its consumers received already
        (``[start, end)`` ranges), which the task does not hand out again.
      wait: an exactly-once job's other splits are not done: one may come back; ask again.
      versions: in an exactly-once job, the version of each object (by URL) that an earlier
        run of the split opened (``PinSplitVersionRequest``): the task reads those or none.
    """

    split: tuple[int, ...] | None
    key: int | None = None
    skip: tuple[tuple[int, int], ...] = ()
    wait: bool = False
    versions: Mapping[str, str | int] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> GetSplitReply:
        """The reply in ``header``.

        Raises:
          InvalidArgumentError: a field is missing or of the wrong type.
        """
        split = field(header, "split", (list, type(None)))
        if split is not None and not all(type(i) is int for i in split):
            raise InvalidArgumentError(
                f"malformed reply: a split is a list of unit indices, got {split!r:.200}"
            )
        skip = field(header, "skip", list, [])
        if not all(
            isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r) for r in skip
        ):
            raise InvalidArgumentError(
                f"malformed reply: skip is a list of [start, end] ranges, got {skip!r:.200}"
            )
        return cls(
            split=None if split is None else tuple(split),
            key=field(header, "key", (int, type(None)), None),
            skip=tuple((start, end) for start, end in skip),
            wait=field(header, "wait", bool, False),
            versions=object_versions(field(header, "versions", dict, {})),
        )

    def to_header(self) -> dict[str, Any]:
        """The reply as the dispatcher sends it."""
        header: dict[str, Any] = {"split": None if self.split is None else list(self.split)}
        if self.key is not None:
            header.update(key=self.key, skip=[list(r) for r in self.skip])
        if self.wait:
            header["wait"] = True
        if self.versions:
            header["versions"] = dict(self.versions)
        return header


# -- messages to a consumer ---------------------------------------------------------------------
# What a consumer reads: the dispatcher's replies to GetOrCreateJob and ClientHeartbeat (a job's
# view) and a worker's reply to GetElements.

#: The states of a task in a job's view.
TASK_STATES = ("running", "done", "lost")


def _rows(header: dict[str, Any], name: str, kinds: Sequence[type]) -> list[tuple[Any, ...]]:
    """``header[name]`` (default ``[]``): a list of rows, each a list of ``len(kinds)`` values
    of those types (``bool`` is no ``int``)."""
    rows = field(header, name, list, [])
    checked = []
    for row in rows:
        if (
            not isinstance(row, list)
            or len(row) != len(kinds)
            or not all(
                isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
                for value, kind in zip(row, kinds, strict=True)
            )
        ):
            names = ", ".join(kind.__name__ for kind in kinds)
            raise InvalidArgumentError(
                f"malformed reply: every item of field {name!r} must be [{names}], got {row!r}"
            )
        checked.append(tuple(row))
    return checked


@dataclasses.dataclass(frozen=True)
class RegisterDatasetReply:
    """The dispatcher's reply to ``RegisterDataset``: the id the dataset is registered under."""

    dataset_id: str

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> RegisterDatasetReply:
        """The reply in ``header``.

        Raises:
          InvalidArgumentError: the id is missing or not a string.
        """
        return cls(field(header, "dataset_id", str))

    def to_header(self) -> dict[str, Any]:
        """The reply as the dispatcher sends it."""
        return {"dataset_id": self.dataset_id}


@dataclasses.dataclass(frozen=True)
class ElementSpecReply:
    """The dispatcher's reply to ``GetElementSpec``; the element spec (JSON, ``_net.specs``) is
    its one buffer.

    Attributes:
      cardinality: the registered dataset's cardinality (``-1``: infinite, ``-2``: unknown).
    """

    cardinality: int

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> ElementSpecReply:
        """The reply in ``header``.

        Raises:
          InvalidArgumentError: the cardinality is missing or not an int.
        """
        return cls(field(header, "cardinality", int))

    def to_header(self) -> dict[str, Any]:
        """The reply as the dispatcher sends it."""
        return {"cardinality": self.cardinality}


@dataclasses.dataclass(frozen=True)
class TaskView:
    """A task of a job, as its consumers see it: ``state`` is ``"running"``, ``"done"`` (its
    input ended) or ``"lost"`` (its worker left or was dropped)."""

    task_id: int
    address: str
    state: str


@dataclasses.dataclass(frozen=True)
class StreamView:
    """What a consumer's saved position needs of a task: the worker's index among
    ``num_workers`` (static sharding) and the elements the task skips (``skip``, a resumed job)."""

    task_id: int
    worker_index: int
    num_workers: int
    skip: int


@dataclasses.dataclass(frozen=True)
class JobView:
    """A job as the dispatcher shows it to its consumers (in the replies of GetOrCreateJob and
    ClientHeartbeat).

    Attributes:
      tasks: the job's tasks, ``[task_id, address, state]`` on the wire.
      streams: per task ``[task_id, worker_index, num_workers, skip]`` on the wire.
      finished: the job ended (with ``error``, if it failed).
      error: the report (``feedline._net.remote_errors.error_report``) of the error that failed
        the job, or None.
      consumers: the job's consumers now.
      joined: the consumers that ever joined the job.
      exactly_once: the job hands out its splits exactly once (``feedline.service.ledger``).
      split_cursor: in an exactly-once job, what its split keys mean; else None.
      version: changes whenever the view does (a heartbeat waits for a newer one).

    Example:
      >>> view = JobView.from_header({"tasks": [[7, "host:1", "done"]], "version": 3})
      >>> view.tasks, view.version, view.consumers
      ((TaskView(task_id=7, address='host:1', state='done'),), 3, 1)
    """

    tasks: tuple[TaskView, ...] = ()
    streams: tuple[StreamView, ...] = ()
    finished: bool = False
    error: dict[str, Any] | None = None
    consumers: int = 1
    joined: int = 1
    exactly_once: bool = False
    split_cursor: dict[str, Any] | None = None
    version: int = -1

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> JobView:
        """The view in a reply's header.

        Raises:
          InvalidArgumentError: a field is missing (``tasks``, ``version``) or mistyped, or a
            task's state is not one of ``TASK_STATES``.
        """
        field(header, "tasks", list)
        tasks = tuple(TaskView(*row) for row in _rows(header, "tasks", (int, str, str)))
        for task in tasks:
            if task.state not in TASK_STATES:
                raise InvalidArgumentError(
                    f"malformed reply: task {task.task_id} is {task.state!r}, not one of "
                    f"{TASK_STATES}"
                )
        return cls(
            tasks=tasks,
            streams=tuple(StreamView(*row) for row in _rows(header, "streams", (int,) * 4)),
            finished=field(header, "finished", bool, False),
            error=field(header, "error", (dict, type(None)), None),
            consumers=field(header, "consumers", int, 1),
            joined=field(header, "joined", int, 1),
            exactly_once=field(header, "exactly_once", bool, False),
            split_cursor=field(header, "split_cursor", (dict, type(None)), None),
            version=field(header, "version", int),
        )

    def to_header(self) -> dict[str, Any]:
        """The view's fields of a reply header."""
        return {
            "tasks": [[t.task_id, t.address, t.state] for t in self.tasks],
            "streams": [[s.task_id, s.worker_index, s.num_workers, s.skip] for s in self.streams],
            "finished": self.finished,
            "error": self.error,
            "consumers": self.consumers,
            "joined": self.joined,
            "exactly_once": self.exactly_once,
            "split_cursor": self.split_cursor,
            "version": self.version,
        }


@dataclasses.dataclass(frozen=True)
class JoinReply:
    """The dispatcher's reply to GetOrCreateJob: the consumer's id in the job, and the job's
    view. A consumer that misses heartbeats for ``client_timeout_ms`` is released."""

    job_id: int
    client_id: int
    incarnation: int
    client_timeout_ms: int
    view: JobView

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> JoinReply:
        """The reply in ``header``.

        Raises:
          InvalidArgumentError: a field is missing or mistyped.
        """
        return cls(
            job_id=field(header, "job_id", int),
            client_id=field(header, "client_id", int),
            incarnation=field(header, "incarnation", int),
            client_timeout_ms=field(header, "client_timeout_ms", int),
            view=JobView.from_header(header),
        )

    def to_header(self) -> dict[str, Any]:
        """The reply's header."""
        return {
            "job_id": self.job_id,
            "client_id": self.client_id,
            "incarnation": self.incarnation,
            "client_timeout_ms": self.client_timeout_ms,
            **self.view.to_header(),
        }


@dataclasses.dataclass(frozen=True)
class HeartbeatReply:
    """The dispatcher's reply to ClientHeartbeat: the job's view, or None where the consumer's
    view is current (the request's ``version`` is the job's: ``{"unchanged": true}`` on the
    wire, a few bytes instead of a view of every task); and, in an exactly-once job,
    ``splits_done``: ``(key, count)`` of the splits the consumer reported or holds that are
    done (None in other jobs); in a job acknowledged on commit, ``flush``: the flush round the
    consumer is asked to report everything it received for, its replies in flight included
    (0: none; ``ledger``), and ``awaits_commits``: every split is out, each element committed
    or held by a consumer, so nothing more comes unless one dies; in an exactly-once
    cross-trainer job, ``complete``: every split is out and this consumer's trainer received
    all of each, so nothing more comes to it (its epoch ended, whatever the others still read).

    Example:
      >>> HeartbeatReply.from_header({"incarnation": 5, "unchanged": True}).view is None
      True
    """

    incarnation: int
    view: JobView | None
    splits_done: tuple[tuple[int, int], ...] | None = None
    flush: int = 0
    awaits_commits: bool = False
    complete: bool = False

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> HeartbeatReply:
        """The reply in ``header``.

        Raises:
          InvalidArgumentError: a field is missing or mistyped.
        """
        done = None
        if field(header, "splits_done", (list, type(None)), None) is not None:
            done = tuple((key, count) for key, count in _rows(header, "splits_done", (int, int)))
        unchanged = field(header, "unchanged", bool, False)
        return cls(
            field(header, "incarnation", int),
            None if unchanged else JobView.from_header(header),
            done,
            field(header, "flush", int, 0),
            field(header, "awaits_commits", bool, False),
            field(header, "complete", bool, False),
        )

    def to_header(self) -> dict[str, Any]:
        """The reply's header."""
        header: dict[str, Any] = {"incarnation": self.incarnation}
        if self.view is None:
            header["unchanged"] = True
        else:
            header.update(self.view.to_header())
        if self.splits_done is not None:
            header["splits_done"] = [[key, count] for key, count in self.splits_done]
        if self.flush:
            header["flush"] = self.flush
        if self.awaits_commits:
            header["awaits_commits"] = True
        if self.complete:
            header["complete"] = True
        return header


#: The most elements whose tags one reply may carry.
_MAX_TAGGED = 1 << 20


def _tags_of_runs(runs: list[Any]) -> list[list[int]]:
    """The ``[split, offset]`` tag of each element from the runs ``[split, first offset,
    count]`` that an ``ElementsReply`` carries.

    Raises:
      InvalidArgumentError: a run is not three integers, an offset negative or a count not
        positive, or the runs tag more than ``_MAX_TAGGED`` elements.
    """
    total = 0
    for run in runs:
        if (
            type(run) is not list
            or len(run) != 3
            or not all(type(number) is int for number in run)  # (``bool`` is no ``int`` here)
            or run[1] < 0
            or run[2] < 1
        ):
            raise InvalidArgumentError(
                "malformed reply: every item of field 'tags' must be [split, first offset, "
                f"count] (integers, a count of at least 1), got {run!r:.100}"
            )
        total += run[2]
        if total > _MAX_TAGGED:
            raise InvalidArgumentError(
                f"malformed reply: field 'tags' tags more than {_MAX_TAGGED} elements"
            )
    return [[key, offset] for key, start, count in runs for offset in range(start, start + count)]


@dataclasses.dataclass(frozen=True)
class ElementsReply:
    """A worker's reply to GetElements. Exactly one of: elements (``meta`` describes them, see
    ``feedline._net.elements``; ``tags`` their ``[split, offset]`` in an exactly-once job, on
    the wire as runs of consecutive offsets, ``[split, first offset, count]``),
    nothing yet (``eos`` False, no ``meta``), the end of the task's input (``eos``), the task is
    ``gone`` (stopped, or ended and drained), or the ``error`` report of the task's pipeline.
    ``shm`` and ``shm_refused`` are the shared-memory fields (``feedline.service.shm``), which
    a consumer's ``ConsumerChannels.received`` takes out of the header before this is read.
    ``retry_after_ms`` comes with nothing yet from a worker that did not wait (too many requests
    wait there already): the consumer waits that long on its side before asking again.

    Example:
      >>> ElementsReply.from_header({"gone": True}).to_header()
      {'gone': True}
      >>> ElementsReply(eos=True).to_header()
      {'eos': True}
    """

    eos: bool = False
    meta: dict[str, Any] | None = None
    tags: list[list[int]] | None = None
    error: dict[str, Any] | None = None
    gone: bool = False
    shm: dict[str, Any] | None = None
    shm_refused: str | None = None
    #: In a cross-trainer job: the position in the task's stream of the first element carried
    #: (past the one asked for when the trainer fell out of the cache's window).
    first: int | None = None
    retry_after_ms: int = 0

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> ElementsReply:
        """The reply in ``header``.

        Raises:
          InvalidArgumentError: a field is mistyped.
        """
        runs = field(header, "tags", (list, type(None)), None)
        return cls(
            eos=field(header, "eos", bool, False),
            meta=field(header, "meta", (dict, type(None)), None),
            tags=None if runs is None else _tags_of_runs(runs),
            error=field(header, "error", (dict, type(None)), None),
            gone=field(header, "gone", bool, False),
            shm=field(header, "shm", (dict, type(None)), None),
            shm_refused=field(header, "shm_refused", (str, type(None)), None),
            first=field(header, "first", (int, type(None)), None),
            retry_after_ms=field(header, "retry_after_ms", int, 0),
        )

    def to_header(self) -> dict[str, Any]:
        """The reply's header, as a worker sends it."""
        if self.error is not None:
            return {"error": self.error}
        if self.gone:
            return {"gone": True}
        header: dict[str, Any] = {"eos": self.eos}
        if self.meta is not None:
            header["meta"] = self.meta
        if self.tags:  # on the wire as runs of offsets: [[split, first offset, count], ...]
            header["tags"] = [[key, start, end - start] for key, start, end in tag_runs(self.tags)]
        if self.shm is not None:
            header["shm"] = self.shm
        if self.shm_refused is not None:
            header["shm_refused"] = self.shm_refused
        if self.first is not None:
            header["first"] = self.first
        if self.retry_after_ms:
            header["retry_after_ms"] = self.retry_after_ms
        return header


# -- the load of a dispatcher's jobs (GetLoad: ``feedline autoscale`` and ``feedline diagnose``) --

#: The most that a consumer waiting more than this fraction of its time counts for: one
#: estimate of the workers needed at most quadruples it.
MAX_WAIT_FRACTION = 0.75


@dataclasses.dataclass(frozen=True)
class JobLoad:
    """What one running job asks of its workers over the last reports (``dispatcher.demand``).

    Attributes:
      job_id: the job.
      busy: the sum of its tasks' busy fractions (workers' worth of work being done).
      wait: the mean fraction of time its consumers' steps waited for input (None: no report).
      fill: the mean fill of its tasks' buffers, 0..1 (None: no report).
      elements_per_s: the elements its tasks made per second.
      steps_per_s: the steps its consumers took per second.
      workers: the workers that run its tasks.
      movable: whether more workers help it (OFF or DYNAMIC, first come, first served).
      stages: its tasks' busy seconds per pipeline stage over the window, summed.
      measured: whether any of its tasks reported a window yet.
      steps_per_s: the steps its consumers took per second.
      demand: the elements per second its consumers would take were their input never late
        (``sum(steps_per_s / (1 - wait))`` over them), None: no report.
      capacity: the elements a worker makes per second of busy time, None: not measured.
    """

    job_id: int
    busy: float
    wait: float | None
    fill: float | None
    elements_per_s: float
    workers: tuple[str, ...]
    movable: bool
    stages: Mapping[str, float] = dataclasses.field(default_factory=dict)
    measured: bool = True
    steps_per_s: float = 0.0
    demand: float | None = None
    capacity: float | None = None

    @property
    def needed(self) -> float:
        """Workers at full speed that the job needs: ``demand / capacity`` where both are
        measured, else ``busy / (1 - wait)``."""
        if self.demand is not None and self.capacity:
            return self.demand / self.capacity
        wait = min(self.wait or 0.0, MAX_WAIT_FRACTION)
        return self.busy / (1.0 - wait)

    @classmethod
    def from_header(cls, header: Any) -> JobLoad:
        """The load in ``header`` (an item of ``LoadReply``'s ``jobs``).

        Raises:
          InvalidArgumentError: a field is missing or mistyped.
        """
        if not isinstance(header, dict):
            raise InvalidArgumentError(f"malformed reply: a job's load is {header!r:.200}")
        return cls(
            job_id=field(header, "job_id", int),
            busy=float(field(header, "busy", (int, float))),
            wait=field(header, "wait", (int, float, type(None))),
            fill=field(header, "fill", (int, float, type(None))),
            elements_per_s=float(field(header, "elements_per_s", (int, float))),
            workers=tuple(field(header, "workers", list)),
            movable=field(header, "movable", bool),
            stages=dict(field(header, "stages", dict, {})),
            measured=field(header, "measured", bool, True),
            steps_per_s=float(field(header, "steps_per_s", (int, float), 0.0)),
            demand=field(header, "demand", (int, float, type(None)), None),
            capacity=field(header, "capacity", (int, float, type(None)), None),
        )

    def to_header(self) -> dict[str, Any]:
        """The load as the dispatcher sends it."""
        return {
            "job_id": self.job_id,
            "busy": self.busy,
            "wait": self.wait,
            "fill": self.fill,
            "elements_per_s": self.elements_per_s,
            "workers": list(self.workers),
            "movable": self.movable,
            "stages": dict(self.stages),
            "measured": self.measured,
            "steps_per_s": self.steps_per_s,
            "demand": self.demand,
            "capacity": self.capacity,
        }


@dataclasses.dataclass(frozen=True)
class WorkerLoad:
    """A registered worker, as ``feedline autoscale`` sees it.

    Attributes:
      address: where consumers reach it.
      draining: it drains before leaving.
      tasks: its running tasks.
      busy: the sum of its tasks' busy fractions.
      pinned: draining it would stop a job: it runs the last task of a running job, or a
        task of a job that cannot move (static sharding, round robin).
    """

    address: str
    draining: bool
    tasks: int
    busy: float
    pinned: bool

    def to_wire(self) -> list[Any]:
        """``[address, draining, tasks, busy, pinned]``."""
        return [self.address, self.draining, self.tasks, self.busy, self.pinned]


@dataclasses.dataclass(frozen=True)
class LoadReply:
    """The dispatcher's reply to ``GetLoad``: the workers the running jobs need, and why.

    Attributes:
      desired_workers: the workers the running jobs need (``feedline_dispatcher_desired_workers``).
      workers: the registered workers.
      jobs: each running job's load.
      consumers: the consumers of the running jobs.
    """

    desired_workers: int
    workers: tuple[WorkerLoad, ...] = ()
    jobs: tuple[JobLoad, ...] = ()
    consumers: int = 0

    @property
    def live_workers(self) -> int:
        """The workers that do not drain."""
        return sum(1 for worker in self.workers if not worker.draining)

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> LoadReply:
        """The reply in ``header``.

        Raises:
          InvalidArgumentError: a field is missing or mistyped.
        """
        workers = _rows(header, "workers", (str, bool, int, float, bool))
        return cls(
            desired_workers=field(header, "desired_workers", int),
            workers=tuple(WorkerLoad(*row) for row in workers),
            jobs=tuple(JobLoad.from_header(job) for job in field(header, "jobs", list, [])),
            consumers=field(header, "consumers", int, 0),
        )

    def to_header(self) -> dict[str, Any]:
        """The reply as the dispatcher sends it."""
        return {
            "desired_workers": self.desired_workers,
            "workers": [worker.to_wire() for worker in self.workers],
            "jobs": [job.to_header() for job in self.jobs],
            "consumers": self.consumers,
        }


# -- distributed_save -------------------------------------------------------------------------

_MAX_PATH_CHARS = 4096


def _path(header: dict[str, Any]) -> str:
    """``header["path"]``: where a snapshot is written, non-empty printable text."""
    path = _text(field(header, "path", str), "path", _MAX_PATH_CHARS)
    if not path:
        raise InvalidArgumentError("malformed request: path must not be empty")
    return path


def _count(header: dict[str, Any], name: str, default: Any = ...) -> int:
    value = field(header, name, int, default)
    if value < 0:
        raise InvalidArgumentError(f"malformed request: {name} must be >= 0, got {value}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class SnapshotRequest:
    """Snapshot: a client starts ``distributed_save`` of dataset ``dataset_id`` to ``path``
    (or resumes the unfinished one there).

    Attributes:
      path: the snapshot's directory (a local path or a URL of the file-system layer).
      dataset_id: the registered dataset.
      fingerprint: the dataset's fingerprint (``Dataset.fingerprint``, 16 hex digits): a
        snapshot of another dataset at ``path`` is refused.
      codec: the chunks' compression (``NONE``, ``GZIP``, ``LZ4`` or ``SNAPPY``).
      element_spec: the element spec as JSON (``_snapshot_format.spec_to_json``).
    """

    path: str
    dataset_id: str
    fingerprint: str
    codec: str
    element_spec: Any

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self:
        """The request in ``header``.

        Raises:
          InvalidArgumentError: a field is missing or mistyped.
        """
        codec = field(header, "codec", str)
        if codec not in ("NONE", "GZIP", "LZ4", "SNAPPY"):
            raise InvalidArgumentError(f"malformed request: unknown codec {codec!r}")
        return cls(
            _path(header),
            _dataset_id(header),
            _text(field(header, "fingerprint", str), "fingerprint", 64),
            codec,
            field(header, "element_spec", (dict, list)),
        )

    def to_header(self) -> dict[str, Any]:
        """The header that carries this request."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class GetSnapshotStreamRequest:
    """GetSnapshotStream: the worker at ``address`` asks for a stream of a save to write (the
    one it writes already, if any)."""

    address: str

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self:
        """The request in ``header``.

        Raises:
          InvalidArgumentError: the address is missing or malformed.
        """
        return cls(_worker_address(header))

    def to_header(self) -> dict[str, Any]:
        """The header that carries this request."""
        return {"address": self.address}


@dataclasses.dataclass(frozen=True)
class SnapshotStreamReply:
    """A stream to write: stream ``stream`` of the save to ``path`` (run ``run``), the dataset
    (``dataset_id``, ``fingerprint``) run over the source units ``units`` (None: the whole
    dataset, whose source does not split), chunks compressed with ``codec``; ``generation``
    is this hand-over of the stream, ``chunks`` its committed chunks (``[name, count]``), after
    which the writer writes on."""

    path: str
    stream: int
    dataset_id: str
    fingerprint: str
    run: str
    codec: str
    units: list[int] | None
    generation: int = 0
    chunks: list[tuple[str, int]] = dataclasses.field(default_factory=list)

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self | None:
        """The stream in ``header``, None where the dispatcher has none to give."""
        if field(header, "stream", (int, type(None)), None) is None:
            return None
        units = field(header, "units", (list, type(None)))
        return cls(
            _path(header),
            _count(header, "stream"),
            _dataset_id(header),
            field(header, "fingerprint", str),
            field(header, "run", str),
            field(header, "codec", str),
            None if units is None else list(_ints(header, "units")),
            _count(header, "generation", 0),
            _chunk_list(header),
        )

    def to_header(self) -> dict[str, Any]:
        """The header that carries this reply."""
        return {**dataclasses.asdict(self), "chunks": [list(c) for c in self.chunks]}


def _chunk_list(header: dict[str, Any]) -> list[tuple[str, int]]:
    """``header["chunks"]``: ``[[name, count], ...]`` (missing: empty)."""
    chunks = []
    for item in field(header, "chunks", list, []):
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], int)
            and not isinstance(item[1], bool)
            and 0 <= item[1] < 2**63
        ):
            raise InvalidArgumentError(
                f"malformed reply: chunks must be [name, count] pairs, got {item!r:.100}"
            )
        chunks.append((item[0], item[1]))
    return chunks


@dataclasses.dataclass(frozen=True)
class SnapshotProgressRequest:
    """SnapshotProgress: the worker at ``address``, writing stream ``stream`` of the save to
    ``path`` in hand-over ``generation``, asks to commit chunk ``chunk`` (its file written,
    ``count`` elements), after which the stream has ``chunks`` chunks, ``elements`` elements
    and ``nbytes`` bytes; or, with ``done``, to complete the stream. ``error``: the dataset
    raised this (``"Type: message"``) while the stream was written, which fails the save.
    The reply's ``accepted`` is False where the stream is no longer this writer's."""

    address: str
    path: str
    stream: int
    chunks: int
    elements: int
    nbytes: int
    done: bool
    error: str | None = None
    generation: int = 0
    chunk: str | None = None
    count: int = 0

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Self:
        """The request in ``header``.

        Raises:
          InvalidArgumentError: a field is missing, mistyped or negative.
        """
        return cls(
            _worker_address(header),
            _path(header),
            _count(header, "stream"),
            _count(header, "chunks"),
            _count(header, "elements"),
            _count(header, "nbytes"),
            field(header, "done", bool),
            field(header, "error", (str, type(None)), None),
            _count(header, "generation", 0),
            field(header, "chunk", (str, type(None)), None),
            _count(header, "count", 0),
        )

    def to_header(self) -> dict[str, Any]:
        """The header that carries this request."""
        return {**dataclasses.asdict(self), "address": self.address}
