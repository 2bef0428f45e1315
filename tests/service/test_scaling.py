"""The back-ends of ``feedline autoscale``: the Kubernetes one against a stand-in for the API
server's ``deployments/scale`` (plain HTTP on loopback; no cluster is needed), and the local
one starting and draining a real ``feedline worker``.

What is not tested here: a real API server (TLS with the pod's CA, RBAC), and which pod a real
Deployment stops on a scale-down.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator

import pytest

from feedline import service
from feedline.errors import FailedPreconditionError
from feedline.service.scaling import HttpsKubernetesApi, KubernetesWorkers, LocalWorkers

pytestmark = pytest.mark.timeout(120)


class FakeScale(http.server.BaseHTTPRequestHandler):
    """``/apis/apps/v1/namespaces/NS/deployments/NAME/scale``: GET and merge PATCH."""

    replicas: dict[str, int] = {}
    seen: list[tuple[str, str, str | None, object]] = []

    def _scale(self) -> str | None:
        parts = self.path.strip("/").split("/")
        if len(parts) == 8 and parts[:3] == ["apis", "apps", "v1"] and parts[7] == "scale":
            key = f"{parts[4]}/{parts[6]}"
            return key if key in self.replicas else None
        return None

    def _reply(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        key = self._scale()
        self.seen.append(("GET", self.path, self.headers.get("Authorization"), None))
        if key is None:
            self._reply(404, {"message": "not found"})
        else:
            self._reply(200, {"kind": "Scale", "spec": {"replicas": self.replicas[key]}})

    def do_PATCH(self) -> None:
        key = self._scale()
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("PATCH", self.path, self.headers.get("Content-Type"), body))
        if self.headers.get("Authorization") != "Bearer secret":
            self._reply(403, {"message": "forbidden"})
        elif key is None:
            self._reply(404, {"message": "not found"})
        else:
            self.replicas[key] = body["spec"]["replicas"]
            self._reply(200, {"kind": "Scale", "spec": {"replicas": self.replicas[key]}})

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def api_server() -> Iterator[str]:
    FakeScale.replicas = {"ml/feedline-worker": 2}
    FakeScale.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeScale)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(10)


def test_kubernetes_sets_the_deployment_s_replicas(api_server: str) -> None:
    workers = KubernetesWorkers("feedline-worker", "ml", HttpsKubernetesApi(api_server, "secret"))
    assert workers.count() == 2
    workers.scale_up(3)
    assert FakeScale.replicas["ml/feedline-worker"] == 5
    # Only as many as there are workers that may drain.
    assert workers.scale_down(4, ["10.0.0.1:5051", "10.0.0.2:5051"]) == 2
    assert FakeScale.replicas["ml/feedline-worker"] == 3
    patch = [s for s in FakeScale.seen if s[0] == "PATCH"][-1]
    assert patch[1] == "/apis/apps/v1/namespaces/ml/deployments/feedline-worker/scale"
    assert patch[2] == "application/merge-patch+json" and patch[3] == {"spec": {"replicas": 3}}
    assert workers.owns("anything:1")


def test_kubernetes_errors_say_what_to_fix(api_server: str) -> None:
    missing = KubernetesWorkers("other", "ml", HttpsKubernetesApi(api_server, "secret"))
    with pytest.raises(FailedPreconditionError, match="--namespace and --deployment"):
        missing.count()
    refused = KubernetesWorkers("feedline-worker", "ml", HttpsKubernetesApi(api_server, "wrong"))
    with pytest.raises(FailedPreconditionError, match="deployments/scale"):
        refused.scale_up(1)


def test_local_workers_start_register_and_drain() -> None:
    dispatcher = service.DispatchServer()
    workers = LocalWorkers(dispatcher.target.split("://")[1], drain_seconds=2.0)
    try:
        workers.scale_up(2)
        assert workers.count() == 2  # starting ones count
        deadline = time.monotonic() + 60
        while len(workers.addresses()) < 2 or len(dispatcher._state.workers) < 2:
            assert time.monotonic() < deadline, "the workers did not register"
            time.sleep(0.1)
        first, second = sorted(workers.addresses())
        assert workers.owns(first) and not workers.owns("127.0.0.1:1")
        assert workers.scale_down(1, ["127.0.0.1:1", second]) == 1
        assert workers.count() == 1 and workers.addresses() == [first]
        while second in dispatcher._state.workers:  # it told the dispatcher it leaves
            assert time.monotonic() < deadline, "the drained worker did not leave"
            time.sleep(0.1)
    finally:
        workers.close()
        dispatcher.stop()
    assert workers.count() == 0
