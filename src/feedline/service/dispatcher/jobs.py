"""The dispatcher's jobs and their consumers: GetOrCreateJob and ReleaseClient.

``Jobs`` finds or creates the job of ``(job_name, iteration)`` and its tasks (skipping what a
resumed consumer had received, ``position``), checks that consumers sharing a job read it the
same way, and releases consumers, ending and collecting an anonymous job when its consumer is
done. A consumer that resumes a named job from a checkpoint has the job collected first, so that
a new one of its name starts at the consumer's position.
"""

from __future__ import annotations

from typing import Any

from feedline.errors import FailedPreconditionError, InvalidArgumentError
from feedline.service.config import ShardingPolicy
from feedline.service.dispatcher.core import DispatcherCore, Reply
from feedline.service.dispatcher.datasets import Datasets
from feedline.service.dispatcher.long_poll import LongPoll
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
from feedline.service.dispatcher.workers import Workers
from feedline.service.position import (
    JobPosition,
    SplitPosition,
    check_checkpointable,
    position_from_state,
    resume_skips,
)
from feedline.service.protocol import (
    GetOrCreateJobRequest,
    JoinReply,
    ReleaseClientRequest,
)

__all__ = ["Jobs"]

_INFINITE = -1


class Jobs:
    """The job and consumer handlers of a dispatcher.

    Args:
      core: the dispatcher's core.
      datasets: its datasets (what a job reads).
      workers: its workers (where a new job's tasks go).
      long_poll: its job views (GetOrCreateJob's reply carries one).
    """

    def __init__(
        self, core: DispatcherCore, datasets: Datasets, workers: Workers, long_poll: LongPoll
    ) -> None:
        self._core = core
        self._datasets = datasets
        self._workers = workers
        self._long_poll = long_poll

    def get_or_create_job(self, header: dict[str, Any], buffers: list[memoryview]) -> Reply:
        """GetOrCreateJob: a ``JoinReply``, the consumer's id in the job and the job's view."""
        request = GetOrCreateJobRequest.from_header(header)
        mode = ShardingPolicy(request.mode)
        num_consumers = request.num_consumers
        core = self._core
        position = None
        if request.resume is not None:
            check_checkpointable(int(mode), num_consumers, core.config.fault_tolerant_mode)
            position = position_from_state(request.resume, int(mode))
        with core.lock:
            again = self._joined_before(request.request_id)
            if again is not None:  # a retry of a join served already: the same consumer
                return self._join_reply(*again)
            record = self._datasets.lookup(request.dataset_id)
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
            if request.cross_trainer:
                check_cross_trainer(request, mode, record.cardinality)
            if request.commits and not (
                core.config.fault_tolerant_mode
                and mode == ShardingPolicy.DYNAMIC
                and num_consumers is None
                and not request.cross_trainer
            ):
                raise FailedPreconditionError(
                    "acknowledge='on_commit' needs an exactly-once job: ShardingPolicy.DYNAMIC "
                    f"(got {mode.name}) without num_consumers or a cross-trainer cache, from a "
                    "dispatcher started with fault_tolerant_mode=True"
                )
            job = self._find_job(request.job_name, request.iteration)
            if job is not None and position is not None:
                self._collect_for_resume(job)
                job = None
            if job is not None:
                self._check_same_job(
                    job,
                    record,
                    mode,
                    num_consumers,
                    request.target_workers,
                    request.cross_trainer,
                    request.commits,
                )
                self._check_epoch_left(job, request)
            else:
                job = self._create_job(record, mode, request, position)
            client_id = core.state.new_id()
            core.apply(
                AcquireClient(
                    client_id,
                    job.job_id,
                    request.trainer_id,
                    request.request_id,
                    request.trainer_splits,
                )
            )
            # A restored trainer that lacks done splits of a lost task opened them again.
            self._workers.run_replays(job)
            core.job_idle_since.pop(job.job_id, None)
            return self._join_reply(job, client_id)

    def _check_epoch_left(self, job: JobRecord, request: GetOrCreateJobRequest) -> None:
        """Refuses a trainer that joins an exactly-once cross-trainer job whose epoch ended
        (every trainer reading it had all of it, so its workers let go of the elements) while
        it lacks part of that epoch: it would get an end of input in place of what it lacks.

        Raises:
          FailedPreconditionError: the trainer lacks elements of the ended epoch.
        """
        ledger = self._core.state.ledgers.get(job.job_id)
        trainer = request.trainer_id
        if not job.finished or ledger is None or not ledger.per_trainer or trainer is None:
            return
        restored = request.trainer_splits
        splits, elements = ledger.lacking(
            trainer, None if restored is None else {int(k): r for k, r in restored}
        )
        if splits:
            raise FailedPreconditionError(
                f"trainer {trainer!r} joined job {job.job_name!r} after its epoch ended: every "
                f"trainer reading it had received all of it, and its workers let go of the "
                f"elements, but this trainer lacks {elements} elements of {splits} splits. Read "
                "the epoch in a job of its own (another job_name), or keep the trainers "
                "reading until every one has joined (a trainer away for longer than "
                "client_timeout_ms is not waited for)"
            )

    def _joined_before(self, request_id: str | None) -> tuple[JobRecord, int] | None:
        """The job and the consumer that the join ``request_id`` made, if it was served and
        the consumer is still in its job (under the lock)."""
        state = self._core.state
        client_id = None if request_id is None else state.client_by_request.get(request_id)
        if client_id is None or state.clients[client_id].released:
            return None
        return state.jobs[state.clients[client_id].job_id], client_id

    def _join_reply(self, job: JobRecord, client_id: int) -> Reply:
        """The reply to the join that made consumer ``client_id`` of ``job`` (under the lock):
        it counts as the consumer's heartbeat."""
        core = self._core
        core.client_seen[client_id] = core.clock()
        reply = JoinReply(
            job_id=job.job_id,
            client_id=client_id,
            incarnation=core.incarnation,
            client_timeout_ms=int(core.config.client_timeout_s * 1000),
            view=self._long_poll.job_view(job),
        )
        return reply.to_header(), ()

    def _find_job(self, job_name: str | None, iteration: int) -> JobRecord | None:
        if job_name is None:
            return None
        state = self._core.state
        job_id = state.job_by_key.get((job_name, iteration))
        return None if job_id is None else state.jobs[job_id]

    def _check_same_job(
        self,
        job: JobRecord,
        record: DatasetRecord,
        mode: ShardingPolicy,
        num_consumers: int | None,
        target_workers: str,
        cross_trainer: bool = False,
        commits: bool = False,
    ) -> None:
        """A consumer joins a job by its name alone, as in TensorFlow: where it registered
        another dataset than the job's, it reads the job's dataset (TensorFlow's
        ``ValidateMatchingJob`` compares the processing mode and target workers only). The
        elements must still look alike, or the consumer could not read them.

        Raises:
          InvalidArgumentError: the job reads in another way, or elements of another spec.
        """
        diff = []
        for what, theirs, mine in (
            ("processing mode", ShardingPolicy(job.mode).name, mode.name),
            ("num_consumers", job.num_consumers, num_consumers),
            ("target workers", job.target_workers, target_workers),
            ("cross_trainer_cache", job.cross_trainer, cross_trainer),
            ("acknowledge on commit", job.commits, commits),
        ):
            if theirs != mine:
                diff.append(f"Existing {what}: <{theirs}>; got <{mine}>.")
        if job.dataset_id != record.dataset_id:
            theirs_spec = self._datasets.lookup(job.dataset_id).element_spec
            if theirs_spec != record.element_spec:
                diff.append(
                    f"Existing dataset {job.dataset_id} has elements of another structure, "
                    f"dtype or shape than this consumer's dataset {record.dataset_id}."
                )
        if diff:
            raise InvalidArgumentError(
                f"Tried to create job with name {job.job_name}, but found an existing job with "
                f"different parameters: {' '.join(diff)} Consumers that share a job must read "
                "it the same way; use another job_name for another way of reading"
            )

    def _collect_for_resume(self, job: JobRecord) -> None:
        """A consumer resumes the named ``job`` from a checkpoint: the job is collected, so
        that a new one of its name starts at the consumer's position (under the lock).

        Raises:
          FailedPreconditionError: other consumers read the job: the position of one of them
            is not the job's.
        """
        active = self._core.state.active_clients(job.job_id)
        if active:
            raise FailedPreconditionError(
                f"cannot resume job {job.job_name!r} (iteration {job.iteration}) from a "
                f"checkpoint: {len(active)} other consumer(s) read it now, and a consumer's "
                "position is the job's only when it reads the job alone. Resume before other "
                "consumers join, or use another job_name"
            )
        if not job.finished:
            self._core.apply(FinishJob(job.job_id))
        self.remove_job(job)

    def _create_job(
        self,
        record: DatasetRecord,
        mode: ShardingPolicy,
        request: GetOrCreateJobRequest,
        position: JobPosition | SplitPosition | None = None,
    ) -> JobRecord:
        """A new job and its tasks; with ``position``, tasks skip what it says was read."""
        core = self._core
        state = core.state
        num_consumers = request.num_consumers
        addresses = self._job_workers(mode, num_consumers)
        skips = [0] * len(addresses)
        if isinstance(position, JobPosition):
            skips = resume_skips(position, int(mode), addresses)
        job_id = state.new_id()
        core.apply(
            CreateJob(
                job_id,
                record.dataset_id,
                int(mode),
                request.job_name,
                request.iteration,
                num_consumers,
                request.target_workers,
                # A cross-trainer job's ledger counts what each trainer received (``ledger``).
                exactly_once=(
                    core.config.fault_tolerant_mode
                    and mode == ShardingPolicy.DYNAMIC
                    and num_consumers is None
                ),
                cross_trainer=request.cross_trainer,
                commits=request.commits,
            )
        )
        if isinstance(position, SplitPosition):
            core.apply(
                ResumeSplits(
                    job_id,
                    position.cursor,
                    [[key, count] for key, count in position.done.items()],
                    [[key, ranges] for key, ranges in position.partial.items()],
                    [[key, held] for key, held in position.versions.items()],
                )
            )
        for index, address in enumerate(addresses):
            core.apply(
                CreateTask(state.new_id(), job_id, address, index, len(addresses), skips[index])
            )
        return state.jobs[job_id]

    def _job_workers(self, mode: ShardingPolicy, num_consumers: int | None) -> tuple[str, ...]:
        """The workers a new job's tasks go to; checked before the job is made, so that a job
        that cannot start leaves nothing behind (a retry of its name starts afresh)."""
        if mode.is_static:
            addresses = self._core.config.worker_addresses
            if addresses is None:
                raise FailedPreconditionError(
                    f"ShardingPolicy.{mode.name} shards by worker index, which needs the "
                    "dispatcher's fixed list of workers: start it with "
                    "DispatcherConfig(worker_addresses=[...])"
                )
            return addresses
        addresses = self._workers.available()
        if num_consumers is not None and not addresses:
            raise FailedPreconditionError(
                "round-robin reads (num_consumers) need the workers registered before the "
                "job starts; no worker is registered with this dispatcher yet"
            )
        return addresses

    def release_client(self, header: dict[str, Any], buffers: list[memoryview]) -> Reply:
        """ReleaseClient: ``{}``."""
        request = ReleaseClientRequest.from_header(header)
        with self._core.lock:
            job = self._core.consumer(request.client_id)
            self.release(request.client_id, job)
        return {}, ()

    def release(self, client_id: int, job: JobRecord) -> None:
        """Consumer ``client_id`` of ``job`` is done (it said so, or missed heartbeats): an
        anonymous job ends and is collected with its last consumer, a named one waits
        ``job_gc_timeout_ms`` for another (under the lock)."""
        core = self._core
        state = core.state
        if not state.clients[client_id].released:
            core.apply(ReleaseClient(client_id))
            core.finish_job_if_done(job)  # a trainer leaving may settle its splits
        core.client_seen.pop(client_id, None)
        if state.active_clients(job.job_id):
            return
        if job.job_name is None:
            # Nobody else can join an anonymous job: it ends, and is collected now.
            if not job.finished:
                core.apply(FinishJob(job.job_id))
            self.remove_job(job)
        else:  # another consumer may still join it, until job_gc_timeout_ms
            core.job_idle_since[job.job_id] = core.clock()

    def remove_job(self, job: JobRecord) -> None:
        """Collects ``job`` (ended, without consumers): its records go, and its workers, whose
        next heartbeat lists tasks this dispatcher no longer knows, are told to delete them
        (under the lock)."""
        core = self._core
        core.apply(RemoveJob(job.job_id))
        core.job_versions.pop(job.job_id, None)
        self._long_poll.forget(job.job_id)
        core.job_idle_since.pop(job.job_id, None)
        for client_id in job.client_ids:
            core.client_seen.pop(client_id, None)
        core.dataset_used[job.dataset_id] = core.clock()


