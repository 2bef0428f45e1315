"""``SignalWatch``: each signal reaches the callback on the watch's thread, in order, and the
previous handlers come back; and a process whose main thread keeps waiting on the event that
the signals set never hangs (a handler that sets the event itself deadlocks in a few hundred)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

from feedline.cli._signals import SignalWatch

SIGNAL = signal.SIGUSR1  # the test process keeps its own SIGTERM and SIGINT


def test_each_signal_is_counted_on_the_watch_thread_and_the_old_handler_comes_back() -> None:
    calls: list[tuple[int, str]] = []
    called = threading.Event()

    def on_signal(count: int) -> None:
        calls.append((count, threading.current_thread().name))
        called.set()

    before = signal.getsignal(SIGNAL)
    with SignalWatch(on_signal, [SIGNAL]) as watch:
        assert signal.getsignal(SIGNAL) is not before
        for expected in (1, 2):
            called.clear()
            os.kill(os.getpid(), SIGNAL)
            assert called.wait(10.0), calls
            assert calls[-1] == (expected, "feedline-signals")
        assert watch.count == 2
    assert signal.getsignal(SIGNAL) == before


_WAITER = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from feedline.cli._signals import SignalWatch

    event, sent = threading.Event(), threading.Event()

    def send():
        for _ in range(300):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.0001)
        sent.set()

    with SignalWatch(lambda count: event.set()) as watch:
        threading.Thread(target=send, daemon=True).start()
        while not sent.is_set():  # the main thread in and out of the event's lock
            event.wait(0)
            event.clear()
        deadline = time.monotonic() + 10
        while watch.count == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    print("received", watch.count)
    """
)


def test_signals_never_deadlock_a_main_thread_waiting_on_the_event_they_set() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WAITER], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    received = int(done.stdout.split()[-1])
    assert 1 <= received <= 300, done.stdout


def test_a_forked_child_s_signal_is_its_own() -> None:
    calls: list[int] = []
    with SignalWatch(calls.append, [SIGNAL]):
        pid = os.fork()
        if pid == 0:  # the child: SIGUSR1's default action ends it
            os.kill(os.getpid(), SIGNAL)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == SIGNAL
    assert calls == []
