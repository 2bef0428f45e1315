"""Elements through shared memory when a consumer and a worker share a host.

Loopback gRPC moves about 1 GB/s, and a large element need not cross it when the consumer and
the worker run on the same host. The consumer then offers the worker an *arena*: a segment of
shared memory that the consumer creates (``memfd_create``). The worker writes a reply's element
buffers into the arena, and the ``GetElements`` reply, still sent over gRPC, carries only the
header. Across hosts, or whenever an offer does not hold, replies carry their buffers over
gRPC as before.

One fetch thread of a consumer and one worker make a *channel*:

1. The first replies travel over gRPC. Once one of them carried at least ``OFFER_BYTES`` of
   buffers, the consumer creates an arena: an anonymous shared-memory file (``memfd_create``,
   named ``feedline-shm-<pidns>-<pid>-<random>``, mode 0600, its pages allocated up front)
   sealed against shrinking and growing (``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``): a
   page for the nonce, then a ring with room for ``RING_REPLIES`` replies of the most bytes a
   reply may carry. From then on each request offers a free run of the ring: ``"shm":
   {"host", "name", "pid", "fd", "nonce", "offset", "size"}``.
2. The worker takes the offer only if ``host`` equals its own ``host_identity()`` (the
   kernel's boot id, the pid namespace, the user id), it can open the consumer's descriptor
   (``/proc/<pid>/fd/<fd>``, which the kernel allows only to processes that may inspect the
   consumer), the file opened is the memfd of that ``name``, a regular file owned by the
   worker's user and closed to every other user (mode 0600, as the consumer creates it: a
   file another user made or may open is refused), sealed against shrinking, and it begins
   with ``nonce``. It then maps the arena once and closes the descriptor. The seal is what
   makes the mapping safe: a file that shrinks under a mapping kills the process that touches
   the lost pages with SIGBUS, and no process, the consumer included, can shrink a sealed
   file (an unsealed one is refused: ``"arena not sealed"``).
3. A reply whose buffers fit in ``size`` bytes is copied into the arena in full (a plain
   memory copy, which releases the GIL); only then is the header sent, with ``"shm":
   {"name", "sizes"}``. A reply that does not fit (one element larger than the arena) goes
   over gRPC. A refused offer is answered over gRPC with ``"shm_refused": reason``, and the
   consumer stops offering on that channel; if the reason is ``"unknown"`` (the worker has
   dropped an arena it had used) it offers a new arena instead.
4. The elements the consumer hands on are read-only views of the ring, and a reply's place in
   the ring is offered again only once every element of it is gone (a ``weakref.finalize`` on
   the reply's region), so elements stay valid however long they are kept. A reply that would
   leave no free run for the next one is copied out of the ring at once instead (the consumer
   holds that many elements). As over gRPC, the elements of one reply share one buffer.
   (Copying every reply out cost about a quarter of the consumer's CPU time per 1 MB element,
   and up to a third of the throughput of ``benchmarks/data_service.py`` S1.)

Compression does not apply to replies written into an arena: they are copied from memory to
memory, and compressing them would only cost time.

Nothing is left behind: an arena has no name in any file system, and its memory is freed when
the last descriptor and mapping of it are gone, which the kernel does for a killed process. The
consumer closes its descriptor as soon as the worker has answered an offer of it (both sides
keep their mappings), when a request fails, and when the reader is released. A worker unmaps an
arena when the task whose replies it carried ends, when the worker stops, and when it has not
used the arena for ``IDLE_S`` seconds (checked whenever an offer comes).

No half element reaches a consumer: the worker sends the header only after every byte of the
reply is in the arena. A worker killed while writing sends nothing, the call fails as for any
lost worker, and the consumer drops that arena, so a late write into it cannot reach anything
that the consumer reads.

Turning it off: ``distribute(..., data_transfer_protocol="grpc")`` or
``from_dataset_id(..., data_transfer_protocol="grpc")`` on a consumer, or
``WorkerConfig(data_transfer_protocol="grpc")`` on a worker.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import logging
import mmap
import os
import re
import secrets
import stat
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from feedline._net.wire import Compressor, encode_frame
from feedline.errors import InvalidArgumentError

__all__ = ["ConsumerChannels", "Offer", "WorkerSegments", "host_identity"]

logger = logging.getLogger(__name__)

PREFIX = "feedline-shm-"
#: A reply must carry at least this many bytes of buffers before a channel offers an arena.
OFFER_BYTES = 64 << 10
#: An arena holds this many replies.
RING_REPLIES = 4
#: A worker unmaps an arena that it has not written for this long.
IDLE_S = 10.0
#: The nonce sits at the start of an arena; the data begins one page in.
_NONCE_BYTES = 16
DATA_OFFSET = mmap.PAGESIZE
_NAME_RE = re.compile(r"feedline-shm-([0-9]+)-([0-9]+)-[0-9a-f]{16}")
_NONCE_RE = re.compile(r"[0-9a-f]{32}")
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
# Refusal reasons: the consumer offers a new arena after "unknown" (if the worker had used the
# old one), and stops offering on the channel after any other.
UNKNOWN = "unknown"
#: The refusal of an arena that may shrink (a mapping of it would not be safe).
UNSEALED = "arena not sealed"
_SEALS = getattr(fcntl, "F_SEAL_SHRINK", 0) | getattr(fcntl, "F_SEAL_GROW", 0)
# A buffer of at least this many bytes is copied into an arena without the GIL.
_LARGE_COPY = 64 << 10


def host_identity() -> str | None:
    """Who may share memory with whom: the kernel's boot id, the pid namespace (a worker
    reaches an arena through the consumer's ``/proc/<pid>/fd``) and the user id; None where
    there is no boot id, no pid namespace to name, or no sealable shared memory."""
    if not hasattr(os, "memfd_create") or not _SEALS:
        return None
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    namespace = _pid_namespace()
    if not namespace:
        return None
    return f"{boot_id}/{namespace}/{os.getuid()}"


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def arena_descriptors() -> list[str]:
    """The names of the arenas this process holds a descriptor of (for tests: a consumer
    closes its own once the worker answered, a worker right after mapping)."""
    names = []
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target.startswith(f"/memfd:{PREFIX}"):
                    names.append(target[len("/memfd:") :].split(" ", 1)[0])
    return sorted(names)


# -- the consumer -----------------------------------------------------------------------------


class _Arena:
    """A segment that a consumer created and offers to one worker: a ring of ``RING_REPLIES``
    replies' room, each reply written where the consumer offers (a free run of
    ``reply_bytes``) and kept there while one of its elements lives (see ``take``).

    Raises:
      OSError: no shared memory can be made (none on this system, or not enough).
    """

    def __init__(self, reply_bytes: int) -> None:
        self.reply_bytes = reply_bytes
        self.size = RING_REPLIES * reply_bytes
        self.name = f"{PREFIX}{_pid_namespace()}-{os.getpid()}-{secrets.token_hex(8)}"
        self.used = False  # a reply came through it
        fd = os.memfd_create(self.name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.fchmod(fd, 0o600)
            # Allocates the pages now: a full tmpfs fails here, not as SIGBUS on a write.
            os.posix_fallocate(fd, 0, DATA_OFFSET + self.size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS | fcntl.F_SEAL_SEAL)
            self._map = mmap.mmap(fd, DATA_OFFSET + self.size, flags=_MAP_FLAGS)
        except BaseException:
            os.close(fd)
            raise
        #: The descriptor a worker opens the arena through (None once closed).
        self.fd: int | None = fd
        self._fd_lock = threading.Lock()
        self.nonce = secrets.token_bytes(_NONCE_BYTES)
        self._map[:_NONCE_BYTES] = self.nonce
        self._data = np.frombuffer(self._map, np.uint8, self.size, DATA_OFFSET)
        # The ring: places offered or kept, oldest first, as [start, end) (an offer holds
        # ``reply_bytes`` until its reply says how much it took); the starts of those whose
        # elements are all gone (appended by finalizers, from any thread, at any time, so
        # without a lock: they are taken in by the fetch thread, the arena's only user), and
        # of those given up (a reply that came over gRPC, or was copied out).
        self._kept: collections.deque[list[int]] = collections.deque()
        self._gone: collections.deque[int] = collections.deque()
        self._done: set[int] = set()
        self._out: set[int] = set()  # the starts of the offers not taken nor cancelled yet
        #: Replies handed on in place, and copied out because the ring was full (for tests).
        self.kept = self.copied = 0

    def offer(self, identity: str) -> tuple[dict[str, Any], int] | None:
        """The offer of a free run of ``reply_bytes`` and where it starts in the ring (hold
        on to it: ``take`` or ``cancel`` it), or None if the ring has none. Several offers
        may be out at once (requests in flight); each holds its place until then."""
        self._reclaim()
        start = self._free_run()
        if start is None:
            return None
        self._kept.append([start, start + self.reply_bytes])
        self._out.add(start)
        offer = {
            "host": identity,
            "name": self.name,
            "pid": os.getpid(),
            "fd": -1 if self.fd is None else self.fd,
            "nonce": self.nonce.hex(),
            "offset": DATA_OFFSET + start,
            "size": self.reply_bytes,
        }
        return offer, start

    def take(self, shm: Any, start: int) -> list[memoryview]:
        """The buffers of a reply written into the arena at the offer of ``start``:
        read-only views of the arena, which keep the reply's place in the ring until the last
        of them is gone, while the ring keeps room for another reply after it; else a copy
        (the ring is full of elements the consumer holds)."""
        sizes = shm.get("sizes") if isinstance(shm, dict) else None
        entry = self._offered(start)
        if (
            entry is None
            or not isinstance(sizes, list)
            or not all(type(s) is int and s >= 0 for s in sizes)
            or sum(sizes) > self.reply_bytes
            or shm.get("name") != self.name
        ):
            raise InvalidArgumentError(
                f"a reply through shared memory names arena {shm!r:.200}, but this consumer "
                f"offered {self.reply_bytes} bytes of {self.name} at {start}"
            )
        self._reclaim()
        total = sum(sizes)
        entry[1] = start + total
        if total and self._free_run() is not None:
            region = self._data[start : start + total]
            weakref.finalize(region, self._gone.append, start)
            self.kept += 1
        else:
            region = np.empty(total, np.uint8)
            np.copyto(region, self._data[start : start + total])
            self._done.add(start)
            self._reclaim()
            self.copied += 1
        region.flags.writeable = False  # as the views of a gRPC frame
        view = region.data  # read-only, as region is
        buffers = []
        position = 0
        for size in sizes:
            buffers.append(view[position : position + size])
            position += size
        return buffers

    def cancel(self, start: int) -> None:
        """The reply to the offer of ``start`` did not come through the arena."""
        if self._offered(start) is not None:
            self._done.add(start)
            self._reclaim()

    def _offered(self, start: int) -> list[int] | None:
        """The ring's entry of the offer of ``start``, which is taken or cancelled now (None
        if there is no such offer out)."""
        if start not in self._out:
            return None
        self._out.discard(start)
        for entry in self._kept:
            if entry[0] == start:
                return entry
        return None

    def _reclaim(self) -> None:
        """Frees the oldest and the newest places whose replies are done with (one between
        places still held is freed after them)."""
        while self._gone:
            self._done.add(self._gone.popleft())
        kept, done = self._kept, self._done
        while kept and kept[0][0] in done:
            done.discard(kept.popleft()[0])
        while kept and kept[-1][0] in done:  # the newest given up: its place is free again
            done.discard(kept.pop()[0])

    def _free_run(self) -> int | None:
        """Where a free run of ``reply_bytes`` begins, or None."""
        kept, need = self._kept, self.reply_bytes
        if not kept:
            return 0
        head, tail = kept[0][0], kept[-1][1]
        if kept[-1][0] >= head:  # not wrapped: free after the newest and before the oldest
            if self.size - tail >= need:
                return tail
            return 0 if head >= need else None
        return tail if head - tail >= need else None

    def close_descriptor(self) -> None:
        """Closes the descriptor a worker opens the arena through; the mappings stay until
        both sides drop them. Idempotent."""
        with self._fd_lock:  # the fetch thread and the reader's release may both close it
            fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        if getattr(self, "_fd_lock", None) is not None:
            self.close_descriptor()


@dataclasses.dataclass(frozen=True)
class Offer:
    """An offer out with a request: the arena and where in its ring (``ConsumerChannels``)."""

    arena: _Arena
    start: int


class _Channel:
    """One fetch thread's traffic with one worker."""

    def __init__(self) -> None:
        self.arena: _Arena | None = None
        self.off = False  # the worker refused: never offer again

    def drop(self) -> None:
        arena, self.arena = self.arena, None
        if arena is not None:
            arena.close_descriptor()


