"""A TCP proxy on loopback that injects the faults of a real network in front of a server:
added latency per connection, per request and per 64 KiB of response, and resets of a seeded
fraction of connections in the middle of a response (the client sees its connection reset
after part of the body arrived).

    with FaultProxy(("127.0.0.1", port), reset_fraction=0.3, seed=1) as proxy:
        client_endpoint = proxy.url   # http://127.0.0.1:<proxy port>

A request is what the client sends after the server last answered on that connection (HTTP
keep-alive sends requests one after another on a connection): its first bytes wait
``request_latency`` seconds before they go upstream, as a store's time to first byte.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from typing import Any


class FaultProxy:
    """Forwards every connection to ``upstream``; a seeded ``reset_fraction`` of them is reset
    once ``reset_after`` bytes of the answer went through; each connection waits ``latency``
    seconds before its first byte goes upstream, each request ``request_latency`` seconds, and
    each 64 KiB of an answer ``latency_per_64k`` seconds. ``connections`` and ``requests``
    count what went through. Threads are daemonic; ``close`` stops all."""

    def __init__(
        self,
        upstream: tuple[str, int],
        reset_fraction: float = 0.0,
        reset_after: int = 2048,
        latency: float = 0.0,
        seed: int = 0,
        request_latency: float = 0.0,
        latency_per_64k: float = 0.0,
    ) -> None:
        self.upstream = upstream
        self.reset_fraction = reset_fraction
        self.reset_after = reset_after
        self.latency = latency
        self.request_latency = request_latency
        self.latency_per_64k = latency_per_64k
        self.resets = 0
        self.connections = 0
        self.requests = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
                doomed = self._random.random() < self.reset_fraction
            threading.Thread(
                target=self._serve, args=(client, doomed), name="fault-proxy-conn", daemon=True
            ).start()

    def _serve(self, client: socket.socket, doomed: bool) -> None:
        try:
            server = socket.create_connection(self.upstream, timeout=30)
        except OSError:
            client.close()
            return
        with self._lock:
            self._sockets += [client, server]
        if self.latency:
            time.sleep(self.latency)
        answered = threading.Event()  # the server answered since the client last sent
        answered.set()
        threading.Thread(
            target=self._pump_requests,
            args=(client, server, answered),
            name="fault-proxy-up",
            daemon=True,
        ).start()
        self._pump_answers(server, client, self.reset_after if doomed else None, answered)

    def _pump_requests(
        self, source: socket.socket, target: socket.socket, answered: threading.Event
    ) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if answered.is_set():  # the first bytes of a new request
                    answered.clear()
                    with self._lock:
                        self.requests += 1
                    if self.request_latency:
                        time.sleep(self.request_latency)
                target.sendall(data)
        except OSError:
            pass
        finally:
            _shutdown(source, target)

    def _pump_answers(
        self,
        source: socket.socket,
        target: socket.socket,
        cut: int | None,
        answered: threading.Event,
    ) -> None:
        sent = 0
        owed = 0.0  # 64 KiB units of answer not yet delayed
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                answered.set()
                if self.latency_per_64k:
                    owed += len(data) / 65536
                    if owed >= 1:
                        time.sleep(self.latency_per_64k * int(owed))
                        owed -= int(owed)
                if cut is not None and sent + len(data) > cut:
                    target.sendall(data[: max(0, cut - sent)])
                    self._reset(source, target)
                    return
                target.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            _shutdown(source, target)

    def _reset(self, *sockets: socket.socket) -> None:
        with self._lock:
            self.resets += 1
        for sock in sockets:
            with contextlib.suppress(OSError):  # close with an RST, as a broken network does
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                # Wakes the thread blocked reading this socket, so that close is the last use.
                sock.shutdown(socket.SHUT_RD)
                sock.close()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _shutdown(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):  # the other side may be gone already
            sock.shutdown(socket.SHUT_RDWR)
