"""The consumer's threads: ``_JobReader`` joins a job, heartbeats the dispatcher for the job's
tasks and reads them (its fetch threads: ``fetch``):

- first come, first served: one fetch thread per task asks for as many elements as the
  consumer has room for (``max_outstanding_requests`` elements in flight and buffered, and a
  byte budget), several per reply when they are small;
- round robin (``consumer_index``/``num_consumers``): round ``r`` is read from task
  ``r % num_tasks``; every consumer reads the same worker at each step.

The reader owns the queue its fetch threads write to (``queue.ElementQueue``) and hands it to
them, with itself as their ``fetch.ReaderLink``; in an exactly-once job it keeps the consumer's
receipts (``exactly_once.SplitReceipts``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import secrets
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from feedline import structure
from feedline._net import exit as _exit
from feedline._net.remote_errors import error_from_report
from feedline._net.retry import call_within
from feedline.errors import (
    FailedPreconditionError,
    FeedlineError,
    NotFoundError,
    UnavailableError,
)
from feedline.service.client.channels import SLOW_CALL_S, _bounded_call, _dispatcher
from feedline.service.client.cross_trainer import TrainerPosition, TrainerPositions
from feedline.service.client.exactly_once import SplitReceipts
from feedline.service.client.fetch import REPLY_BYTES, RPC_TIMEOUT_S, Fetchers
from feedline.service.client.queue import ElementQueue
from feedline.service.client.read_params import _ReadParams
from feedline.service.client.step_commits import StepCommits
from feedline.service.config import ShardingPolicy
from feedline.service.position import (
    JobPosition,
    SplitPosition,
    TaskPosition,
    check_checkpointable,
)
from feedline.service.protocol import (
    ClientHeartbeatRequest,
    GetOrCreateJobRequest,
    HeartbeatReply,
    InputWait,
    JobView,
    JoinReply,
    ReleaseClientRequest,
    SplitVersionsRequest,
    StreamView,
    local_worker_addresses,
    split_versions_from_reply,
)
from feedline.service.shm import ConsumerChannels

if TYPE_CHECKING:
    from feedline.service.client.dataset import DataServiceDataset

logger = logging.getLogger(__name__)

# Without max_outstanding_requests: elements a consumer keeps in flight and buffered.
_DEFAULT_OUTSTANDING = 1024
# The same for a consumer of a shared job (a job_name, first come, first served): what it holds
# is lost to the job's other consumers, and one that joins later shares only what the workers
# still have, so it holds a few elements ahead, not a whole small job (TF's consumers share a
# job's elements, each to one consumer): 16 at first, then what it reads in
# ``ElementQueue.HOLD_S`` (50 ms), up to _DEFAULT_OUTSTANDING. A fixed 16 made a fast reader
# ask for 2-5 elements a request: a tenth of the rate of a job without a name.
_SHARED_OUTSTANDING = 16
# The same for a round-robin consumer (num_consumers), at most: its fetch thread also holds the
# rounds of each task that one reply brought beyond the one due (as many as the queue had room
# for). A worker keeps at most 256 rounds that not every consumer took (``buffer.ROUND_WINDOW``):
# a consumer further ahead waits for the others.
_ROUNDS_AHEAD = 512
# Elements' bytes a consumer keeps in flight and buffered.
_BUFFER_BYTES = 64 << 20
# The size of a shared-memory arena's slot: the most bytes a reply carries.
_REPLY_BYTES = REPLY_BYTES
# The longest time between a consumer's heartbeats (shorter if the dispatcher's
# client_timeout_ms asks for it).
_HEARTBEAT_S = 1.0
# The same while the job's view does not change: each heartbeat without news doubles the time
# to the next, up to this or a quarter of client_timeout_ms or of the consumer's timeout
# (whichever is shortest); news brings it back. A task ending here asks for the view at once
# (``tasks_ended``).
_IDLE_HEARTBEAT_S = 4.0
# The longest time between the reports of a consumer of an exactly-once job (what it received:
# a split is done, and the job can end, only once its elements are reported).
_REPORT_S = 0.1
# A reader of an exactly-once job that waits this long for an element has its heartbeat report
# at once (``_nudge_report``): the job's last splits are done, and its end comes, only once the
# consumers' receipts are reported. At most every _NUDGE_EVERY_S, so that a reader that often
# waits does not turn every wait into a report.
_NUDGE_AFTER_S = 0.005
_NUDGE_EVERY_S = 0.02


class StepWaits:
    """How long a consumer's steps waited for input: each ``next`` call is a step, and the
    time from the end of the first on is the consumer's (the first waits for the job to
    start); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._first: float | None = None
        self._steps = 0
        self._waited = 0.0

    def step(self, started: float, ended: float) -> None:
        """A step asked for input at ``started`` and had it (or an error) at ``ended``."""
        with self._lock:
            if self._first is None:
                self._first = ended
                return
            self._steps += 1
            self._waited += ended - started

    def report(self) -> InputWait | None:
        """The waits so far, None before the first step."""
        with self._lock:
            if self._first is None:
                return None
            return InputWait(self._steps, self._waited, time.monotonic() - self._first)


