"""``WorkerServer``: runs the tasks the dispatcher assigns and serves their elements.

A worker registers with the dispatcher and keeps a heartbeat open (``WorkerHeartbeat`` waits at
the dispatcher for news, so a new job's task starts at once). For each task it fetches the job's
dataset (cloudpickled, so any Python in the pipeline runs here), shapes it by the job's sharding
policy, and runs it on a producer thread into a buffer bounded in bytes and elements:

============  ==================================================================================
OFF           the whole dataset
DYNAMIC       the source replaced by the splits the dispatcher hands this task (``_split``)
FILE          ``auto_shard(FILE)``: this worker's share of the files
DATA          ``shard(num_workers, worker_index)``
FILE_OR_DATA  FILE where the dataset reads files, else DATA
HINT          ``auto_shard(HINT)``: ``shard(SHARD_HINT, SHARD_HINT)`` filled in
============  ==================================================================================

Consumers call ``GetElements``. First come, first served: a reply carries as many buffered
elements as fit in the consumer's request (several small ones, or one large one as raw NumPy
buffers). Round robin (``num_consumers``): the task cuts its output into rounds of
``num_consumers`` elements and consumer ``i`` gets element ``i`` of each round it asks for;
nobody waits for a consumer that stopped asking, and rounds far behind the newest are dropped.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

import cloudpickle

from feedline.data import structure
from feedline.data.auto_shard import ShardMode, auto_shard
from feedline.data.dataset import Dataset
from feedline.data.options import AutoShardPolicy
from feedline.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    UnavailableError,
)
from feedline.service import _rpc
from feedline.service._rpc import field
from feedline.service._split import with_split_source
from feedline.service._wire import Compressor, encode_frame, pack_elements
from feedline.service.config import ShardingPolicy, WorkerConfig
from feedline.service.dispatcher import SERVICE_NAME as DISPATCHER_SERVICE

__all__ = ["WorkerServer", "local_worker_addresses"]

logger = logging.getLogger(__name__)

SERVICE_NAME = "feedline.service.Worker"
# A task's buffer holds at most this many bytes and elements.
_BUFFER_BYTES = 64 << 20
_BUFFER_ELEMENTS = 4096
# Round-robin rounds kept behind the newest one asked for.
_ROUND_WINDOW = 256
_MAX_WAIT_S = 1.0

_local_lock = threading.Lock()
_local_addresses: set[str] = set()


def local_worker_addresses() -> frozenset[str]:
    """The addresses of the workers running in this process (``target_workers="LOCAL"``)."""
    with _local_lock:
        return frozenset(_local_addresses)


class WorkerServer:
    """A data service worker.

    Example:
      >>> from feedline import service
      >>> dispatcher = service.DispatchServer()
      >>> worker = service.WorkerServer(
      ...     service.WorkerConfig(dispatcher_address=dispatcher.target.split("://")[1]))
      >>> worker.stop(); dispatcher.stop()

    Args:
      config: a ``WorkerConfig``.
      start: start now: serve, and register with the dispatcher (waiting up to
        ``dispatcher_timeout_ms`` for it).
    """

    def __init__(self, config: WorkerConfig, start: bool = True) -> None:
        if not isinstance(config, WorkerConfig):
            raise InvalidArgumentError(
                f"config must be a WorkerConfig, got {type(config).__name__}"
            )
        self._config = config
        self._token = _rpc.resolve_token(config.token)
        self._dispatcher = _rpc.RpcClient(
            _rpc.parse_service(config.dispatcher_address), DISPATCHER_SERVICE, self._token
        )
        self._tasks: dict[int, _Task] = {}
        self._deleted: set[int] = set()
        self._datasets: dict[str, tuple[Dataset, str | None]] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._server: Any = None
        self._address: str | None = None
        self._heartbeat_thread: threading.Thread | None = None
        if start:
            self.start()

    @property
    def worker_address(self) -> str:
        """The address consumers reach this worker at."""
        if self._address is None:
            raise FailedPreconditionError("the worker is not started; call start() first")
        return self._address

    def start(self) -> None:
        """Starts serving and registers with the dispatcher; idempotent.

        Raises:
          UnavailableError: the dispatcher could not be reached within dispatcher_timeout_ms.
          FailedPreconditionError: the dispatcher refuses this worker (not in its fixed list).
        """
        if self._server is not None:
            return
        config = self._config
        self._server, port = _rpc.start_server(
            SERVICE_NAME,
            {"GetElements": self._get_elements},
            bind=config.bind,
            port=config.port,
            token=self._token,
        )
        host = "localhost" if config.bind in ("0.0.0.0", "::", "[::]") else config.bind
        self._address = (config.worker_address or f"{host}:%port%").replace("%port%", str(port))
        with _local_lock:
            _local_addresses.add(self._address)
        try:
            self._heartbeat(wait_s=0.0, timeout=config.dispatcher_timeout_s, wait_for_ready=True)
        except Exception:
            self.stop()
            raise
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, name=f"feedline-worker-{port}-heartbeat", daemon=True
        )
        self._heartbeat_thread.start()
        logger.info("worker %s registered with %s", self._address, self._dispatcher.address)

    def join(self) -> None:
        """Blocks until the server stops."""
        if self._server is not None:
            self._server.wait_for_termination()

    def stop(self) -> None:
        """Stops serving and every task; idempotent."""
        self._stopped.set()
        with _local_lock:
            _local_addresses.discard(self._address or "")
        if self._server is not None:
            self._server.stop(grace=0.2)
        with self._lock:
            tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.stop()
        self._dispatcher.close()

    def __enter__(self) -> WorkerServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- the dispatcher ---------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        backoff = 0.05
        while not self._stopped.is_set():
            try:
                self._heartbeat(wait_s=self._config.heartbeat_interval_s, timeout=30.0)
                backoff = 0.05
            except UnavailableError as error:
                if self._stopped.is_set():
                    return
                logger.warning("worker %s: dispatcher unreachable (%s)", self._address, error)
                self._stopped.wait(backoff)
                backoff = min(2 * backoff, 2.0)
            except Exception:
                if self._stopped.is_set():
                    return
                logger.exception("worker %s: heartbeat failed", self._address)
                self._stopped.wait(1.0)

    def _heartbeat(self, *, wait_s: float, timeout: float, wait_for_ready: bool = False) -> None:
        with self._lock:
            current = sorted(self._tasks)
            finished = sorted(t for t, task in self._tasks.items() if task.finished())
        reply, _ = self._dispatcher.call(
            "WorkerHeartbeat",
            {
                "address": self._address,
                "tags": list(self._config.worker_tags),
                "current_tasks": current,
                "finished_tasks": finished,
                "wait_ms": int(wait_s * 1000),
            },
            timeout=timeout + wait_s,
            wait_for_ready=wait_for_ready,
        )
        for task_id in reply["delete_tasks"]:
            with self._lock:
                task = self._tasks.pop(task_id, None)
                self._deleted.add(task_id)
            if task is not None:
                task.stop()
        for task_def in reply["new_tasks"]:
            self._start_task(task_def)

    def _start_task(self, task_def: dict[str, Any]) -> None:
        dataset, compression = self._dataset(task_def["dataset_id"])
        task = _Task(task_def, dataset, compression, self._dispatcher)
        with self._lock:
            if self._stopped.is_set() or task_def["task_id"] in self._tasks:
                return
            self._tasks[task_def["task_id"]] = task
        task.start()

    def _dataset(self, dataset_id: str) -> tuple[Dataset, str | None]:
        cached = self._datasets.get(dataset_id)
        if cached is None:
            reply, buffers = self._dispatcher.call(
                "GetDatasetDef", {"dataset_id": dataset_id}, timeout=60.0
            )
            dataset = cloudpickle.loads(buffers[0])
            cached = self._datasets[dataset_id] = (dataset, reply["compression"])
        return cached

    # -- consumers --------------------------------------------------------------------------
    def _get_elements(self, header: dict[str, Any], buffers: list[memoryview]) -> bytes:
        task_id = field(header, "task_id", int)
        with self._lock:
            task = self._tasks.get(task_id)
            deleted = task_id in self._deleted
        if task is None:
            # A deleted task belonged to a finished job: nothing more comes from it. Another
            # one is on its way here (the consumer heard of it first): nothing yet.
            if not deleted:
                time.sleep(0.01)
            return encode_frame({"eos": deleted})
        return task.get_elements(header)


class _DispatcherSplits:
    """The ``SplitProvider`` of a DYNAMIC task: asks the dispatcher for the job's splits."""

    def __init__(self, dispatcher: _rpc.RpcClient, job_id: int, task_id: int) -> None:
        self._dispatcher = dispatcher
        self._job_id = job_id
        self._task_id = task_id

    def next_split(self, repetition: int) -> list[int] | None:
        reply, _ = self._dispatcher.call(
            "GetSplit",
            {"job_id": self._job_id, "repetition": repetition, "task_id": self._task_id},
            timeout=60.0,
            wait_for_ready=True,
        )
        return reply["split"]


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


