"""``distributed_save``: the service's workers write a dataset to a snapshot directory.

The client registers the dataset and asks the dispatcher to save it (``Snapshot``); the call
returns once the dispatcher has recorded the save, as TensorFlow's does, while the workers
write it (``dispatcher.snapshots``, ``worker.snapshot_writer``). ``Dataset.load(path)`` reads
the snapshot once it is finished; ``Dataset.load(path, wait=True)`` reads it while it is
being written.
"""

from __future__ import annotations

import os

from feedline._net import rpc as _rpc
from feedline.data.dataset import Dataset
from feedline.data.ops._fingerprint import fingerprint
from feedline.data.ops._snapshot_format import resolve_codec, spec_to_json
from feedline.errors import InvalidArgumentError
from feedline.service.client.channels import _bounded_call, _dispatcher
from feedline.service.client.dataset import _DEFAULT_TIMEOUT_MS, register_dataset
from feedline.service.protocol import SnapshotRequest

__all__ = ["distributed_save"]


def distributed_save(
    dataset: Dataset,
    path: str | os.PathLike[str],
    data_service_address: str,
    compression: str | None = "AUTO",
) -> None:
    """Saves ``dataset`` to ``path`` with the data service's workers
    (``tf.data.experimental.distributed_save``).

    The dispatcher cuts the dataset in streams (one per split of its source, or one where the
    source does not split), each written by one worker as checksummed chunks; a worker that
    dies, a dispatcher that restarts on its journal, or a worker that joins halfway leaves a
    snapshot that holds every element once. Returns as soon as the dispatcher accepted the
    save; ``Dataset.load(path, wait=True)`` reads the elements as they are written and ends
    with the save, ``Dataset.load(path)`` reads the finished snapshot.

    Example::

        distributed_save(dataset, "s3://bucket/snapshot", "localhost:5050")
        for element in Dataset.load("s3://bucket/snapshot", wait=True):
            ...

    Args:
      dataset: the dataset; its pipeline (with a splittable source: ``range``,
        ``from_tensor_slices``, files) must yield the same elements each time it runs.
      path: the snapshot's directory, a local path or a URL (``s3://``, ``gs://``, ...) that
        the dispatcher and every worker can write.
      data_service_address: the dispatcher's ``host:port`` (``grpc://host:port`` also works).
      compression: ``"AUTO"`` (LZ4), ``"GZIP"``, ``"LZ4"``, ``"SNAPPY"``, or None.

    Raises:
      AlreadyExistsError: ``path`` holds a finished snapshot.
      InvalidArgumentError: ``path`` holds an unfinished save of another dataset, or an
        argument is of the wrong kind. An unfinished save of the same dataset is resumed.
      UnavailableError: the dispatcher could not be reached.
    """
    if not isinstance(dataset, Dataset):
        raise InvalidArgumentError(
            f"distributed_save expects a Dataset, got {type(dataset).__name__}"
        )
    if not isinstance(data_service_address, str) or not data_service_address:
        raise InvalidArgumentError(
            "distributed_save: data_service_address must be the dispatcher's 'host:port', got "
            f"{data_service_address!r}"
        )
    path = os.fspath(path)
    codec = resolve_codec(compression, "distributed_save", allow_auto=True)
    address = _rpc.parse_service(data_service_address)
    dataset_id = register_dataset(address, dataset)
    request = SnapshotRequest(
        path,
        dataset_id,
        f"{int(fingerprint(dataset)):016x}",
        codec,
        spec_to_json(dataset.element_spec),
    )
    timeout_ms = dataset.options().experimental_distribute.service_timeout_ms
    _bounded_call(
        _dispatcher(address),
        "Snapshot",
        request.to_header(),
        (timeout_ms or _DEFAULT_TIMEOUT_MS) / 1000,
        f"starting the distributed_save to {path}",
    )