class _JobReader:
    """Joins a job and reads it: a heartbeat thread follows the job's view at the dispatcher,
    fetch threads (``Fetchers``) fill the reader's ``ElementQueue``, ``next`` takes from it.

    How a read ends (``next``):

    ===============================================  ==========================================
    every task's input ended (the worker said        StopIteration
    ``eos``; or some did and the others were lost
    with their workers) and a view of the job
    asked for after that lists no other task (a
    worker that registers mid-job gets a task of
    it); or the dispatcher ended the job
    without error
    the job failed: a task raised (any worker),      that error, at every call; the reader
    the dispatcher restarted without its journal,    stops its threads and releases the job
    the consumer was released, a round-robin
    worker is gone
    the reader was released while ``next`` waited   ``FailedPreconditionError`` (the exit
                                                     hook released it: a thread still reading
                                                     stops waiting)
    the dispatcher did not answer for ``timeout_s``  ``UnavailableError``, once: the next call
    or no worker served the job for ``timeout_s``    waits again
    ===============================================  ==========================================

    Only a failed RPC means that a worker cannot be reached; an error raised by the pipeline on
    a worker arrives inside a reply, whatever its type, and fails the job.
    """

    def __init__(
        self,
        dataset: DataServiceDataset,
        iteration: int,
        timeout_s: float,
        resume: JobPosition | SplitPosition | TrainerPosition | None = None,
        job_name: str | None = None,
    ) -> None:
        params = self._params = dataset._params
        # A trainer of a cross-trainer job keeps its own positions and rejoins its job.
        self.trainer: TrainerPositions | None = None
        # (an exactly-once cross-trainer job) The dispatcher said this trainer has every
        # element of the epoch: once it returned them, its epoch ends, whatever the others read.
        self._epoch_complete = False
        if params.trainer_id is not None:
            restored = resume if isinstance(resume, TrainerPosition) else None
            self.trainer = TrainerPositions(params.trainer_id, restored)
            resume = None
        self._resume = resume
        # The name of the job joined: the dataset's, or the one a cluster's restore chose.
        self.job_name = job_name or params.job_name
        self._dispatcher = _dispatcher(params.address)
        self._timeout_s = timeout_s
        shared = (
            params.job_name is not None and params.num_consumers is None and self.trainer is None
        )
        if params.num_consumers is not None:
            outstanding = min(params.max_outstanding_requests or _ROUNDS_AHEAD, _ROUNDS_AHEAD)
            self.queue = ElementQueue(outstanding, _BUFFER_BYTES)
        elif params.max_outstanding_requests:
            self.queue = ElementQueue(params.max_outstanding_requests, _BUFFER_BYTES)
        elif shared:
            self.queue = ElementQueue(_SHARED_OUTSTANDING, _BUFFER_BYTES, _DEFAULT_OUTSTANDING)
        else:
            self.queue = ElementQueue(_DEFAULT_OUTSTANDING, _BUFFER_BYTES)
        # Replies from same-host workers through shared memory (_shm).
        self._shm = ConsumerChannels(params.data_transfer_protocol != "grpc", _REPLY_BYTES)
        # Guards what the newest view said (below) and _answered_at, _released.
        self._lock = threading.Lock()
        self._version = -1
        self._view = JobView()  # the newest view (a heartbeat answered "unchanged" repeats it)
        self._consumers = 1  # the job's consumers, as the dispatcher last said
        self._joined = 1  # the consumers that ever joined the job, as the dispatcher last said
        self._streams: dict[int, StreamView] = {}  # per task: what a position saves
        self._split_cursor: dict[str, Any] | None = None  # what split keys mean
        self._released = False
        # The start of the wait for a worker (``queue.idle_since``) that a warning told of.
        self._idle_told: float | None = None
        # How long the training steps waited for input (the heartbeats report it).
        self._input_wait = StepWaits()
        # A consumer that acknowledges on commit (``step_commits``), once it joined.
        self._commits: StepCommits | None = None
        joined = self._join(dataset, iteration)
        self._client_id = joined.client_id
        self._job_id = joined.job_id
        if self.trainer is not None:
            try:
                self.trainer.check_job(joined.job_id, params.job_name)
            except FailedPreconditionError:
                self.release()
                raise
        self._heartbeat_s = min(_HEARTBEAT_S, max(0.05, joined.client_timeout_ms / 4000))
        # While the job's view does not change, the heartbeats space out up to this (well
        # within the time after which a silent dispatcher is an error, ``_overdue``).
        idle_s = min(_IDLE_HEARTBEAT_S, joined.client_timeout_ms / 4000, timeout_s / 4)
        self._idle_heartbeat_s = max(self._heartbeat_s, idle_s)
        # Exactly-once jobs (``ledger``): the [split, offset] received and returned.
        self._splits: SplitReceipts | None = None
        self._nudged_at = -math.inf  # when the reader last nudged the heartbeat (monotonic)
        if joined.view.exactly_once:
            self._splits = SplitReceipts(
                resume if isinstance(resume, SplitPosition) else None,
                None if self.trainer is None else self.trainer.restored_splits(),
            )
            self._heartbeat_s = self._idle_heartbeat_s = min(self._heartbeat_s, _REPORT_S)
            # A trainer's epoch ends when the dispatcher says it has every element of it.
            self.queue.ends_by_view = self.trainer is not None
        if params.commits and self._splits is not None:
            self._commits = StepCommits()
        self._fetchers = Fetchers(
            self.queue,
            self,
            self._shm,
            structure.spec_structure(dataset.element_spec),
            client_id=joined.client_id,
            job_id=joined.job_id,
            consumer_index=params.consumer_index,
            timeout_s=timeout_s,
            trainer=self.trainer,
        )
        self._answered_at = time.monotonic()
        self._apply_view(joined.view, 0)
        _exit.register(self, "stop_at_exit", _exit.CONSUMER)
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, name=f"feedline-consumer-{self._client_id}", daemon=True
        )
        self._heartbeat_thread.start()
        _exit.join_at_exit(self._heartbeat_thread)

    @property
    def params(self) -> _ReadParams:
        """How this consumer reads (the arguments of ``distribute``)."""
        return self._params

    @property
    def client_id(self) -> int:
        """This consumer's id at the dispatcher."""
        return self._client_id

    def uncommitted(self) -> int:
        """(``acknowledge="on_commit"``) How many elements ``next`` returned since the last
        commit."""
        return 0 if self._commits is None else self._commits.step_size

    # -- the dispatcher ---------------------------------------------------------------------
    def _join(self, dataset: DataServiceDataset, iteration: int) -> JoinReply:
        """Joins the job, registering the dataset first where needed, and again if the
        dispatcher no longer knows it (it restarted without a journal)."""
        dataset_id = dataset._registered_id(self._timeout_s)
        try:
            return self._join_as(dataset_id, iteration)
        except NotFoundError:
            if not dataset._forget_registration(dataset_id):
                raise
        return self._join_as(dataset._registered_id(self._timeout_s), iteration)

    def _join_as(self, dataset_id: str, iteration: int) -> JoinReply:
        params = self._params
        request = GetOrCreateJobRequest(
            dataset_id,
            int(params.mode),
            self.job_name,
            iteration,
            params.num_consumers,
            params.target_workers,
            None if self._resume is None else self._resume.to_state(),
            cross_trainer=self.trainer is not None,
            trainer_id=None if self.trainer is None else self.trainer.trainer_id,
            # The same in every retry of this join: the dispatcher serves it once.
            request_id=secrets.token_hex(16),
            commits=params.commits,
            trainer_splits=None if self.trainer is None else self.trainer.restored_report(),
        )
        what = f"joining a job of dataset {dataset_id}"
        reply, _ = _bounded_call(
            self._dispatcher, "GetOrCreateJob", request.to_header(), self._timeout_s, what
        )
        return JoinReply.from_header(reply)

    def _heartbeat_loop(self) -> None:
        interval = self._heartbeat_s
        while not self.queue.closed:
            started = time.monotonic()
            asked_after = self.queue.ends()
            with self._lock:
                version = self._version
            # A consumer of an exactly-once job does not wait at the dispatcher: its reports
            # go every _REPORT_S, and at once when the reader nudges (``_nudge_report``).
            wait_ms = 0 if self._splits is not None else int(interval * 1000)
            committed_tags: list[Sequence[int]] = []  # (on commit) acknowledged by this one
            request = ClientHeartbeatRequest(
                self._client_id, version, wait_ms, input_wait=self._input_wait.report()
            )
            if self._splits is not None:  # what it received, and the lost tasks it closed
                # A flush is reported with the receipts collected after it (``step_commits``).
                commits = self._commits
                flushed = (
                    0 if commits is None else commits.flush_report(self.queue.answered_through)
                )
                request = dataclasses.replace(request, **self._splits.report(), flushed=flushed)
                if self._commits is not None:  # steps committed with commit(wait=False)
                    committed, committed_tags = self._commits.take_unsent()
                    request = dataclasses.replace(request, committed=committed)
            try:
                header, _ = self._dispatcher.call(
                    "ClientHeartbeat", request.to_header(), timeout=interval + RPC_TIMEOUT_S
                )
                reply = HeartbeatReply.from_header(header)
            except UnavailableError:  # next() raises once this lasts too long
                if self._splits is not None:
                    self._splits.report_failed()
                if self._commits is not None and request.committed:
                    self._commits.unsent(request.committed, committed_tags)
                self.queue.wait_closed(min(interval, 0.5))
                continue
            except BaseException as error:
                self.fail(error)
                return
            with self._lock:
                self._answered_at = time.monotonic()
            if self._splits is not None and self._commits is not None:
                # Acknowledged: they count in the position.
                self._splits.returned_all(committed_tags)
            # A trainer keeps what it has of a split done for the job: restored from its
            # checkpoint, it may read the split again.
            if self._splits is not None and self.trainer is None:
                self._splits.heard(reply.splits_done or ())
            if self.trainer is not None and reply.complete:
                self._epoch_complete = True
            if self._commits is not None:
                self._commits.awaits_commits = reply.awaits_commits
                if reply.flush:
                    self._commits.asked(reply.flush, self.queue.requests_made())
            news = self._apply_view(self._view_in(reply), asked_after)
            if news:
                interval = self._heartbeat_s
            if self._commits is not None and (
                self._commits.flush_pending() or self._commits.has_unsent()
            ):
                self.queue.wait_closed(0.01)  # its replies in flight arrive meanwhile
            elif (
                not news
            ):  # no news: the next waits its turn, and while none comes, longer each time
                self.queue.wait_nudged(max(0.0, interval - (time.monotonic() - started)))
                interval = min(interval * 2, self._idle_heartbeat_s)

    def _view_now(self, within_s: float = 0.0) -> HeartbeatReply:
        """The job's view, asked for at once (without waiting for news); asked again for up to
        ``within_s`` while the dispatcher cannot answer (it restarts)."""
        request = ClientHeartbeatRequest(self._client_id).to_header()
        if within_s <= 0:
            header, _ = self._dispatcher.call("ClientHeartbeat", request, timeout=RPC_TIMEOUT_S)
        else:
            header, _ = call_within(
                within_s,
                lambda timeout: self._dispatcher.call("ClientHeartbeat", request, timeout=timeout),
                attempt_s=RPC_TIMEOUT_S,
            )
        return HeartbeatReply.from_header(header)

    def _split_versions(self, partial: dict[int, Any]) -> dict[int, dict[str, str | int]]:
        """The object versions the ``partial`` splits are held to, as the dispatcher says
        (they go with the position, so that the job it resumes in reads their rest from the
        same versions)."""
        if not partial:
            return {}
        request = SplitVersionsRequest(self._client_id, tuple(sorted(partial)))
        try:
            header, _ = call_within(
                self._timeout_s,
                lambda timeout: self._dispatcher.call(
                    "SplitVersions", request.to_header(), timeout=timeout
                ),
                attempt_s=RPC_TIMEOUT_S,
            )
        except FeedlineError as error:
            raise FailedPreconditionError(
                f"cannot save the position of the consumer of job {self._job_id}: the "
                f"dispatcher at {self._params.address} did not say which object versions its "
                f"splits read ({error})"
            ) from error
        return split_versions_from_reply(header)

    def _view_in(self, reply: HeartbeatReply) -> JobView:
        """The job's view that ``reply`` gives: its own, or where it says that this consumer's
        is current (``unchanged``), the newest this consumer has."""
        if reply.view is not None:
            return reply.view
        with self._lock:
            return self._view

    def _apply_view(self, view: JobView, asked_after: int) -> bool:
        """Takes in the job's view from the dispatcher, asked for once ``asked_after`` tasks had
        ended here; starts reading new tasks. Whether it was news."""
        listed = list(view.tasks)
        if self._params.target_workers == "LOCAL":
            local = local_worker_addresses()
            if listed and not any(task.address in local for task in listed):
                self.fail(
                    FailedPreconditionError(
                        "target_workers='LOCAL' reads only from workers in this process, and "
                        "none of the job's workers runs here; start a WorkerServer in this "
                        "process or use target_workers='ANY'"
                    )
                )
                return True
            listed = [task for task in listed if task.address in local]
        if self.trainer is not None:
            # A task is done for the job once the trainers its worker knows read it all; this
            # trainer (restarted from a checkpoint) may still have to: its worker says when.
            listed = [
                dataclasses.replace(task, state="running") if task.state == "done" else task
                for task in listed
            ]
        with self._lock:
            news = view.version != self._version
            self._version = view.version
            self._view = view
            if view.split_cursor is not None:
                self._split_cursor = view.split_cursor
            self._consumers = view.consumers
            self._joined = view.joined
            self._streams.update((stream.task_id, stream) for stream in view.streams)
        if self._splits is not None:  # nothing more is taken from a lost task
            self._splits.close_tasks(task.task_id for task in view.tasks if task.state == "lost")
        error = None if view.error is None else error_from_report(view.error)
        new = self.queue.update(listed, asked_after, view.finished, view.consumers, error)
        if error is not None:
            self.fail(error)
        elif self._params.num_consumers is not None:
            if new:
                self._fetchers.start_rounds()
        else:
            for task_id in new:
                if self.queue.readable(task_id):
                    self._fetchers.start_task(task_id)
        return news

    # -- what the fetch threads need (fetch.ReaderLink) -------------------------------------
    def consumers(self) -> int:
        """The job's consumers, as the dispatcher last said."""
        with self._lock:
            return self._consumers

    def admit(self, task_id: int, tags: Sequence[Sequence[int]] | None, count: int) -> list[bool]:
        """Which of the ``count`` elements of a reply of ``task_id`` this consumer takes: all,
        but in an exactly-once job none from a task it closed and none it received before.

        Raises:
          FailedPreconditionError: an exactly-once job's elements came without their tags.
        """
        if self._splits is None:
            return [True] * count
        if self.trainer is not None:
            keep = self.trainer.admit(self._splits, task_id, tags, count)
        else:
            keep = self._splits.keep(task_id, tags, count)
        if keep is None:
            raise FailedPreconditionError(
                f"the worker {self.queue.address(task_id)} sent elements of exactly-once job "
                f"{self._job_id} without their [split, offset] tags"
            )
        return keep

    def tasks_ended(self) -> None:
        """Asks the dispatcher for the job's view at once, without waiting for news: called when
        every task this consumer knows has ended, to learn of a task made since the last view
        before taking this for the end of the job. If the call fails, the heartbeat's next view
        serves instead."""
        if self.queue.closed or self.queue.job_finished:
            return
        asked_after = self.queue.ends()
        try:
            reply = self._view_now()
        except FeedlineError as error:  # the heartbeat loop meets it too, and handles it
            logger.debug("consumer %s: asking for the job's view: %s", self._client_id, error)
            return
        with self._lock:
            self._answered_at = time.monotonic()
        self._apply_view(self._view_in(reply), asked_after)

    def fail(self, error: BaseException) -> None:
        """The job failed for this consumer: ``next`` raises ``error`` from now on, and the
        reader stops its threads and releases the job."""
        self.queue.fail(error)
        self.release()

    # -- the consumer -----------------------------------------------------------------------
    def _overdue(self) -> BaseException | None:
        """(Waiting for an element.) The error to raise when a wait has lasted too long; each
        is raised once, and the next call waits again."""
        now = time.monotonic()
        limit = f"options.experimental_distribute.service_timeout_ms = {self._timeout_s * 1000:.0f}"
        with self._lock:
            silent = now - self._answered_at
            if silent > self._timeout_s:
                self._answered_at = now
        if silent > self._timeout_s:
            return UnavailableError(
                f"the dispatcher at {self._params.address} has not answered for {silent:.0f} s "
                f"while this consumer waited for the next element of job {self._job_id} "
                f"({limit}); it is down or unreachable"
            )
        idle = self.queue.idle_overdue(self._timeout_s)
        if idle is not None:
            return UnavailableError(
                f"no worker has served job {self._job_id} for {idle:.0f} s ({limit}); "
                f"{self._why_idle()}; start workers, which take over the job's remaining splits "
                "under DYNAMIC sharding"
            )
        since = self.queue.idle_since
        if since is not None and since != self._idle_told and now - since > SLOW_CALL_S:
            self._idle_told = since  # once per wait
            logger.warning(
                "%s",
                f"no worker has served job {self._job_id} for {now - since:.0f} s: "
                f"{self._why_idle()}; this consumer waits up to {self._timeout_s:.0f} s in all "
                f"({limit}) for a worker to serve it",
            )
        return None

    def _why_idle(self) -> str:
        """Why no task of the job can be read, for a message."""
        lost = self.queue.lost_addresses()
        return f"its workers {lost} are gone" if lost else "no worker runs a task of it"

    def next(self) -> Any:
        started = time.monotonic()
        try:
            return self._next()
        finally:  # how long this training step waited for its input
            self._input_wait.step(started, time.monotonic())

    def _next(self) -> Any:
        # Exactly-once: while what it received waits to be reported, the reader waits briefly,
        # and has the heartbeat report it if nothing came (``_nudge_report``).
        nudge = self._splits is not None
        while True:
            item = None if self._commits is None else self._commits.again()
            wait_s = _NUDGE_AFTER_S if nudge else self._get_wait_s()
            try:
                # A failed job raises at every call, even where a reply that was on its way
                # when the error came left elements behind: the job is over.
                item = item or self.queue.get(wait_s)
            except BaseException:  # the job's error, or StopIteration
                self.release()
                raise
            if item is not None:
                if self._commits is not None:  # counted as returned when its step commits
                    self._commits.returned(item)
                elif item.tag is not None and self.trainer is not None:
                    self.trainer.returned(item.task_id, item.tag)
                elif item.tag is not None and self._splits is not None:
                    self._splits.returned(item.tag)
                return item.element
            if nudge:
                assert self._splits is not None
                if self._splits.unreported():
                    self._nudge_report()
                else:
                    nudge = False
            if (
                self._commits is not None
                and self._commits.step_size
                and (self._commits.awaits_commits)
            ):
                # The job waits for steps to commit, this one's too: nothing more comes to it
                # (unless a consumer dies). The step may commit; the reader stays joined.
                raise StopIteration
            if self._epoch_complete:  # every element returned, none more to come
                self.release()
                raise StopIteration
            if self.queue.closed:  # released before the end: nothing more comes
                raise FailedPreconditionError(
                    f"the consumer of job {self._job_id} was released before the job "
                    "ended (the process is exiting, or the iterator was closed)"
                )
            overdue = self._overdue()
            if overdue is not None:
                raise overdue

    # -- acknowledged on commit (``step_commits``) -------------------------------------------
    def commit(self, wait: bool = True) -> int:
        """The current step committed: the elements ``next`` returned since the last commit
        are acknowledged to the dispatcher (which journals them before answering), and then
        count in this consumer's position; how many.

        Args:
          wait: return once the dispatcher answered. With False the consumer's next heartbeat
            carries the acknowledgement (within ~0.1 s, several steps in one call): a consumer
            killed before it arrived gets those steps delivered again.

        Raises:
          FailedPreconditionError: the consumer does not acknowledge on commit.
          UnavailableError: the dispatcher did not answer for ``timeout_s``; the step is not
            committed (call ``commit`` again, or ``abort``).
        """
        commits = self._require_commits()
        count = commits.step_size
        if not wait:
            commits.send_later()
            return count
        ranges, tags = commits.step_ranges(), commits.step_tags()
        if ranges:
            self._send_commit(ranges, tags)
        commits.committed()
        return count

    def _send_commit(self, ranges: list[list[Any]], tags: list[Sequence[int]]) -> None:
        request = ClientHeartbeatRequest(self._client_id, committed=ranges).to_header()
        call_within(
            self._timeout_s,
            lambda timeout: self._dispatcher.call("ClientHeartbeat", request, timeout=timeout),
            attempt_s=RPC_TIMEOUT_S,
        )
        if self._splits is not None:  # always: commits come with receipts
            self._splits.returned_all(tags)

    def abort(self) -> int:
        """The current step is aborted: ``next`` returns its elements again, in order; how
        many.

        Raises:
          FailedPreconditionError: the consumer does not acknowledge on commit.
        """
        return self._require_commits().abort()

    def _require_commits(self) -> StepCommits:
        if self._commits is None:
            raise FailedPreconditionError(
                "commit() and abort() need a consumer that acknowledges on commit: "
                "distribute(processing_mode='distributed_epoch', ..., acknowledge='on_commit') "
                "with a dispatcher started with fault_tolerant_mode=True"
            )
        return self._commits

    def _nudge_report(self) -> None:
        """The reader found nothing for ``_NUDGE_AFTER_S`` and what it received is not yet
        reported: the heartbeat reports it now, not at its next turn (at most every
        ``_NUDGE_EVERY_S``), for at the end of an epoch the last splits wait for it."""
        now = time.monotonic()
        if now - self._nudged_at >= _NUDGE_EVERY_S:
            self._nudged_at = now
            self.queue.nudge()

    def _get_wait_s(self) -> float:
        """How long ``next`` waits on the queue before looking again: briefly while its own
        step is uncommitted (the job may wait for that step alone: ``awaits_commits``)."""
        return 0.02 if self._commits is not None and self._commits.step_size else 0.5

    @property
    def exactly_once(self) -> bool:
        """Whether the job hands out its splits exactly once (a fault-tolerant dispatcher's
        DYNAMIC job)."""
        return self._splits is not None

    def position(self, share: bool = False) -> JobPosition | SplitPosition:
        """This consumer's position in its job: per task, the elements ``next`` returned
        (plus those the task skipped for a resumed consumer); in an exactly-once DYNAMIC job,
        the splits and offsets returned. Asks the dispatcher for the job's view first, so that
        a consumer that joined since the last heartbeat is known (``shared`` says whether one
        did).

        Args:
          share: where other consumers joined an exactly-once job, return this consumer's
            share of its position (what it returned) rather than raise.

        Raises:
          FailedPreconditionError: another consumer joined the job (its reads are not counted
            here) and ``share`` does not apply, or the dispatcher could not say whether one
            did; a DYNAMIC job of a dispatcher that is not fault-tolerant.
        """
        check_checkpointable(int(self._params.mode), self._params.num_consumers, self.exactly_once)
        if not self.queue.closed and not self.queue.job_finished:
            try:  # a dispatcher that restarts meanwhile is waited for, as next() would
                reply = self._view_now(self._timeout_s)
            except FeedlineError as error:
                raise FailedPreconditionError(
                    f"cannot save the position of the consumer of job {self._job_id}: the "
                    f"dispatcher at {self._params.address} did not say whether other consumers "
                    f"read the job ({error})"
                ) from error
            self._apply_view(self._view_in(reply), self.queue.ends())
        with self._lock:
            joined, cursor, streams = self._joined, self._split_cursor, dict(self._streams)
        if joined > 1 and not (share and self._splits is not None):
            raise FailedPreconditionError(
                f"cannot save the position of a consumer of job {self._job_id} "
                f"({self.job_name!r}): {joined} consumers joined it and share "
                "its elements first come, first served, so what one of them received is "
                "not the job's position. Give each checkpointed consumer its own job_name, or "
                "read with ShardingPolicy.DYNAMIC from a fault-tolerant dispatcher, whose "
                "consumers save shares that a cluster's checkpoint restores together"
            )
        if self._splits is not None:
            done, partial = self._splits.position()
            return SplitPosition(cursor, done, partial, self._split_versions(partial))
        tasks = []
        num_workers = 0
        for task_id, address in self.queue.tasks():
            stream = streams[task_id]
            num_workers = stream.num_workers
            skip = stream.skip + self.queue.returned(task_id)
            tasks.append(TaskPosition(stream.worker_index, address, skip))
        if not ShardingPolicy(self._params.mode).is_static:
            num_workers = len(tasks)
        return JobPosition(int(self._params.mode), num_workers, tuple(tasks))

    def trainer_position(self) -> TrainerPosition:
        """A cross-trainer job's trainer's position: per task, the elements ``next``
        returned from its stream (the other trainers' reads do not count here).

        Raises:
          FailedPreconditionError: this consumer is not a trainer of a cross-trainer job.
        """
        if self.trainer is None:
            raise FailedPreconditionError(
                f"the consumer of job {self._job_id} is not a trainer of a cross-trainer job"
            )
        return self.trainer.position(self._job_id)

    @property
    def shared(self) -> bool:
        """Whether other consumers joined this consumer's job (as the last view said)."""
        with self._lock:
            return self._joined > 1

    def release(self, timeout: float = 5.0) -> None:
        """Stops the threads and tells the dispatcher this consumer is done (after the
        acknowledgements ``commit(wait=False)`` left to the heartbeat); idempotent."""
        if self._commits is not None and self._commits.has_unsent() and not self._released:
            ranges, _ = self._commits.take_unsent()
            last = ClientHeartbeatRequest(self._client_id, committed=ranges).to_header()
            try:
                self._dispatcher.call("ClientHeartbeat", last, timeout=timeout)
            except FeedlineError as error:  # what it acknowledged goes back to the job
                logger.debug("consumer %d: a commit failed: %s", self._client_id, error)
        self._shm.close()
        self.queue.close()
        with self._lock:
            if self._released:
                return
            self._released = True
        try:
            request = ReleaseClientRequest(self._client_id)
            self._dispatcher.call("ReleaseClient", request.to_header(), timeout=timeout)
        except FeedlineError as error:  # the dispatcher forgets the consumer when it times out
            logger.debug("consumer %d: release failed: %s", self._client_id, error)

    def stop_at_exit(self) -> None:
        self.release(timeout=1.0)