class ConsumerChannels:
    """The consumer's side: an arena per (fetch thread, worker), offered with each request.

    Called by the reader's fetch threads around each ``GetElements``: ``ask`` before it (the
    request, with the offer added), ``received`` after it (the reply's buffers: views of the
    arena, or copies, when the reply came through it), ``lost`` when the call failed.
    ``close`` when the reader is released. Thread-safe: each thread uses only its own channels.

    Args:
      enabled: offer arenas at all (False: ``data_transfer_protocol="grpc"``).
      reply_bytes: the most bytes one reply carries (the request's ``max_bytes``).
    """

    def __init__(self, enabled: bool, reply_bytes: int) -> None:
        self._identity = host_identity() if enabled else None
        self._reply_bytes = int(reply_bytes)
        self._lock = threading.Lock()
        self._channels: dict[tuple[int, str], _Channel] = {}
        self._closed = False

    def _channel(self, worker: str) -> _Channel | None:
        if self._identity is None:
            return None
        key = (threading.get_ident(), worker)
        with self._lock:
            channel = self._channels.get(key)
            if channel is None:
                channel = self._channels[key] = _Channel()
        return channel

    def ask(self, worker: str, request: dict[str, Any]) -> tuple[dict[str, Any], Offer | None]:
        """``request`` with this channel's offer, if it has an arena and room in it, and the
        offer (for ``received``; several may be out at once)."""
        channel = self._channel(worker)
        arena = None if channel is None else channel.arena
        if arena is None or self._closed or self._identity is None:
            return request, None
        made = arena.offer(self._identity)
        if made is None:
            return request, None
        offer, start = made
        return {**request, "shm": offer}, Offer(arena, start)

    def received(
        self,
        worker: str,
        header: dict[str, Any],
        buffers: list[memoryview],
        offer: Offer | None = None,
    ) -> list[memoryview]:
        """The buffers of a reply from ``worker`` to a request that carried ``offer`` (its
        ``header`` loses the keys of this module): those written into the arena, copied
        out, or ``buffers`` as they came. Replies are taken in the order of their requests."""
        shm = header.pop("shm", None)
        refused = header.pop("shm_refused", None)
        channel = self._channel(worker)
        if shm is not None:
            if offer is None:
                raise InvalidArgumentError(
                    f"worker {worker} answered through shared memory, which was not offered"
                )
            # The offer's arena, even where the channel has dropped it since (its mapping
            # lives as long as something refers to it).
            buffers = offer.arena.take(shm, offer.start)
            offer.arena.used = True
            offer.arena.close_descriptor()  # the worker has it mapped: it opens it no more
            return buffers
        if offer is not None:
            offer.arena.cancel(offer.start)
        if channel is None:
            return buffers
        arena = channel.arena
        if refused is not None:
            if offer is None or arena is offer.arena:  # not about an arena dropped since
                renew = refused == UNKNOWN and arena is not None and arena.used
                channel.drop()
                channel.off = not renew
                logger.debug("worker %s refused shared memory (%s)", worker, refused)
        elif arena is None and not channel.off and sum(b.nbytes for b in buffers) >= OFFER_BYTES:
            self._new_arena(channel)
        return buffers

    def lost(self, worker: str) -> None:
        """A call to ``worker`` failed: its arena is dropped (a late write from that call
        must not reach a later reply); a new one is offered after the next large reply."""
        channel = self._channel(worker)
        if channel is not None:
            channel.drop()

    def close(self) -> None:
        """Closes every arena's descriptor (the mappings go with the reader); offers no
        more."""
        with self._lock:
            self._closed = True
            # The elements handed on keep their arena's mapping.
            for channel in self._channels.values():
                channel.drop()

    def _new_arena(self, channel: _Channel) -> None:
        """Gives ``channel`` an arena, unless the consumer closed (before or meanwhile)."""
        with self._lock:
            if self._closed:
                return
        try:
            arena = _Arena(self._reply_bytes)
        except OSError as error:
            channel.off = True
            logger.info("no shared memory for replies (%s); reading over gRPC", error)
            return
        with self._lock:  # ``close`` drops the channels' arenas under this lock
            if not self._closed:
                channel.arena = arena
                return
        arena.close_descriptor()