def check_cross_trainer(
    request: GetOrCreateJobRequest, mode: ShardingPolicy, cardinality: int
) -> None:
    """What a cross-trainer job (``CrossTrainerCache``) asks of the request, as TensorFlow's
    dispatcher checks it, and where feedline goes further (finite DYNAMIC epochs).

    Raises:
      FailedPreconditionError: no job name, round-robin reads, a static sharding policy, or a
        finite dataset under ShardingPolicy.OFF.
    """
    if request.job_name is None:
        raise FailedPreconditionError(
            "cross_trainer_cache needs a job_name: the trainers share the job by its name"
        )
    if request.num_consumers is not None:
        raise FailedPreconditionError(
            "cross_trainer_cache cannot be combined with round-robin reads "
            "(consumer_index/num_consumers): every trainer reads every element"
        )
    if mode not in (ShardingPolicy.OFF, ShardingPolicy.DYNAMIC):
        raise FailedPreconditionError(
            f"cross_trainer_cache needs ShardingPolicy.OFF or DYNAMIC, got {mode.name}: "
            "statically sharded tasks are read by worker index, not shared by trainers"
        )
    if mode == ShardingPolicy.OFF and cardinality != _INFINITE:
        raise FailedPreconditionError(
            f"cross_trainer_cache with ShardingPolicy.OFF needs an infinite dataset (as in "
            f"TensorFlow); dataset {request.dataset_id} has cardinality {cardinality}. Add "
            ".repeat() at the end of the dataset, or read a finite epoch with "
            "'distributed_epoch', where every trainer gets every element once"
        )
