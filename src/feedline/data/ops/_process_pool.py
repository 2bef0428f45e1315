"""Worker processes for ``map(..., use_processes=True)``: Python functions that hold the GIL.

``ProcessPool(fn, num_workers)`` is what one parallel-map iterator uses: ``submit(elements)``
returns a ``Future`` of ``(outcomes, seconds)``, exactly what ``_functions.apply_chunk``
returns, and ``shutdown`` releases the workers. Underneath:

* Workers are spawned (``multiprocessing.get_context("spawn")``), never forked, so they are safe
  next to threads and CUDA. The function is pickled with cloudpickle once, before any process
  starts; a function that does not pickle is a ``TypeError`` that names it.
* Every worker reads chunks from its own task pipe and writes results to its own result pipe, in
  order. At most ``_DEPTH`` chunks are in flight per worker (so that the next chunk is waiting
  when one finishes); the rest wait in the parent, in submission order.
* A chunk whose elements share structure, dtypes and shapes travels as columns, one stacked
  array per leaf (``_pack``), in both directions: pickling one array costs far less than pickling
  many small ones. Messages are pickled with protocol 5. Array buffers of at least
  ``_SHM_MIN_BYTES`` are written to one shared-memory segment per message
  (``multiprocessing.shared_memory``) instead of being copied through the pipe, as is any message
  larger than ``_INLINE_MAX``; small ones are pickled inline. So every pipe message is small, and
  sends never wait on a busy reader. A segment is named after its chunk, so that the parent can
  remove it if the worker that made it dies.
* One daemon thread per set of workers reads results, resolves futures and watches each worker's
  sentinel: a worker that dies (killed, segfault, ``os._exit``) fails the chunks it held with a
  ``WorkerDiedError`` (an ``UnavailableError``) that names its exit code, within ``_POLL_SECONDS``.
  Every wait in the parent has a timeout.
* An exception raised by the function reaches the consumer as the original exception type, with
  the worker's traceback text attached as a note (an exception that cannot be pickled becomes a
  ``RuntimeError`` naming the original type).
* Spawning costs about half a second, so released workers are kept for reuse by the next iterator of
  the same function (same cloudpickle bytes) and worker count, at most ``_MAX_IDLE_SETS`` sets
  and ``_IDLE_SECONDS`` each. Chunks left over from the previous iterator are dropped when they
  come back. A consequence to know: state that the function keeps inside a worker (a cache, a
  counter) persists from one iterator to the next, as it does between chunks. Everything is
  stopped at interpreter exit, and a forked child never reuses its parent's workers.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import hashlib
import itertools
import multiprocessing
import os
import secrets
import selectors
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from feedline.data.ops._functions import UserFunction, function_name
from feedline.data.ops._process_wire import (
    _STOP_FRAME,
    _decode,
    _discard_frame,
    _discard_segment,
    _encode,
    _load_error,
    _pack,
    _unpack,
    _worker_main,
)
from feedline.errors import InvalidArgumentError, UnavailableError, WorkerDiedError

__all__ = ["ProcessPool", "WorkerDiedError", "shutdown_all"]

# Chunks in flight per worker: the one it maps and the one waiting in its pipe.
_DEPTH = 2
# The longest that the I/O thread waits before it looks at the workers' health again.
_POLL_SECONDS = 0.1
# How long stopping workers waits for them to exit before SIGTERM, then before SIGKILL.
_STOP_SECONDS = 1.0
# Released worker sets kept for reuse, and for how long.
_MAX_IDLE_SETS = 2
_IDLE_SECONDS = 60.0


# -- the parent side ----------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class _Chunk:
    chunk_id: int
    size: int
    future: Future
    owner: int
    frame: bytes | None


@dataclasses.dataclass(eq=False)
class _Worker:
    index: int
    process: Any
    tasks: Connection
    results: Connection
    in_flight: collections.deque[_Chunk] = dataclasses.field(default_factory=collections.deque)
    usable: bool = True
    watched: bool = True


def _signal_name(exitcode: int | None) -> str:
    if exitcode is None or exitcode >= 0:
        return ""
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


_HINTS = {
    "SIGKILL": "it was killed (by a user, or by the kernel's out-of-memory killer)",
    "SIGSEGV": "the function crashed the interpreter (a fault in native code)",
    "SIGBUS": "shared memory (/dev/shm) may be full: large results travel through it",
    "SIGTERM": "it was terminated by another process",
}


def _death_message(
    description: str, pid: int | None, exitcode: int | None, size: int, held: bool
) -> str:
    name = _signal_name(exitcode)
    how = f"exit code {exitcode}" + (f" ({name})" if name else "")
    hint = _HINTS.get(name, "the function exited the process or the worker failed")
    what = (
        f"while it held a chunk of {size} elements, which are lost"
        if held
        else f"and a chunk of {size} elements queued for its worker set is dropped with it"
    )
    return (
        f"{description}: worker process {pid} died with {how} {what}; {hint}. Workers are not "
        "restarted: make a new iterator to start again, or map on threads (use_processes=False)."
    )


class _WorkerSet:
    """``num_workers`` spawned processes running one function, and the thread that reads them."""

    def __init__(
        self, key: tuple[bytes, int], payload: bytes, num_workers: int, name: str, owner: int
    ) -> None:
        self.key = key
        self.description = name
        self.pid = os.getpid()
        self._prefix = f"fl{secrets.token_hex(4)}_"
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._queue: collections.deque[_Chunk] = collections.deque()
        self._owner: int | None = owner
        self._released_at = time.monotonic()
        # Set once the set cannot run chunks: makes the error for a chunk of a given size.
        self._broken: Callable[[int], BaseException] | None = None
        self._closing = False
        self._selector = selectors.DefaultSelector()
        self.workers: list[_Worker] = []
        context = multiprocessing.get_context("spawn")
        try:
            for index in range(num_workers):
                task_reader, task_writer = context.Pipe(duplex=False)
                result_reader, result_writer = context.Pipe(duplex=False)
                process = context.Process(
                    target=_worker_main,
                    args=(payload, task_reader, result_writer, self._prefix),
                    name=f"feedline-map-worker-{index}",
                    daemon=True,
                )
                process.start()
                task_reader.close()
                result_writer.close()
                worker = _Worker(index, process, task_writer, result_reader)
                self.workers.append(worker)
                self._selector.register(result_reader, selectors.EVENT_READ, (worker, True))
                self._selector.register(process.sentinel, selectors.EVENT_READ, (worker, False))
        except BaseException:
            for worker in self.workers:
                worker.process.kill()
            raise
        self._last_check = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, name="feedline-map-processes", daemon=True
        )
        with _CACHE_LOCK:
            _LIVE.add(self)
        self._thread.start()

    # -- used by ProcessPool handles (consumer threads) --------------------------------------
    def claim(self, owner: int) -> bool:
        """Makes ``owner`` the user of this set if it is idle and healthy."""
        with self._lock:
            healthy = all(w.usable and w.process.is_alive() for w in self.workers)
            if self._owner is not None or self._closing or self._broken or not healthy:
                return False
            self._owner = owner
            return True

    def submit(self, owner: int, elements: list[Any]) -> Future:
        future: Future = Future()
        chunk_id = next(self._ids)
        try:
            frame = _encode(("task", chunk_id, _pack(elements)), f"{self._prefix}i{chunk_id}")
        except Exception as error:
            error.add_note(
                f"while sending a chunk of {len(elements)} elements to the worker processes of "
                f"{self.description}; elements must pickle"
            )
            future.set_exception(error)
            return future
        chunk = _Chunk(chunk_id, len(elements), future, owner, frame)
        with self._lock:
            failure = self._failure(len(elements))
            if failure is None:
                self._queue.append(chunk)
                self._dispatch()
        if failure is not None:
            _discard_frame(frame)
            future.set_exception(failure)
        return future

    def release(self, owner: int, cancel: bool, wait: bool) -> None:
        """Ends ``owner``'s use of the set, cancelling its chunks if ``cancel``; then caches it."""
        with self._lock:
            if self._owner == owner:
                self._owner = None
            self._released_at = time.monotonic()
            dropped: list[_Chunk] = []
            if cancel:
                dropped = [c for c in self._queue if c.owner == owner]
                self._queue = collections.deque(c for c in self._queue if c.owner != owner)
                dropped += [c for w in self.workers for c in w.in_flight if c.owner == owner]
            reusable = self._broken is None and not self._closing
        for chunk in dropped:
            chunk.future.cancel()
            if chunk.frame is not None:
                _discard_frame(chunk.frame)
        if wait:
            deadline = time.monotonic() + _IDLE_SECONDS
            while self._busy_for(owner) and time.monotonic() < deadline and self._thread.is_alive():
                time.sleep(0.005)
        if reusable and self.pid == os.getpid():
            _park(self)
        else:
            self.close(wait=False)

    def close(self, wait: bool) -> None:
        """Stops the workers (SIGTERM, then SIGKILL for stragglers) and fails open futures."""
        with self._lock:
            self._closing = True
        _forget(self)
        if wait and self._thread is not threading.current_thread():
            self._thread.join(timeout=3 * _STOP_SECONDS + 2 * _POLL_SECONDS)

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self.workers]

    # -- helpers that expect the lock held ------------------------------------------------------
    def _failure(self, size: int) -> BaseException | None:
        if self._broken is not None:
            return self._broken(size)
        if self._closing:
            return UnavailableError(f"{self.description}: the worker processes were shut down")
        return None

    def _dispatch(self) -> None:
        """Sends queued chunks to workers with room, fewest chunks in flight first."""
        while self._queue:
            worker = min(
                (w for w in self.workers if w.usable and len(w.in_flight) < _DEPTH),
                key=lambda w: len(w.in_flight),
                default=None,
            )
            if worker is None:
                return
            chunk = self._queue.popleft()
            worker.in_flight.append(chunk)
            frame, chunk.frame = chunk.frame, None
            assert frame is not None, "a chunk is queued, and sent, once"
            try:
                worker.tasks.send_bytes(frame)  # small: never waits on the worker
            except OSError:
                worker.usable = False  # it died; its sentinel reports it with the exit code
                _discard_frame(frame)

    def _busy_for(self, owner: int) -> bool:
        with self._lock:
            return any(c.owner == owner for w in self.workers for c in w.in_flight)

    # -- the I/O thread -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closing:
                for key, _ in self._selector.select(timeout=_POLL_SECONDS):
                    worker, is_results = key.data
                    if is_results:
                        self._read(worker)
                    else:
                        self._lost(worker)
                self._housekeeping()
        except BaseException as error:  # a bug here must not leave a consumer waiting forever
            with self._lock:
                self._closing = True
            _forget(self)
            self._stop_workers(error)
            raise
        self._stop_workers(None)

    def _read(self, worker: _Worker) -> None:
        try:
            frame = worker.results.recv_bytes()
        except (EOFError, OSError):
            self._lost(worker)
            return
        self._deliver(worker, frame)

    def _deliver(self, worker: _Worker, frame: bytes) -> None:
        try:
            message = _decode(frame)
        except Exception as error:
            error.add_note(f"while reading a result of {self.description} from a worker process")
            message = ("chunk_error", None, error)
        kind = message[0]
        if kind == "init_error":
            self._init_failed(worker, _load_error(message[2]))
            return
        with self._lock:
            chunk = worker.in_flight.popleft() if worker.in_flight else None
            self._dispatch()
        if chunk is None:
            return
        try:
            if kind == "result":
                _, _, (form, payload), seconds = message
                if form == "values":
                    outcomes = [(True, value) for value in _unpack(payload)]
                else:
                    outcomes = [(ok, value if ok else _load_error(value)) for ok, value in payload]
                chunk.future.set_result((outcomes, seconds))
            else:
                failure = message[2]
                chunk.future.set_exception(
                    failure if isinstance(failure, BaseException) else _load_error(failure)
                )
        except InvalidStateError:
            return  # cancelled by its owner's shutdown: the result is dropped

    def _init_failed(self, worker: _Worker, error: BaseException) -> None:
        error.add_note(
            f"while loading the function of {self.description} in a worker process; with "
            "use_processes=True the function must load in a fresh interpreter (spawn), so "
            "define it in an importable module or make it picklable by value"
        )
        with self._lock:
            worker.usable = False
            self._broken = self._broken or (lambda size: error)
            lost = list(worker.in_flight) + list(self._queue)
            worker.in_flight.clear()
            self._queue.clear()
        for chunk in lost:
            if chunk.frame is not None:
                _discard_frame(chunk.frame)
            _fail(chunk.future, error)

    def _lost(self, worker: _Worker) -> None:
        """A worker's pipe closed or its process ended: reads what it sent, fails the rest."""
        if not worker.watched:
            return
        while True:
            try:
                if not worker.results.poll(0):
                    break
                frame = worker.results.recv_bytes()
            except (EOFError, OSError):
                break
            self._deliver(worker, frame)
        worker.watched = False
        self._selector.unregister(worker.results)
        self._selector.unregister(worker.process.sentinel)
        worker.process.join(timeout=_STOP_SECONDS)
        pid, exitcode = worker.process.pid, worker.process.exitcode
        description = self.description

        def died(size: int, held: bool = False) -> WorkerDiedError:
            message = _death_message(description, pid, exitcode, size, held)
            return WorkerDiedError(message, pid, exitcode)

        with self._lock:
            worker.usable = False
            if self._closing:
                return  # _stop_workers fails what is left
            lost = list(worker.in_flight)
            worker.in_flight.clear()
            self._broken = self._broken or died
            queued = list(self._queue)
            self._queue.clear()
        for chunk in lost:
            for tag in "ire":
                _discard_segment(f"{self._prefix}{tag}{chunk.chunk_id}")
            _fail(chunk.future, died(chunk.size, held=True))
        for chunk in queued:
            if chunk.frame is not None:
                _discard_frame(chunk.frame)
            _fail(chunk.future, self._broken(chunk.size))

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now - self._last_check < 0.5:
            return
        self._last_check = now
        for worker in self.workers:
            if worker.watched and not worker.process.is_alive():
                self._lost(worker)
        with self._lock:
            idle = self._owner is None and now - self._released_at > _IDLE_SECONDS
        if idle and _unpark(self):
            self.close(wait=False)

    def _stop_workers(self, error: BaseException | None) -> None:
        """Asks every worker to stop, then terminates and kills those that do not."""
        for worker in self.workers:
            try:
                worker.tasks.send_bytes(_STOP_FRAME)
            except OSError:
                continue
        deadline = time.monotonic() + _STOP_SECONDS
        for worker in self.workers:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
        for action in ("terminate", "kill"):
            stragglers = [w for w in self.workers if w.process.is_alive()]
            for worker in stragglers:
                getattr(worker.process, action)()
            for worker in stragglers:
                worker.process.join(timeout=_STOP_SECONDS / 2)
        for worker in self.workers:
            # Results that were never read still own shared-memory segments.
            while True:
                try:
                    if not worker.results.poll(0):
                        break
                    _discard_frame(worker.results.recv_bytes())
                except (EOFError, OSError):
                    break
        with self._lock:
            left = [c for w in self.workers for c in w.in_flight] + list(self._queue)
            for worker in self.workers:
                worker.in_flight.clear()
                worker.usable = False
            self._queue.clear()
        for chunk in left:
            if chunk.frame is not None:
                _discard_frame(chunk.frame)
            for tag in "ire":
                _discard_segment(f"{self._prefix}{tag}{chunk.chunk_id}")
            failure = UnavailableError(
                f"{self.description}: the worker processes were shut down before this chunk of "
                f"{chunk.size} elements came back"
            )
            if error is not None:
                failure.__cause__ = error
            _fail(chunk.future, failure)
        for worker in self.workers:
            worker.tasks.close()
            worker.results.close()
        self._selector.close()


