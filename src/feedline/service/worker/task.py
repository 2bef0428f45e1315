"""A worker's task: the job's dataset shaped by its sharding policy, run on a producer thread
into a buffer bounded in bytes and elements (``worker`` has the table of what each policy runs).

``_Task`` produces; what it hands consumers (first come, first served or round robin) is
``_task_replies.TaskReplies``. A DYNAMIC task asks the dispatcher for its splits through
``_DispatcherSplits``; in an exactly-once job (``ledger``) it runs the pipeline once per split
(``replay``), tags each element ``[split, offset]`` and reports each split's count and when it
has handed all of it out.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Any

from feedline import structure
from feedline._net.remote_errors import error_report
from feedline._net.wire import Compressor
from feedline.data.auto_shard import ShardMode, auto_shard
from feedline.data.dataset import Dataset
from feedline.data.options import AutoShardPolicy
from feedline.errors import InvalidArgumentError
from feedline.service.config import ShardingPolicy
from feedline.service.ledger import contains
from feedline.service.worker.replay import SplitRunner
from feedline.service.worker.replies import TaskReplies
from feedline.service.worker.split_source import with_split_source

if TYPE_CHECKING:
    from feedline.service.worker.server import WorkerServer

__all__ = ["task_dataset"]

# The worker's logger, as before these classes moved here.
logger = logging.getLogger("feedline.service.worker.server")

# A task's buffer holds at most this many bytes and elements.
_BUFFER_BYTES = 64 << 20
_BUFFER_ELEMENTS = 4096
# How often an exactly-once task whose input ran out asks whether a split came back.
_GRANT_POLL_S = 0.05


class _DispatcherSplits:
    """The ``SplitProvider`` of a DYNAMIC task: asks the dispatcher for the job's splits. A
    draining worker asks for none: its source ends after the split it holds (``drained``).

    Each request carries its number (``request``), the same when it is tried again, so that a
    dispatcher that handed out a split whose reply was lost (it was killed, the call timed out)
    hands out the same split again instead of skipping it."""

    def __init__(self, worker: WorkerServer, job_id: int, task_id: int) -> None:
        self._worker = worker
        self._job_id = job_id
        self._task_id = task_id
        self._requests = 0  # the replies received so far: the number of the next request
        self._requests_lock = threading.Lock()
        self.drained = False

    def next_split(self, repetition: int) -> list[int] | None:
        reply = self._ask({"repetition": repetition})
        return None if reply is None else reply["split"]

    def next_grant(
        self, finished: list[int] | None, handed_out: list[int]
    ) -> dict[str, Any] | None:
        """The next split of an exactly-once job: ``{"split", "key", "skip"}``, ``{"wait":
        True}`` while the job's other splits are not done, None at the end (or when draining).
        ``finished`` (``[key, count]``) reports the split this task produced last,
        ``handed_out`` the splits whose every element it has handed to consumers since."""
        request = {"repetition": 0, "finished": finished, "handed_out": handed_out}
        reply = self._ask(request)
        if reply is None or reply.get("wait"):
            return reply
        return None if reply["split"] is None else reply

    def _ask(self, fields: dict[str, Any]) -> dict[str, Any] | None:
        """GetSplit with ``fields`` and this task's next request number, which moves on with
        every reply received (a request whose reply was lost goes again with the same
        number). None when draining."""
        if self._worker.draining:
            self.drained = True
            return None
        with self._requests_lock:
            reply, _ = self._worker.call_dispatcher(
                "GetSplit",
                {
                    "job_id": self._job_id,
                    "task_id": self._task_id,
                    "request": self._requests,
                    **fields,
                },
                f"getting a split of job {self._job_id} for task {self._task_id}",
            )
            self._requests += 1
        return reply


def task_dataset(
    dataset: Dataset, mode: ShardingPolicy, num_workers: int, worker_index: int, splits: Any
) -> Dataset:
    """What a task runs: ``dataset`` shaped by the job's sharding policy (the module's table)."""
    if mode == ShardingPolicy.OFF:
        return dataset
    if mode == ShardingPolicy.DYNAMIC:
        return with_split_source(dataset, splits)
    if mode == ShardingPolicy.DATA:
        return dataset.shard(num_workers, worker_index)
    policy = {
        ShardingPolicy.FILE: AutoShardPolicy.FILE,
        ShardingPolicy.FILE_OR_DATA: AutoShardPolicy.AUTO,
        ShardingPolicy.HINT: AutoShardPolicy.HINT,
    }[mode]
    sharded, shard_mode = auto_shard(dataset, num_workers, worker_index, policy)
    if shard_mode == ShardMode.DATA:
        return dataset.shard(num_workers, worker_index)
    return sharded


class _Task(TaskReplies):
    """One task: a producer thread running the task's dataset into a bounded buffer, and the
    replies that hand its elements out.

    The dataset is fetched, unpickled and shaped by the job's policy on the producer thread, so
    that whatever fails there (a dataset the policy cannot shape, one that does not unpickle
    here) fails the task like an element that raises, and the consumers hear why.

    A reply to ``GetElements`` says, besides the elements, one of: ``eos`` (the task's input
    ended and everything was handed out), ``gone`` (this worker gives nothing more, though the
    input did not end: it drained or stops; the task is lost), ``error`` (the task failed: an
    error report for every consumer), or nothing (more may come: ask again).
    """

    def __init__(self, task_def: dict[str, Any], worker: WorkerServer) -> None:
        self.task_id = int(task_def["task_id"])
        #: The content fingerprint of the task's dataset (what the worker caches it by).
        self.fingerprint = str(task_def.get("fingerprint", ""))
        self._task_def = task_def
        self._worker = worker
        self._mode = ShardingPolicy(task_def["mode"])
        self._exactly_once = bool(task_def.get("exactly_once"))
        self._splits = _DispatcherSplits(worker, int(task_def["job_id"]), self.task_id)
        self._num_consumers: int | None = task_def["num_consumers"]
        self._compressor = Compressor(None)
        self._cond = threading.Condition()
        # (leaves, bytes, tag): tag is [split key, offset] in exactly-once jobs, else None.
        self._buffer: collections.deque[tuple[list[Any], int, list[int] | None]] = (
            collections.deque()
        )
        self._buffered_bytes = 0
        # Exactly-once jobs: elements of each split still buffered, the splits produced whole
        # and not yet handed out whole, and those handed out whole since the last GetSplit.
        self._pending: collections.Counter[int] = collections.Counter()
        self._produced: set[int] = set()
        self._splits_out: list[int] = []
        self._ended = False
        self._drained = False  # ended because the worker drains, not because the input did
        self._draining = False
        self._report: dict[str, Any] | None = None  # the task's error, as consumers get it
        self._stop = False
        # First come, first served, shared fairly: consumers whose request waits here now,
        # and consumers whose last request got nothing (hungry until the time given).
        self._waiting: collections.Counter[int] = collections.Counter()
        self._hungry: dict[int, float] = {}
        self._shared = bool(task_def.get("shared"))
        self._consumers_hint = 1  # the job's consumers, as the requests tell
        self._first_ask: float | None = None
        self._handed_out = False
        self._rounds: dict[int, list[Any]] = {}
        self._round_taken: dict[int, set[int]] = {}
        self._next_round = 0
        # Elements and their bytes handed to consumers (for the status pages).
        self.served_elements = 0
        self.served_bytes = 0
        self._thread = threading.Thread(
            target=self._produce, name=f"feedline-task-{self.task_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._buffer.clear()
            self._buffered_bytes = 0
            self._cond.notify_all()
        self._worker._shm.forget_task(self.task_id)  # its consumers' arenas

    def drain(self) -> None:
        """Produces no more than it must: a DYNAMIC task finishes the split it holds (its
        provider hands out no more), any other task stops at once. What is buffered stays."""
        with self._cond:
            self._draining = True
            self._cond.notify_all()

    def completed(self) -> bool:
        """Whether the task's input ended and every element was handed out."""
        with self._cond:
            return (
                self._ended
                and not self._drained
                and self._report is None
                and not self._stop
                and not self._buffer
            )

    def failure(self) -> dict[str, Any] | None:
        """The task's error report, or None."""
        with self._cond:
            return self._report

    def drained_out(self) -> bool:
        """Whether the task produces nothing more and has handed out what it had."""
        with self._cond:
            return (self._ended or self._stop) and not self._buffer

    def buffered(self) -> int:
        with self._cond:
            return len(self._buffer)

    def status(self, rates: Any) -> dict[str, Any]:
        """What the worker's status page shows of this task (``rates``: a ``RateTracker``)."""
        task_def = self._task_def
        with self._cond:
            buffered, nbytes = len(self._buffer), self._buffered_bytes
            if self._report is not None:
                state = f"failed: {self._report.get('type')}: {self._report.get('message')}"
            elif self._stop or (self._ended and self._drained):
                state = "stopped"
            elif self._ended:
                state = "input ended"
            else:
                state = "draining" if self._draining else "running"
        _, _, per_s, bytes_per_s = rates.get(self.task_id)
        consumers = self._num_consumers
        return {
            "task_id": self.task_id,
            "job_id": task_def["job_id"],
            "dataset_id": task_def["dataset_id"],
            "mode": self._mode.name,
            "worker_index": task_def["worker_index"],
            "num_workers": task_def["num_workers"],
            "consumers": "shared" if consumers is None else f"round robin of {consumers}",
            "buffered": buffered,
            "buffered_bytes": nbytes,
            "fill": max(buffered / _BUFFER_ELEMENTS, nbytes / _BUFFER_BYTES),
            "elements": self.served_elements,
            "elements_per_s": per_s,
            "bytes_per_s": bytes_per_s,
            "state": state,
        }

    def _produce(self) -> None:
        iterator = None
        failed = False
        try:
            dataset, compression = self._worker.dataset(self._task_def)
            self._compressor = Compressor(compression)
            expected = structure.spec_structure(dataset.element_spec)
            if self._exactly_once:
                self._produce_splits(dataset, expected)
                return
            shaped = task_dataset(
                dataset,
                self._mode,
                int(self._task_def["num_workers"]),
                int(self._task_def["worker_index"]),
                self._splits,
            )
            skip = int(self._task_def.get("skip", 0))
            if skip:  # a consumer resumed the job: it had received these from this stream
                shaped = shaped.skip(skip)
            iterator = iter(shaped)
            for index, element in enumerate(iterator):
                if not self._put(element, index, expected, None):
                    return
                with self._cond:
                    if self._draining and self._mode != ShardingPolicy.DYNAMIC:
                        self._drained = True
                        return
        except BaseException as error:
            with self._cond:
                if not self._stop:
                    failed = True
                    self._report = error_report(
                        error, worker=self._worker.worker_address, task_id=self.task_id
                    )
            if failed:
                logger.warning("task %d failed: %r", self.task_id, error)
                self._worker._telemetry.task_failed(self.task_id, self._report or {})
        finally:
            with self._cond:
                self._drained = self._drained or self._splits.drained
                self._ended = True
                self._cond.notify_all()
            if iterator is not None:
                with contextlib.suppress(Exception):
                    iterator.close()
            if failed:
                self._worker._report_failure()

    def _put(self, element: Any, index: int, expected: Any, tag: list[int] | None) -> bool:
        """Buffers ``element`` (the ``index``-th), waiting for room; False once stopped.

        Raises:
          InvalidArgumentError: the element does not have the structure ``expected``.
        """
        leaves, treespec = structure.flatten(element)
        if treespec != expected:
            raise InvalidArgumentError(
                f"element {index} of the dataset has the structure {treespec}, but the "
                f"dataset's element_spec has the structure {expected}; every element "
                "must have the structure of the element_spec"
            )
        size = sum(leaf.nbytes for leaf in leaves)
        with self._cond:
            while (
                not self._stop
                and self._buffer
                and (
                    self._buffered_bytes + size > _BUFFER_BYTES
                    or len(self._buffer) >= _BUFFER_ELEMENTS
                )
            ):
                self._cond.wait()
            if self._stop:
                return False
            self._buffer.append((leaves, size, tag))
            self._buffered_bytes += size
            if tag is not None:
                self._pending[tag[0]] += 1
            self._cond.notify_all()
        return True

    def _produce_splits(self, dataset: Dataset, expected: Any) -> None:
        """An exactly-once task's input: each split the dispatcher grants, run on its own and
        tagged ``[key, offset]``, minus the offsets consumers already received (``replay``)."""
        runner = SplitRunner(dataset)
        finished: list[int] | None = None
        index = 0
        while True:
            with self._cond:
                handed_out, self._splits_out = self._splits_out, []
            grant = self._splits.next_grant(finished, handed_out)
            finished = None
            if grant is None:
                return
            if grant.get("wait"):  # the other splits are not done: one may come back
                with self._cond:
                    if self._stop:
                        return
                    self._cond.wait(_GRANT_POLL_S)
                continue
            key, skip = int(grant["key"]), grant["skip"]
            count = 0
            for offset, element in enumerate(runner.run(key, grant["split"])):
                count = offset + 1
                if contains(skip, offset):
                    continue
                if not self._put(element, index, expected, [key, offset]):
                    return
                index += 1
            finished = [key, count]
            with self._cond:
                if self._pending[key]:
                    self._produced.add(key)
                else:
                    self._splits_out.append(key)

    def _take(self, tags: list[list[int]] | None = None) -> list[Any]:
        leaves, size, tag = self._buffer.popleft()
        self._buffered_bytes -= size
        self._cond.notify_all()
        if tag is not None:
            key = tag[0]
            self._pending[key] -= 1
            if not self._pending[key]:
                del self._pending[key]
                if key in self._produced:
                    self._produced.discard(key)
                    self._splits_out.append(key)
            if tags is not None:
                tags.append(tag)
        return leaves
