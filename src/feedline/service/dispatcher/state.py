"""The dispatcher's durable state: explicit records changed only by explicit updates.

Everything the dispatcher must not forget (registered datasets, workers, jobs, their tasks and
consumers, the split cursors of DYNAMIC jobs) lives in ``DispatcherState`` as plain records.

Ids are never reused, not even by a dispatcher restarted without its journal: every job, task and
consumer id carries the *incarnation* of the dispatcher life that made it in its high bits
(``id >> INCARNATION_SHIFT``), a random number drawn at each start, so an id from an earlier
life is never mistaken for one of this life (``incarnation_of``).
The state changes in one way only: ``apply(update)``, where an update is one of the small frozen
dataclasses below. Updates are deterministic and JSON-serialisable (``update_to_json`` /
``update_from_json``), so that a journal that writes each update before applying it, and replays
them on start, restores the state exactly; ``state_to_json`` / ``state_from_json`` write and read
the whole state at once (the journal's snapshot, which bounds its replay). What is volatile
(heartbeat times, who is waiting for what) stays in the dispatcher server and is rebuilt by the
next heartbeats.
"""

from __future__ import annotations

import base64
import dataclasses
import typing
from typing import Any

from feedline.errors import InvalidArgumentError
from feedline.service.ledger import SplitLedger
from feedline.service.protocol import INCARNATION_SHIFT, incarnation_of

