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
It registers the dataset on first use, joins the job and reads it with a ``_JobReader``
(``job_reader``: the heartbeat and fetch threads, first come first served or round robin).

An iterator's ``get_state`` is its position: per task, the elements ``next`` returned
(``position``; OFF and static sharding, read first come). ``set_state`` releases the job it
joined and joins a new one of the same name that resumes there.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import cloudpickle

from feedline import _cluster_shares as cluster_shares
from feedline import structure
from feedline._net import rpc as _rpc
from feedline._net.specs import decode_spec, encode_spec
from feedline.data.dataset import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    DatasetIterator,
    IteratorContext,
)
from feedline.errors import (
    ConsumerReleasedError,
    FailedPreconditionError,
    InvalidArgumentError,
)
from feedline.service.client.channels import _bounded_call, _dispatcher, _patiently
from feedline.service.client.cross_trainer import CrossTrainerCache, TrainerPosition
from feedline.service.client.job_reader import _JobReader
from feedline.service.client.read_params import _compression, _read_params, _ReadParams
from feedline.service.config import ShardingPolicy
from feedline.service.position import (
    JobPosition,
    SplitPosition,
    check_checkpointable,
    position_from_state,
)
from feedline.service.protocol import (
    ElementSpecReply,
    GetElementSpecRequest,
    RegisterDatasetReply,
    RegisterDatasetRequest,
)
from feedline.service.splits import split_plan

__all__ = ["DataServiceDataset", "distribute", "from_dataset_id", "register_dataset"]

logger = logging.getLogger(__name__)

# How long a consumer waits for an unreachable dispatcher, or for a job no worker serves,
# before next() raises UnavailableError (options.experimental_distribute.service_timeout_ms).
_DEFAULT_TIMEOUT_MS = 300_000


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
    cross_trainer_cache: CrossTrainerCache | None = None,
    acknowledge: str = "on_receipt",
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
      data_transfer_protocol: None (the default: replies of a worker on this host come through
        shared memory, others over gRPC) or ``"grpc"`` (every reply over gRPC).
      compression: ``"AUTO"`` (compress on the wire when it pays) or None; TensorFlow's
        ``"SNAPPY"`` is taken as ``"AUTO"``.
      target_workers: ``"AUTO"``/``"ANY"`` (every worker) or ``"LOCAL"`` (only workers in this
        process).
      cross_trainer_cache: a ``CrossTrainerCache``: this consumer is a trainer that reads
        every element of the job ``job_name``, which the workers compute once for all its
        trainers (needs ``job_name``; under ``parallel_epochs`` an infinite dataset). It
        follows ``target_workers`` (TensorFlow 2.21 puts it before): pass it by name.
      acknowledge: ``"on_receipt"`` (the default) or ``"on_commit"``: under
        ``distributed_epoch`` with a fault-tolerant dispatcher, an element counts as consumed
        only when the step that used it commits (the iterator's ``commit()``); the elements of
        a consumer that dies before its step committed go to the job's other consumers, or to
        one that joins, and ``abort()`` returns the step's elements again. Batch before
        ``distribute`` and commit each step before the next ``next()``.

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
        cross_trainer_cache,
        acknowledge,
    )
    compression = _compression(compression)

    def apply(dataset: Dataset) -> DataServiceDataset:
        return DataServiceDataset(params, source=dataset, compression=compression)

    return apply


