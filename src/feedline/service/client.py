"""The consumer side of the data service: ``distribute``, ``register_dataset``,
``from_dataset_id`` and the dataset they make.

``dataset.apply(distribute(...))`` returns a ``DataServiceDataset``: a source whose elements come
from the service's workers. The dataset before ``distribute`` travels to the workers as a
cloudpickled description (any Python in it runs there); what follows ``distribute`` runs here::

    Dataset.range(5).map(square)      # on the workers
      .apply(distribute("parallel_epochs", target))
      .map(plus_one)                  # in this process

Each iterator of a ``DataServiceDataset`` (each ``iter``, each ``repeat`` pass) is a new job, or,
with ``job_name``, the job of ``(job_name, iteration)`` that every consumer of that name shares.
It registers the dataset on first use, joins the job, heartbeats the dispatcher for the job's
tasks and reads them:

- first come, first served: one fetch thread per task asks for as many elements as the
  consumer has room for (``max_outstanding_requests`` elements in flight and buffered, and a
  byte budget), several per reply when they are small;
- round robin (``consumer_index``/``num_consumers``): round ``r`` is read from task
  ``r % num_tasks``; every consumer reads the same worker at each step.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Any

import cloudpickle

from feedline.data import structure
from feedline.data.dataset import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    DatasetIterator,
    IteratorContext,
)
from feedline.errors import (
    FailedPreconditionError,
    FeedlineError,
    InvalidArgumentError,
    UnavailableError,
)
from feedline.service import _rpc
from feedline.service._split import split_plan
from feedline.service._wire import decode_frame, encode_frame, unpack_elements
from feedline.service.config import ShardingPolicy
from feedline.service.dispatcher import SERVICE_NAME as DISPATCHER_SERVICE
from feedline.service.worker import SERVICE_NAME as WORKER_SERVICE
from feedline.service.worker import local_worker_addresses

__all__ = ["DataServiceDataset", "distribute", "from_dataset_id", "register_dataset"]

logger = logging.getLogger(__name__)

_TARGET_WORKERS = ("AUTO", "ANY", "LOCAL")
_COMPRESSIONS = ("AUTO", None)
# Without max_outstanding_requests: elements and bytes a consumer keeps in flight and buffered.
_DEFAULT_OUTSTANDING = 1024
_BUFFER_BYTES = 64 << 20
# The most bytes one reply carries (one larger element still travels alone).
_REPLY_BYTES = 8 << 20
_POLL_MS = 500
_RPC_TIMEOUT_S = 60.0


# -- arguments --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _ReadParams:
    """How a consumer reads from the service (validated by ``_read_params``)."""

    mode: ShardingPolicy
    address: str
    job_name: str | None
    consumer_index: int | None
    num_consumers: int | None
    max_outstanding_requests: int | None
    target_workers: str


def _read_params(
    processing_mode: Any,
    service: Any,
    job_name: Any,
    consumer_index: Any,
    num_consumers: Any,
    max_outstanding_requests: Any,
    data_transfer_protocol: Any,
    target_workers: Any,
) -> _ReadParams:
    mode = ShardingPolicy.parse(processing_mode)
    address = _rpc.parse_service(service)
    if job_name is not None and (not isinstance(job_name, str) or not job_name):
        raise InvalidArgumentError(f"job_name must be a non-empty string, got {job_name!r}")
    if (consumer_index is None) != (num_consumers is None):
        raise InvalidArgumentError(
            "consumer_index and num_consumers must be given together (got consumer_index="
            f"{consumer_index!r}, num_consumers={num_consumers!r})"
        )
    if num_consumers is not None:
        if job_name is None:
            raise InvalidArgumentError(
                "round-robin reads (consumer_index/num_consumers) need a job_name that the "
                "consumers share"
            )
        if not _is_int(num_consumers) or num_consumers < 1:
            raise InvalidArgumentError(f"num_consumers must be an int >= 1, got {num_consumers!r}")
        if not _is_int(consumer_index) or not 0 <= consumer_index < num_consumers:
            raise InvalidArgumentError(
                f"consumer_index must be an int in [0, {num_consumers}), got {consumer_index!r}"
            )
    if max_outstanding_requests is not None and (
        not _is_int(max_outstanding_requests) or max_outstanding_requests < 1
    ):
        raise InvalidArgumentError(
            f"max_outstanding_requests must be an int >= 1 or None, got "
            f"{max_outstanding_requests!r}"
        )
    if data_transfer_protocol not in (None, "grpc"):
        raise InvalidArgumentError(
            f"data_transfer_protocol must be None or 'grpc', got {data_transfer_protocol!r}"
        )
    workers = target_workers.upper() if isinstance(target_workers, str) else target_workers
    if workers not in _TARGET_WORKERS:
        raise InvalidArgumentError(
            f"target_workers must be one of {_TARGET_WORKERS}, got {target_workers!r}"
        )
    return _ReadParams(
        mode,
        address,
        job_name,
        consumer_index,
        num_consumers,
        max_outstanding_requests,
        "ANY" if workers == "AUTO" else workers,
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_compression(compression: Any) -> None:
    if compression not in _COMPRESSIONS:
        raise InvalidArgumentError(f"compression must be 'AUTO' or None, got {compression!r}")


# -- public functions -------------------------------------------------------------------------


def distribute(
    processing_mode: Any,
    service: Any,
    job_name: str | None = None,
    consumer_index: int | None = None,
    num_consumers: int | None = None,
    max_outstanding_requests: int | None = None,
    data_transfer_protocol: str | None = None,
    compression: str | None = "AUTO",
    target_workers: str = "AUTO",
) -> Any:
    """A transformation (for ``dataset.apply``) that moves the dataset's processing onto the
    data service.

    Example:
      >>> from feedline.data import Dataset
      >>> from feedline import service
      >>> dispatcher = service.DispatchServer()
      >>> address = dispatcher.target.split("://")[1]
      >>> workers = [service.WorkerServer(service.WorkerConfig(dispatcher_address=address))
      ...            for _ in range(2)]
      >>> dataset = Dataset.range(10).apply(
      ...     service.distribute("parallel_epochs", dispatcher.target))
      >>> sorted(int(x) for x in dataset)
      [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9]
      >>> for server in [*workers, dispatcher]: server.stop()

    Args:
      processing_mode: a ``ShardingPolicy``, or ``"parallel_epochs"`` (OFF) /
        ``"distributed_epoch"`` (DYNAMIC).
      service: the dispatcher, ``"[grpc://]host:port"`` or ``("grpc", "host:port")``.
      job_name: share one job per iteration with every consumer of this name.
      consumer_index: this consumer's index for round-robin reads (with ``num_consumers``).
      num_consumers: the number of round-robin consumers; needs ``job_name`` and an infinite
        dataset.
      max_outstanding_requests: the most elements in flight and buffered at once (memory is at
        most that many times an element's size).
      data_transfer_protocol: None or ``"grpc"``.
      compression: ``"AUTO"`` (compress on the wire when it pays) or None.
      target_workers: ``"AUTO"``/``"ANY"`` (every worker) or ``"LOCAL"`` (only workers in this
        process).

    Raises:
      InvalidArgumentError: an argument out of its range; under DYNAMIC, a dataset without a
        splittable source (raised when the transformation is applied).
    """
    params = _read_params(
        processing_mode,
        service,
        job_name,
        consumer_index,
        num_consumers,
        max_outstanding_requests,
        data_transfer_protocol,
        target_workers,
    )
    _check_compression(compression)

    def apply(dataset: Dataset) -> DataServiceDataset:
        return DataServiceDataset(params, source=dataset, compression=compression)

    return apply


def register_dataset(
    service: Any, dataset: Dataset, compression: str | None = "AUTO", dataset_id: str | None = None
) -> str:
    """Registers ``dataset`` with the service's dispatcher and returns its id (registering the
    same dataset again returns the same id). See ``from_dataset_id``."""
    if not isinstance(dataset, Dataset):
        raise InvalidArgumentError(f"register_dataset expects a Dataset, got {type(dataset)}")
    _check_compression(compression)
    if dataset_id is not None and (not isinstance(dataset_id, str) or not dataset_id):
        raise InvalidArgumentError(f"dataset_id must be a non-empty string, got {dataset_id!r}")
    return _register(_rpc.parse_service(service), dataset, compression, dataset_id)


def from_dataset_id(
    processing_mode: Any,
    service: Any,
    dataset_id: str,
    element_spec: Any = None,
    job_name: str | None = None,
    consumer_index: int | None = None,
    num_consumers: int | None = None,
    max_outstanding_requests: int | None = None,
    data_transfer_protocol: str | None = None,
    target_workers: str = "AUTO",
) -> DataServiceDataset:
    """A dataset reading the registered dataset ``dataset_id`` from the service; the element
    spec is asked of the dispatcher when not given."""
    params = _read_params(
        processing_mode,
        service,
        job_name,
        consumer_index,
        num_consumers,
        max_outstanding_requests,
        data_transfer_protocol,
        target_workers,
    )
    if not isinstance(dataset_id, str) or not dataset_id:
        raise InvalidArgumentError(f"dataset_id must be a non-empty string, got {dataset_id!r}")
    reply, buffers = _dispatcher(params.address).call(
        "GetElementSpec", {"dataset_id": dataset_id}, timeout=_RPC_TIMEOUT_S, wait_for_ready=True
    )
    if element_spec is None:
        element_spec = cloudpickle.loads(buffers[0])
    return DataServiceDataset(
        params, dataset_id=dataset_id, element_spec=element_spec, cardinality=reply["cardinality"]
    )


# -- connections ------------------------------------------------------------------------------

_clients_lock = threading.Lock()
_clients: dict[tuple[str, str, str], _rpc.RpcClient] = {}


def _client(address: str, service_name: str) -> _rpc.RpcClient:
    """One channel per address and service in this process (channels are thread-safe)."""
    token = _rpc.resolve_token(None)
    key = (address, service_name, token or "")
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = _rpc.RpcClient(address, service_name, token)
        return client


def _dispatcher(address: str) -> _rpc.RpcClient:
    return _client(address, DISPATCHER_SERVICE)


def _register(
    address: str, dataset: Dataset, compression: str | None, dataset_id: str | None
) -> str:
    spec = cloudpickle.dumps(dataset.element_spec)  # before the dataset: it may cache its spec
    try:
        plan = split_plan(dataset).to_json()
    except InvalidArgumentError:
        plan = None
    header = {
        "compression": compression,
        "cardinality": dataset.cardinality(),
        "split_plan": plan,
        "dataset_id": dataset_id,
    }
    try:
        payload = cloudpickle.dumps(dataset)
    except Exception as error:
        raise InvalidArgumentError(
            f"the dataset cannot be sent to the service: pickling it failed with {error!r}; "
            "every function in the pipeline must be picklable by cloudpickle"
        ) from error
    reply, _ = _dispatcher(address).call(
        "RegisterDataset", header, (payload, spec), timeout=_RPC_TIMEOUT_S, wait_for_ready=True
    )
    return str(reply["dataset_id"])


# -- the dataset ------------------------------------------------------------------------------


class DataServiceDataset(Dataset):
    """Elements read from the data service (made by ``distribute`` and ``from_dataset_id``).

    It has no inputs in this process: the dataset it reads runs on the workers, so graph
    rewrites here (auto-sharding) never reach into it.
    """

    def __init__(
        self,
        params: _ReadParams,
        *,
        source: Dataset | None = None,
        compression: str | None = "AUTO",
        dataset_id: str | None = None,
        element_spec: Any = None,
        cardinality: int = UNKNOWN_CARDINALITY,
    ) -> None:
        super().__init__(())
        self._params = params
        self._source = source
        self._compression = compression
        self._dataset_id = dataset_id
        self._iterations = 0
        if source is not None:
            if not isinstance(source, Dataset):
                raise InvalidArgumentError(
                    f"distribute is applied to a Dataset, got {type(source).__name__}"
                )
            if params.mode == ShardingPolicy.DYNAMIC:
                split_plan(source)  # a dataset without a splittable source fails here
            element_spec = source.element_spec
            cardinality = source.cardinality()
        self._element_spec = element_spec
        self._source_cardinality = cardinality

    def _cardinality(self) -> int:
        if self._source_cardinality == INFINITE_CARDINALITY:
            return INFINITE_CARDINALITY
        return UNKNOWN_CARDINALITY

    @property
    def job_name(self) -> str | None:
        return self._params.job_name

    def _is_sharded_elsewhere(self) -> bool:
        """Consumers of a named job split its data among themselves: auto-sharding keeps off."""
        return self._params.job_name is not None

    def _registered_id(self) -> str:
        with self._passes_lock:
            if self._dataset_id is None:
                assert self._source is not None
                self._dataset_id = _register(
                    self._params.address, self._source, self._compression, None
                )
            return self._dataset_id

    def _make_iterator(self, ctx: IteratorContext) -> _ServiceIterator:
        with self._passes_lock:
            iteration = self._iterations
            self._iterations += 1
        return _ServiceIterator(self, ctx, iteration)


class _ServiceIterator(DatasetIterator):
    """One job's elements. Single-threaded API. The reading happens in a ``_JobReader``, whose
    threads do not hold the iterator: an iterator dropped unclosed is collected, and closing it
    releases the job."""

    def __init__(self, dataset: DataServiceDataset, ctx: IteratorContext, iteration: int) -> None:
        super().__init__(dataset, ctx)
        self._reader = _JobReader(dataset, iteration)

    def _next(self) -> Any:
        return self._reader.next()

    def _get_state(self) -> dict[str, Any]:
        raise FailedPreconditionError(
            "an iterator over the data service cannot be checkpointed: its elements come from "
            "a shared job on remote workers. Checkpoint the model and start a new job instead"
        )

    def _set_state(self, state: dict[str, Any]) -> None:
        self._get_state()

    def _close(self) -> None:
        self._reader.release()


class _JobReader:
    """Joins a job and reads it: a heartbeat thread follows the job's tasks, fetch threads fill
    a bounded buffer, ``next`` takes from it."""

    def __init__(self, dataset: DataServiceDataset, iteration: int) -> None:
        params = self._params = dataset._params
        self._dispatcher = _dispatcher(params.address)
        self._treespec = structure.spec_structure(dataset.element_spec)
        self._cond = threading.Condition()
        self._results: collections.deque[tuple[Any, int]] = collections.deque()
        self._error: BaseException | None = None
        self._credits = params.max_outstanding_requests or _DEFAULT_OUTSTANDING
        self._buffered_bytes = 0
        self._tasks: dict[int, str] = {}
        self._fetchers: dict[int, threading.Thread] = {}
        self._done_tasks: set[int] = set()
        self._ended_tasks: set[int] = set()
        self._job_finished = False
        self._stopping = threading.Event()
        reply, _ = self._dispatcher.call(
            "GetOrCreateJob",
            {
                "dataset_id": dataset._registered_id(),
                "mode": int(params.mode),
                "job_name": params.job_name,
                "iteration": iteration,
                "num_consumers": params.num_consumers,
                "target_workers": params.target_workers,
            },
            timeout=_RPC_TIMEOUT_S,
            wait_for_ready=True,
        )
        self._client_id = int(reply["client_id"])
        self._job_finished = bool(reply["finished"])
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, name=f"feedline-consumer-{self._client_id}", daemon=True
        )
        self._heartbeat_thread.start()

    # -- the dispatcher ---------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        wait_ms = 0
        unreachable_since = 0.0
        while not self._stopping.is_set():
            try:
                reply, _ = self._dispatcher.call(
                    "ClientHeartbeat",
                    {
                        "client_id": self._client_id,
                        "known_tasks": self._running_tasks(),
                        "wait_ms": wait_ms,
                    },
                    timeout=_RPC_TIMEOUT_S,
                )
            except UnavailableError as error:
                if not unreachable_since:
                    unreachable_since = time.monotonic()
                    logger.warning(
                        "consumer %d: dispatcher unreachable, retrying (%s)", self._client_id, error
                    )
                self._stopping.wait(0.5)
                continue
            except BaseException as error:
                self._fail(error)
                return
            wait_ms = 1000
            unreachable_since = 0.0
            self._update_tasks(reply["tasks"], bool(reply["finished"]))

    def _running_tasks(self) -> list[int]:
        with self._cond:
            return sorted(set(self._tasks) - self._ended_tasks)

    def _update_tasks(self, listed: list[list[Any]], finished: bool) -> None:
        """Takes in the job's tasks ``[task_id, address, ended]`` from a heartbeat: starts
        reading new ones and notes those that ended at the dispatcher (a task whose worker was
        dropped ends there; its fetcher stops when the worker does not answer)."""
        tasks = {int(t): str(a) for t, a, _ in listed}
        if self._params.target_workers == "LOCAL":
            local = local_worker_addresses()
            if tasks and not any(a in local for a in tasks.values()):
                self._fail(
                    FailedPreconditionError(
                        "target_workers='LOCAL' reads only from workers in this process, and "
                        "none of the job's workers runs here; start a WorkerServer in this "
                        "process or use target_workers='ANY'"
                    )
                )
                return
            tasks = {t: a for t, a in tasks.items() if a in local}
        with self._cond:
            self._ended_tasks.update(int(t) for t, _, ended in listed if ended)
            new = {t: a for t, a in tasks.items() if t not in self._tasks}
            self._tasks.update(new)
            self._job_finished = finished
            self._cond.notify_all()
        if self._params.num_consumers is not None:
            if new and not self._fetchers:
                self._start_fetcher(-1, self._fetch_rounds)
            return
        for task_id in sorted(new):
            self._start_fetcher(task_id, self._fetch_first_come)

    def _start_fetcher(self, key: int, target: Any) -> None:
        thread = threading.Thread(
            target=target,
            args=(key,),
            name=f"feedline-consumer-{self._client_id}-fetch-{key}",
            daemon=True,
        )
        self._fetchers[key] = thread
        thread.start()

    def _fail(self, error: BaseException) -> None:
        with self._cond:
            if self._error is None and not self._stopping.is_set():
                self._error = error
            self._cond.notify_all()

    # -- reading ----------------------------------------------------------------------------
    def _acquire(self) -> int:
        """Credits for one request (0 when stopping): at most the consumer's share of room."""
        with self._cond:
            while not self._stopping.is_set() and (
                self._credits <= 0 or self._buffered_bytes >= _BUFFER_BYTES
            ):
                self._cond.wait(0.5)
            if self._stopping.is_set():
                return 0
            active = max(1, len(self._tasks) - len(self._done_tasks))
            share = max(1, self._credits // active)
            self._credits -= share
            return share

    def _deliver(self, elements: list[list[Any]], credits: int) -> None:
        treespec = self._treespec
        items = []
        for leaves in elements:
            size = sum(leaf.nbytes for leaf in leaves)
            # 0-d numbers come back as NumPy scalars, as feedline.data's sources give them.
            leaves = [
                leaf[()] if leaf.ndim == 0 and leaf.dtype.kind in "biufc" else leaf
                for leaf in leaves
            ]
            items.append((structure.unflatten(treespec, leaves), size))
        with self._cond:
            self._results.extend(items)
            self._credits += credits - len(items)
            self._buffered_bytes += sum(size for _, size in items)
            self._cond.notify_all()

    def _worker_call(self, address: str, request: dict[str, Any]) -> dict[str, Any] | None:
        """One GetElements call; its header with ``elements`` added, or None if the worker is
        unreachable right now."""
        try:
            frame = _client(address, WORKER_SERVICE).call_frame(
                "GetElements", encode_frame(request), timeout=_RPC_TIMEOUT_S
            )
        except UnavailableError:
            return None
        header, buffers = decode_frame(frame)
        meta = header.get("meta")
        header["elements"] = [] if meta is None else unpack_elements(meta, buffers)
        return header

    def _fetch_first_come(self, task_id: int) -> None:
        address = self._tasks[task_id]
        try:
            while not self._stopping.is_set() and task_id not in self._done_tasks:
                credits = self._acquire()
                if not credits:
                    return
                reply = self._worker_call(
                    address,
                    {
                        "task_id": task_id,
                        "max_elements": credits,
                        "max_bytes": _REPLY_BYTES,
                        "wait_ms": _POLL_MS,
                    },
                )
                self._deliver([] if reply is None else reply["elements"], credits)
                if reply is None and task_id not in self._ended_tasks:
                    self._stopping.wait(0.1)
                elif reply is None or reply["eos"]:
                    with self._cond:
                        self._done_tasks.add(task_id)
                        self._cond.notify_all()
        except BaseException as error:
            self._fail(error)

    def _fetch_rounds(self, _: int) -> None:
        params = self._params
        round_index = 0
        try:
            while not self._stopping.is_set():
                if not self._acquire():
                    return
                tasks = sorted(self._tasks.items())
                task_id, address = tasks[round_index % len(tasks)]
                request = {
                    "task_id": task_id,
                    "consumer_index": params.consumer_index,
                    "round": round_index // len(tasks),
                    "wait_ms": _POLL_MS,
                }
                reply = None
                while not self._stopping.is_set():
                    reply = self._worker_call(address, request)
                    if reply is not None and (reply["elements"] or reply["eos"]):
                        break
                    if reply is None:
                        self._stopping.wait(0.1)
                if reply is None or reply["eos"]:
                    self._deliver([], 1)
                    with self._cond:
                        self._done_tasks.update(self._tasks)
                        self._cond.notify_all()
                    return
                self._deliver(reply["elements"], 1)
                round_index += 1
        except BaseException as error:
            self._fail(error)

    def _finished(self) -> bool:
        if self._job_finished and not self._tasks:
            return True
        return bool(self._tasks) and self._done_tasks >= set(self._tasks)

    def next(self) -> Any:
        with self._cond:
            while not self._results:
                if self._error is not None:
                    raise self._error
                if self._finished():
                    self.release()
                    raise StopIteration
                self._cond.wait(1.0)
            element, size = self._results.popleft()
            self._credits += 1
            self._buffered_bytes -= size
            self._cond.notify_all()
        return element

    def release(self) -> None:
        """Stops the threads and tells the dispatcher this consumer is done; idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        try:
            self._dispatcher.call("ReleaseClient", {"client_id": self._client_id}, timeout=5.0)
        except FeedlineError as error:  # the dispatcher forgets the consumer when it times out
            logger.info("consumer %d: release failed: %s", self._client_id, error)
