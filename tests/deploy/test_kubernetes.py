"""deploy/kubernetes: every overlay renders (``kubectl kustomize``) and keeps the invariants of
``manifests.violations``; overlays that break them are refused; the probes' paths and the
autoscaler's metric exist on real status servers; and the rendered pods, run as local
processes (``runner.LocalCluster``), serve a chaos round with every element exactly once, drain
on SIGTERM within their grace period, and feed the example torchrun trainer."""

from __future__ import annotations

import http.server
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from tests.deploy import manifests
from tests.deploy.runner import LocalCluster, Pod
from tests.launcher import Processes

pytest.importorskip("yaml")


def _render(path: Path) -> list[manifests.Doc]:
    try:
        return manifests.render(path)
    except manifests.KubectlMissing as missing:
        pytest.skip(str(missing))


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[manifests.Doc]]:
    return {overlay.name: _render(overlay) for overlay in manifests.OVERLAYS}


def test_there_are_dev_and_production_overlays() -> None:
    assert {p.name for p in manifests.OVERLAYS} >= {"dev", "production"}


@pytest.mark.parametrize("overlay", [p.name for p in manifests.OVERLAYS])
def test_overlay_keeps_the_invariants(
    overlay: str, rendered: dict[str, list[manifests.Doc]]
) -> None:
    docs = rendered[overlay]
    assert manifests.violations(docs) == []
    (dispatcher,) = [w for w in manifests.workloads(docs) if w.role == "dispatcher"]
    assert (dispatcher.kind, dispatcher.replicas) == ("StatefulSet", 1)
    work_dir = dispatcher.option("--work-dir")
    assert work_dir is not None
    mount = dispatcher.mount_of(work_dir)
    assert mount is not None and "volumeClaimTemplate" in mount[1]
    assert any(
        w.name == "feedline-trainer" and w.argv[0] == "torchrun" for w in manifests.workloads(docs)
    )


def test_production_has_tls_and_the_autoscaler(rendered: dict[str, list[manifests.Doc]]) -> None:
    docs = rendered["production"]
    for workload in manifests.workloads(docs):
        env = {e["name"]: e for e in workload.container["env"]}
        assert {"FEEDLINE_TLS_CERT", "FEEDLINE_TLS_KEY", "FEEDLINE_TLS_CA"} <= set(env), (
            workload.name
        )
        if workload.role is not None:
            assert all(
                url.startswith("https://") for url in manifests.probe_urls(workload).values()
            )
    assert manifests.hpa_metric_names(docs) == ["feedline_dispatcher_desired_workers"]


BAD_OVERLAYS = {
    "two dispatchers on one journal": (
        """
        apiVersion: apps/v1
        kind: StatefulSet
        metadata:
          name: feedline-dispatcher
        spec:
          replicas: 2
        """,
        "replicas 2, must be 1: two dispatchers on one journal",
    ),
    "the journal on an emptyDir": (
        """
        apiVersion: apps/v1
        kind: StatefulSet
        metadata:
          name: feedline-dispatcher
        spec:
          template:
            spec:
              containers:
                - name: dispatcher
                  volumeMounts:
                    - name: scratch
                      mountPath: /var/lib/feedline/dispatcher
              volumes:
                - name: scratch
                  emptyDir: {}
        """,
        "is not on a PersistentVolumeClaim",
    ),
    "a grace period shorter than the drain": (
        """
        apiVersion: apps/v1
        kind: Deployment
        metadata:
          name: feedline-worker
        spec:
          template:
            spec:
              terminationGracePeriodSeconds: 5
        """,
        "terminationGracePeriodSeconds 5 < --drain-seconds 30",
    ),
    "a worker as root": (
        """
        apiVersion: apps/v1
        kind: Deployment
        metadata:
          name: feedline-worker
        spec:
          template:
            spec:
              securityContext:
                runAsUser: 0
        """,
        "may run as root",
    ),
}


