"""The arguments of ``distribute`` and ``from_dataset_id`` that say how a consumer reads from
the service, validated into a ``_ReadParams``."""

from __future__ import annotations

import dataclasses
from typing import Any

from feedline._net import rpc as _rpc
from feedline.errors import InvalidArgumentError
from feedline.service.client.cross_trainer import trainer_id_of
from feedline.service.config import ShardingPolicy
from feedline.service.protocol import TARGET_WORKERS

_COMPRESSIONS = ("AUTO", None)
#: When a consumer acknowledges an element: as it receives it, or when its step commits.
ACKNOWLEDGE = ("on_receipt", "on_commit")


@dataclasses.dataclass(frozen=True)
class _ReadParams:
    """How a consumer reads from the service (validated by ``read_params``)."""

    mode: ShardingPolicy
    address: str
    job_name: str | None
    consumer_index: int | None
    num_consumers: int | None
    max_outstanding_requests: int | None
    target_workers: str
    # None: through shared memory with a worker on the same host, else gRPC (_shm);
    # "grpc": always gRPC.
    data_transfer_protocol: str | None = None
    # A trainer of a cross-trainer job (CrossTrainerCache): it reads every element.
    trainer_id: str | None = None
    # acknowledge="on_commit": elements count as consumed when the step that used them commits.
    commits: bool = False


def _read_params(
    processing_mode: Any,
    service: Any,
    job_name: Any,
    consumer_index: Any,
    num_consumers: Any,
    max_outstanding_requests: Any,
    data_transfer_protocol: Any,
    target_workers: Any,
    cross_trainer_cache: Any = None,
    acknowledge: Any = "on_receipt",
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
    if workers not in TARGET_WORKERS:
        raise InvalidArgumentError(
            f"target_workers must be one of {TARGET_WORKERS}, got {target_workers!r}"
        )
    trainer_id = trainer_id_of(cross_trainer_cache, job_name)
    if trainer_id is not None:
        if num_consumers is not None:
            raise InvalidArgumentError(
                "cross_trainer_cache cannot be combined with consumer_index/num_consumers: "
                "every trainer reads every element, round-robin consumers one each"
            )
        if mode not in (ShardingPolicy.OFF, ShardingPolicy.DYNAMIC):
            raise InvalidArgumentError(
                f"cross_trainer_cache needs processing_mode ShardingPolicy.OFF "
                f"('parallel_epochs') or DYNAMIC ('distributed_epoch'), got {mode.name}"
            )
    if acknowledge not in ACKNOWLEDGE:
        raise InvalidArgumentError(f"acknowledge must be one of {ACKNOWLEDGE}, got {acknowledge!r}")
    if acknowledge == "on_commit" and (
        mode != ShardingPolicy.DYNAMIC or num_consumers is not None or trainer_id is not None
    ):
        raise InvalidArgumentError(
            "acknowledge='on_commit' needs processing_mode 'distributed_epoch' (DYNAMIC) "
            f"without consumer_index/num_consumers or cross_trainer_cache, got {mode.name}"
        )
    return _ReadParams(
        mode,
        address,
        job_name,
        consumer_index,
        num_consumers,
        max_outstanding_requests,
        "ANY" if workers == "AUTO" else workers,
        data_transfer_protocol,
        trainer_id,
        acknowledge == "on_commit",
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _compression(compression: Any) -> str | None:
    """``distribute``'s ``compression`` as the service carries it: ``"AUTO"`` or None.
    TensorFlow's ``"SNAPPY"`` asks for compression: it is ``"AUTO"`` here (LZ4 where it pays)."""
    if compression == "SNAPPY":
        return "AUTO"
    if compression not in _COMPRESSIONS:
        raise InvalidArgumentError(
            f"compression must be 'AUTO', 'SNAPPY' or None, got {compression!r}"
        )
    return compression
