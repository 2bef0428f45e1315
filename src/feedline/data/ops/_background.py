"""A producer thread that runs an iterator ahead of its consumer, with pausable state capture.

The producer puts ``(kind, value)`` items on a bounded deque: an element, the end of input, or an
exception (the iterator may continue after it, as ``ignore_errors`` needs). The consumer re-raises
exceptions with their original traceback. ``capture`` pauses the producer between two elements so
that the input's state and the buffered items together are an exact position.

At interpreter exit the producers stop before the interpreter tears down: a daemon thread still
running a map function (NumPy, PyTorch) while the interpreter finalizes aborts the process
("terminate called without an active exception", "Fatal Python error"). Python runs threading's
at-exit hooks, newest first, before it joins threads and runs ``atexit``; ``_stop_all_at_exit``
is registered after ``concurrent.futures``' hook (this module imports it first), so it runs while
the thread pools of parallel maps still take work. It stops the producers newest first (an outer
producer, which reads from inner ones, before them), each after the element in hand, within
``_EXIT_WAIT_S`` in all. From then on a producer runs no thread: ``get`` pulls the element in the
caller's thread, so a thread that still iterates (a non-daemon thread of the program) carries on.
"""

from __future__ import annotations

import collections
import concurrent.futures.thread  # noqa: F401  (its at-exit hook must be registered first)
import itertools
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

ELEMENT, END, ERROR = "element", "end", "error"
Item = tuple[str, Any]

# The longest the exit hook waits, over all producers, for the elements in hand.
_EXIT_WAIT_S = 5.0
_registry_lock = threading.Lock()
# Every producer, with the order it was made in (held weakly: a producer lives with its iterator).
_producers: weakref.WeakKeyDictionary[Producer, int] = weakref.WeakKeyDictionary()
_made = itertools.count()
_exiting = threading.Event()


class Producer:
    """Runs ``pull`` on a named daemon thread into a deque of at most ``capacity()`` items."""

    def __init__(
        self,
        pull: Callable[[], Any],
        capacity: Callable[[], int],
        name: str,
        cond: threading.Condition | None = None,
    ) -> None:
        """``cond`` may be shared by several producers, so that one consumer can wait for any."""
        self._pull = pull
        self._capacity = capacity
        self._name = name
        self._items: collections.deque[Item] = collections.deque()
        self._cond = cond or threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._paused = False
        self._busy = False
        self._ended = False
        # The process is exiting: no thread any more, ``get`` pulls in the caller's thread.
        self._inline = _exiting.is_set()
        with _registry_lock:
            _producers[self] = next(_made)

    def start(self) -> None:
        """Starts the thread if it is not running and the input has not ended."""
        with self._cond:
            if self._thread is None and not self._ended and not self._inline:
                self._start()

    def ready(self) -> bool:
        """Whether ``get`` has an item without waiting for the thread (starting it if needed)."""
        self.start()
        with self._cond:
            return bool(self._items) or (self._inline and not self._busy)

    def get(self) -> tuple[Item, bool]:
        """The next item and whether the consumer had to wait for it."""
        cond = self._cond
        with cond:
            if self._thread is None and not self._ended and not self._inline:
                self._start()
            waited = False
            while not self._items:
                waited = True
                if self._inline and not self._busy:
                    self._pull_inline()
                    continue
                cond.wait()
            item = self._items[0]
            if item[0] != END:
                self._items.popleft()
                cond.notify_all()
            return item, waited

    def _pull_inline(self) -> None:
        """(Under the lock, with nothing buffered, at exit.) Pulls one item in this thread."""
        self._busy = True
        self._cond.release()
        try:
            item = self._pull_item()
        finally:
            self._cond.acquire()
            self._busy = False
        self._items.append(item)
        if item[0] == END:
            self._ended = True
        self._cond.notify_all()

    def capture(self, snapshot: Callable[[], Any]) -> tuple[Any, list[Item]]:
        """``snapshot()`` of the input taken between two elements, and the buffered items."""
        with self._cond:
            self._paused = True
            while self._busy:
                self._cond.wait()
            try:
                return snapshot(), list(self._items)
            finally:
                self._paused = False
                self._cond.notify_all()

    def reset(self, items: list[Item]) -> None:
        """Stops the thread and replaces the buffer; the thread restarts on the next ``get``."""
        self.stop()
        with self._cond:
            self._items = collections.deque(items)
            self._stop = False
            self._ended = any(kind == END for kind, _ in items)
            self._thread = None

    def stop(self) -> None:
        """Stops the thread once it finishes the element in hand; idempotent."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            while self._busy:
                self._cond.wait()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def stop_at_exit(self, deadline: float) -> None:
        """Stops the thread for good (the process exits), waiting until ``deadline`` at most
        for the element in hand; what is buffered stays, and ``get`` pulls the rest inline."""
        with self._cond:
            self._inline = True
            self._stop = True
            self._cond.notify_all()
            while self._busy and (remaining := deadline - time.monotonic()) > 0:
                self._cond.wait(remaining)
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def _pull_item(self) -> Item:
        try:
            return (ELEMENT, self._pull())
        except StopIteration:
            return (END, None)
        except BaseException as error:
            return (ERROR, error)

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._stop and (self._paused or len(self._items) >= self._capacity()):
                    cond.wait()
                if self._stop:
                    return
                self._busy = True
            item = self._pull_item()
            with cond:
                self._busy = False
                self._items.append(item)
                cond.notify_all()
                if item[0] == END:
                    self._ended = True
                    return


def _stop_all_at_exit() -> None:
    """Stops every producer, newest first, before the interpreter tears down (threading's
    at-exit hooks run before it joins threads)."""
    _exiting.set()
    with _registry_lock:
        producers = sorted(_producers.items(), key=lambda entry: entry[1], reverse=True)
    deadline = time.monotonic() + _EXIT_WAIT_S
    for producer, _ in producers:
        producer.stop_at_exit(deadline)


threading._register_atexit(_stop_all_at_exit)  # type: ignore[attr-defined]