@pytest.mark.parametrize("case", list(BAD_OVERLAYS))
def test_an_overlay_that_breaks_an_invariant_is_refused(case: str, tmp_path: Path) -> None:
    patch, expected = BAD_OVERLAYS[case]
    (tmp_path / "patch.yaml").write_text(textwrap.dedent(patch))
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"bases:\n  - {os.path.relpath(manifests.KUBERNETES / 'overlays' / 'dev', tmp_path)}\n"
        "patchesStrategicMerge:\n  - patch.yaml\n"
    )
    found = manifests.violations(_render(tmp_path))
    assert any(expected in line for line in found), found


def _get(url: str, token: str) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""


def test_probe_paths_and_the_hpa_metric_exist_on_real_status_servers(
    rendered: dict[str, list[manifests.Doc]],
) -> None:
    from feedline import service

    token = secrets.token_hex(16)
    dispatcher = service.DispatchServer(service.DispatcherConfig(status_port=0, token=token))
    address = dispatcher.target.split("://")[1]
    worker = service.WorkerServer(
        service.WorkerConfig(dispatcher_address=address, status_port=0, token=token)
    )
    try:
        status = {"dispatcher": dispatcher.status_url, "worker": worker.status_url}
        checked = set()
        for docs in rendered.values():
            for workload in manifests.workloads(docs):
                if workload.role is None:
                    continue
                for url in manifests.probe_urls(workload).values():
                    path = urllib.parse.urlsplit(url).path
                    base = str(status[workload.role]).rstrip("/")
                    assert _get(base + path, token)[0] == 200, (workload.role, path)
                    assert _get(base + path, "wrong")[0] == 401, (workload.role, path)
                    checked.add((workload.role, path))
        assert {role for role, _ in checked} == {"dispatcher", "worker"}
        _, text = _get(str(dispatcher.status_url).rstrip("/") + "/metrics", token)
        exported = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
        for docs in rendered.values():
            for name in manifests.hpa_metric_names(docs):
                assert name in exported, f"{name} is not on the dispatcher's /metrics: {exported}"
    finally:
        worker.stop()
        dispatcher.stop()