def register_dataset(
    service: Any, dataset: Dataset, compression: str | None = "AUTO", dataset_id: str | None = None
) -> str:
    """Registers ``dataset`` with the service's dispatcher and returns its id (registering the
    same dataset again returns the same id). See ``from_dataset_id``. An unreachable dispatcher
    is waited for (and the call tried again) for the dataset's
    ``options().experimental_distribute.service_timeout_ms`` (5 minutes when unset)."""
    if not isinstance(dataset, Dataset):
        raise InvalidArgumentError(f"register_dataset expects a Dataset, got {type(dataset)}")
    compression = _compression(compression)
    if dataset_id is not None and (not isinstance(dataset_id, str) or not dataset_id):
        raise InvalidArgumentError(f"dataset_id must be a non-empty string, got {dataset_id!r}")
    timeout_ms = dataset.options().experimental_distribute.service_timeout_ms
    return _register(
        _rpc.parse_service(service),
        dataset,
        compression,
        dataset_id,
        (timeout_ms or _DEFAULT_TIMEOUT_MS) / 1000,
    )


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
    cross_trainer_cache: CrossTrainerCache | None = None,
    acknowledge: str = "on_receipt",
) -> DataServiceDataset:
    """A dataset reading the registered dataset ``dataset_id`` from the service; the element
    spec is asked of the dispatcher when not given. The other arguments are ``distribute``'s,
    but for ``job_name``, which names a job of this dataset (as in TensorFlow: consumers of
    another dataset id that give the same name read a job of their own)."""
    params = _read_params(
        processing_mode,
        service,
        job_name,
        consumer_index,
        num_consumers,
        max_outstanding_requests,
        data_transfer_protocol,
        target_workers,
        cross_trainer_cache,
        acknowledge,
    )
    if not isinstance(dataset_id, str) or not dataset_id:
        raise InvalidArgumentError(f"dataset_id must be a non-empty string, got {dataset_id!r}")
    if params.job_name is not None:
        # As in TensorFlow, a name given here is the dataset's own: consumers of two datasets
        # that use one name read two jobs (``distribute`` shares a job by its name alone).
        params = dataclasses.replace(params, job_name=f"dataset_id={dataset_id}/{params.job_name}")
    reply, buffers = _bounded_call(
        _dispatcher(params.address),
        "GetElementSpec",
        GetElementSpecRequest(dataset_id).to_header(),
        _DEFAULT_TIMEOUT_MS / 1000,
        f"asking for the element spec of dataset {dataset_id}",
    )
    if element_spec is None:
        # The spec is data (``_net.specs``): a reply is never unpickled, so a dispatcher,
        # genuine or not, cannot run code here.
        if not buffers or not len(buffers[0]):
            raise InvalidArgumentError(
                f"the dispatcher has no element spec of dataset {dataset_id} that it can send "
                "as data (it was registered by an older feedline, or its spec holds more than "
                "tensor specs in tuples, lists, dicts and namedtuples); pass element_spec="
            )
        try:
            element_spec = decode_spec(buffers[0])
        except InvalidArgumentError as error:
            raise InvalidArgumentError(
                f"the element spec of dataset {dataset_id} from the dispatcher at "
                f"{params.address} is not a valid spec ({error}); pass element_spec="
            ) from None
    return DataServiceDataset(
        params,
        dataset_id=dataset_id,
        element_spec=element_spec,
        cardinality=ElementSpecReply.from_header(reply).cardinality,
    )


def _register(
    address: str,
    dataset: Dataset,
    compression: str | None,
    dataset_id: str | None,
    timeout_s: float = _DEFAULT_TIMEOUT_MS / 1000,
) -> str:
    structure.check_dense(
        dataset.element_spec,
        "the data service (distribute)",
        "map them to dense arrays before distribute (r.to_tensor(), s.to_dense(), or their "
        "component arrays: r.values and r.row_splits), or ragged_batch / sparse_batch after it",
    )
    try:  # before the dataset is pickled: it may cache its spec
        spec = encode_spec(dataset.element_spec)
    except InvalidArgumentError:
        spec = b""  # this consumer has its spec; from_dataset_id will need element_spec=
    try:
        plan = split_plan(dataset).to_json()
    except InvalidArgumentError:
        plan = None
    request = RegisterDatasetRequest(compression, dataset.cardinality(), plan, dataset_id)
    try:
        payload = cloudpickle.dumps(dataset)
    except Exception as error:
        raise InvalidArgumentError(
            f"the dataset cannot be sent to the service: pickling it failed with {error!r}; "
            "every function in the pipeline must be picklable by cloudpickle"
        ) from error
    dispatcher = _dispatcher(address)
    # Tried again if the dispatcher restarts meanwhile: the same dataset, the same id.
    reply, _ = _patiently(
        address,
        "registering the dataset",
        timeout_s,
        lambda timeout: dispatcher.upload(
            "RegisterDataset",
            request.to_header(),
            (payload, spec),
            timeout=timeout,
            wait_for_ready=True,
        ),
    )
    return RegisterDatasetReply.from_header(reply).dataset_id


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
            if (
                params.trainer_id is not None
                and params.mode == ShardingPolicy.OFF
                and cardinality != INFINITE_CARDINALITY
            ):
                raise InvalidArgumentError(
                    "cross_trainer_cache with processing_mode 'parallel_epochs' (OFF) needs an "
                    f"infinite dataset, as in TensorFlow; this one has cardinality "
                    f"{cardinality}. Add .repeat() before distribute, or read a finite epoch "
                    "with 'distributed_epoch', where every trainer gets every element once"
                )
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
        """Consumers of a named job split its data among themselves (and trainers of a
        cross-trainer job each read all of it): auto-sharding keeps off."""
        return self._params.job_name is not None

    def _registered_id(self, timeout_s: float) -> str:
        """The dataset's id at the dispatcher, registering it first if needed (called by an
        iterator that is joining, under ``_passes_lock``)."""
        if self._dataset_id is None:
            if self._source is None:
                raise FailedPreconditionError("a dataset read by id lost its id")
            self._dataset_id = _register(
                self._params.address, self._source, self._compression, None, timeout_s
            )
        return self._dataset_id

    def _forget_registration(self, dataset_id: str) -> bool:
        """Forgets ``dataset_id``, which the dispatcher no longer knows (it forgot a dataset
        nobody read, or restarted without its journal), so that the next join registers the
        dataset again; False if this dataset cannot be registered again (it was read by id)."""
        if self._source is None or self._dataset_id != dataset_id:
            return False
        self._dataset_id = None
        return True

    def _make_iterator(self, ctx: IteratorContext) -> _ServiceIterator:
        # The iteration counts only once its job is joined: a consumer that failed to join
        # (dispatcher unreachable, a refused job) joins the same job when it tries again.
        with self._passes_lock:
            iterator = _ServiceIterator(self, ctx, self._iterations)
            self._iterations += 1
        return iterator