def _fail(future: Future, error: BaseException | None) -> None:
    try:
        future.set_exception(error)
    except InvalidStateError:
        return


# -- the cache of released worker sets ------------------------------------------------------------

_CACHE_LOCK = threading.Lock()
_PARKED: list[_WorkerSet] = []  # released, oldest first
_LIVE: set[_WorkerSet] = set()
_OWNERS = itertools.count(1)


def _acquire(key: tuple[bytes, int], owner: int) -> _WorkerSet | None:
    with _CACHE_LOCK:
        for workers in reversed(_PARKED):
            if workers.key == key and workers.pid == os.getpid() and workers.claim(owner):
                _PARKED.remove(workers)
                return workers
    return None


def _park(workers: _WorkerSet) -> None:
    with _CACHE_LOCK:
        if workers not in _LIVE:
            return
        _PARKED.append(workers)
        evicted = _PARKED[:-_MAX_IDLE_SETS]
        del _PARKED[:-_MAX_IDLE_SETS]
    for old in evicted:
        old.close(wait=False)


def _unpark(workers: _WorkerSet) -> bool:
    """Takes ``workers`` out of the cache; False if someone claimed it meanwhile."""
    with _CACHE_LOCK:
        if workers in _PARKED:
            _PARKED.remove(workers)
            return True
    return False