class _Task:
    """One task: a producer thread running the task's dataset into a bounded buffer, and the
    replies that hand its elements out."""

    def __init__(
        self,
        task_def: dict[str, Any],
        dataset: Dataset,
        compression: str | None,
        dispatcher: _rpc.RpcClient,
    ) -> None:
        self.task_id = int(task_def["task_id"])
        mode = ShardingPolicy(task_def["mode"])
        splits = _DispatcherSplits(dispatcher, int(task_def["job_id"]), self.task_id)
        # Shaped on the producer thread, so that a dataset the policy cannot shape (FILE over a
        # dataset without files) fails the task and its consumers hear why, instead of waiting.
        self._make_dataset = lambda: task_dataset(
            dataset, mode, int(task_def["num_workers"]), int(task_def["worker_index"]), splits
        )
        self._num_consumers: int | None = task_def["num_consumers"]
        self._compressor = Compressor(compression)
        self._cond = threading.Condition()
        self._buffer: collections.deque[tuple[list[Any], int]] = collections.deque()
        self._buffered_bytes = 0
        self._ended = False
        self._error: BaseException | None = None
        self._told = False  # whether a consumer received the error
        self._stop = False
        self._rounds: dict[int, list[Any]] = {}
        self._round_taken: dict[int, set[int]] = {}
        self._next_round = 0
        self._thread = threading.Thread(
            target=self._produce, name=f"feedline-task-{self.task_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._buffer.clear()
            self._cond.notify_all()

    def finished(self) -> bool:
        """Whether every element was handed out, or the task failed and a consumer was told
        (a failed task stays until then, so that its consumers hear the error, not an end)."""
        with self._cond:
            return self._ended and not self._buffer and (self._error is None or self._told)

    def _produce(self) -> None:
        iterator = None
        try:
            iterator = iter(self._make_dataset())
            for element in iterator:
                leaves, _ = structure.flatten(element)
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
                        return
                    self._buffer.append((leaves, size))
                    self._buffered_bytes += size
                    self._cond.notify_all()
        except BaseException as error:
            logger.warning("task %d failed: %r", self.task_id, error)
            with self._cond:
                self._error = error
        finally:
            with self._cond:
                self._ended = True
                self._cond.notify_all()
            if iterator is not None:
                iterator.close()

    def _wait_for_data(self, wait_s: float) -> None:
        """Waits (under the lock) until an element is buffered, the input ends or time runs out."""
        deadline = time.monotonic() + wait_s
        while not self._buffer and not self._ended and not self._stop:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._cond.wait(remaining)

    def _take(self) -> list[Any]:
        leaves, size = self._buffer.popleft()
        self._buffered_bytes -= size
        self._cond.notify_all()
        return leaves

    def get_elements(self, header: dict[str, Any]) -> bytes:
        wait_s = min(field(header, "wait_ms", int, 500) / 1000, _MAX_WAIT_S)
        if self._num_consumers is not None:
            return self._get_round(header, wait_s)
        max_elements = max(1, field(header, "max_elements", int, 1))
        max_bytes = max(1, field(header, "max_bytes", int, 8 << 20))
        elements: list[list[Any]] = []
        with self._cond:
            self._wait_for_data(wait_s)
            taken = 0
            while self._buffer and len(elements) < max_elements:
                if elements and taken + self._buffer[0][1] > max_bytes:
                    break
                taken += self._buffer[0][1]
                elements.append(self._take())
            if not elements:
                if self._error is not None:
                    self._told = True
                    raise self._error
                if self._stop:
                    raise NotFoundError(f"task {self.task_id} was stopped")
                return encode_frame({"eos": self._ended})
        return self._reply(elements)

    def _reply(self, elements: list[list[Any]]) -> bytes:
        meta, buffers = pack_elements(elements)
        return encode_frame({"eos": False, "meta": meta}, buffers, compressor=self._compressor)

    def _get_round(self, header: dict[str, Any], wait_s: float) -> bytes:
        num_consumers = self._num_consumers or 1
        consumer = field(header, "consumer_index", int)
        round_index = field(header, "round", int)
        if not 0 <= consumer < num_consumers:
            raise InvalidArgumentError(
                f"consumer_index {consumer} is out of range [0, {num_consumers})"
            )
        deadline = time.monotonic() + wait_s
        with self._cond:
            while self._next_round <= round_index:
                if len(self._buffer) >= num_consumers:
                    self._rounds[self._next_round] = [self._take() for _ in range(num_consumers)]
                    self._round_taken[self._next_round] = set()
                    self._next_round += 1
                    for old in [r for r in self._rounds if r < self._next_round - _ROUND_WINDOW]:
                        del self._rounds[old], self._round_taken[old]
                    continue
                if self._error is not None:
                    self._told = True
                    raise self._error
                if self._ended:
                    return encode_frame({"eos": True})
                if self._stop:
                    raise NotFoundError(f"task {self.task_id} was stopped")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return encode_frame({"eos": False})  # nothing yet: the consumer asks again
                self._cond.wait(remaining)
            if round_index not in self._rounds:
                raise OutOfRangeError(
                    f"round {round_index} of task {self.task_id} was dropped: consumer "
                    f"{consumer} fell more than {_ROUND_WINDOW} rounds behind the others"
                )
            element = self._rounds[round_index][consumer]
            taken = self._round_taken[round_index]
            taken.add(consumer)
            if len(taken) == num_consumers:
                del self._rounds[round_index], self._round_taken[round_index]
        return self._reply([element])
