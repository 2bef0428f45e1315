"""The back-ends of ``feedline autoscale``: what starts and drains workers.

``LocalWorkers`` runs ``feedline worker`` processes on this machine: it starts them, learns
each one's address from its banner, drains one by sending it SIGTERM (it hands out what it
holds and leaves, as ``feedline worker`` does), and drains them all when it closes.

``KubernetesWorkers`` sets the ``replicas`` of the workers' Deployment through the Kubernetes
API (its ``scale`` sub-resource); Kubernetes chooses the pods to stop and sends each SIGTERM,
on which a worker drains (give the pods a ``terminationGracePeriodSeconds`` of at least
``--drain-seconds``). Credentials: in a pod, its service account (``KUBERNETES_SERVICE_HOST``
and the token and CA under ``/var/run/secrets/kubernetes.io/serviceaccount``), through plain
HTTPS; elsewhere the ``kubernetes`` package, if installed, with the usual kubeconfig.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from feedline.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError

__all__ = ["HttpsKubernetesApi", "KubernetesApi", "KubernetesWorkers", "LocalWorkers"]

logger = logging.getLogger(__name__)

#: Where a pod finds its service account's credentials.
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_BANNER = "feedline worker serving at "
# Seconds a closing back-end gives its draining workers beyond their drain.
_EXIT_GRACE_S = 10.0


class _Worker:
    """One ``feedline worker`` process and what its banner said."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.address: str | None = None
        self.draining = False
        self.output: list[str] = []
        self.reader = threading.Thread(
            target=self._read, name=f"feedline-autoscale-worker-{process.pid}", daemon=True
        )
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            line = line.rstrip("\n")
            if line.startswith(_BANNER) and self.address is None:
                self.address = line[len(_BANNER) :].split()[-1]
            if len(self.output) < 200:
                self.output.append(line)


class LocalWorkers:
    """``feedline worker`` processes on this machine.

    Args:
      dispatcher: the dispatcher's ``HOST:PORT``.
      drain_seconds: how long a drained worker may hand out what it holds.
      worker_args: more arguments of each ``feedline worker`` (``--bind``, TLS files).
      python: the interpreter that runs them (this one by default).
    """

    def __init__(
        self,
        dispatcher: str,
        drain_seconds: float = 10.0,
        worker_args: Sequence[str] = (),
        python: str = sys.executable,
    ) -> None:
        self._command = [
            python,
            "-m",
            "feedline.cli",
            "worker",
            "--dispatcher",
            dispatcher,
            "--port",
            "0",
            "--drain-seconds",
            str(drain_seconds),
            *worker_args,
        ]
        self._drain_seconds = drain_seconds
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        #: Workers drained so far.
        self.drained = 0

    def _reap(self) -> None:
        """Forgets the workers that exited (under the lock)."""
        for worker in [w for w in self._workers if w.process.poll() is not None]:
            if not worker.draining:
                logger.warning(
                    "autoscale: worker %s exited with code %s: %s",
                    worker.address or f"pid {worker.process.pid}",
                    worker.process.returncode,
                    " | ".join(worker.output[-3:]),
                )
            self._workers.remove(worker)

    def count(self) -> int:
        """The workers started that do not drain (those still starting included)."""
        with self._lock:
            self._reap()
            return sum(1 for w in self._workers if not w.draining)

    def addresses(self) -> list[str]:
        """The addresses of the workers that serve and do not drain."""
        with self._lock:
            return [w.address for w in self._workers if w.address and not w.draining]

    def owns(self, address: str) -> bool:
        """Whether ``address`` is one of the workers started here."""
        with self._lock:
            return any(w.address == address for w in self._workers)

    def scale_up(self, count: int) -> None:
        """Starts ``count`` workers (they register with the dispatcher on their own)."""
        with self._lock:
            for _ in range(count):
                process = subprocess.Popen(
                    self._command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,  # a Ctrl-C of the autoscaler is not theirs
                )
                self._workers.append(_Worker(process))

    def scale_down(self, count: int, candidates: Sequence[str]) -> int:
        """Sends SIGTERM to ``count`` of the workers in ``candidates``, in that order (a
        worker drains on it); how many."""
        drained = 0
        with self._lock:
            for address in candidates:
                if drained >= count:
                    break
                worker = next(
                    (w for w in self._workers if w.address == address and not w.draining), None
                )
                if worker is None or worker.process.poll() is not None:
                    continue
                worker.draining = True
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signal.SIGTERM)
                drained += 1
            self.drained += drained
        return drained

    def close(self) -> None:
        """Drains every worker started here and waits for them (killing those that outlive
        their drain by ``_EXIT_GRACE_S``)."""
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            if worker.process.poll() is None:
                worker.draining = True
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self._drain_seconds + _EXIT_GRACE_S
        for worker in workers:
            try:
                worker.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait(5.0)
                logger.warning(
                    "autoscale: worker %s did not end its drain in time and was killed: %s",
                    worker.address or f"pid {worker.process.pid}",
                    " | ".join(worker.output[-3:]),
                )
            worker.reader.join(5.0)
            if worker.process.stdout is not None:
                worker.process.stdout.close()
        with self._lock:
            self._workers.clear()


class KubernetesApi(Protocol):
    """The two calls of the Deployment's ``scale`` sub-resource that the back-end makes."""

    def get_replicas(self, namespace: str, deployment: str) -> int:
        """The Deployment's ``spec.replicas``."""

    def set_replicas(self, namespace: str, deployment: str, replicas: int) -> None:
        """Sets the Deployment's ``spec.replicas``."""


