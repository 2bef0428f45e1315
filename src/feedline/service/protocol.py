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

import secrets
import threading

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


# -- messages to a worker -----------------------------------------------------------------------
# What a worker reads: the GetElements request of a consumer, and the dispatcher's replies to
# its WorkerHeartbeat and GetSplit (its task definitions among them).


# -- messages to a consumer ---------------------------------------------------------------------
# What a consumer reads: the dispatcher's replies to GetOrCreateJob and ClientHeartbeat (a job's
# view) and a worker's reply to GetElements.
import dataclasses  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import Any  # noqa: E402

from feedline._net.rpc import field  # noqa: E402
from feedline.errors import InvalidArgumentError  # noqa: E402

__all__ += ["ElementsReply", "HeartbeatReply", "JobView", "JoinReply", "StreamView", "TaskView"]

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
    """The dispatcher's reply to ClientHeartbeat: the job's view and, in an exactly-once job,
    ``splits_done``: ``(key, count)`` of the splits the consumer reported or holds that are
    done (None in other jobs)."""

    incarnation: int
    view: JobView
    splits_done: tuple[tuple[int, int], ...] | None = None

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> HeartbeatReply:
        """The reply in ``header``.

        Raises:
          InvalidArgumentError: a field is missing or mistyped.
        """
        done = None
        if field(header, "splits_done", (list, type(None)), None) is not None:
            done = tuple((key, count) for key, count in _rows(header, "splits_done", (int, int)))
        return cls(field(header, "incarnation", int), JobView.from_header(header), done)

    def to_header(self) -> dict[str, Any]:
        """The reply's header."""
        header = {"incarnation": self.incarnation, **self.view.to_header()}
        if self.splits_done is not None:
            header["splits_done"] = [[key, count] for key, count in self.splits_done]
        return header


@dataclasses.dataclass(frozen=True)
class ElementsReply:
    """A worker's reply to GetElements. Exactly one of: elements (``meta`` describes them, see
    ``feedline._net.elements``; ``tags`` their ``[split, offset]`` in an exactly-once job),
    nothing yet (``eos`` False, no ``meta``), the end of the task's input (``eos``), the task is
    ``gone`` (stopped, or ended and drained), or the ``error`` report of the task's pipeline.
    ``shm`` and ``shm_refused`` are the shared-memory fields (``feedline.service.shm``), which
    a consumer's ``ConsumerChannels.received`` takes out of the header before this is read.

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

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> ElementsReply:
        """The reply in ``header``.

        Raises:
          InvalidArgumentError: a field is mistyped.
        """
        tags = None
        if field(header, "tags", (list, type(None)), None) is not None:
            tags = [list(tag) for tag in _rows(header, "tags", (int, int))]
        return cls(
            eos=field(header, "eos", bool, False),
            meta=field(header, "meta", (dict, type(None)), None),
            tags=tags,
            error=field(header, "error", (dict, type(None)), None),
            gone=field(header, "gone", bool, False),
            shm=field(header, "shm", (dict, type(None)), None),
            shm_refused=field(header, "shm_refused", (str, type(None)), None),
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
        if self.tags:
            header["tags"] = self.tags
        if self.shm is not None:
            header["shm"] = self.shm
        if self.shm_refused is not None:
            header["shm_refused"] = self.shm_refused
        return header
