"""Real ``feedline dispatcher`` and ``feedline worker`` processes on loopback, for the fault
tests and the chaos harness (``benchmarks/chaos.py``).

Every server is a process of the one launcher (``tests.launcher``), running the ``feedline``
command line; ``ServiceProcesses`` starts them one at a time (a dispatcher again on its port, a
worker after a kill), signals them, and kills whatever is left when it closes. Every wait has a
timeout.

Example::

    with ServiceProcesses() as cluster:
        cluster.start_dispatcher()
        worker = cluster.start_worker()
        dataset = Dataset.range(10).apply(distribute("distributed_epoch", cluster.target))
        cluster.send(worker, signal.SIGKILL)
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.launcher import FEEDLINE_CLI, Processes, free_port

__all__ = ["ServiceProcesses"]

BANNER_TIMEOUT_S = 30.0


class ServiceProcesses:
    """A dispatcher on a fixed free port and any number of workers, each a process.

    Args:
      timeout: the longest any of its processes may live.
      env: extra environment variables for every process.
    """

    def __init__(self, *, timeout: float = 180.0, env: Mapping[str, str] | None = None) -> None:
        self._stack = contextlib.ExitStack()
        self._groups: dict[str, Processes] = {}
        self._timeout = timeout
        self._env = dict(env or {})
        self.port = free_port()
        self.addresses: dict[str, str] = {}  # worker name -> address
        self._started = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def target(self) -> str:
        return f"grpc://{self.address}"

    def __enter__(self) -> ServiceProcesses:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    def _start(self, role: str, argv: Sequence[str]) -> str:
        self._started += 1
        name = f"{role}{self._started}"
        self._groups[name] = self._stack.enter_context(
            Processes(FEEDLINE_CLI, [(name, {})], argv=argv, timeout=self._timeout, env=self._env)
        )
        return name

    def start_dispatcher(self, *args: str) -> str:
        """Starts ``feedline dispatcher`` on this cluster's port; its name, once it serves."""
        name = self._start("dispatcher", ["dispatcher", "--port", str(self.port), *args])
        self._groups[name].wait_for_line(
            name, "feedline dispatcher serving at ", timeout=BANNER_TIMEOUT_S
        )
        return name

    def start_worker(self, *args: str, port: int = 0) -> str:
        """Starts ``feedline worker``; its name, once it serves (``addresses[name]``)."""
        argv = ["worker", "--dispatcher", self.address, "--port", str(port), *args]
        name = self._start("worker", argv)
        line = self._groups[name].wait_for_line(
            name, "feedline worker serving at ", timeout=BANNER_TIMEOUT_S
        )
        self.addresses[name] = line.rsplit(" ", 1)[-1]
        return name

    def send(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Sends ``sig`` to server ``name`` (SIGKILL: a kill -9)."""
        self._groups[name].send(name, sig)

    def wait_exit(self, name: str, timeout: float = 30.0) -> int | None:
        """Its exit code once it ends, or None after ``timeout`` seconds."""
        return self._groups[name].wait_exit(name, timeout)

    def output(self, name: str, stream: str = "stderr") -> str:
        """What server ``name`` printed (its log is on stderr, its banner on stdout)."""
        return self._groups[name].output(name, stream)

    def pid(self, name: str) -> int:
        """The process id of server ``name``."""
        return self._groups[name].pid(name)

    def alive(self, name: str) -> bool:
        return self._groups[name].poll(name) is None

    def cpu_seconds(self, name: str) -> float:
        """The CPU time server ``name`` has used so far (user and system; Linux ``/proc``)."""
        fields = Path(f"/proc/{self._groups[name].pid(name)}/stat").read_text().rsplit(")", 1)[1]
        utime, stime = fields.split()[11:13]
        return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")

    def rss_bytes(self, name: str, shared: bool = True) -> int:
        """The resident memory of server ``name`` now (Linux ``/proc``); without the shared
        memory it maps (``RssShmem``: consumers' arenas, which are theirs) unless ``shared``."""
        fields = {}
        for line in Path(f"/proc/{self._groups[name].pid(name)}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssShmem"):
                fields[key] = int(value.split()[0]) * 1024
        if "VmRSS" not in fields:
            raise RuntimeError(f"no VmRSS for {name}")
        return fields["VmRSS"] - (0 if shared else fields.get("RssShmem", 0))

    def run(
        self, code: str, processes: Sequence[tuple[str, Mapping[str, str]]], **kw: Any
    ) -> Processes:
        """Starts ``code`` in consumer processes (``tests.launcher.Processes``), closed with
        the cluster; the environment has ``FEEDLINE_TARGET``, the dispatcher's target."""
        env = {**self._env, "FEEDLINE_TARGET": self.target, **kw.pop("env", {})}
        return self._stack.enter_context(
            Processes(code, processes, timeout=kw.pop("timeout", self._timeout), env=env, **kw)
        )


def read_in_thread(
    iterator: Any, timeout: float, convert: Callable[[Any], Any] = int
) -> tuple[list[Any], BaseException | None]:
    """Reads ``iterator`` to its end on a thread: what it gave (each through ``convert``: as
    ints by default), and what it raised.

    Raises:
      AssertionError: it had not ended after ``timeout`` seconds (a hang); the iterator is closed.
    """
    got: list[Any] = []
    raised: list[BaseException] = []

    def read() -> None:
        try:
            for x in iterator:
                got.append(convert(x))
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=read, name="read-in-thread", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        iterator.close()
        raise AssertionError(
            f"the consumer hung: no end and no error after {timeout} s ({len(got)} read)"
        )
    return got, (raised[0] if raised else None)


def release_consumer(target: str, iterator: Any) -> None:
    """Releases ``iterator``'s consumer at the dispatcher of ``target``, as the dispatcher
    releases one that missed its heartbeats (the consumer itself goes on)."""
    from feedline.service.client.channels import _dispatcher
    from feedline.service.protocol import ReleaseClientRequest

    request = ReleaseClientRequest(iterator._reader.client_id).to_header()
    _dispatcher(target.split("://")[-1]).call("ReleaseClient", request, timeout=10)
