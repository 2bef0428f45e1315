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
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  (its at-exit hook must be registered first)
import contextlib
import threading
import weakref
from typing import Any

__all__ = ["CHANNELS", "CONSUMER", "DISPATCHER", "WORKER", "exiting", "register"]

#: Stages, stopped in this order.
CONSUMER, CHANNELS, WORKER, DISPATCHER = 0, 1, 2, 3
_STAGES = (CONSUMER, CHANNELS, WORKER, DISPATCHER)

_lock = threading.Lock()
# Per stage: the objects to stop, with the name of the method that stops them.
_stops: dict[int, weakref.WeakKeyDictionary[Any, str]] = {
    stage: weakref.WeakKeyDictionary() for stage in _STAGES
}
_exiting = threading.Event()


def exiting() -> bool:
    """Whether the process is exiting (the service stops quietly and without grace)."""
    return _exiting.is_set()


def register(owner: Any, method: str, stage: int) -> None:
    """Calls ``owner.<method>()`` when the process exits, in ``stage`` order, unless ``owner``
    is gone by then (it is held weakly)."""
    with _lock:
        _stops[stage][owner] = method


def _stop_all() -> None:
    _exiting.set()
    for stage in _STAGES:
        with _lock:
            owners = list(_stops[stage].items())
            _stops[stage].clear()
        for owner, method in owners:
            with contextlib.suppress(Exception):  # exiting: nobody is left to tell
                getattr(owner, method)()


threading._register_atexit(_stop_all)  # type: ignore[attr-defined]