# -- the worker -------------------------------------------------------------------------------


class _Mapped:
    """An arena a worker has mapped (see the module's docstring, step 2, for the checks).

    Raises:
      OSError: the descriptor cannot be opened, or is no regular file of an arena's size.
      _Refused: the file is not the arena offered, not the worker's user's alone, or not
        sealed against shrinking (``refusal`` says why).
    """

    def __init__(self, name: str, pid: int, fd: int, nonce: bytes) -> None:
        # Not O_NOFOLLOW: /proc/<pid>/fd/<fd> is the kernel's link to the open file itself.
        fd = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            # The descriptor number may have been closed and reused for another file.
            if os.readlink(f"/proc/self/fd/{fd}") != f"/memfd:{name} (deleted)":
                raise _Refused(UNKNOWN)
            facts = os.fstat(fd)
            if not stat.S_ISREG(facts.st_mode):
                raise OSError(f"{name} is not a regular file")
            # The consumer offers it as this worker's user (its host identity says so), and
            # creates it 0600: a file of another user, or one that others may open, is not an
            # arena of a consumer of this user.
            if facts.st_uid != os.geteuid():
                raise _Refused(f"arena owned by another user (uid {facts.st_uid})")
            if facts.st_mode & 0o077:
                raise _Refused("arena open to other users")
            # Sealed, it can never shrink under the mapping (seals are never removed).
            if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS != _SEALS:
                raise _Refused(UNSEALED)
            if facts.st_size < DATA_OFFSET:
                raise OSError(
                    f"{name} holds {facts.st_size} bytes, less than an arena's first page"
                )
            self.matches = os.pread(fd, _NONCE_BYTES, 0) == nonce
            self._map: mmap.mmap | None = (
                mmap.mmap(fd, facts.st_size, flags=mmap.MAP_SHARED) if self.matches else None
            )
        finally:
            os.close(fd)
        self.name = name
        #: The arena's size: nothing is ever written past it.
        self.size = facts.st_size
        self.busy = 0
        self.used_at = time.monotonic()
        self.task: int | None = None  # the task whose replies it carries

    def write(self, offset: int, size: int, buffers: Sequence[Any]) -> list[int] | None:
        """Copies ``buffers`` back to back to ``offset``; their sizes, or None if they do not
        fit in ``size`` bytes at ``offset``. The copies release the GIL."""
        arena = self._map
        assert arena is not None  # unmapped only when not busy
        if offset < DATA_OFFSET or size < 0 or offset + size > self.size:
            return None
        views = [memoryview(buffer) for buffer in buffers]
        sizes = [view.nbytes for view in views]
        total = sum(sizes)
        if total > size:
            return None
        if total:
            target = np.frombuffer(arena, np.uint8, total, offset)
            position = offset
            for view, count in zip(views, sizes, strict=True):
                if count >= _LARGE_COPY:  # NumPy copies without the GIL
                    start = position - offset
                    target[start : start + count] = np.frombuffer(view.cast("B"), np.uint8)
                elif count:  # cheaper per buffer, under the GIL
                    arena[position : position + count] = view.cast("B")
                position += count
            del target
        return sizes

    def close(self) -> None:
        """Unmaps the arena (at once, or when the last view of a write is gone)."""
        arena, self._map = self._map, None
        if arena is not None:
            with contextlib.suppress(BufferError):
                arena.close()


