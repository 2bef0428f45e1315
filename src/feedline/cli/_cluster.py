"""``feedline server``: one ``ps`` or ``worker`` task of a ParameterServerStrategy cluster."""

from __future__ import annotations

import os
import sys
from typing import Any

from feedline._net.security import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV
from feedline.cli._serve import Served, serve
from feedline.distribute import Server
from feedline.distribute.cluster_resolver import TFConfigClusterResolver
from feedline.errors import FeedlineError, InvalidArgumentError


def server(
    *,
    cluster_spec: dict[str, Any] | None,
    job: str | None,
    task: int | None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
    insecure: bool = False,
) -> int:
    """``feedline server``: one task until SIGTERM or SIGINT; the exit code.

    Prints ``feedline server /job:JOB/task:I serving at HOST:PORT`` once it serves. The task
    comes from ``cluster_spec`` with ``job`` and ``task`` (default 0), else from ``TF_CONFIG``.
    Exit codes: 0 after a signal, 2 for a configuration error (``feedline server: error: ...``
    on stderr).

    Args:
      cluster_spec: the cluster (job -> addresses), or None for ``TF_CONFIG``'s.
      job: this task's job, ``ps`` or ``worker`` (with ``cluster_spec``).
      task: this task's index in its job (with ``cluster_spec``).
      tls_cert: TLS certificate file, or None.
      tls_key: its key file, or None.
      tls_ca: CA file (verifies peers; mutual TLS), or None.
      insecure: serve off loopback without a token or mutual TLS.
    """
    # The task's own clients (a worker task calls the ps tasks) take the same files.
    for name, value in ((TLS_CERT_ENV, tls_cert), (TLS_KEY_ENV, tls_key), (TLS_CA_ENV, tls_ca)):
        if value is not None:
            os.environ[name] = value

    def make() -> Served:
        job_name: str | None
        index: int | None
        if cluster_spec is not None:
            spec: Any = cluster_spec
            job_name, index = job, 0 if task is None else task
        else:
            resolver = TFConfigClusterResolver()
            spec, job_name, index = resolver.cluster_spec(), resolver.task_type, resolver.task_id
            if not spec:
                raise InvalidArgumentError(
                    "no cluster: set TF_CONFIG (its cluster and this task) or pass "
                    "--cluster-spec JSON --job ps|worker --task I"
                )
        running = Server(spec, job_name, index, insecure=insecure)
        return Served(
            banner=f"feedline server /job:{job_name}/task:{index} serving at {running.address}",
            stop=lambda signalled: running.stop(),
        )

    return serve(
        make,
        expected=(FeedlineError, ValueError, KeyError),
        errors=sys.stderr,
        command="feedline server",
    )


def membership_store(*, host: str, port: int) -> int:
    """``feedline membership-store``: the store where the workers of elastic
    ``MultiWorkerMirroredStrategy`` jobs meet (``ElasticClusterResolver``), until SIGTERM or
    SIGINT. Prints ``feedline membership-store serving at HOST:PORT`` once it serves."""

    def make() -> Served:
        from feedline.distribute.elastic import serve_membership_store

        served = [serve_membership_store(host, port)]  # it serves while referenced

        def stop(signalled: bool) -> None:
            served.clear()

        return Served(
            banner=f"feedline membership-store serving at {host}:{served[0].port}", stop=stop
        )

    return serve(
        make,
        expected=(FeedlineError, ValueError, RuntimeError, OSError),
        errors=sys.stderr,
        command="feedline membership-store",
    )
