"""The data service in an exiting process: everything stops in order, quietly, at once.

A script that never calls ``stop()`` (as TensorFlow's examples do not) still exits cleanly.
When the interpreter exits, Python first runs threading's at-exit hooks, in the reverse order
of their registration, then joins the remaining threads, then runs ``atexit``. The thread pools
of ``concurrent.futures``, on which gRPC servers run their handlers, close in one of those
hooks; a server still receiving requests after that fails them with "cannot schedule new
futures after interpreter shutdown". This module registers its hook after
``concurrent.futures`` registered its own (it imports it first), so it runs before: it stops
consumers, closes their channels (so that no channel hears a server go away), then stops
workers, then dispatchers, each without grace and without logging what their peers' departure
does to them (``exiting()``).

Last, it joins the threads that call servers (``join_at_exit``: a consumer's heartbeat and
fetch threads, a worker's heartbeat), whose calls the steps above cancelled, for at most
``_JOIN_SECONDS`` in all. They are daemon threads: one still inside a gRPC call when the
interpreter finalizes would, on its way back, find the interpreter gone, and Python ends such
a thread with ``pthread_exit``, whose unwinding through gRPC's C++ frames aborts the process
("terminate called without an active exception").
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  (its at-exit hook must be registered first)
import contextlib
import threading
import time
import weakref
from typing import Any

__all__ = ["CHANNELS", "CONSUMER", "DISPATCHER", "WORKER", "exiting", "join_at_exit", "register"]

#: Stages, stopped in this order.
CONSUMER, CHANNELS, WORKER, DISPATCHER = 0, 1, 2, 3
_STAGES = (CONSUMER, CHANNELS, WORKER, DISPATCHER)

_lock = threading.Lock()
# Per stage: the objects to stop, with the name of the method that stops them.
_stops: dict[int, weakref.WeakKeyDictionary[Any, str]] = {
    stage: weakref.WeakKeyDictionary() for stage in _STAGES
}
_exiting = threading.Event()
_threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_JOIN_SECONDS = 2.0


def exiting() -> bool:
    """Whether the process is exiting (the service stops quietly and without grace)."""
    return _exiting.is_set()


def register(owner: Any, method: str, stage: int) -> None:
    """Calls ``owner.<method>()`` when the process exits, in ``stage`` order, unless ``owner``
    is gone by then (it is held weakly)."""
    with _lock:
        _stops[stage][owner] = method


def join_at_exit(thread: threading.Thread) -> None:
    """Joins ``thread`` when the process exits, after every stage stopped (it is held
    weakly): a thread that calls servers, which those stops end."""
    with _lock:
        _threads.add(thread)


def _stop_all() -> None:
    _exiting.set()
    for stage in _STAGES:
        with _lock:
            owners = list(_stops[stage].items())
            _stops[stage].clear()
        for owner, method in owners:
            with contextlib.suppress(Exception):  # exiting: nobody is left to tell
                getattr(owner, method)()
    with _lock:
        threads = list(_threads)
    deadline = time.monotonic() + _JOIN_SECONDS
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


threading._register_atexit(_stop_all)  # type: ignore[attr-defined]