__all__ = [
    "AcquireClient",
    "AssignStream",
    "ClientRecord",
    "CommitChunk",
    "CountSplit",
    "CreateJob",
    "CreateTask",
    "DatasetRecord",
    "DispatcherState",
    "EndTaskSplits",
    "FailSnapshot",
    "FinishJob",
    "FinishSnapshot",
    "FinishStream",
    "FinishTask",
    "HandOutSplits",
    "JobRecord",
    "MoveSplitCursor",
    "RegisterDataset",
    "RegisterWorker",
    "ReleaseClient",
    "RemoveDataset",
    "RemoveJob",
    "RemoveWorker",
    "ReplaySplit",
    "ReportSplits",
    "ResumeSplits",
    "SnapshotRecord",
    "StartSnapshot",
    "TaskRecord",
    "Update",
    "state_from_json",
    "state_to_json",
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
    #: The id of the worker's process (``WorkerHeartbeatRequest.instance``; None: not said).
    instance: int | None = None


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
    #: The task ended because its worker left or was dropped, not because its input ended.
    lost: bool = False
    #: The last DYNAMIC split handed to the task: ``{"request", "repetition", "cursor"}``, the
    #: cursor *before* it (so that a retried request gets the same split again); for a split
    #: handed out again (exactly-once jobs), ``{"request", "repetition", "replay": key}``.
    last_split: dict[str, Any] | None = None
    #: Elements the worker skips before serving: the count a resumed consumer had already
    #: received from this task's stream (``GetOrCreateJob``'s ``resume``), else 0.
    skip: int = 0
    #: (Exactly-once jobs) GetSplit told the task that the splits ended: it asks for none
    #: again, and a split that comes back later runs in a task of its own.
    splits_ended: bool = False


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
    #: Why the job failed (``{"type", "message", "traceback", "worker"}``), None if it did not.
    error: dict[str, Any] | None = None
    #: A DYNAMIC job of a fault-tolerant dispatcher: its splits are kept in a ``SplitLedger``
    #: and every element reaches the consumers once (``ledger``).
    exactly_once: bool = False
    #: Its consumers are trainers that each read every element (``CrossTrainerCache``).
    cross_trainer: bool = False
    #: (``exactly_once``) Its consumers acknowledge elements when their step commits (``ledger``).
    commits: bool = False


@dataclasses.dataclass
class ClientRecord:
    client_id: int
    job_id: int
    released: bool = False
    #: The id of the join that made it, or None.
    request_id: str | None = None


@dataclasses.dataclass
class SnapshotRecord:
    """A ``distributed_save`` of dataset ``dataset_id`` to ``path``: its ``num_streams``
    streams, which worker writes each (None: nobody yet) and which are complete.

    ``cursor`` (a ``SplitCursor``'s JSON, None for a dataset whose source does not split: one
    stream) fixes each stream's units: stream ``i`` is the split at positions
    ``i * split_size`` to ``(i + 1) * split_size``.
    """

    path: str
    dataset_id: str
    fingerprint: str
    run: str
    codec: str
    num_streams: int
    cursor: dict[str, Any] | None
    writers: list[str | None]
    done: list[bool]
    finished: bool = False
    #: Why the save failed (the dataset raised while a stream was written), None if it did not.
    error: str | None = None
    #: Each stream's last hand-over (0: never handed out): only its writer commits chunks.
    generations: list[int] = dataclasses.field(default_factory=list)
    #: Each stream's committed chunks, ``[name, count]``, in order.
    chains: list[list[list[Any]]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.generations += [0] * (self.num_streams - len(self.generations))
        self.chains += [[] for _ in range(self.num_streams - len(self.chains))]


# -- updates ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RegisterDataset:
    record: DatasetRecord


@dataclasses.dataclass(frozen=True)
class RegisterWorker:
    address: str
    tags: tuple[str, ...] = ()
    instance: int | None = None


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
    exactly_once: bool = False
    cross_trainer: bool = False
    commits: bool = False


@dataclasses.dataclass(frozen=True)
class CreateTask:
    """A task of ``job_id`` on the worker at ``worker_address``; ``skip`` elements of its
    stream were already received by a consumer that resumed the job from a checkpoint."""

    task_id: int
    job_id: int
    worker_address: str
    worker_index: int
    num_workers: int
    skip: int = 0


@dataclasses.dataclass(frozen=True)
class FinishTask:
    task_id: int


@dataclasses.dataclass(frozen=True)
class EndTaskSplits:
    """GetSplit told ``task_id`` (of an exactly-once job) that the job's splits ended."""

    task_id: int


@dataclasses.dataclass(frozen=True)
class FinishJob:
    """The job ends: its input ended, or (with ``error``) a task failed and the job with it."""

    job_id: int
    error: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class AcquireClient:
    client_id: int
    job_id: int
    #: The trainer of a cross-trainer job the consumer reads as (``CrossTrainerCache``).
    trainer_id: str | None = None
    #: The id of the join that made the consumer (``GetOrCreateJobRequest.request_id``).
    request_id: str | None = None
    #: A trainer restored from its checkpoint: the offsets of each split its position says it
    #: returned, ``[[key, ranges], ...]`` (``SplitLedger.joined``); None: not restored.
    restored: list[list[Any]] | None = None


@dataclasses.dataclass(frozen=True)
class ReleaseClient:
    client_id: int


@dataclasses.dataclass(frozen=True)
class MoveSplitCursor:
    """The split cursor of ``(job_id, repetition)`` after handing out a split; with ``task_id``,
    the split went to that task as the answer to its request number ``request``, and
    ``previous`` is the cursor it was taken from."""

    job_id: int
    repetition: int
    cursor: dict[str, Any]
    task_id: int | None = None
    request: int | None = None
    previous: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class ReplaySplit:
    """Split ``key`` of exactly-once job ``job_id``, whose worker was lost, was handed out again
    to ``task_id`` as the answer to its request number ``request``."""

    job_id: int
    key: int
    task_id: int
    request: int


@dataclasses.dataclass(frozen=True)
class CountSplit:
    """A worker produced all of split ``key`` of exactly-once job ``job_id``: ``count``
    elements."""

    job_id: int
    key: int
    count: int


@dataclasses.dataclass(frozen=True)
class PinSplitVersion:
    """A run of split ``key`` of exactly-once job ``job_id`` opened object ``url`` as
    ``version``: a run of it again reads that version."""

    job_id: int
    key: int
    url: str
    version: str | int


@dataclasses.dataclass(frozen=True)
class HandOutSplits:
    """Task ``task_id`` of exactly-once job ``job_id`` handed every element of the splits
    ``keys`` to consumers."""

    job_id: int
    task_id: int
    keys: list[int]


@dataclasses.dataclass(frozen=True)
class ReportSplits:
    """Consumer ``client_id`` of exactly-once job ``job_id`` received the offsets ``received``
    (``[[key, ranges], ...]``) and takes nothing more from the lost tasks ``closed``; in a job
    acknowledged on commit, its steps committed the offsets ``committed`` (as ``received``) and
    it reported all it received up to the flush round ``flushed`` (0: none)."""

    job_id: int
    client_id: int
    received: list[list[Any]]
    closed: list[int]
    committed: list[list[Any]] = dataclasses.field(default_factory=list)
    flushed: int = 0


@dataclasses.dataclass(frozen=True)
class ResumeSplits:
    """Exactly-once job ``job_id`` resumes a consumer's saved position: splits of ``cursor``'s
    geometry (None: the job's own), ``done`` (``[[key, count], ...]``) are not handed out,
    ``partial`` ones (``[[key, ranges], ...]``) are handed out first, skipping those offsets,
    and read the objects as ``versions`` (``[[key, {url: version}], ...]``)."""

    job_id: int
    cursor: dict[str, Any] | None
    done: list[list[int]]
    partial: list[list[Any]]
    versions: list[list[Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class StartSnapshot:
    """A ``distributed_save`` begins (or, found unfinished at its path, resumes)."""

    path: str
    dataset_id: str
    fingerprint: str
    run: str
    codec: str
    num_streams: int
    cursor: dict[str, Any] | None


@dataclasses.dataclass(frozen=True)
class AssignStream:
    """Stream ``stream`` of the save to ``path`` is written by the worker at ``worker``, in
    hand-over ``generation`` (an id: never reused, across dispatcher lives too)."""

    path: str
    stream: int
    worker: str
    generation: int = 0


@dataclasses.dataclass(frozen=True)
class CommitChunk:
    """The next chunk of stream ``stream`` of the save to ``path`` is ``name`` (``count``
    elements), written in hand-over ``generation``."""

    path: str
    stream: int
    generation: int
    name: str
    count: int


@dataclasses.dataclass(frozen=True)
class FinishStream:
    """Stream ``stream`` of the save to ``path`` is complete (its DONE file is written)."""

    path: str
    stream: int


@dataclasses.dataclass(frozen=True)
class FailSnapshot:
    """The save to ``path`` failed: its dataset raised ``error`` while a stream was written."""

    path: str
    error: str


@dataclasses.dataclass(frozen=True)
class FinishSnapshot:
    """The save to ``path`` is finished (its DONE file is written)."""

    path: str


@dataclasses.dataclass(frozen=True)
class RemoveJob:
    """The job is collected: it, its tasks, its consumers and its split cursors are forgotten
    (a named job's name then starts a new job)."""

    job_id: int


@dataclasses.dataclass(frozen=True)
class RemoveDataset:
    """The dataset is collected (no job reads it)."""

    dataset_id: str


Update = (
    RegisterDataset
    | RegisterWorker
    | RemoveWorker
    | CreateJob
    | CreateTask
    | FinishTask
    | EndTaskSplits
    | FinishJob
    | AcquireClient
    | ReleaseClient
    | MoveSplitCursor
    | ReplaySplit
    | CountSplit
    | PinSplitVersion
    | HandOutSplits
    | ReportSplits
    | ResumeSplits
    | RemoveJob
    | RemoveDataset
    | StartSnapshot
    | AssignStream
    | CommitChunk
    | FinishStream
    | FinishSnapshot
    | FailSnapshot
)
_UPDATES: dict[str, type] = {kind.__name__: kind for kind in typing.get_args(Update)}


def update_to_json(update: Update) -> dict[str, Any]:
    """``update`` as a JSON-able dict (bytes fields as base64)."""
    if isinstance(update, RegisterDataset):
        fields = dataclasses.asdict(update)
        record = fields["record"]
        for key in ("payload", "element_spec"):
            record[key] = base64.b64encode(record[key]).decode("ascii")
    else:  # fields of JSON values: no copy (``asdict`` copies each, 20 µs an update)
        fields = {field.name: getattr(update, field.name) for field in dataclasses.fields(update)}
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

    def __init__(self, incarnation: int = 0) -> None:
        self.incarnation = incarnation
        self.datasets: dict[str, DatasetRecord] = {}
        self.dataset_by_fingerprint: dict[str, str] = {}
        self.workers: dict[str, WorkerRecord] = {}
        self.jobs: dict[int, JobRecord] = {}
        self.job_by_key: dict[tuple[str, int], int] = {}
        self.tasks: dict[int, TaskRecord] = {}
        # The ids of each worker's tasks, in the order they were made (an index of ``tasks``).
        self._worker_task_ids: dict[str, dict[int, None]] = {}
        self.clients: dict[int, ClientRecord] = {}
        #: The consumer each join made, by the join's request id (an index of ``clients``).
        self.client_by_request: dict[str, int] = {}
        self.split_cursors: dict[tuple[int, int], dict[str, Any]] = {}
        #: The split ledgers of the exactly-once jobs.
        self.ledgers: dict[int, SplitLedger] = {}
        #: The ``distributed_save`` runs, by path.
        self.snapshots: dict[str, SnapshotRecord] = {}
        self.next_id = (incarnation << INCARNATION_SHIFT) + 1

    def new_id(self) -> int:
        """An id for the next job, task or client (ids are never reused, across dispatcher
        lives too: each carries this state's incarnation)."""
        return self.next_id

    def _take_id(self, used: int) -> None:
        if incarnation_of(used) == self.incarnation:  # a replayed id of an earlier life is not
            self.next_id = max(self.next_id, used + 1)

    def apply(self, update: Update) -> None:
        """Changes the state by ``update``; the only way it changes."""
        match update:
            case RegisterDataset(record):
                self.datasets[record.dataset_id] = record
                self.dataset_by_fingerprint[record.fingerprint] = record.dataset_id
                if record.dataset_id.isdigit():  # an id the dispatcher chose (new_id)
                    self._take_id(int(record.dataset_id))
            case RegisterWorker(address, tags, instance):
                self.workers[address] = WorkerRecord(address, tuple(tags), instance)
            case RemoveWorker(address):
                self.workers.pop(address, None)
                for snapshot in self.snapshots.values():  # its streams go to other workers
                    snapshot.writers = [None if w == address else w for w in snapshot.writers]
                for task in self.worker_tasks(address):
                    if not task.finished:
                        task.finished = task.lost = True
                        ledger = self.ledgers.get(task.job_id)
                        if ledger is not None:
                            ledger.holder_lost(task.task_id, self.active_clients(task.job_id))
            case CreateJob():
                job = JobRecord(**dataclasses.asdict(update))
                self.jobs[job.job_id] = job
                if job.job_name is not None:
                    self.job_by_key[(job.job_name, job.iteration)] = job.job_id
                if job.exactly_once:
                    self.ledgers[job.job_id] = SplitLedger(
                        per_trainer=job.cross_trainer, commits=job.commits
                    )
                self._take_id(job.job_id)
            case CreateTask():
                task = TaskRecord(**dataclasses.asdict(update))
                self.tasks[task.task_id] = task
                self._worker_task_ids.setdefault(task.worker_address, {})[task.task_id] = None
                self.jobs[task.job_id].task_ids.append(task.task_id)
                self._take_id(task.task_id)
            case FinishTask(task_id):
                self.tasks[task_id].finished = True
            case EndTaskSplits(task_id):
                self.tasks[task_id].splits_ended = True
            case FinishJob(job_id, error):
                job = self.jobs[job_id]
                job.finished = True
                job.error = error
                for task_id in job.task_ids:
                    self.tasks[task_id].finished = True
                for key in [key for key in self.split_cursors if key[0] == job_id]:
                    del self.split_cursors[key]
            case AcquireClient(client_id, job_id, trainer_id, request_id, restored):
                self.clients[client_id] = ClientRecord(client_id, job_id, request_id=request_id)
                if request_id is not None:
                    self.client_by_request[request_id] = client_id
                if job_id in self.ledgers:
                    self.ledgers[job_id].joined(
                        client_id,
                        trainer_id,
                        None if restored is None else {int(k): r for k, r in restored},
                    )
                self.jobs[job_id].client_ids.append(client_id)
                self._take_id(client_id)
            case ReleaseClient(client_id):
                client = self.clients[client_id]
                client.released = True
                if client.job_id in self.ledgers:
                    self.ledgers[client.job_id].client_gone(client_id)
            case MoveSplitCursor(job_id, repetition, cursor, task_id, request, previous):
                self.split_cursors[(job_id, repetition)] = cursor
                if task_id is not None and task_id in self.tasks:
                    self.tasks[task_id].last_split = {
                        "request": request,
                        "repetition": repetition,
                        "cursor": previous,
                    }
                    if job_id in self.ledgers and previous is not None:
                        self.ledgers[job_id].grant(int(previous["position"]), task_id)
            case ReplaySplit(job_id, key, task_id, request):
                self.ledgers[job_id].regrant(key, task_id)
                self.tasks[task_id].last_split = {
                    "request": request,
                    "repetition": 0,
                    "replay": key,
                }
            case CountSplit(job_id, key, count):
                self.ledgers[job_id].count(key, count)
            case PinSplitVersion(job_id, key, url, version):
                self.ledgers[job_id].pin(key, url, version)
            case HandOutSplits(job_id, task_id, keys):
                for handed_out in keys:
                    self.ledgers[job_id].handed_out(handed_out, task_id)
            case ReportSplits(job_id, client_id, received, closed, committed, flushed):
                ledger = self.ledgers[job_id]
                for received_key, ranges in received:
                    ledger.receive(int(received_key), ranges, client_id)
                for committed_key, ranges in committed:
                    ledger.commit(int(committed_key), ranges, client_id)
                ledger.closed(client_id, closed)
                if flushed:
                    ledger.flushed(client_id, flushed)
            case ResumeSplits(job_id, cursor, done, partial, versions):
                if cursor is not None:
                    self.split_cursors[(job_id, 0)] = {**cursor, "position": 0}
                self.ledgers[job_id].resume(
                    {int(k): int(c) for k, c in done},
                    {int(k): r for k, r in partial},
                    {int(k): held for k, held in versions},
                )
            case RemoveJob(job_id):
                self._remove_job(job_id)
            case RemoveDataset(dataset_id):
                record = self.datasets.pop(dataset_id)
                if self.dataset_by_fingerprint.get(record.fingerprint) == dataset_id:
                    del self.dataset_by_fingerprint[record.fingerprint]
            case StartSnapshot():
                fields = dataclasses.asdict(update)
                count = update.num_streams
                self.snapshots[update.path] = SnapshotRecord(
                    **fields, writers=[None] * count, done=[False] * count
                )
            case AssignStream(path, stream, worker, generation):
                snapshot = self.snapshots[path]
                snapshot.writers[stream] = worker
                snapshot.generations[stream] = generation
                self._take_id(generation)
            case CommitChunk(path, stream, _, name, count):
                self.snapshots[path].chains[stream].append([name, count])
            case FinishStream(path, stream):
                snapshot = self.snapshots[path]
                snapshot.done[stream] = True
                snapshot.writers[stream] = None
            case FinishSnapshot(path):
                self.snapshots[path].finished = True
            case FailSnapshot(path, error):
                snapshot = self.snapshots[path]
                snapshot.error = error
                snapshot.writers = [None] * snapshot.num_streams
            case _:
                raise InvalidArgumentError(f"not a dispatcher update: {update!r}")

    def _remove_job(self, job_id: int) -> None:
        job = self.jobs.pop(job_id)
        if job.job_name is not None:
            name = (job.job_name, job.iteration)
            if self.job_by_key.get(name) == job_id:
                del self.job_by_key[name]
        for task_id in job.task_ids:
            task = self.tasks.pop(task_id)
            ids = self._worker_task_ids[task.worker_address]
            del ids[task_id]
            if not ids:
                del self._worker_task_ids[task.worker_address]
        for client_id in job.client_ids:
            client = self.clients.pop(client_id)
            if client.request_id is not None:
                self.client_by_request.pop(client.request_id, None)
        for cursor in [key for key in self.split_cursors if key[0] == job_id]:
            del self.split_cursors[cursor]
        self.ledgers.pop(job_id, None)

    # -- queries ----------------------------------------------------------------------------
    def active_clients(self, job_id: int) -> list[int]:
        return [c for c in self.jobs[job_id].client_ids if not self.clients[c].released]

    def job_tasks(self, job_id: int) -> list[TaskRecord]:
        return [self.tasks[t] for t in self.jobs[job_id].task_ids]

    def worker_tasks(self, address: str) -> list[TaskRecord]:
        """The tasks of the worker at ``address``, oldest first (from an index: the cost is
        the worker's own tasks, not every task the dispatcher keeps)."""
        return [self.tasks[t] for t in self._worker_task_ids.get(address, ())]


# -- the whole state, at once -----------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def state_to_json(state: DispatcherState) -> dict[str, Any]:
    """The whole of ``state`` as a JSON-able dict: ``state_from_json`` makes an equal state
    (records, indexes, the next id and the incarnation)."""
    datasets = []
    for record in state.datasets.values():
        fields = dataclasses.asdict(record)
        fields["payload"], fields["element_spec"] = _b64(record.payload), _b64(record.element_spec)
        datasets.append(fields)
    return {
        "incarnation": state.incarnation,
        "next_id": state.next_id,
        "datasets": datasets,
        "dataset_by_fingerprint": dict(state.dataset_by_fingerprint),
        "workers": [dataclasses.asdict(w) for w in state.workers.values()],
        "jobs": [dataclasses.asdict(j) for j in state.jobs.values()],
        "job_by_key": [[name, iteration, i] for (name, iteration), i in state.job_by_key.items()],
        "tasks": [dataclasses.asdict(t) for t in state.tasks.values()],
        "clients": [dataclasses.asdict(c) for c in state.clients.values()],
        "split_cursors": [[j, r, cursor] for (j, r), cursor in state.split_cursors.items()],
        "ledgers": [[j, ledger.to_json()] for j, ledger in state.ledgers.items()],
        "snapshots": [dataclasses.asdict(s) for s in state.snapshots.values()],
    }


def state_from_json(data: dict[str, Any]) -> DispatcherState:
    """The state ``state_to_json`` wrote.

    Raises:
      InvalidArgumentError: ``data`` is not a state ``state_to_json`` wrote.
    """
    try:
        state = DispatcherState(int(data["incarnation"]))
        state.next_id = int(data["next_id"])
        for fields in data["datasets"]:
            fields = dict(fields)
            for key in ("payload", "element_spec"):
                fields[key] = base64.b64decode(fields[key])
            record = DatasetRecord(**fields)
            state.datasets[record.dataset_id] = record
        state.dataset_by_fingerprint = {
            str(k): str(v) for k, v in data["dataset_by_fingerprint"].items()
        }
        for fields in data["workers"]:
            worker = WorkerRecord(fields["address"], tuple(fields["tags"]), fields.get("instance"))
            state.workers[worker.address] = worker
        for fields in data["jobs"]:
            job = JobRecord(**fields)
            state.jobs[job.job_id] = job
        state.job_by_key = {(name, int(it)): int(i) for name, it, i in data["job_by_key"]}
        for fields in data["tasks"]:
            task = TaskRecord(**fields)
            state.tasks[task.task_id] = task
            state._worker_task_ids.setdefault(task.worker_address, {})[task.task_id] = None
        for fields in data["clients"]:
            client = ClientRecord(**fields)
            state.clients[client.client_id] = client
            if client.request_id is not None:
                state.client_by_request[client.request_id] = client.client_id
        state.split_cursors = {(int(j), int(r)): dict(c) for j, r, c in data["split_cursors"]}
        state.ledgers = {int(j): SplitLedger.from_json(d) for j, d in data.get("ledgers", ())}
        for fields in data.get("snapshots", ()):
            snapshot = SnapshotRecord(**fields)
            state.snapshots[snapshot.path] = snapshot
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise InvalidArgumentError(f"not a dispatcher state snapshot: {error!r}") from error
    return state