class _Refused(Exception):
    """An offered arena that the worker does not take; the message is the refusal."""


class WorkerSegments:
    """The worker's side: the arenas its consumers offered, mapped once each.

    Args:
      enabled: take offers at all (False: ``WorkerConfig(data_transfer_protocol="grpc")``).
    """

    def __init__(self, enabled: bool) -> None:
        self._identity = host_identity() if enabled else None
        self._namespace = _pid_namespace()  # a stat of /proc: once, not per reply
        self._enabled = enabled
        self._lock = threading.Lock()
        self._mapped: dict[str, _Mapped] = {}

    def reply(
        self,
        offer: Any,
        task_id: int,
        header: dict[str, Any],
        buffers: Sequence[Any],
        compressor: Compressor | None,
    ) -> bytes:
        """The frame of a reply of task ``task_id`` with ``header`` (passed through) and
        ``buffers``: through the arena of the request's ``offer`` (its ``shm`` field, None
        without one) when it can, else over gRPC (``compressor`` applies)."""
        if offer is None:
            return encode_frame(header, buffers, compressor=compressor)
        mapped, refusal = self._acquire(offer)
        if mapped is None:
            return encode_frame({**header, "shm_refused": refusal}, buffers, compressor=compressor)
        try:
            sizes = mapped.write(offer["offset"], offer["size"], buffers)
        finally:
            with self._lock:
                mapped.busy -= 1
                mapped.used_at = time.monotonic()
                mapped.task = task_id
        if sizes is None:
            return encode_frame(header, buffers, compressor=compressor)
        return encode_frame({**header, "shm": {"name": offer["name"], "sizes": sizes}})

    def _acquire(self, offer: Any) -> tuple[_Mapped | None, str]:
        """The mapped arena of ``offer``, marked busy, or None and why not."""
        if not self._enabled:
            return None, "off"
        if self._identity is None or not isinstance(offer, dict):
            return None, "no shared memory here"
        if offer.get("host") != self._identity:
            return None, "another host"
        name, nonce = offer.get("name"), offer.get("nonce")
        offset, size = offer.get("offset"), offer.get("size")
        pid, fd = offer.get("pid"), offer.get("fd")
        named = _NAME_RE.fullmatch(name) if isinstance(name, str) else None
        if (
            named is None
            or not isinstance(nonce, str)
            or not _NONCE_RE.fullmatch(nonce)
            or type(offset) is not int
            or type(size) is not int
            or size < 0
            or type(pid) is not int
            or type(fd) is not int
            or int(named.group(2)) != pid
        ):
            return None, "malformed offer"
        if int(named.group(1)) != self._namespace:
            return None, "another pid namespace"
        name = named.group(0)
        self._forget_idle()
        with self._lock:
            mapped = self._mapped.get(name)
            if mapped is not None:
                mapped.busy += 1
                return mapped, ""
        if fd < 0:  # the consumer no longer holds it: this worker had it and dropped it
            return None, UNKNOWN
        try:
            mapped = _Mapped(name, pid, fd, bytes.fromhex(nonce))
        except FileNotFoundError:
            return None, UNKNOWN
        except _Refused as refusal:
            return None, str(refusal)
        except (OSError, ValueError) as error:
            return None, f"cannot map the arena: {error}"
        if not mapped.matches:
            mapped.close()
            return None, "nonce differs"
        with self._lock:
            known = self._mapped.setdefault(name, mapped)
            known.busy += 1
        if known is not mapped:
            mapped.close()
        return known, ""

    def _forget_idle(self) -> None:
        now = time.monotonic()
        with self._lock:
            idle = [
                name
                for name, mapped in self._mapped.items()
                if not mapped.busy and now - mapped.used_at > IDLE_S
            ]
            dropped = [self._mapped.pop(name) for name in idle]
        for mapped in dropped:
            mapped.close()

    def forget_task(self, task_id: int) -> None:
        """Closes the arenas that carried replies of task ``task_id`` (it ended)."""
        with self._lock:
            names = [name for name, m in self._mapped.items() if m.task == task_id]
            dropped = [self._mapped.pop(name) for name in names]
        for mapped in dropped:
            if not mapped.busy:
                mapped.close()

    def mapped(self) -> int:
        """How many arenas are mapped (for tests)."""
        with self._lock:
            return len(self._mapped)

    def close(self) -> None:
        """Unmaps every arena not in use (one in use is unmapped once its reply is written
        and nothing refers to it)."""
        with self._lock:
            mapped, self._mapped = list(self._mapped.values()), {}
            self._enabled = False
        for arena in mapped:
            if not arena.busy:
                arena.close()
