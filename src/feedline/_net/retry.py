"""Calls tried again while their server cannot answer, within a bound.

``feedline._net.rpc`` turns every failure that says "the server cannot answer now" into an
``UnavailableError``: a server that cannot be reached, a call past its deadline, and a call
that the server cancelled or refused because it is stopping (gRPC CANCELLED or UNAVAILABLE, a
GOAWAY, a reset connection). ``call_within`` tries such a call again until it is answered or
the bound passes, so that a server stopped and started again (a graceful restart, a rolling
restart by an orchestrator) is a pause for its callers, not an error. Any other error is the
call's answer and is raised at once.

A call tried again may have reached the server before it failed: only calls the server
answers the same way twice are tried again (registering a dataset, joining a named job,
a ``GetSplit`` with its request number, heartbeats).

    >>> from feedline import errors
    >>> answers = iter([errors.UnavailableError("stopping"), "answered"])
    >>> def attempt(timeout: float) -> str:
    ...     answer = next(answers)
    ...     if isinstance(answer, Exception):
    ...         raise answer
    ...     return answer
    >>> call_within(5.0, attempt)
    'answered'
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from feedline.errors import UnavailableError

__all__ = ["call_within", "said_if_slow"]

T = TypeVar("T")

# Pauses between attempts that failed at once (a server refusing calls while it stops): from
# the first to the last, doubling.
_FIRST_PAUSE_S = 0.02
_LAST_PAUSE_S = 0.5


def call_within(
    seconds: float,
    attempt: Callable[[float], T],
    *,
    attempt_s: float = math.inf,
    stopped: threading.Event | None = None,
) -> T:
    """``attempt(timeout)``, tried again while it raises ``UnavailableError``, for at most
    ``seconds`` in all (``math.inf``: until it is answered).

    Args:
      seconds: how long the server may stay unable to answer.
      attempt: makes the call with the given timeout (a gRPC deadline), in seconds.
      attempt_s: the longest timeout of one attempt.
      stopped: set when the caller gives up (its process stops); the last error is raised.

    Raises:
      UnavailableError: the last attempt's, once ``seconds`` passed or ``stopped`` was set.
      Exception: any other error of an attempt, at once.
    """
    deadline = time.monotonic() + seconds
    pause = _FIRST_PAUSE_S
    while True:
        remaining = deadline - time.monotonic()
        try:
            return attempt(max(0.001, min(remaining, attempt_s)))
        except UnavailableError as error:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (stopped is not None and stopped.is_set()):
                raise
            last = error
        # A call refused at once (the server stops, or has just stopped and its port does not
        # listen yet) is tried again after a pause, never in a busy loop.
        if stopped is not None and stopped.wait(min(pause, remaining)):
            raise last
        if stopped is None:
            time.sleep(min(pause, remaining))
        pause = min(2 * pause, _LAST_PAUSE_S)


@contextlib.contextmanager
def said_if_slow(log: logging.Logger, after_s: float, message: Callable[[], str]) -> Iterator[None]:
    """Logs ``message()`` as a warning if the block has not ended after ``after_s`` seconds:
    a call that may wait minutes for its server (``call_within``) is not silent meanwhile.

    Example:
      >>> with said_if_slow(logging.getLogger("example"), 60.0, lambda: "still waiting"):
      ...     pass  # ended at once: nothing logged
    """
    timer = threading.Timer(after_s, lambda: log.warning("%s", message()))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
