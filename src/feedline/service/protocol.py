"""What the data service's processes agree on: service names, incarnation ids, the workers of
this process, and the shapes of the messages they exchange.

The dispatcher (``dispatcher/``), the workers (``worker/``) and the consumers in a training
process (``client/``) never import one another's servers; they meet here. Every RPC is a frame
of ``feedline._net.wire`` whose header is a JSON object; the dataclasses below are those
headers, built by the side that sends and read (and checked) by the side that receives, so that
a field has one name and one type in one place.

Ids. A dispatcher draws a random *incarnation* at each start (kept across restarts by its
journal); every job, task and consumer id it makes is ``incarnation << INCARNATION_SHIFT |
counter``, so that workers and consumers recognise what belongs to an earlier life of a
restarted dispatcher (``incarnation_of``).
"""

from __future__ import annotations

import secrets
import threading

__all__ = [
    "DISPATCHER_SERVICE",
    "INCARNATION_SHIFT",
    "MAX_DATASET_BYTES",
    "WORKER_SERVICE",
    "incarnation_of",
    "local_worker_addresses",
    "new_incarnation",
    "register_local_worker",
    "unregister_local_worker",
]

#: The gRPC service of the dispatcher (``/feedline.service.Dispatcher/<Method>``).
DISPATCHER_SERVICE = "feedline.service.Dispatcher"
#: The gRPC service of a worker (``/feedline.service.Worker/GetElements``).
WORKER_SERVICE = "feedline.service.Worker"
#: The largest RegisterDataset request (the pickled dataset and its element spec). Every other
#: request is a small control message (``feedline._net.rpc.DEFAULT_MAX_REQUEST_BYTES``).
MAX_DATASET_BYTES = 256 << 20

#: Job, task and consumer ids are ``incarnation << INCARNATION_SHIFT | counter``.
INCARNATION_SHIFT = 32


def new_incarnation() -> int:
    """A random, non-zero dispatcher incarnation (31 bits: ids stay below 2**63)."""
    return secrets.randbits(31) | 1


def incarnation_of(some_id: int) -> int:
    """The incarnation of the dispatcher life that made the job, task or consumer ``some_id``."""
    return some_id >> INCARNATION_SHIFT


# -- the workers of this process ---------------------------------------------------------------
# A consumer with ``target_workers="LOCAL"`` reads only from workers running in its own process;
# a worker adds its address here when it serves and removes it when it stops.
_local_lock = threading.Lock()
_local_addresses: set[str] = set()


def local_worker_addresses() -> frozenset[str]:
    """The addresses of the workers running in this process (``target_workers="LOCAL"``)."""
    with _local_lock:
        return frozenset(_local_addresses)


def register_local_worker(address: str) -> None:
    """Marks ``address`` as a worker serving in this process."""
    with _local_lock:
        _local_addresses.add(address)


def unregister_local_worker(address: str) -> None:
    """Forgets ``address`` (a stopped worker); unknown addresses are ignored."""
    with _local_lock:
        _local_addresses.discard(address)


# -- messages to the dispatcher -----------------------------------------------------------------
# The requests of RegisterDataset, GetDatasetDef, GetElementSpec, GetOrCreateJob, ClientHeartbeat,
# ReleaseClient, WorkerHeartbeat and GetSplit, as the dispatcher reads them.


# -- messages to a worker -----------------------------------------------------------------------
# What a worker reads: the GetElements request of a consumer, and the dispatcher's replies to
# its WorkerHeartbeat and GetSplit (its task definitions among them).


# -- messages to a consumer ---------------------------------------------------------------------
# What a consumer reads: the dispatcher's replies to GetOrCreateJob and ClientHeartbeat (a job's
# view) and a worker's reply to GetElements.
