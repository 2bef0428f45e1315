"""``serve``: a server as a long-running process that stops cleanly on SIGTERM or SIGINT.

What ``feedline dispatcher``, ``feedline worker`` and ``feedline server`` share. The server is
made on a helper thread (a worker may wait long for its dispatcher inside gRPC, where the main
thread would not see a signal); once it serves, one banner line says where. Exit codes: 0 after
SIGTERM or SIGINT; 2 for every failure, each one line ``feedline COMMAND: error: ...``: a server
that cannot start (a bad configuration, a work dir it may not write, a damaged journal) or that
stops on its own later (a worker whose dispatcher stayed unreachable, a dispatcher whose journal
failed), so that a supervisor (systemd, Kubernetes) sees it fail and restarts it. An error that
is not one of ``expected`` nor an ``OSError`` also has its traceback logged.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
from collections.abc import Callable
from typing import TextIO

from feedline.cli._signals import SignalWatch
from feedline.errors import FeedlineError

logger = logging.getLogger(__name__)

#: The exit code of every failure.
FAILED = 2
#: Seconds between two looks at a running server.
_POLL_SECONDS = 0.2


def _no_failure() -> str | None:
    return None


def _nothing() -> None:
    """A second signal to a server that has nothing to cut short."""


@dataclasses.dataclass(frozen=True)
class Served:
    """A started server, as ``serve`` runs it.

    Attributes:
      banner: the line printed once it serves (``feedline ROLE serving at ADDRESS``).
      stop: stops it; called with whether a signal asked for that (a worker then drains).
      failure: why it stopped on its own, checked every ``_POLL_SECONDS``; None while it serves.
      interrupt: called on a second signal (a worker stops draining).
    """

    banner: str
    stop: Callable[[bool], None]
    failure: Callable[[], str | None] = _no_failure
    interrupt: Callable[[], None] = _nothing


def serve(
    make: Callable[[], Served],
    expected: tuple[type[BaseException], ...],
    errors: TextIO | None = None,
    command: str = "feedline",
) -> int:
    """Makes a server with ``make`` and runs it until SIGTERM or SIGINT; the exit code.

    Args:
      make: makes and starts the server (on a helper thread).
      expected: the errors of ``make`` that are a bad configuration, reported as one line;
        ``OSError`` (a folder it may not write, a port in use) is one too. Any other error is
        also one line, after its traceback is logged.
      errors: where ``error: ...`` lines go (default ``sys.stdout``, with the banner).
      command: what the error lines start with (``feedline dispatcher``).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    stop = threading.Event()
    started: list[Served | BaseException] = []

    def on_signal(count: int) -> None:
        if count > 1 and started and isinstance(started[0], Served):
            started[0].interrupt()  # a second signal
        stop.set()

    with SignalWatch(on_signal):  # called in-process (tests), the caller gets its handlers back
        return _run(make, started, stop, expected, errors, command)


def _run(
    make: Callable[[], Served],
    started: list[Served | BaseException],
    stop: threading.Event,
    expected: tuple[type[BaseException], ...],
    errors: TextIO | None,
    command: str,
) -> int:
    starter = threading.Thread(
        target=_start, args=(make, started), name="feedline-cli-start", daemon=True
    )
    starter.start()
    while starter.is_alive():
        if stop.wait(0.1):
            return 0
    (server,) = started
    if isinstance(server, KeyboardInterrupt | SystemExit):
        raise server
    if isinstance(server, BaseException):
        if not isinstance(server, (*expected, OSError)):
            logger.error("%s failed to start", command, exc_info=server)
        _say(f"{command}: error: {_one_line(server)}", errors)
        return FAILED
    _say(server.banner)
    try:
        while not stop.wait(_POLL_SECONDS):
            failure = server.failure()
            if failure is not None:
                _say(f"{command}: error: {failure}", errors)
                return FAILED
    finally:
        server.stop(stop.is_set())
    return 0


def _one_line(error: BaseException) -> str:
    """``error`` as one line: its message (an ``OSError``'s with the path), else its type."""
    text = str(error) or type(error).__name__
    if isinstance(error, OSError) and not isinstance(error, FeedlineError):
        text = f"{type(error).__name__}: {text}"
    return " ".join(text.split())


def _start(make: Callable[[], Served], started: list[Served | BaseException]) -> None:
    try:
        started.append(make())
    except BaseException as error:
        started.append(error)


def _say(line: str, file: TextIO | None = None) -> None:
    print(line, file=sys.stdout if file is None else file, flush=True)
