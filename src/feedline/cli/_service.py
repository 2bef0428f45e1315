"""``feedline dispatcher`` and ``feedline worker``: the data service's servers as processes.

Each prints one line when it serves, ``feedline dispatcher serving at grpc://HOST:PORT`` or
``feedline worker serving at HOST:PORT``, so that scripts started with ``--port 0`` can learn
the port (the address it is bound to: ``0.0.0.0`` for every interface); ``feedline ROLE:
error: ...`` lines go to stdout with it. The shared secret is read from
``$FEEDLINE_SERVICE_TOKEN``; TLS files and ``--insecure`` go to the config
(``docs/security.md``). Exit codes are ``serve``'s: 2 for a server that cannot start, a worker
whose dispatcher stayed unreachable past ``--dispatcher-timeout`` (``--wait-forever`` keeps it
trying) and a dispatcher whose journal cannot be written.
"""

from __future__ import annotations

from feedline.cli._serve import Served, serve
from feedline.errors import FeedlineError
from feedline.service import DispatcherConfig, DispatchServer, WorkerConfig, WorkerServer


def dispatcher(
    *,
    port: int,
    bind: str,
    work_dir: str | None,
    fault_tolerant: bool,
    worker_addresses: str | None,
    journal_sync: str = "full",
    status_port: int | None,
    worker_timeout_ms: int | None = None,
    client_timeout_ms: int | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
    insecure: bool = False,
) -> int:
    """``feedline dispatcher``: a ``DispatchServer`` until SIGTERM or SIGINT; the exit code.

    Args:
      port: port to listen on (0: any free).
      bind: interface to listen on.
      work_dir: folder for the dispatcher's files.
      fault_tolerant: journal the state in ``work_dir``.
      worker_addresses: comma-separated fixed worker list, or None.
      journal_sync: ``DispatcherConfig.journal_sync``.
      status_port: port of the status page, or None.
      worker_timeout_ms: ``DispatcherConfig.worker_timeout_ms`` (None: its default).
      client_timeout_ms: ``DispatcherConfig.client_timeout_ms`` (None: its default).
      tls_cert: TLS certificate file, or None.
      tls_key: its key file, or None.
      tls_ca: CA file (mutual TLS), or None.
      insecure: serve off loopback without a token or mutual TLS.
    """
    workers = None if worker_addresses is None else tuple(worker_addresses.split(","))

    def make() -> Served:
        server = DispatchServer(
            DispatcherConfig(
                port=port,
                bind=bind,
                work_dir=work_dir,
                fault_tolerant_mode=fault_tolerant,
                journal_sync=journal_sync,
                worker_addresses=workers,
                status_port=status_port,
                worker_timeout_ms=worker_timeout_ms,
                client_timeout_ms=client_timeout_ms,
                tls_cert=tls_cert,
                tls_key=tls_key,
                tls_ca=tls_ca,
                insecure=insecure,
            )
        )

        def failure() -> str | None:
            if server.error is not None:
                return str(server.error)
            return "the dispatcher stopped" if server.stopped else None

        bound = server.target.rpartition(":")[2]
        return Served(
            banner=f"feedline dispatcher serving at grpc://{_host(bind)}:{bound}",
            stop=lambda signalled: server.stop(),
            failure=failure,
        )

    return serve(make, expected=(FeedlineError,), command="feedline dispatcher")


def worker(
    *,
    dispatcher: str,
    port: int,
    bind: str,
    worker_address: str | None,
    heartbeat_interval_ms: int | None,
    drain_seconds: float,
    dispatcher_timeout: float,
    wait_forever: bool,
    status_port: int | None,
    buffer_memory_mib: int = 256,
    cross_trainer_cache_mib: int = 64,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
    insecure: bool = False,
) -> int:
    """``feedline worker``: a ``WorkerServer`` until SIGTERM or SIGINT (it drains first, for
    at most ``drain_seconds``; a second signal ends the drain) or until it stops on its own
    (exit code 2); the exit code.

    Args:
      dispatcher: the dispatcher's ``HOST:PORT``.
      port: port to listen on (0: any free).
      bind: interface to listen on.
      worker_address: address consumers reach this worker at, or None.
      heartbeat_interval_ms: ``WorkerConfig.heartbeat_interval_ms`` (None: its default).
      drain_seconds: on SIGTERM, how long it may hand out what it holds.
      dispatcher_timeout: seconds to keep trying an unreachable dispatcher.
      wait_forever: keep trying an unreachable dispatcher for as long as it takes.
      status_port: port of the status page, or None.
      buffer_memory_mib: MiB that the buffers of all of the worker's tasks hold together.
      cross_trainer_cache_mib: MiB each task of a cross-trainer job keeps in memory.
      tls_cert: TLS certificate file (also presented to the dispatcher), or None.
      tls_key: its key file, or None.
      tls_ca: CA file (verifies the dispatcher; mutual TLS), or None.
      insecure: serve off loopback without a token or mutual TLS.
    """

    def make() -> Served:
        server = WorkerServer(
            WorkerConfig(
                dispatcher_address=dispatcher,
                port=port,
                bind=bind,
                worker_address=worker_address,
                heartbeat_interval_ms=heartbeat_interval_ms,
                dispatcher_timeout_ms=max(1, round(dispatcher_timeout * 1000)),
                wait_forever=wait_forever,
                status_port=status_port,
                buffer_memory_bytes=buffer_memory_mib << 20,
                cross_trainer_cache_size_bytes=cross_trainer_cache_mib << 20,
                tls_cert=tls_cert,
                tls_key=tls_key,
                tls_ca=tls_ca,
                insecure=insecure,
            )
        )

        def failure() -> str | None:
            if not server.stopped:
                return None
            return str(server.error or "the worker stopped")

        advertised = server.worker_address
        bound = f"{_host(bind)}:{advertised.rpartition(':')[2]}"
        # The last word stays the address consumers reach it at (what scripts read).
        note = "" if advertised == bound else f" as {advertised}"
        return Served(
            banner=f"feedline worker serving at {bound}{note}",
            stop=lambda signalled: server.stop(drain_seconds=drain_seconds if signalled else 0.0),
            failure=failure,
            interrupt=server.cancel_drain,
        )

    return serve(make, expected=(FeedlineError,), command="feedline worker")


def _host(bind: str) -> str:
    """``bind`` as the host part of an address (IPv6 in brackets)."""
    host = bind.strip("[]")
    return f"[{host}]" if ":" in host else host
