"""What ``dispatcher_load.py`` and ``worker_load.py`` share: a service process of the command
line with a token, processes of simulated clients, a timed unrelated call, and the figures
printed."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from feedline._net.rpc import TOKEN_ENV

_CLI = "import sys\nfrom feedline.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def start_cli(args: list[str], token: str) -> tuple[subprocess.Popen[str], str]:
    """``feedline ARGS`` in a process of its own that checks ``token`` on every call, and the
    line it printed once it serves."""
    process = subprocess.Popen(
        [sys.executable, "-c", _CLI, *args],
        env={**os.environ, TOKEN_ENV: token},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    return process, process.stdout.readline().strip()


def stop(process: subprocess.Popen[str]) -> None:
    """Stops ``process`` (SIGTERM, then SIGKILL after 30 s)."""
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)


class LoadProcesses:
    """``count`` processes of simulated clients (spawned, ``nice`` nicer than this one), all
    ready (their imports done) when this returns: slow starts do not eat into the load. Each
    runs ``target(*args, *orders)`` once ``send`` gave it its orders, and its result comes back
    through ``results``; ``close`` kills those still running."""

    def __init__(
        self, target: Callable[..., Any], args: tuple[Any, ...], count: int, nice: int = 0
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._out = context.Queue()
        self._inboxes = [context.Queue() for _ in range(count)]
        self._processes = [
            context.Process(target=_run, args=(target, args, nice, inbox, self._out))
            for inbox in self._inboxes
        ]
        for process in self._processes:
            process.start()
        for _ in self._processes:
            self._out.get(timeout=300)

    def send(self, orders: list[tuple[Any, ...]]) -> None:
        """Starts the load: process ``i`` runs with ``orders[i]``."""
        for inbox, order in zip(self._inboxes, orders, strict=True):
            inbox.put(order)

    def results(self) -> list[Any]:
        """What each process returned, once all are done (in the order they finished)."""
        results = [self._out.get(timeout=300) for _ in self._processes]
        for process in self._processes:
            process.join(30)
        return results

    def close(self) -> None:
        for process in self._processes:
            if process.is_alive():
                process.kill()


def _run(
    target: Callable[..., Any], args: tuple[Any, ...], nice: int, inbox: Any, out: Any
) -> None:
    os.nice(nice)
    out.put("ready")
    orders = inbox.get(timeout=600)
    out.put(target(*args, *orders))


def time_calls(call: Callable[[], Any], seconds: float, every: float = 0.02) -> list[float]:
    """``call`` every ``every`` s for ``seconds``: each one's time in seconds."""
    latencies = []
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        started = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - started)
        time.sleep(every)
    return latencies


def percentiles(latencies: list[float]) -> dict[str, float]:
    """p50, p99 and max of ``latencies`` (seconds), in ms."""
    ms = np.asarray(latencies) * 1000
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
    }
