"""``feedline dispatcher`` and ``feedline worker``: the service's servers as long-running
processes that stop cleanly on SIGTERM or SIGINT.

Each prints one line when it serves, ``feedline dispatcher serving at grpc://HOST:PORT`` or
``feedline worker serving at HOST:PORT``, so that scripts started with ``--port 0`` can learn
the port. The shared secret is read from ``$FEEDLINE_SERVICE_TOKEN``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections.abc import Callable

from feedline.errors import FeedlineError
from feedline.service.config import DispatcherConfig, WorkerConfig
from feedline.service.dispatcher import DispatchServer
from feedline.service.worker import WorkerServer


def dispatcher_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="feedline dispatcher", description=__doc__)
    parser.add_argument("--port", type=int, default=5050, help="port to listen on (0: any free)")
    parser.add_argument("--bind", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--work-dir", default=None, help="folder for the dispatcher's files")
    parser.add_argument(
        "--worker-addresses",
        default=None,
        help="comma-separated fixed worker list, for static sharding (FILE, DATA, HINT)",
    )
    args = parser.parse_args(argv)
    workers = None if args.worker_addresses is None else tuple(args.worker_addresses.split(","))
    return _serve(
        lambda: DispatchServer(
            DispatcherConfig(
                port=args.port, bind=args.bind, work_dir=args.work_dir, worker_addresses=workers
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
    args = parser.parse_args(argv)
    return _serve(
        lambda: WorkerServer(
            WorkerConfig(
                dispatcher_address=args.dispatcher,
                port=args.port,
                bind=args.bind,
                worker_address=args.worker_address,
            )
        ),
        lambda server: f"feedline worker serving at {server.worker_address}",
    )


def _serve(
    make: Callable[[], DispatchServer | WorkerServer],
    banner: Callable[[DispatchServer | WorkerServer], str],
) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    # Start on a helper thread: a worker may wait long for its dispatcher inside gRPC, where
    # this thread would not see a signal.
    started: list[DispatchServer | WorkerServer | BaseException] = []
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
        while not stop.wait(1.0):
            pass
    finally:
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