def test_the_dockerfile_runs_the_feedline_command_as_a_user() -> None:
    lines = [line.strip() for line in manifests.DOCKERFILE.read_text().splitlines()]
    (base,) = [line for line in lines if line.startswith("FROM ")]
    assert base.startswith("FROM python:") and base.endswith("-slim")
    (user,) = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert user.split(":")[0] not in ("root", "0")
    assert lines.index(next(line for line in lines if line.startswith("USER "))) > max(
        i for i, line in enumerate(lines) if line.startswith("RUN ")
    ), "USER must come after the last RUN"
    scripts = tomllib.loads((manifests.ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert manifests.entrypoint() == ["feedline"] and "feedline" in scripts
    install = next(line for line in lines if "pip install" in line)
    assert '".[torch' in install
    ignored = (manifests.ROOT / ".dockerignore").read_text().splitlines()
    assert "!src/" in ignored and "!pyproject.toml" in ignored


# The local runs: the rendered pods as processes.

CONSUMER = """
import os, time
from feedline.data import Dataset
from feedline.service import distribute
from tests.launcher import report


def slow(x):
    time.sleep(0.002)
    return x


dataset = Dataset.range(int(os.environ["ELEMENTS"])).map(slow).apply(
    distribute("distributed_epoch", os.environ["DISPATCHER"], job_name="chaos"))
with open(os.environ["OUT"], "w", buffering=1) as out:
    for x in dataset:
        out.write(f"{int(x)}\\n")
report("end")
"""


def _lines(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _start_service(cluster: LocalCluster, workers: int) -> tuple[Pod, list[Pod]]:
    (dispatcher,) = cluster.start_all("feedline-dispatcher")
    cluster.wait_for_line(dispatcher, "feedline dispatcher serving at ")
    cluster.wait_ready(dispatcher)
    pods = [cluster.start("feedline-worker") for _ in range(workers)]
    for pod in pods:
        cluster.wait_ready(pod)
        code, why = cluster.probe(pod, "livenessProbe")
        assert code == 0, why
    code, why = cluster.probe(dispatcher, "livenessProbe")
    assert code == 0, why
    return dispatcher, pods


def _token_secret() -> dict[str, bytes]:
    # As a file-backed Secret usually holds it: with a trailing newline (stripped by feedline).
    return {"token": secrets.token_hex(16).encode() + b"\n"}


@pytest.mark.timeout(300)
def test_dev_overlay_runs_locally_and_loses_nothing_under_kills(
    rendered: dict[str, list[manifests.Doc]], tmp_path: Path
) -> None:
    """The dispatcher (StatefulSet) and a worker (Deployment) are killed with SIGKILL mid-epoch
    and replaced as Kubernetes would (the dispatcher on its claim, the worker by a new pod):
    the consumer still reads every element exactly once. Then a worker leaves on SIGTERM,
    drained within its grace period (exit code 0)."""
    elements = 4000
    secret = {"feedline-token": _token_secret()}
    with LocalCluster(rendered["dev"], secret, tmp_path / "cluster") as cluster:
        dispatcher, workers = _start_service(cluster, cluster.workloads["feedline-worker"].replicas)
        out = tmp_path / "read.txt"
        env = {
            **cluster.env_of("feedline-trainer"),
            "DISPATCHER": cluster.service_address("feedline-dispatcher", "grpc"),
            "ELEMENTS": str(elements),
            "OUT": str(out),
        }
        with Processes(CONSUMER, [("consumer", env)], timeout=200) as consumer:
            deadline = time.monotonic() + 120
            while len(_lines(out)) < elements // 3:
                assert consumer.poll("consumer") is None, consumer.output("consumer", "stderr")
                assert time.monotonic() < deadline, "the consumer made no progress"
                time.sleep(0.05)
            cluster.kill(dispatcher)
            cluster.kill(workers[0])
            assert cluster.wait_exit(dispatcher, 30) is not None
            cluster.restart(dispatcher)
            cluster.wait_for_line(dispatcher, "feedline dispatcher serving at ")
            replacement = cluster.start("feedline-worker")
            cluster.wait_ready(dispatcher)
            (result,) = consumer.wait().values()
        assert result.result == "end", result.describe()
        counts = Counter(_lines(out))
        assert sorted(counts) == list(range(elements))
        assert [x for x, n in counts.items() if n > 1] == []
        cluster.wait_ready(replacement)
        grace = cluster.workloads["feedline-worker"].pod["terminationGracePeriodSeconds"]
        started = time.monotonic()
        assert cluster.terminate(workers[1]) == 0, cluster.output(workers[1], "stderr")[-3000:]
        assert time.monotonic() - started < grace


def _certificates(folder: Path) -> dict[str, bytes]:
    """A CA and one certificate for the DNS name `feedline` (serverAuth and clientAuth), made by
    the openssl commands of docs/deployment.md, as the production overlay's Secret
    `feedline-tls` holds them (cert-manager's keys)."""
    doc = (manifests.ROOT / "docs" / "deployment.md").read_text()
    (block,) = [
        b for b in re.findall(r"```bash\n(.*?)```", doc, re.DOTALL) if "openssl req -x509" in b
    ]
    commands = block.split("\nkubectl ")[0]  # what runs before the cluster is called
    subprocess.run(
        ["bash", "-euc", commands], check=True, capture_output=True, timeout=120, cwd=folder
    )
    return {name: (folder / name).read_bytes() for name in ("tls.crt", "tls.key", "ca.crt")}


@pytest.mark.timeout(240)
def test_production_overlay_runs_locally_with_mutual_tls_and_the_token(
    rendered: dict[str, list[manifests.Doc]], tmp_path: Path
) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed, so no certificates can be made for the test")
    (tmp_path / "certs").mkdir()
    secret = {"feedline-token": _token_secret(), "feedline-tls": _certificates(tmp_path / "certs")}
    with LocalCluster(rendered["production"], secret, tmp_path / "cluster") as cluster:
        dispatcher, (worker,) = _start_service(cluster, 1)
        # The status pages need the token and a client certificate: the probes bring both.
        assert cluster.probe(worker, env={"FEEDLINE_SERVICE_TOKEN": ""})[0] == 1
        no_certificate = {"FEEDLINE_TLS_CERT": "", "FEEDLINE_TLS_KEY": ""}
        assert cluster.probe(dispatcher, env=no_certificate)[0] == 1
        out = tmp_path / "read.txt"
        env = {
            **cluster.env_of("feedline-trainer"),
            "DISPATCHER": cluster.service_address("feedline-dispatcher", "grpc"),
            "ELEMENTS": "300",
            "OUT": str(out),
        }
        with Processes(CONSUMER, [("consumer", env)], timeout=120) as consumer:
            (result,) = consumer.wait().values()
        assert result.result == "end", result.describe()
        assert sorted(_lines(out)) == list(range(300))


@pytest.mark.timeout(300)
def test_the_example_trainer_job_reads_the_service(
    rendered: dict[str, list[manifests.Doc]], tmp_path: Path
) -> None:
    """The trainer Job's container as rendered (torchrun, two processes), with a smaller
    epoch: together its ranks train on every example once."""
    pytest.importorskip("torch")
    examples = 640
    secret = {"feedline-token": _token_secret()}
    with LocalCluster(rendered["dev"], secret, tmp_path / "cluster") as cluster:
        _start_service(cluster, 1)
        args = [str(word) for word in cluster.workloads["feedline-trainer"].container["args"]]
        args[args.index("--examples") + 1] = str(examples)
        trainer = cluster.start("feedline-trainer", replace={"args": args})
        code = cluster.wait_exit(trainer, timeout=240)
        output = cluster.output(trainer)
        assert code == 0, output[-3000:] + cluster.output(trainer, "stderr")[-5000:]
    ranks = [json.loads(line) for line in output.splitlines() if line.startswith('{"rank"')]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert sum(r["examples"] for r in ranks) == examples
    assert sum(r["index_sum"] for r in ranks) == examples * (examples - 1) // 2
    assert f"trained on {examples} examples" in output


def test_the_prometheus_adapter_serves_the_metric_the_autoscaler_reads(
    rendered: dict[str, list[manifests.Doc]],
) -> None:
    import yaml

    folder = manifests.KUBERNETES / "prometheus"
    values = yaml.safe_load((folder / "adapter-values.yaml").read_text())
    served = {rule["name"]["as"] for rule in values["rules"]["external"]}
    for docs in rendered.values():
        assert set(manifests.hpa_metric_names(docs)) <= served
    (job,) = yaml.safe_load((folder / "scrape-config.yaml").read_text())
    assert job["authorization"]["credentials_file"].endswith("/token")
    assert job["tls_config"]["server_name"] == "feedline"


@pytest.mark.parametrize(("age", "ready"), [("3.5", True), ("20.0", False), ("-1.0", False)])
def test_the_worker_readiness_probe_follows_its_heartbeats(age: str, ready: bool) -> None:
    """Readiness (``--max-heartbeat-age 15``) fails for a worker whose dispatcher has not
    answered for longer, or ever; liveness does not look (a worker waiting for its dispatcher is
    not restarted for it)."""
    body = f"feedline_worker_tasks 0.0\nfeedline_worker_seconds_since_heartbeat {age}\n".encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    probe = manifests.KUBERNETES / "base" / "probe.py"
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        readiness = subprocess.run(
            [sys.executable, str(probe), url, "--max-heartbeat-age", "15"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        liveness = subprocess.run(
            [sys.executable, str(probe), url], capture_output=True, text=True, timeout=60
        )
    finally:
        server.shutdown()
        server.server_close()
    assert (readiness.returncode == 0) == ready, readiness.stderr
    assert liveness.returncode == 0, liveness.stderr
