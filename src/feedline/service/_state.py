"""The dispatcher's durable state: explicit records changed only by explicit updates.

Everything the dispatcher must not forget (registered datasets, workers, jobs, their tasks and
consumers, the split cursors of DYNAMIC jobs) lives in ``DispatcherState`` as plain records.
The state changes in one way only: ``apply(update)``, where an update is one of the small frozen
dataclasses below. Updates are deterministic and JSON-serialisable (``update_to_json`` /
``update_from_json``), so that a journal that writes each update before applying it, and replays
them on start, restores the state exactly. What is volatile (heartbeat times, who is waiting for
what) stays in the dispatcher server and is rebuilt by the next heartbeats.
"""

from __future__ import annotations

import base64
import dataclasses
import typing
from typing import Any

from feedline.errors import InvalidArgumentError

__all__ = [
    "AcquireClient",
    "ClientRecord",
    "CreateJob",
    "CreateTask",
    "DatasetRecord",
    "DispatcherState",
    "FinishJob",
    "FinishTask",
    "JobRecord",
    "MoveSplitCursor",
    "RegisterDataset",
    "RegisterWorker",
    "ReleaseClient",
    "RemoveWorker",
    "TaskRecord",
    "Update",
    "update_from_json",
    "update_to_json",
]


# -- records ----------------------------------------------------------------------------------


@dataclasses.dataclass
class DatasetRecord:
    """A registered dataset: its pickled description and what the dispatcher needs of it."""

    dataset_id: str
    fingerprint: str
    payload: bytes
    element_spec: bytes
    compression: str | None
    cardinality: int
    split_plan: dict[str, Any] | None


@dataclasses.dataclass
class WorkerRecord:
    address: str
    tags: tuple[str, ...] = ()


@dataclasses.dataclass
class TaskRecord:
    """One worker's part of a job: it runs the job's dataset as worker ``worker_index`` of
    ``num_workers`` (what static sharding uses)."""

    task_id: int
    job_id: int
    worker_address: str
    worker_index: int
    num_workers: int
    finished: bool = False


@dataclasses.dataclass
class JobRecord:
    """One iteration of a dataset, shared by the consumers that name it.

    ``job_name`` and ``iteration`` key a named job: the ``iteration``-th pass of each consumer
    over a dataset distributed with that name reads from the same job.
    """

    job_id: int
    dataset_id: str
    mode: int
    job_name: str | None
    iteration: int
    num_consumers: int | None
    target_workers: str
    task_ids: list[int] = dataclasses.field(default_factory=list)
    client_ids: list[int] = dataclasses.field(default_factory=list)
    finished: bool = False


@dataclasses.dataclass
class ClientRecord:
    client_id: int
    job_id: int
    released: bool = False


# -- updates ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RegisterDataset:
    record: DatasetRecord


@dataclasses.dataclass(frozen=True)
class RegisterWorker:
    address: str
    tags: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class RemoveWorker:
    address: str


@dataclasses.dataclass(frozen=True)
class CreateJob:
    job_id: int
    dataset_id: str
    mode: int
    job_name: str | None
    iteration: int
    num_consumers: int | None
    target_workers: str


@dataclasses.dataclass(frozen=True)
class CreateTask:
    task_id: int
    job_id: int
    worker_address: str
    worker_index: int
    num_workers: int


@dataclasses.dataclass(frozen=True)
class FinishTask:
    task_id: int


@dataclasses.dataclass(frozen=True)
class FinishJob:
    job_id: int


@dataclasses.dataclass(frozen=True)
class AcquireClient:
    client_id: int
    job_id: int


@dataclasses.dataclass(frozen=True)
class ReleaseClient:
    client_id: int


@dataclasses.dataclass(frozen=True)
class MoveSplitCursor:
    """The split cursor of ``(job_id, repetition)`` after handing out a split."""

    job_id: int
    repetition: int
    cursor: dict[str, Any]


Update = (
    RegisterDataset
    | RegisterWorker
    | RemoveWorker
    | CreateJob
    | CreateTask
    | FinishTask
    | FinishJob
    | AcquireClient
    | ReleaseClient
    | MoveSplitCursor
)
_UPDATES: dict[str, type] = {kind.__name__: kind for kind in typing.get_args(Update)}


