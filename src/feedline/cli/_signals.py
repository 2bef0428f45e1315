"""``SignalWatch``: SIGTERM and SIGINT handled on a thread, so that no handler takes a lock.

A Python signal handler runs on the main thread between two of its bytecodes, and so possibly
while that thread holds a lock: ``threading.Event.wait`` holds its condition's lock between two
looks at the flag. A handler that then takes the same lock (``Event.set`` on the event the main
thread waits for) waits for itself, and the process hangs until it is killed, never draining.
Here the handler only writes the signal's number to a pipe; a thread reads it and calls
``on_signal``, where taking a lock is safe.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType, TracebackType

#: The signals a server stops on.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalWatch:
    """Calls ``on_signal(count)`` on its own thread for each of ``signals`` the process gets
    while the ``with`` block runs (``count``: 1 for the first, 2 for the second...). Entered on
    the main thread (only it may set signal handlers); the previous handlers come back on exit.
    A child forked meanwhile keeps the default action (its signals are not this process's).
    """

    def __init__(
        self, on_signal: Callable[[int], None], signals: Sequence[int] = STOP_SIGNALS
    ) -> None:
        self._on_signal = on_signal
        self._signals = tuple(signals)
        self._previous: dict[int, object] = {}
        self._read_fd = self._write_fd = -1
        self._thread: threading.Thread | None = None
        self._pid = 0
        #: The signals received so far.
        self.count = 0

    def __enter__(self) -> SignalWatch:
        self._pid = os.getpid()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # a handler never waits on a full pipe
        self._thread = threading.Thread(target=self._watch, name="feedline-signals", daemon=True)
        self._thread.start()
        self._previous = {signum: signal.signal(signum, self._handle) for signum in self._signals}
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        os.close(self._write_fd)  # the thread reads the end of the pipe and returns
        if self._thread is not None:
            self._thread.join(5.0)
        os.close(self._read_fd)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a forked child's signal: as if no handler were set
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        with contextlib.suppress(BlockingIOError):  # a full pipe already holds signals to read
            os.write(self._write_fd, bytes([signum]))

    def _watch(self) -> None:
        while data := os.read(self._read_fd, 64):
            for _ in data:
                self.count += 1
                self._on_signal(self.count)
