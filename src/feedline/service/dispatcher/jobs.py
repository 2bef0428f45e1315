"""The dispatcher's jobs and their consumers: GetOrCreateJob and ReleaseClient.

Part of ``DispatchServer`` (``dispatcher``): ``JobHandlers`` holds its methods that find or create
the job of ``(job_name, iteration)`` and its tasks (skipping what a resumed consumer had received,
``position``), check that consumers sharing a job read it the same way, and release consumers,
ending and collecting an anonymous job when its consumer is done.
"""

from __future__ import annotations

import time
from typing import Any

from feedline._net.rpc import field
from feedline.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from feedline.service.config import ShardingPolicy
from feedline.service.dispatcher.state import (
    AcquireClient,
    CreateJob,
    CreateTask,
    DatasetRecord,
    FinishJob,
    JobRecord,
    ReleaseClient,
    RemoveJob,
    ResumeSplits,
)
from feedline.service.position import (
    JobPosition,
    SplitPosition,
    check_checkpointable,
    position_from_state,
    resume_skips,
)
from feedline.service.protocol import incarnation_of

_TARGET_WORKERS = ("AUTO", "ANY", "LOCAL")
_INFINITE = -1


class JobHandlers:
    """The job and consumer methods of ``DispatchServer``.

    A base of ``DispatchServer`` only: its methods use the server's state and lock.
    """

    def _get_or_create_job(self, header: dict[str, Any], buffers: list[memoryview]) -> Any:
        mode = ShardingPolicy(field(header, "mode", int))
        job_name = field(header, "job_name", (str, type(None)))
        iteration = field(header, "iteration", int)
        num_consumers = field(header, "num_consumers", (int, type(None)))
        target_workers = field(header, "target_workers", str)
        if target_workers not in _TARGET_WORKERS:
            raise InvalidArgumentError(
                f"target_workers must be one of {_TARGET_WORKERS}, got {target_workers!r}"
            )
        resume = header.get("resume")
        position = None
        if resume is not None:
            check_checkpointable(int(mode), num_consumers, self._config.fault_tolerant_mode)
            position = position_from_state(resume, int(mode))
        with self._lock:
            record = self._dataset(header.get("dataset_id"))
            if mode == ShardingPolicy.DYNAMIC and record.split_plan is None:
                raise FailedPreconditionError(
                    f"dataset {record.dataset_id} has no splittable source, so it cannot be "
                    "read with ShardingPolicy.DYNAMIC"
                )
            if num_consumers is not None and record.cardinality != _INFINITE:
                raise FailedPreconditionError(
                    "round-robin reads (num_consumers) need a dataset of infinite cardinality, "
                    f"so that the consumers stay in step; dataset {record.dataset_id} has "
                    f"cardinality {record.cardinality}. Add .repeat() at the end of the dataset"
                )
            job = self._find_job(job_name, iteration)
            if job is not None and position is not None:
                self._collect_for_resume(job)
                job = None
            if job is not None:
                self._check_same_job(job, record.dataset_id, mode, num_consumers, target_workers)
            else:
                job = self._create_job(
                    record, mode, job_name, iteration, num_consumers, target_workers, position
                )
            client_id = self._state.new_id()
            self._apply(AcquireClient(client_id, job.job_id))
            self._client_seen[client_id] = time.monotonic()
            self._job_idle_since.pop(job.job_id, None)
            reply = {
                "job_id": job.job_id,
                "client_id": client_id,
                "incarnation": self._incarnation,
                "client_timeout_ms": int(self._config.client_timeout_s * 1000),
                **self._job_view(job),
            }
            return reply, ()

    def _find_job(self, job_name: str | None, iteration: int) -> JobRecord | None:
        if job_name is None:
            return None
        job_id = self._state.job_by_key.get((job_name, iteration))
        return None if job_id is None else self._state.jobs[job_id]

    @staticmethod
    def _check_same_job(
        job: JobRecord,
        dataset_id: str,
        mode: ShardingPolicy,
        num_consumers: int | None,
        target_workers: str,
    ) -> None:
        theirs = (job.dataset_id, ShardingPolicy(job.mode), job.num_consumers, job.target_workers)
        mine = (dataset_id, mode, num_consumers, target_workers)
        if theirs != mine:
            raise InvalidArgumentError(
                f"job {job.job_name!r} was created with (dataset, processing_mode, "
                f"num_consumers, target_workers) = {theirs}, but this consumer asks for {mine}; "
                "consumers that share a job must read the same dataset the same way"
            )

    def _create_job(
        self,
        record: DatasetRecord,
        mode: ShardingPolicy,
        job_name: str | None,
        iteration: int,
        num_consumers: int | None,
        target_workers: str,
        position: JobPosition | SplitPosition | None = None,
    ) -> JobRecord:
        """A new job and its tasks; with ``position``, tasks skip what it says was read."""
        state = self._state
        addresses = self._job_workers(mode, num_consumers)
        skips = [0] * len(addresses)
        if isinstance(position, JobPosition):
            skips = resume_skips(position, int(mode), addresses)
        job_id = state.new_id()
        self._apply(
            CreateJob(
                job_id,
                record.dataset_id,
                int(mode),
                job_name,
                iteration,
                num_consumers,
                target_workers,
                exactly_once=(
                    self._config.fault_tolerant_mode
                    and mode == ShardingPolicy.DYNAMIC
                    and num_consumers is None
                ),
            )
        )
        if isinstance(position, SplitPosition):
            self._apply(
                ResumeSplits(
                    job_id,
                    position.cursor,
                    [[key, count] for key, count in position.done.items()],
                    [[key, ranges] for key, ranges in position.partial.items()],
                )
            )
        for index, address in enumerate(addresses):
            self._apply(
                CreateTask(state.new_id(), job_id, address, index, len(addresses), skips[index])
            )
        return state.jobs[job_id]

    def _job_workers(self, mode: ShardingPolicy, num_consumers: int | None) -> tuple[str, ...]:
        """The workers a new job's tasks go to; checked before the job is made, so that a job
        that cannot start leaves nothing behind (a retry of its name starts afresh)."""
        if mode.is_static:
            addresses = self._config.worker_addresses
            if addresses is None:
                raise FailedPreconditionError(
                    f"ShardingPolicy.{mode.name} shards by worker index, which needs the "
                    "dispatcher's fixed list of workers: start it with "
                    "DispatcherConfig(worker_addresses=[...])"
                )
            return addresses
        addresses = tuple(sorted(set(self._state.workers) - self._draining))
        if num_consumers is not None and not addresses:
            raise FailedPreconditionError(
                "round-robin reads (num_consumers) need the workers registered before the "
                "job starts; no worker is registered with this dispatcher yet"
            )
        return addresses

    def _client(self, header: dict[str, Any]) -> tuple[int, JobRecord]:
        client_id = field(header, "client_id", int)
        client = self._state.clients.get(client_id)
        if client is None:
            if incarnation_of(client_id) != self._incarnation:
                raise FailedPreconditionError(
                    f"consumer {client_id} joined its job in an earlier life of the dispatcher "
                    f"at {self.target.split('://')[-1]}, which has restarted since without a "
                    "journal: the job is gone, and the elements not yet received with it. "
                    "Iterate the dataset again to start a new job"
                )
            raise NotFoundError(f"no consumer {client_id} is known to the dispatcher")
        return client_id, self._state.jobs[client.job_id]

    def _release_client(self, header: dict[str, Any], buffers: list[memoryview]) -> Any:
        with self._lock:
            client_id, job = self._client(header)
            self._release(client_id, job)
        return {}, ()

    def _release(self, client_id: int, job: JobRecord) -> None:
        if not self._state.clients[client_id].released:
            self._apply(ReleaseClient(client_id))
        self._client_seen.pop(client_id, None)
        if self._state.active_clients(job.job_id):
            return
        if job.job_name is None:
            # Nobody else can join an anonymous job: it ends, and is collected now.
            if not job.finished:
                self._apply(FinishJob(job.job_id))
            self._remove_job(job)
        else:  # another consumer may still join it, until job_gc_timeout_ms
            self._job_idle_since[job.job_id] = time.monotonic()

    def _remove_job(self, job: JobRecord) -> None:
        """Collects ``job`` (ended, without consumers): its records go, and its workers, whose
        next heartbeat lists tasks this dispatcher no longer knows, are told to delete them
        (under the lock)."""
        self._apply(RemoveJob(job.job_id))
        self._job_versions.pop(job.job_id, None)
        self._job_idle_since.pop(job.job_id, None)
        for client_id in job.client_ids:
            self._client_seen.pop(client_id, None)
        self._dataset_used[job.dataset_id] = time.monotonic()