def update_to_json(update: Update) -> dict[str, Any]:
    """``update`` as a JSON-able dict (bytes fields as base64)."""
    fields = dataclasses.asdict(update)
    if isinstance(update, RegisterDataset):
        record = fields["record"]
        for key in ("payload", "element_spec"):
            record[key] = base64.b64encode(record[key]).decode("ascii")
    return {"type": type(update).__name__, **fields}


def update_from_json(data: dict[str, Any]) -> Update:
    """The update ``update_to_json`` wrote.

    Raises:
      InvalidArgumentError: an unknown update type or fields that do not fit it.
    """
    data = dict(data)
    kind = _UPDATES.get(data.pop("type", None))
    if kind is None:
        raise InvalidArgumentError(f"not a dispatcher update: {data!r}")
    try:
        if kind is RegisterDataset:
            record = dict(data["record"])
            for key in ("payload", "element_spec"):
                record[key] = base64.b64decode(record[key])
            return RegisterDataset(DatasetRecord(**record))
        if kind is RegisterWorker:
            data["tags"] = tuple(data.get("tags", ()))
        return kind(**data)
    except (KeyError, TypeError, ValueError) as error:
        raise InvalidArgumentError(f"malformed {kind.__name__} update: {error}") from error


# -- the state --------------------------------------------------------------------------------


class DispatcherState:
    """Datasets, workers, jobs, tasks, consumers and split cursors, changed by ``apply``.

    Not thread-safe: the dispatcher applies updates under its lock.
    """

    def __init__(self) -> None:
        self.datasets: dict[str, DatasetRecord] = {}
        self.dataset_by_fingerprint: dict[str, str] = {}
        self.workers: dict[str, WorkerRecord] = {}
        self.jobs: dict[int, JobRecord] = {}
        self.job_by_key: dict[tuple[str, int], int] = {}
        self.tasks: dict[int, TaskRecord] = {}
        self.clients: dict[int, ClientRecord] = {}
        self.split_cursors: dict[tuple[int, int], dict[str, Any]] = {}
        self.next_id = 1

    def new_id(self) -> int:
        """An id for the next job, task or client (ids are never reused)."""
        return self.next_id

    def _take_id(self, used: int) -> None:
        self.next_id = max(self.next_id, used + 1)

    def apply(self, update: Update) -> None:
        """Changes the state by ``update``; the only way it changes."""
        match update:
            case RegisterDataset(record):
                self.datasets[record.dataset_id] = record
                self.dataset_by_fingerprint[record.fingerprint] = record.dataset_id
            case RegisterWorker(address, tags):
                self.workers[address] = WorkerRecord(address, tuple(tags))
            case RemoveWorker(address):
                self.workers.pop(address, None)
                for task in self.tasks.values():
                    if task.worker_address == address:
                        task.finished = True
            case CreateJob():
                job = JobRecord(**dataclasses.asdict(update))
                self.jobs[job.job_id] = job
                if job.job_name is not None:
                    self.job_by_key[(job.job_name, job.iteration)] = job.job_id
                self._take_id(job.job_id)
            case CreateTask():
                task = TaskRecord(**dataclasses.asdict(update))
                self.tasks[task.task_id] = task
                self.jobs[task.job_id].task_ids.append(task.task_id)
                self._take_id(task.task_id)
            case FinishTask(task_id):
                self.tasks[task_id].finished = True
            case FinishJob(job_id):
                job = self.jobs[job_id]
                job.finished = True
                for task_id in job.task_ids:
                    self.tasks[task_id].finished = True
                for key in [key for key in self.split_cursors if key[0] == job_id]:
                    del self.split_cursors[key]
            case AcquireClient(client_id, job_id):
                self.clients[client_id] = ClientRecord(client_id, job_id)
                self.jobs[job_id].client_ids.append(client_id)
                self._take_id(client_id)
            case ReleaseClient(client_id):
                self.clients[client_id].released = True
            case MoveSplitCursor(job_id, repetition, cursor):
                self.split_cursors[(job_id, repetition)] = cursor
            case _:
                raise InvalidArgumentError(f"not a dispatcher update: {update!r}")

    # -- queries ----------------------------------------------------------------------------
    def active_clients(self, job_id: int) -> list[int]:
        return [c for c in self.jobs[job_id].client_ids if not self.clients[c].released]

    def job_tasks(self, job_id: int) -> list[TaskRecord]:
        return [self.tasks[t] for t in self.jobs[job_id].task_ids]

    def worker_tasks(self, address: str) -> list[TaskRecord]:
        return [task for task in self.tasks.values() if task.worker_address == address]
