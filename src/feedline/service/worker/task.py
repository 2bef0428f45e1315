"""A worker's task: the job's dataset shaped by its sharding policy, run on a producer thread
into a buffer bounded in bytes and elements (``server`` has the table of what each policy runs).

``Task`` is made of parts: the producer (here) puts elements into a ``buffer.TaskBuffer``, from
which ``replies.TaskReplies`` answers consumers (first come, first served or round robin); what
the task needs from its worker is a ``host.TaskHost``. A DYNAMIC task asks the dispatcher for
its splits through ``_DispatcherSplits``; in an exactly-once job (``ledger``) it runs the
pipeline once per split (``replay``), tags each element ``[split, offset]`` and reports each
split's count and when it has handed all of it out.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from feedline import structure
from feedline._net.remote_errors import error_report
from feedline.data.auto_shard import ShardMode, auto_shard
from feedline.data.dataset import INFINITE_CARDINALITY, Dataset, raw_elements
from feedline.data.options import AutoShardPolicy
from feedline.errors import InvalidArgumentError
from feedline.service.config import ShardingPolicy
from feedline.service.ledger import contains
from feedline.service.protocol import (
    GetElementsRequest,
    GetSplitReply,
    GetSplitRequest,
    PinSplitVersionRequest,
    PinSplitVersionsRequest,
    TaskDef,
    TaskLoad,
    object_versions,
)
from feedline.service.stages import StageClock, timed
from feedline.service.worker.buffer import TaskBuffer
from feedline.service.worker.host import TaskHost
from feedline.service.worker.replay import SplitRunner
from feedline.service.worker.replies import TaskReplies
from feedline.service.worker.split_source import SplitProvider, with_split_source
from feedline.service.worker.trainer_cache import CACHE_BYTES, TrainerCache

__all__ = ["Task", "task_dataset"]

# The worker's logger, as before these classes moved here.
logger = logging.getLogger("feedline.service.worker.server")

# How often an exactly-once task whose input ran out asks whether a split came back.
_GRANT_POLL_S = 0.05
# How long such a task's GetSplit may wait at the dispatcher for a split to come back or the
# job's splits to be done, when it holds no split it has not handed out whole.
_GRANT_WAIT_MS = 500


class _DispatcherSplits:
    """The ``SplitProvider`` of a DYNAMIC task: asks the dispatcher for the job's splits. A
    draining worker asks for none: its source ends after the split it holds (``drained``).

    Each request carries its number (``request``), the same when it is tried again, so that a
    dispatcher that handed out a split whose reply was lost (it was killed, the call timed out)
    hands out the same split again instead of skipping it."""

    def __init__(self, host: TaskHost, job_id: int, task_id: int) -> None:
        self._host = host
        self._job_id = job_id
        self._task_id = task_id
        self._requests = 0  # the replies received so far: the number of the next request
        self._requests_lock = threading.Lock()
        self.drained = False

    def next_split(self, repetition: int) -> list[int] | None:
        reply = self._ask(repetition)
        return None if reply is None or reply.split is None else list(reply.split)

    def next_grant(
        self, finished: tuple[int, int] | None, handed_out: list[int], wait_ms: int = 0
    ) -> GetSplitReply | None:
        """The next split of an exactly-once job (with its ``key`` and ``skip``), a reply that
        says ``wait`` while the job's other splits are not done, None at the end (or when
        draining). ``finished`` (``(key, count)``) reports the split this task produced last,
        ``handed_out`` the splits whose every element it has handed to consumers since;
        ``wait_ms``: how long the dispatcher may wait for a split to come back or the end."""
        reply = self._ask(0, finished, tuple(handed_out), wait_ms)
        if reply is None or reply.wait:
            return reply
        return None if reply.split is None else reply

    def _ask(
        self,
        repetition: int,
        finished: tuple[int, int] | None = None,
        handed_out: tuple[int, ...] = (),
        wait_ms: int = 0,
    ) -> GetSplitReply | None:
        """GetSplit of ``repetition`` (with an exactly-once task's ``finished`` and
        ``handed_out``, see ``GetSplitRequest``) and this task's next request number, which
        moves on with every reply received (a request whose reply was lost goes again with the
        same number). None when draining."""
        if self._host.draining:
            self.drained = True
            return None
        with self._requests_lock:
            request = GetSplitRequest(
                self._job_id,
                repetition,
                self._task_id,
                self._requests,
                finished,
                handed_out,
                wait_ms,
            )
            reply, _ = self._host.call_dispatcher(
                "GetSplit",
                request.to_header(),
                f"getting a split of job {self._job_id} for task {self._task_id}",
            )
            self._requests += 1
        return GetSplitReply.from_header(reply)

    def pin_all(self, key: int, versions: dict[str, Any]) -> dict[str, Any]:
        """``pin`` of each of ``versions`` (URL -> version) of split ``key`` at once
        (``PinSplitVersionsRequest``: a split holds at most ``MAX_PINS`` files); the versions
        held, URL -> version."""
        request = PinSplitVersionsRequest(self._job_id, self._task_id, key, versions)
        reply, _ = self._host.call_dispatcher(
            "PinSplitVersions",
            request.to_header(),
            f"pinning the versions of {len(versions)} objects for split {key} of job "
            f"{self._job_id}",
        )
        return object_versions(reply.get("versions"), "the versions held")

    def pin(self, key: int, url: str, version: Any) -> Any:
        """Tells the dispatcher that this task's run of split ``key`` opened ``url`` as
        ``version``; the version the split is held to (``PinSplitVersionRequest``)."""
        request = PinSplitVersionRequest(self._job_id, self._task_id, key, url, version)
        reply, _ = self._host.call_dispatcher(
            "PinSplitVersion",
            request.to_header(),
            f"pinning the version of {url!r} for split {key} of job {self._job_id}",
        )
        return reply.get("version")


def task_dataset(
    dataset: Dataset,
    mode: ShardingPolicy,
    num_workers: int,
    worker_index: int,
    splits: SplitProvider | None,
) -> Dataset:
    """What a task runs: ``dataset`` shaped by the job's sharding policy (the module's table)."""
    if mode == ShardingPolicy.OFF:
        return dataset
    if mode == ShardingPolicy.DYNAMIC:
        if splits is None:
            raise InvalidArgumentError("a DYNAMIC task needs the provider of its splits")
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


class Task:
    """One task: a producer thread running the task's dataset into its ``TaskBuffer``, and the
    ``TaskReplies`` that hand its elements out.

    The dataset is fetched (``host.dataset``), unpickled and shaped by the job's policy on the
    producer thread, so that whatever fails there (a dataset the policy cannot shape, one that
    does not unpickle here) fails the task like an element that raises, and the consumers hear
    why; the host is told at once (``report_failure``).

    A reply to ``GetElements`` says, besides the elements, one of: ``eos`` (the task's input
    ended and everything was handed out), ``gone`` (this worker gives nothing more, though the
    input did not end: it drained or stops; the task is lost), ``error`` (the task failed: an
    error report for every consumer), or nothing (more may come: ask again).

    Args:
      definition: the task, as the dispatcher defined it.
      host: the worker that runs it.
      buffer: the buffer to produce into (a new one, bounded as usual, by default).
      cache_bytes: in a cross-trainer job, the bytes its ``TrainerCache`` keeps in memory.
    """

    def __init__(
        self,
        definition: TaskDef,
        host: TaskHost,
        buffer: TaskBuffer | None = None,
        cache_bytes: int = CACHE_BYTES,
    ) -> None:
        self.task_id = definition.task_id
        #: The content fingerprint of the task's dataset (what the worker caches it by).
        self.fingerprint = definition.fingerprint
        self.definition = definition
        self._host = host
        self._buffer = TaskBuffer(self.task_id) if buffer is None else buffer
        self._replies = TaskReplies(
            self.task_id, self._buffer, host, definition.num_consumers, definition.shared
        )
        self._splits = _DispatcherSplits(host, definition.job_id, self.task_id)
        # A cross-trainer job: every trainer reads every element (``trainer_cache``).
        self._cache = TrainerCache(self._buffer, cache_bytes) if definition.cross_trainer else None
        # Seconds per stage of the task's pipeline (``TaskLoad.stages``).
        self._stages = StageClock()
        self._thread = threading.Thread(
            target=self._produce, name=f"feedline-task-{self.task_id}", daemon=True
        )

    @property
    def served_elements(self) -> int:
        """Elements handed to consumers so far."""
        return self._replies.served_elements

    @property
    def served_bytes(self) -> int:
        """Bytes of the elements handed to consumers so far."""
        return self._replies.served_bytes

    def start(self) -> None:
        """Starts producing."""
        self._thread.start()

    def stop(self) -> None:
        """Stops producing and drops what is buffered; its consumers' arenas are unmapped."""
        self._buffer.stop()
        if self._cache is not None:
            self._cache.close()
        self._host.shm.forget_task(self.task_id)

    def drain(self) -> None:
        """Produces no more than it must: a DYNAMIC task finishes the split it holds (its
        provider hands out no more), any other task stops at once. What is buffered stays."""
        self._buffer.drain()

    def completed(self) -> bool:
        """Whether the task's input ended and every element was handed out (to every trainer
        it knows, in a cross-trainer job)."""
        if self._cache is not None:
            return self._cache.completed()
        return self._buffer.completed()

    def failure(self) -> dict[str, Any] | None:
        """The task's error report, or None."""
        return self._buffer.failure()

    def drained_out(self) -> bool:
        """Whether the task produces nothing more and has handed out what it had."""
        if self._cache is not None:
            return self._cache.drained_out()
        return self._buffer.drained_out()

    def load(self) -> TaskLoad:
        """What the task's producer did so far (for the dispatcher's estimate of the workers
        the jobs need, and ``feedline diagnose``)."""
        produced, busy_s, wall_s, fill = self._buffer.load()
        return TaskLoad(self.task_id, produced, busy_s, wall_s, fill, self._stages.seconds())

    def buffered(self) -> int:
        """The elements buffered."""
        return len(self._buffer)

    def get_elements(self, request: GetElementsRequest) -> bytes:
        """The reply frame to a consumer's ``request`` (``TaskReplies.get_elements``, or
        ``get_cached`` in a cross-trainer job)."""
        if self._cache is not None:
            return self._replies.get_cached(request, self._cache)
        return self._replies.get_elements(request)

    def status(self, rates: Any) -> dict[str, Any]:
        """What the worker's status page shows of this task (``rates``: a ``RateTracker``)."""
        definition = self.definition
        buffered, nbytes, state = self._buffer.state()
        _, _, per_s, bytes_per_s = rates.get(self.task_id)
        consumers = definition.num_consumers
        if self._cache is not None:
            readers = "trainers (cross-trainer cache)"
        else:
            readers = "shared" if consumers is None else f"round robin of {consumers}"
        return {
            "task_id": self.task_id,
            "job_id": definition.job_id,
            "dataset_id": definition.dataset_id,
            "mode": definition.mode.name,
            "worker_index": definition.worker_index,
            "num_workers": definition.num_workers,
            "consumers": readers,
            "buffered": buffered,
            "buffered_bytes": nbytes,
            "fill": max(buffered / self._buffer.max_elements, nbytes / self._buffer.max_bytes),
            "elements": self.served_elements,
            "elements_per_s": per_s,
            "bytes_per_s": bytes_per_s,
            "state": state,
            **({"trainer_cache": self._cache.state()} if self._cache is not None else {}),
        }

    def _produce(self) -> None:
        iterator = None
        drained = False
        failed = False
        definition = self.definition
        try:
            dataset, compression = self._host.dataset(definition)
            self._replies.use_compression(compression)
            if self._cache is not None:  # TensorFlow's sliding window for infinite datasets
                self._cache.set_window(dataset.cardinality() == INFINITE_CARDINALITY)
            expected = structure.spec_structure(dataset.element_spec)
            if definition.exactly_once:
                self._produce_splits(dataset, expected)
                return
            shaped = task_dataset(
                dataset,
                definition.mode,
                definition.num_workers,
                definition.worker_index,
                self._splits,
            )
            if definition.skip:  # a consumer resumed the job: it had these from this stream
                shaped = shaped.skip(definition.skip)
            iterator = iter(timed(shaped, self._stages))
            # A DYNAMIC task's input ends when the worker drains (it asks for no more splits).
            stops_draining = definition.mode != ShardingPolicy.DYNAMIC
            for index, element in enumerate(raw_elements(iterator)):
                if not self._put(element, index, expected, None):
                    return
                if stops_draining and self._buffer.draining:
                    drained = True
                    return
        except BaseException as error:
            report = error_report(error, worker=self._host.worker_address, task_id=self.task_id)
            failed = self._buffer.fail(report)
            if failed:
                logger.warning("task %d failed: %r", self.task_id, error)
                self._host.telemetry.task_failed(self.task_id, report)
        finally:
            self._buffer.finish(drained=drained or self._splits.drained)
            if iterator is not None:
                _close(iterator, self.task_id)
            if failed:
                self._host.report_failure()

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
        size = leaves[0].nbytes if len(leaves) == 1 else sum(leaf.nbytes for leaf in leaves)
        return self._buffer.put(leaves, size, tag)

    def _produce_splits(self, dataset: Dataset, expected: Any) -> None:
        """An exactly-once task's input: each split the dispatcher grants, run on its own and
        tagged ``[key, offset]``, minus the offsets consumers already received (``replay``)."""
        definition = self.definition
        runner = SplitRunner(dataset, lambda shaped: timed(shaped, self._stages))
        finished: tuple[int, int] | None = None
        index = 0
        while True:
            # Waiting at the dispatcher would hold back the news of a split handed out whole
            # meanwhile (the job may wait for it): only a task that holds none waits there.
            wait_ms = 0 if self._buffer.splits_in_hand() else _GRANT_WAIT_MS
            grant = self._splits.next_grant(finished, self._buffer.handed_out_splits(), wait_ms)
            finished = None
            if grant is None:
                return
            if grant.wait:  # the other splits are not done: one may come back
                if not self._buffer.pause(_GRANT_POLL_S):
                    return
                continue
            key, units = grant.key, grant.split
            if key is None or units is None:
                raise InvalidArgumentError(
                    f"malformed reply: a split of exactly-once job {definition.job_id} comes "
                    f"with its key, got {grant}"
                )
            skip = [list(r) for r in grant.skip]  # ledger ranges: lists, as the ledger's
            count = 0
            pin = functools.partial(self._splits.pin, key)
            pin_all = functools.partial(self._splits.pin_all, key)
            run = runner.run(key, units, grant.versions, pin, pin_all)
            for offset, element in enumerate(run):
                count = offset + 1
                if skip and contains(skip, offset):
                    self._buffer.made_not_kept()  # made all the same: the worker's rate
                    continue
                if not self._put(element, index, expected, [key, offset]):
                    return
                index += 1
            finished = (key, count)
            self._buffer.split_done(key)


def _close(iterator: Any, task_id: int) -> None:
    """Closes a task's iterator; what that raises is logged (the task ended already)."""
    try:
        iterator.close()
    except Exception as error:
        logger.debug("task %d: closing its iterator raised %r", task_id, error)