class HttpsKubernetesApi:
    """The Kubernetes API over plain HTTPS with a bearer token (a pod's service account).

    Args:
      server: ``https://host:port`` of the API server.
      token: the bearer token, or None.
      ca_file: the CA that signs the server's certificate (None: the system's).
      timeout_s: seconds per call.
    """

    def __init__(
        self, server: str, token: str | None, ca_file: str | None = None, timeout_s: float = 10.0
    ) -> None:
        self._server = server.rstrip("/")
        self._token = token
        self._timeout_s = timeout_s
        self._context = (
            ssl.create_default_context(cafile=ca_file) if server.startswith("https") else None
        )

    @classmethod
    def in_cluster(cls) -> HttpsKubernetesApi | None:
        """The API of the cluster this process runs in as a pod, None outside one."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        token_file = SERVICE_ACCOUNT / "token"
        if not host or not token_file.exists():
            return None
        host = f"[{host}]" if ":" in host else host
        ca = SERVICE_ACCOUNT / "ca.crt"
        return cls(
            f"https://{host}:{port}",
            token_file.read_text().strip(),
            str(ca) if ca.exists() else None,
        )

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/merge-patch+json"
        request = urllib.request.Request(
            self._server + path, data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(
                request, timeout=self._timeout_s, context=self._context
            ) as reply:
                return json.loads(reply.read() or b"{}")
        except urllib.error.HTTPError as error:
            with error:
                detail = error.read().decode(errors="replace")[:300]
            if error.code in (401, 403):
                raise FailedPreconditionError(
                    f"the Kubernetes API refused {method} {path} ({error.code}): {detail}; the "
                    "autoscaler's service account needs get and patch on deployments/scale"
                ) from None
            if error.code == 404:
                raise FailedPreconditionError(
                    f"the Kubernetes API has no {path} (404): check --namespace and --deployment"
                ) from None
            raise UnavailableError(f"the Kubernetes API answered {error.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as error:
            raise UnavailableError(
                f"the Kubernetes API at {self._server} cannot be reached: {error}"
            ) from None

    @staticmethod
    def _path(namespace: str, deployment: str) -> str:
        return f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}/scale"

    def get_replicas(self, namespace: str, deployment: str) -> int:
        reply = self._call("GET", self._path(namespace, deployment))
        return int(reply.get("spec", {}).get("replicas", 0))

    def set_replicas(self, namespace: str, deployment: str, replicas: int) -> None:
        self._call("PATCH", self._path(namespace, deployment), {"spec": {"replicas": replicas}})


class _ClientKubernetesApi:
    """The Kubernetes API through the ``kubernetes`` package and its kubeconfig."""

    def __init__(self) -> None:
        from kubernetes import client, config  # type: ignore[import-not-found, import-untyped, unused-ignore]

        config.load_kube_config()
        self._apps = client.AppsV1Api()

    def get_replicas(self, namespace: str, deployment: str) -> int:
        scale = self._apps.read_namespaced_deployment_scale(deployment, namespace)
        return int(scale.spec.replicas or 0)

    def set_replicas(self, namespace: str, deployment: str, replicas: int) -> None:
        self._apps.patch_namespaced_deployment_scale(
            deployment, namespace, {"spec": {"replicas": replicas}}
        )


def kubernetes_api() -> KubernetesApi:
    """The API of this pod's cluster, else the one of the kubeconfig.

    Raises:
      FailedPreconditionError: neither can be used.
    """
    api = HttpsKubernetesApi.in_cluster()
    if api is not None:
        return api
    try:
        return _ClientKubernetesApi()
    except ImportError:
        raise FailedPreconditionError(
            "no Kubernetes credentials: this process is not in a pod (KUBERNETES_SERVICE_HOST "
            "is unset) and the kubernetes package is not installed for a kubeconfig "
            "(pip install kubernetes); or let a HorizontalPodAutoscaler scale the workers on "
            "the metric feedline_dispatcher_desired_workers instead"
        ) from None
    except Exception as error:  # the package's own errors: no kubeconfig, a bad one
        raise FailedPreconditionError(f"the kubeconfig cannot be used: {error}") from None


def default_namespace() -> str:
    """This pod's namespace, else ``default``."""
    path = SERVICE_ACCOUNT / "namespace"
    return path.read_text().strip() if path.exists() else "default"


class KubernetesWorkers:
    """The workers' Deployment, scaled through the Kubernetes API.

    Args:
      deployment: the Deployment's name.
      namespace: its namespace.
      api: the API (``kubernetes_api()`` by default).
    """

    def __init__(self, deployment: str, namespace: str, api: KubernetesApi | None = None) -> None:
        if not deployment:
            raise InvalidArgumentError("the workers' Deployment needs a name (--deployment)")
        self._deployment = deployment
        self._namespace = namespace
        self._api = kubernetes_api() if api is None else api

    def count(self) -> int:
        """The Deployment's ``replicas``."""
        return self._api.get_replicas(self._namespace, self._deployment)

    def owns(self, address: str) -> bool:
        """Every worker is the Deployment's."""
        return True

    def scale_up(self, count: int) -> None:
        replicas = self.count() + count
        self._api.set_replicas(self._namespace, self._deployment, replicas)

    def scale_down(self, count: int, candidates: Sequence[str]) -> int:
        """Lowers ``replicas`` by at most as many as there are ``candidates`` (workers that
        may drain): Kubernetes chooses the pods, which drain on SIGTERM."""
        count = min(count, len(candidates))
        if count > 0:
            replicas = max(0, self.count() - count)
            self._api.set_replicas(self._namespace, self._deployment, replicas)
        return count

    def close(self) -> None:
        """Leaves the Deployment as it is."""
