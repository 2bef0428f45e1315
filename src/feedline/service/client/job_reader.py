"""The consumer's threads: ``_JobReader`` joins a job, heartbeats the dispatcher for the job's
tasks and reads them (its fetch threads: ``fetch``):

- first come, first served: one fetch thread per task asks for as many elements as the
  consumer has room for (``max_outstanding_requests`` elements in flight and buffered, and a
  byte budget), several per reply when they are small;
- round robin (``consumer_index``/``num_consumers``): round ``r`` is read from task
  ``r % num_tasks``; every consumer reads the same worker at each step.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from feedline import structure
from feedline._net import exit as _exit
from feedline._net.remote_errors import error_from_report
from feedline.errors import (
    FailedPreconditionError,
    FeedlineError,
    NotFoundError,
    UnavailableError,
)
from feedline.service.client.channels import _bounded_call, _dispatcher
from feedline.service.client.fetch import _REPLY_BYTES, _RPC_TIMEOUT_S, Fetchers
from feedline.service.config import ShardingPolicy
from feedline.service.ledger import Receipts, Returned
from feedline.service.position import (
    JobPosition,
    SplitPosition,
    TaskPosition,
    check_checkpointable,
)
from feedline.service.protocol import local_worker_addresses
from feedline.service.shm import ConsumerChannels

if TYPE_CHECKING:
    from feedline.service.client.dataset import DataServiceDataset

logger = logging.getLogger(__name__)

# Without max_outstanding_requests: elements a consumer keeps in flight and buffered.
_DEFAULT_OUTSTANDING = 1024
# The longest time between a consumer's heartbeats (shorter if the dispatcher's
# client_timeout_ms asks for it).
_HEARTBEAT_S = 1.0
# The longest time between the reports of a consumer of an exactly-once job (what it received:
# a split is done, and the job can end, only once its elements are reported).
_REPORT_S = 0.1


class _JobReader(Fetchers):
    """Joins a job and reads it: a heartbeat thread follows the job's view at the dispatcher,
    fetch threads fill a bounded buffer, ``next`` takes from it.

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
        resume: JobPosition | SplitPosition | None = None,
    ) -> None:
        params = self._params = dataset._params
        self._resume = resume
        self._dispatcher = _dispatcher(params.address)
        self._timeout_s = timeout_s
        self._treespec = structure.spec_structure(dataset.element_spec)
        self._cond = threading.Condition()
        # (element, its size, the task it came from, its [split, offset] in exactly-once jobs),
        # in the order next() returns them.
        self._results: collections.deque[tuple[Any, int, int, list[int] | None]] = (
            collections.deque()
        )
        # Per task: the elements next() returned, and (worker_index, num_workers, skip).
        self._returned: collections.Counter[int] = collections.Counter()
        self._task_info: dict[int, tuple[int, int, int]] = {}
        self._joined = 1  # the consumers that ever joined the job, as the dispatcher last said
        self._job_error: BaseException | None = None  # the job failed: raised at every call
        self._credits = params.max_outstanding_requests or _DEFAULT_OUTSTANDING
        self._buffered_bytes = 0
        self._tasks: dict[int, str] = {}
        self._completed: set[int] = set()  # the task's input ended and it handed out all
        # Tasks with a request in flight: elements a worker handed out before it said it was
        # done may still be on their way here.
        self._in_flight: set[int] = set()
        self._lost: set[int] = set()  # its worker left or was dropped
        # Exactly-once jobs (``ledger``): the [split, offset] received, the lost tasks this
        # consumer takes nothing more from (reported as closed), and whether the last report
        # may not have arrived (the next then sends everything).
        self._receipts: Receipts | None = None
        self._returned_splits: Returned | None = None  # the position: what next() returned
        self._split_cursor: dict[str, Any] | None = None  # what split keys mean
        self._closed: set[int] = set()
        self._report_all = False
        self._fetchers: dict[int, threading.Thread] = {}
        # How many times a task ended here, and that count when the newest view applied was
        # asked for: the end of the tasks this consumer knows is the end of the job only once a
        # view asked for after it lists no other task (a worker that registers mid-job gets a
        # task of it, which the consumer may not have heard of yet).
        self._task_ends = 0
        self._viewed_ends = 0
        self._job_finished = False
        self._version = -1
        self._consumers = 1  # the job's consumers, as the dispatcher last said
        self._stopping = threading.Event()
        # Replies from same-host workers through shared memory (_shm).
        self._shm = ConsumerChannels(params.data_transfer_protocol != "grpc", _REPLY_BYTES)
        self._released = False
        self._client_id: int | None = None
        reply = self._join(dataset, iteration)
        self._client_id = int(reply["client_id"])
        self._job_id = int(reply["job_id"])
        self._heartbeat_s = min(_HEARTBEAT_S, max(0.05, reply["client_timeout_ms"] / 4000))
        if reply.get("exactly_once"):
            self._receipts = Receipts()
            resumed = resume if isinstance(resume, SplitPosition) else None
            self._returned_splits = Returned(
                resumed.done if resumed else None, resumed.partial if resumed else None
            )
            self._heartbeat_s = min(self._heartbeat_s, _REPORT_S)
        self._answered_at = time.monotonic()
        self._idle_since: float | None = None  # since when no task of the job can be read
        self._apply_view(reply, 0)
        _exit.register(self, "stop_at_exit", _exit.CONSUMER)
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, name=f"feedline-consumer-{self._client_id}", daemon=True
        )
        self._heartbeat_thread.start()

    # -- the dispatcher ---------------------------------------------------------------------
    def _join(self, dataset: DataServiceDataset, iteration: int) -> dict[str, Any]:
        """Joins the job, registering the dataset first where needed, and again if the
        dispatcher no longer knows it (it restarted without a journal)."""
        dataset_id = dataset._registered_id(self._timeout_s)
        try:
            return self._join_as(dataset_id, iteration)
        except NotFoundError:
            if not dataset._forget_registration(dataset_id):
                raise
        return self._join_as(dataset._registered_id(self._timeout_s), iteration)

    def _join_as(self, dataset_id: str, iteration: int) -> dict[str, Any]:
        params = self._params
        header = {
            "dataset_id": dataset_id,
            "mode": int(params.mode),
            "job_name": params.job_name,
            "iteration": iteration,
            "num_consumers": params.num_consumers,
            "target_workers": params.target_workers,
            "resume": None if self._resume is None else self._resume.to_state(),
        }
        what = f"joining a job of dataset {dataset_id}"
        reply, _ = _bounded_call(self._dispatcher, "GetOrCreateJob", header, self._timeout_s, what)
        return reply

    def _heartbeat_loop(self) -> None:
        interval = self._heartbeat_s
        while not self._stopping.is_set():
            started = time.monotonic()
            with self._cond:
                asked_after = self._task_ends
                request = {
                    "client_id": self._client_id,
                    "version": self._version,
                    "wait_ms": int(interval * 1000),
                    **self._report(),
                }
            try:
                reply, _ = self._dispatcher.call(
                    "ClientHeartbeat", request, timeout=interval + _RPC_TIMEOUT_S
                )
            except UnavailableError:  # next() raises once this lasts too long
                self._report_all = True
                self._stopping.wait(min(interval, 0.5))
                continue
            except BaseException as error:
                self._fail(error)
                return
            with self._cond:
                self._answered_at = time.monotonic()
                if self._receipts is not None and self._returned_splits is not None:
                    done = reply.get("splits_done", ())
                    self._receipts.forget(key for key, _ in done)
                    self._returned_splits.counted(done)
            if not self._apply_view(reply, asked_after):  # no news: the next waits its turn
                self._stopping.wait(max(0.0, interval - (time.monotonic() - started)))

    def _report(self) -> dict[str, Any]:
        """(Under the lock.) What an exactly-once job's consumer reports with its heartbeat:
        the offsets received since the last report (all of them after a failed one) and the
        lost tasks it closed."""
        if self._receipts is None:
            return {}
        everything, self._report_all = self._report_all, False
        return {
            "received": self._receipts.report(everything),
            "holding": self._receipts.holding(),
            "closed": sorted(self._closed),
            "wait_ms": 0 if self._receipts.unreported() else int(self._heartbeat_s * 1000),
        }

    def _refresh_view(self) -> None:
        """Asks the dispatcher for the job's view at once, without waiting for news: called when
        every task this consumer knows has ended, to learn of a task made since the last view
        before taking this for the end of the job. If the call fails, the heartbeat's next view
        serves instead."""
        with self._cond:
            if self._stopping.is_set() or self._job_finished:
                return
            asked_after = self._task_ends
        try:
            reply, _ = self._dispatcher.call(
                "ClientHeartbeat",
                {"client_id": self._client_id, "version": -1, "wait_ms": 0},
                timeout=_RPC_TIMEOUT_S,
            )
        except FeedlineError as error:  # the heartbeat loop meets it too, and handles it
            logger.debug("consumer %s: asking for the job's view: %s", self._client_id, error)
            return
        with self._cond:
            self._answered_at = time.monotonic()
        self._apply_view(reply, asked_after)

    def _apply_view(self, view: dict[str, Any], asked_after: int) -> bool:
        """Takes in the job's view from the dispatcher (tasks ``[task_id, address, state]``,
        whether it finished, its error), asked for once ``asked_after`` tasks had ended here;
        starts reading new tasks. Whether it was news."""
        listed = [(int(t), str(a), str(s)) for t, a, s in view["tasks"]]
        info = {int(t): (int(i), int(n), int(k)) for t, i, n, k in view.get("streams", ())}
        if self._params.target_workers == "LOCAL":
            local = local_worker_addresses()
            if listed and not any(a in local for _, a, _ in listed):
                self._fail(
                    FailedPreconditionError(
                        "target_workers='LOCAL' reads only from workers in this process, and "
                        "none of the job's workers runs here; start a WorkerServer in this "
                        "process or use target_workers='ANY'"
                    )
                )
                return True
            listed = [task for task in listed if task[1] in local]
        error = view.get("error")
        with self._cond:
            news = view["version"] != self._version
            self._version = view["version"]
            for task_id, _, state in listed:
                if state == "done":
                    self._completed.add(task_id)
                elif state == "lost":
                    self._lost.add(task_id)
            if view.get("split_cursor") is not None:
                self._split_cursor = view["split_cursor"]
            if self._receipts is not None:  # nothing more is taken from a lost task
                self._closed.update(int(t) for t, _, state in view["tasks"] if state == "lost")
            new = sorted(t for t, _, _ in listed if t not in self._tasks)
            self._tasks.update((t, a) for t, a, _ in listed if t in new)
            self._viewed_ends = max(self._viewed_ends, asked_after)
            # A job never starts again: an older view answered late does not undo the end.
            self._job_finished = self._job_finished or bool(view["finished"])
            self._consumers = int(view.get("consumers", 1))
            self._joined = int(view.get("joined", 1))
            self._task_info.update(info)
            self._note_liveness()
            self._cond.notify_all()
            readable = [t for t in new if t not in self._completed and t not in self._lost]
        if error is not None:
            self._fail(error_from_report(error))
        elif self._params.num_consumers is not None:
            if new and not self._fetchers:
                self._start_fetcher(-1, self._fetch_rounds)
        else:
            for task_id in readable:
                self._start_fetcher(task_id, self._fetch_first_come)
        return news

    def _note_liveness(self) -> None:
        """(Under the lock.) Notes since when no task of the job can be read."""
        readable = any(t not in self._completed and t not in self._lost for t in self._tasks)
        if readable or self._job_finished or self._finished():
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = time.monotonic()

    def _start_fetcher(self, key: int, target: Any) -> None:
        if self._stopping.is_set():
            return
        thread = threading.Thread(
            target=target,
            args=(key,),
            name=f"feedline-consumer-{self._client_id}-fetch-{key}",
            daemon=True,
        )
        self._fetchers[key] = thread
        thread.start()

    def _fail(self, error: BaseException) -> None:
        """The job failed for this consumer: ``next`` raises ``error`` from now on, and the
        reader stops its threads and releases the job."""
        with self._cond:
            if self._job_error is None and not self._stopping.is_set():
                self._job_error = error
            self._cond.notify_all()
        self.release()

    def _finished(self) -> bool:
        """(Under the lock.) Whether the job's input ended for this consumer: every task
        ended, at least one because its input did, and a view asked for after the last one
        ended lists no other task (or the dispatcher ended the job)."""
        if self._job_error is not None or self._in_flight:
            return False
        if not self._tasks:
            return self._job_finished
        if not set(self._tasks) <= self._completed | self._lost:
            return False
        if self._job_finished:
            return True
        return bool(self._completed) and self._viewed_ends >= self._task_ends

    def _overdue(self) -> BaseException | None:
        """(Under the lock, waiting for an element.) The error to raise when a wait has
        lasted too long; each is raised once, and the next call waits again."""
        now = time.monotonic()
        limit = f"options.experimental_distribute.service_timeout_ms = {self._timeout_s * 1000:.0f}"
        if now - self._answered_at > self._timeout_s:
            waited, self._answered_at = now - self._answered_at, now
            return UnavailableError(
                f"the dispatcher at {self._params.address} has not answered for {waited:.0f} s "
                f"while this consumer waited for the next element of job {self._job_id} "
                f"({limit}); it is down or unreachable"
            )
        if self._idle_since is not None and now - self._idle_since > self._timeout_s:
            waited, self._idle_since = now - self._idle_since, now
            lost = sorted(self._tasks[t] for t in self._lost if t in self._tasks)
            return UnavailableError(
                f"no worker has served job {self._job_id} for {waited:.0f} s ({limit}); "
                + (f"its workers {lost} are gone" if lost else "no worker runs a task of it")
                + "; start workers, which take over the job's remaining splits under DYNAMIC "
                "sharding"
            )
        return None

    def next(self) -> Any:
        with self._cond:
            # A failed job raises at every call, even where a reply that was on its way when
            # the error came left elements behind: the job is over.
            while self._job_error is None and not self._results and not self._finished():
                if self._stopping.is_set():  # released before the end: nothing more comes
                    raise FailedPreconditionError(
                        f"the consumer of job {self._job_id} was released before the job "
                        "ended (the process is exiting, or the iterator was closed)"
                    )
                overdue = self._overdue()
                if overdue is not None:
                    raise overdue
                self._cond.wait(0.5)
            error = self._job_error
            if error is None and self._results:
                element, size, task_id, tag = self._results.popleft()
                if tag is not None and self._returned_splits is not None:
                    self._returned_splits.take(*tag)
                self._returned[task_id] += 1
                self._credits += 1
                self._buffered_bytes -= size
                self._cond.notify_all()
                return element
        self.release()
        if error is not None:
            raise error
        raise StopIteration

    @property
    def exactly_once(self) -> bool:
        """Whether the job hands out its splits exactly once (a fault-tolerant dispatcher's
        DYNAMIC job)."""
        return self._receipts is not None

    def position(self) -> JobPosition | SplitPosition:
        """This consumer's position in its job: per task, the elements ``next`` returned
        (plus those the task skipped for a resumed consumer); in an exactly-once DYNAMIC job,
        the splits and offsets returned. Asks the dispatcher for the job's view first, so that
        a consumer that joined since the last heartbeat is known.

        Raises:
          FailedPreconditionError: another consumer joined the job (its reads are not counted
            here), or the dispatcher could not say whether one did; a DYNAMIC job of a
            dispatcher that is not fault-tolerant.
        """
        check_checkpointable(int(self._params.mode), self._params.num_consumers, self.exactly_once)
        with self._cond:
            live = not self._stopping.is_set() and not self._job_finished
        if live:
            try:
                reply, _ = self._dispatcher.call(
                    "ClientHeartbeat",
                    {"client_id": self._client_id, "version": -1, "wait_ms": 0},
                    timeout=_RPC_TIMEOUT_S,
                )
            except FeedlineError as error:
                raise FailedPreconditionError(
                    f"cannot save the position of the consumer of job {self._job_id}: the "
                    f"dispatcher at {self._params.address} did not say whether other consumers "
                    f"read the job ({error})"
                ) from error
            self._apply_view(reply, self._task_ends)
        with self._cond:
            if self._joined > 1:
                raise FailedPreconditionError(
                    f"cannot save the position of a consumer of job {self._job_id} "
                    f"({self._params.job_name!r}): {self._joined} consumers joined it and share "
                    "its elements first come, first served, so what one of them received is "
                    "not the job's position. Give each checkpointed consumer its own job_name"
                )
            if self._returned_splits is not None:
                done, partial = self._returned_splits.position()
                return SplitPosition(self._split_cursor, done, partial)
            tasks = []
            num_workers = 0
            for task_id, address in sorted(self._tasks.items()):
                index, num_workers, skip = self._task_info[task_id]
                tasks.append(TaskPosition(index, address, skip + self._returned[task_id]))
            if not ShardingPolicy(self._params.mode).is_static:
                num_workers = len(tasks)
            return JobPosition(int(self._params.mode), num_workers, tuple(tasks))

    def release(self, timeout: float = 5.0) -> None:
        """Stops the threads and tells the dispatcher this consumer is done; idempotent."""
        self._shm.close()
        with self._cond:
            self._stopping.set()
            self._cond.notify_all()
            if self._released or self._client_id is None:
                return
            self._released = True
        try:
            self._dispatcher.call("ReleaseClient", {"client_id": self._client_id}, timeout=timeout)
        except FeedlineError as error:  # the dispatcher forgets the consumer when it times out
            logger.debug("consumer %d: release failed: %s", self._client_id, error)

    def stop_at_exit(self) -> None:
        self.release(timeout=1.0)
