"""``feedline autoscale`` and ``feedline diagnose``: what a dispatcher's load says, acted on or
explained.

Both ask the dispatcher (its ``GetLoad`` RPC, with ``$FEEDLINE_SERVICE_TOKEN`` and the TLS
files as every client does) for the workers its jobs need and the load behind that.
``autoscale`` runs ``service.autoscaler.Autoscaler`` with a back-end of ``service.scaling``
until SIGTERM or SIGINT; ``diagnose`` watches for ``--seconds`` and prints
``service.diagnosis``'s verdict for each running job.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from collections.abc import Callable

from feedline._net import rpc as _rpc
from feedline._net.security import TlsConfig
from feedline.cli._signals import SignalWatch
from feedline.errors import InvalidArgumentError, UnavailableError
from feedline.service.autoscaler import Autoscaler, Policy, ScalingBackend
from feedline.service.diagnosis import Diagnosis, render
from feedline.service.diagnosis import diagnose as diagnose_load
from feedline.service.protocol import DISPATCHER_SERVICE, LoadReply
from feedline.service.scaling import KubernetesWorkers, LocalWorkers, default_namespace

# Seconds one GetLoad may take.
_CALL_TIMEOUT_S = 10.0


def load_source(
    dispatcher: str,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
) -> tuple[Callable[[], LoadReply], Callable[[], None]]:
    """``(load, close)``: ``load()`` asks the dispatcher at ``dispatcher`` for its load."""
    address = _rpc.parse_service(dispatcher)
    tls = TlsConfig.resolve(tls_cert, tls_key, tls_ca, what=f"the client of {address}")
    client = _rpc.RpcClient(address, DISPATCHER_SERVICE, _rpc.resolve_token(None), tls)

    def load() -> LoadReply:
        header, _ = client.call("GetLoad", {}, timeout=_CALL_TIMEOUT_S)
        return LoadReply.from_header(header)

    return load, client.close


def autoscale(
    *,
    dispatcher: str,
    backend: str,
    min_workers: int,
    max_workers: int,
    interval: float,
    stabilization: float,
    drain_seconds: float,
    scale_down: float = 5.0,
    deployment: str,
    namespace: str | None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
    insecure: bool = False,
) -> int:
    """``feedline autoscale``: the loop until SIGTERM or SIGINT; the exit code.

    Args:
      dispatcher: the dispatcher's ``HOST:PORT``.
      backend: ``local`` or ``kubernetes``.
      min_workers: never fewer workers.
      max_workers: never more.
      interval: seconds between rounds.
      stabilization: at most one scale-down right after a scale-up this many seconds.
      drain_seconds: local: how long a drained worker may hand out what it holds.
      scale_down: seconds of fewer workers asked for before a scale-down.
      deployment: kubernetes: the workers' Deployment.
      namespace: kubernetes: its namespace, None: the pod's.
      tls_cert, tls_key, tls_ca: TLS files (also given to local workers), or None.
      insecure: given to local workers.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if min_workers > max_workers or min_workers < 0:
        raise InvalidArgumentError(
            f"--min-workers {min_workers} must be between 0 and --max-workers {max_workers}"
        )
    policy = Policy(min_workers, max_workers, stabilization, scale_down_s=scale_down)
    load, close = load_source(dispatcher, tls_cert, tls_key, tls_ca)
    scaler: ScalingBackend
    if backend == "local":
        worker_args = [
            arg
            for flag, value in (
                ("--tls-cert", tls_cert),
                ("--tls-key", tls_key),
                ("--tls-ca", tls_ca),
            )
            if value
            for arg in (flag, value)
        ] + (["--insecure"] if insecure else [])
        scaler = LocalWorkers(dispatcher, drain_seconds, worker_args)
    else:
        scaler = KubernetesWorkers(deployment, namespace or default_namespace())
    stop = threading.Event()
    try:
        with SignalWatch(lambda _: stop.set()):  # before the banner, which says it runs
            print(
                f"feedline autoscale: {backend} workers for {dispatcher}, "
                f"{min_workers} to {max_workers}",
                flush=True,
            )
            Autoscaler(load, scaler, policy, interval_s=max(0.05, interval)).run(stop)
    finally:
        scaler.close()
        close()
    return 0


def watch(load: Callable[[], LoadReply], seconds: float) -> tuple[list[Diagnosis], LoadReply]:
    """Asks for the load about once a second for ``seconds``; for each job still running at
    the end, the verdict it got most often (the newest of those)."""
    deadline = time.monotonic() + seconds
    seen: dict[int | None, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    latest: dict[tuple[int | None, str], Diagnosis] = {}
    while True:
        reply = load()
        verdicts = diagnose_load(reply)
        for item in verdicts:
            seen[item.job_id][item.bottleneck] += 1
            latest[item.job_id, item.bottleneck] = item
        if time.monotonic() >= deadline:
            break
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    final = [latest[v.job_id, seen[v.job_id].most_common(1)[0][0]] for v in verdicts]
    return final, reply


def diagnose(
    *,
    dispatcher: str,
    seconds: float,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
    insecure: bool = False,
) -> int:
    """``feedline diagnose``: prints what holds each running job's input back; the exit code.

    Args:
      dispatcher: the dispatcher's ``HOST:PORT``.
      seconds: how long to watch.
      tls_cert, tls_key, tls_ca: TLS files, or None.
      insecure: unused (a client).
    """
    load, close = load_source(dispatcher, tls_cert, tls_key, tls_ca)
    try:
        verdicts, reply = watch(load, seconds)
    except UnavailableError as error:
        raise UnavailableError(
            f"the dispatcher at {dispatcher} cannot be reached: {error}"
        ) from None
    finally:
        close()
    print(render(verdicts, reply), file=sys.stdout, flush=True)
    return 0