class _ServiceIterator(DatasetIterator):
    """One job's elements. Single-threaded API. The reading happens in a ``_JobReader``, whose
    threads do not hold the iterator: an iterator dropped unclosed is collected, and closing it
    releases the job.

    Its state is the consumer's position in the job (``position``): per task, the elements
    ``next`` has returned. ``set_state`` releases the job joined so far and joins a new job of
    the same name and iteration whose tasks skip what the position counts, so that the elements
    after it come next (OFF and static sharding, and DYNAMIC with a fault-tolerant dispatcher,
    whose position is the splits and offsets returned; round robin raises
    ``FailedPreconditionError``). A saved position is the job's only if this consumer read the
    job alone: ``get_state`` raises ``FailedPreconditionError`` when another consumer joined it,
    except in an exactly-once job, where it returns this consumer's *share*
    (``feedline._cluster_shares``: what it returned). A share resumes only with every other
    consumer's, as a cluster's checkpoint restores them: the lead consumer resumes a job named
    after this one and the restore's token at their union, and the others join that job.
    """

    def __init__(self, dataset: DataServiceDataset, ctx: IteratorContext, iteration: int) -> None:
        super().__init__(dataset, ctx)
        timeout_ms = ctx.options.experimental_distribute.service_timeout_ms
        self._timeout_s = (timeout_ms or _DEFAULT_TIMEOUT_MS) / 1000
        self._iteration = iteration
        self._service_dataset = dataset
        self._reader = _JobReader(dataset, iteration, self._timeout_s)
        # (on commit) The elements of the step in progress went back to the job when the
        # dispatcher released this consumer: the step cannot commit (``_rejoin``).
        self._step_lost = 0

    def _next(self) -> Any:
        try:
            return self._reader.next()
        except ConsumerReleasedError:
            if not self._rejoin():
                raise
        return self._reader.next()

    def _rejoin(self) -> bool:
        """(``acknowledge="on_commit"``) The dispatcher released this consumer while it lived
        (it heard no heartbeat from it for ``client_timeout_ms``: the process was paused or cut
        off), and gave what it held and had not committed back to the job: the consumer joins
        the job again, as a new one. Whether it did (other consumers do not: their error
        stands)."""
        old = self._reader
        if not old.params.commits or self._closed:
            return False
        self._step_lost += old.uncommitted()
        old.release()
        self._reader = _JobReader(
            self._service_dataset, self._iteration, self._timeout_s, job_name=old.job_name
        )
        logger.warning(
            "the dispatcher at %s released consumer %d of job %r (it heard no heartbeat from it "
            "for its client_timeout_ms: this process was paused or cut off), and gave what it "
            "held and had not committed back to the job; it joined the job again as consumer "
            "%d%s",
            old.params.address,
            old.client_id,
            old.job_name,
            self._reader.client_id,
            f"; the step in progress (elements read: {self._step_lost}) went back with it and "
            "does not commit"
            if self._step_lost
            else "",
        )
        return True

    def _lost_step(self) -> ConsumerReleasedError:
        """The error ``commit`` raises for a step whose elements went back to the job; what
        the step read since the consumer joined again comes again first (``abort``), as the
        step does not commit."""
        count, self._step_lost = self._step_lost, 0
        self._reader.abort()
        return ConsumerReleasedError(
            f"the step is not committed: the dispatcher released this consumer while the step "
            f"ran (it heard no heartbeat from it for its client_timeout_ms) and what the step "
            f"read (elements: {count}) went back to the job, to be read again by this consumer "
            "or another. The iterator joined the job again: go on with the next step"
        )

    def _get_state(self) -> dict[str, Any]:
        reader = self._reader
        if reader.trainer is not None:
            return reader.trainer_position().to_state()
        state = reader.position(share=True).to_state()
        if reader.shared:  # other consumers returned the rest of the job's position
            state[cluster_shares.SHARE] = f"data service job {reader.job_name!r}"
        return state

    def _set_state(self, state: dict[str, Any]) -> None:
        params = self._reader.params
        if params.trainer_id is not None:  # a trainer rejoins its job where it was
            resume = TrainerPosition.from_state(state)
            if resume.trainer_id != params.trainer_id:
                raise InvalidArgumentError(
                    f"the state is the position of trainer {resume.trainer_id!r}, and this "
                    f"iterator reads as trainer {params.trainer_id!r}"
                )
            if self._closed:
                raise InvalidArgumentError("the iterator is closed: restore into a new iterator")
            self._reader.release()
            self._reader = _JobReader(
                self._service_dataset, self._iteration, self._timeout_s, resume
            )
            return
        check_checkpointable(int(params.mode), params.num_consumers, self._reader.exactly_once)
        job_name, position = self._restored_position(state)
        if self._closed:
            raise InvalidArgumentError("the iterator is closed: restore into a new iterator")
        self._reader.release()
        self._reader = _JobReader(
            self._service_dataset, self._iteration, self._timeout_s, position, job_name
        )

    def _restored_position(
        self, state: dict[str, Any]
    ) -> tuple[str | None, JobPosition | SplitPosition | None]:
        """The job to join and the position to resume it at, from a state: this consumer's
        own, or (``_cluster_shares``) every consumer's share of a job they shared, which the
        lead consumer resumes in a job of a new name and the others then join.

        Raises:
          FailedPreconditionError: ``state`` is one consumer's share, restored alone.
        """
        mode = int(self._reader.params.mode)
        if cluster_shares.SHARE in state:
            raise FailedPreconditionError(
                f"the state holds one consumer's share of the position of "
                f"{state[cluster_shares.SHARE]}, which other consumers read too: it resumes "
                "only with every consumer's share, as a MultiWorkerMirroredStrategy cluster's "
                "checkpoint of its distributed iterator restores it"
            )
        if not cluster_shares.is_gathered(state):
            return None, position_from_state(state, mode)
        shares = [position_from_state(_own(share), mode) for share in state[cluster_shares.SHARES]]
        if not all(isinstance(share, SplitPosition) for share in shares):
            raise InvalidArgumentError(f"shares of a job position of another mode: {state}")
        name = f"{self._service_dataset.job_name}@{state[cluster_shares.GROUP]}"
        if not state[cluster_shares.LEAD]:
            return name, None  # joins the job that the lead consumer resumed
        return name, SplitPosition.union(shares)  # type: ignore[arg-type]

    @property
    def acknowledges_on_commit(self) -> bool:
        """Whether elements count as consumed when ``commit`` says their step committed
        (``acknowledge="on_commit"``), rather than on receipt."""
        return self._reader.params.commits

    def commit(self, wait: bool = True) -> int:
        """The training step that used the elements ``next`` returned since the last commit
        committed (``acknowledge="on_commit"``): the dispatcher records them as consumed before
        this returns, and they count in the iterator's state; how many. With ``wait=False``
        the consumer's next heartbeat carries the acknowledgement (within ~0.1 s): a consumer
        killed before it went out gets those steps delivered again.

        Raises:
          FailedPreconditionError: the dataset was not distributed with
            ``acknowledge="on_commit"``.
          UnavailableError: the dispatcher did not answer within the service timeout; the step
            is not committed (call ``commit`` again, or ``abort``).
          ConsumerReleasedError: the dispatcher released this consumer while the step ran (it
            heard no heartbeat from it for ``client_timeout_ms``: the process was paused or cut
            off); the step's elements went back to the job and it is not committed. The
            iterator joined the job again: go on with the next step.
        """
        if self._step_lost:
            raise self._lost_step()
        try:
            return self._reader.commit(wait)
        except ConsumerReleasedError:
            if not self._rejoin():
                raise
        raise self._lost_step()

    def abort(self) -> int:
        """The current step is aborted (``acknowledge="on_commit"``): ``next`` returns the
        elements it returned since the last commit again, in order; how many (not those that
        went back to the job when the dispatcher released this consumer: ``commit``)."""
        self._step_lost = 0
        return self._reader.abort()

    def _close(self) -> None:
        self._reader.release()


def _own(share: dict[str, Any]) -> dict[str, Any]:
    """A consumer's share of a shared job's position, as a position of its own."""
    return {k: v for k, v in share.items() if k != cluster_shares.SHARE}
