"""``feedline dispatcher`` and ``feedline worker``: the service's servers as long-running
processes that stop cleanly on SIGTERM or SIGINT.

Each prints one line when it serves, ``feedline dispatcher serving at grpc://HOST:PORT`` or
``feedline worker serving at HOST:PORT``, so that scripts started with ``--port 0`` can learn
the port. The shared secret is read from ``$FEEDLINE_SERVICE_TOKEN``.

Exit codes: 0 after SIGTERM or SIGINT; 2 for a configuration error (``error: ...``); 1 for a
worker whose dispatcher stayed unreachable past ``--dispatcher-timeout`` (``error: ...``;
``--wait-forever`` keeps it trying). On SIGTERM a worker first drains for up to
``--drain-seconds``: it takes no new work, finishes the DYNAMIC splits it began, hands out what
it holds and tells the dispatcher it leaves; a second signal ends the drain at once.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections.abc import Callable

from feedline.errors import FeedlineError
from feedline.service.config import DispatcherConfig, WorkerConfig
from feedline.service.dispatcher.server import DispatchServer
from feedline.service.worker.server import WorkerServer


def dispatcher_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="feedline dispatcher", description=__doc__)
    parser.add_argument("--port", type=int, default=5050, help="port to listen on (0: any free)")
    parser.add_argument("--bind", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--work-dir", default=None, help="folder for the dispatcher's files")
    parser.add_argument(
        "--fault-tolerant",
        action="store_true",
        help="journal the dispatcher's state in --work-dir; restarted on the same --work-dir and "
        "port, it resumes its jobs",
    )
    parser.add_argument(
        "--worker-addresses",
        default=None,
        help="comma-separated fixed worker list, for static sharding (FILE, DATA, HINT)",
    )
    _add_status_port(parser)
    args = parser.parse_args(argv)
    workers = None if args.worker_addresses is None else tuple(args.worker_addresses.split(","))
    return _serve(
        lambda: DispatchServer(
            DispatcherConfig(
                port=args.port,
                bind=args.bind,
                work_dir=args.work_dir,
                fault_tolerant_mode=args.fault_tolerant,
                worker_addresses=workers,
                status_port=args.status_port,
            )
        ),
        lambda server: f"feedline dispatcher serving at {server.target}",
    )


def worker_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="feedline worker", description=__doc__)
    parser.add_argument("--dispatcher", required=True, help="the dispatcher's HOST:PORT")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any free)")
    parser.add_argument("--bind", default="127.0.0.1", help="interface to listen on")
    parser.add_argument(
        "--worker-address", default=None, help="address consumers reach this worker at"
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=10.0,
        help="on SIGTERM, hand out what this worker holds for at most this long (default 10)",
    )
    parser.add_argument(
        "--dispatcher-timeout",
        type=float,
        default=60.0,
        help="seconds to keep trying an unreachable dispatcher before exiting (default 60)",
    )
    parser.add_argument(
        "--wait-forever",
        action="store_true",
        help="keep trying an unreachable dispatcher for as long as it takes",
    )
    _add_status_port(parser)
    args = parser.parse_args(argv)
    return _serve(
        lambda: WorkerServer(
            WorkerConfig(
                dispatcher_address=args.dispatcher,
                port=args.port,
                bind=args.bind,
                worker_address=args.worker_address,
                dispatcher_timeout_ms=max(1, round(args.dispatcher_timeout * 1000)),
                wait_forever=args.wait_forever,
                status_port=args.status_port,
            )
        ),
        lambda server: f"feedline worker serving at {server.worker_address}",
        drain_seconds=args.drain_seconds,
    )


def _serve(
    make: Callable[[], DispatchServer | WorkerServer],
    banner: Callable[[DispatchServer | WorkerServer], str],
    drain_seconds: float = 0.0,
) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    stop = threading.Event()
    started: list[DispatchServer | WorkerServer | BaseException] = []

    def on_signal(*_: object) -> None:
        if stop.is_set() and started and isinstance(started[0], WorkerServer):
            started[0].cancel_drain()  # a second signal: stop draining now
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    # Start on a helper thread: a worker may wait long for its dispatcher inside gRPC, where
    # this thread would not see a signal.
    starter = threading.Thread(target=_start, args=(make, started), daemon=True)
    starter.start()
    while starter.is_alive():
        if stop.wait(0.1):
            return 0
    (server,) = started
    if isinstance(server, FeedlineError):
        print(f"error: {server}", flush=True)
        return 2
    if isinstance(server, BaseException):
        raise server
    print(banner(server), flush=True)
    try:
        while not stop.wait(0.2):
            if isinstance(server, WorkerServer) and server.stopped:
                print(f"error: {server.error or 'the worker stopped'}", flush=True)
                return 1
    finally:
        if isinstance(server, WorkerServer):
            server.stop(drain_seconds=drain_seconds if stop.is_set() else 0.0)
        else:
            server.stop()
    return 0


def _start(
    make: Callable[[], DispatchServer | WorkerServer],
    started: list[DispatchServer | WorkerServer | BaseException],
) -> None:
    try:
        started.append(make())
    except BaseException as error:
        started.append(error)


def _add_status_port(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--status-port",
        type=int,
        default=None,
        help="serve a status page at http://BIND:PORT/ and Prometheus metrics at /metrics "
        "(0: any free port; default: none)",
    )