def _forget(workers: _WorkerSet) -> None:
    with _CACHE_LOCK:
        _LIVE.discard(workers)
        if workers in _PARKED:
            _PARKED.remove(workers)


def shutdown_all() -> None:
    """Stops every worker process of this interpreter (run at exit)."""
    with _CACHE_LOCK:
        live = [w for w in _LIVE if w.pid == os.getpid()]
    for workers in live:
        workers.close(wait=False)
    for workers in live:
        workers.close(wait=True)


def _forget_inherited() -> None:
    """In a forked child, the parent's workers and threads are not ours."""
    with _CACHE_LOCK:
        _PARKED.clear()
        _LIVE.clear()


atexit.register(shutdown_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_inherited)


class ProcessPool:
    """Worker processes that map chunks of elements with one function; map's process backend.

    A pool belongs to one iterator and is used from its consumer thread. ``submit`` never waits
    for a worker: chunks beyond what the workers hold wait in the parent.

    Args:
      fn: the function to apply, as ``map`` wraps it.
      num_workers: the number of worker processes.

    Raises:
      TypeError: ``fn`` cannot be pickled with cloudpickle.

    Example:
      >>> from feedline.data.ops._functions import UserFunction
      >>> pool = ProcessPool(UserFunction(abs, "map"), 1)
      >>> outcomes, seconds = pool.submit([-1, 2]).result(timeout=60)
      >>> [value.item() for ok, value in outcomes]
      [1, 2]
      >>> pool.shutdown()
    """

    def __init__(self, fn: UserFunction, num_workers: int) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise InvalidArgumentError(f"num_workers must be an int >= 1, got {num_workers!r}")
        self._closed = True
        try:
            payload = cloudpickle.dumps(fn)
        except Exception as error:
            raise TypeError(
                f"{fn.description}: use_processes=True sends the function to worker processes, "
                f"but the function {function_name(fn.fn)!r} cannot be pickled with cloudpickle "
                f"({error!r}); capture only picklable values (no locks, open files, sockets or "
                "generators), or map on threads (use_processes=False)"
            ) from error
        key = (hashlib.sha256(payload).digest(), num_workers)
        self._owner = next(_OWNERS)
        workers = _acquire(key, self._owner)
        if workers is None:
            workers = _WorkerSet(key, payload, num_workers, fn.description, self._owner)
        self._workers = workers
        self._closed = False

    @property
    def num_workers(self) -> int:
        return len(self._workers.workers)

    @property
    def pids(self) -> list[int]:
        """The process ids of the workers."""
        return self._workers.pids

    def submit(self, elements: list[Any]) -> Future:
        """A future of ``(outcomes, seconds)`` for ``elements``, as ``apply_chunk`` gives."""
        if self._closed:
            raise UnavailableError("submit on a ProcessPool that was shut down")
        return self._workers.submit(self._owner, list(elements))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Releases the workers; idempotent.

        Args:
          wait: wait until the chunks that workers hold for this pool have come back.
          cancel_futures: cancel this pool's chunks that have not come back; their results are
            dropped when they arrive. Without it, submitted chunks still complete.
        """
        if self._closed:
            return
        self._closed = True
        self._workers.release(self._owner, cancel=cancel_futures, wait=wait)

    def __del__(self) -> None:
        if getattr(self, "_closed", True):
            return
        try:
            self.shutdown(wait=False, cancel_futures=True)
        except Exception:  # at interpreter exit; shutdown_all stops the workers then
            return

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown(wait=False, cancel_futures=True)
