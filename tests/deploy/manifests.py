"""The Kubernetes manifests of ``deploy/kubernetes``, rendered and read: what the deploy tests
check and what ``runner.LocalCluster`` starts.

``render(path)`` runs ``kubectl kustomize`` (``KubectlMissing`` where there is none) and returns
the documents; ``violations(docs)`` lists every invariant a rendering breaks, in words (empty
when it keeps them all):

* exactly one dispatcher: a StatefulSet of 1 (two dispatchers on one journal would hand out
  the same splits twice), in fault-tolerant mode, its ``--work-dir`` on a PersistentVolumeClaim;
* every server off loopback without ``--insecure``, its token from a Secret (never a literal), its
  TLS files (if any) on a mounted Secret volume;
* readiness and liveness probes on the status port; workers: a memory-backed ``/dev/shm``, a
  grace period that covers ``--drain-seconds``, a PodDisruptionBudget; a NetworkPolicy for
  each server; resource requests everywhere; no container that may run as root.

``probe_urls`` and ``hpa_metric_names`` return what the tests then check against a real status
server (the paths exist, the metric is exported).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p for p in (KUBERNETES / "overlays").iterdir() if p.is_dir())
DOCKERFILE = ROOT / "Dockerfile"

#: What ``--drain-seconds`` is when a worker's arguments do not say (``feedline worker``'s default).
DEFAULT_DRAIN_SECONDS = 10.0

Doc = dict[str, Any]


class KubectlMissing(RuntimeError):
    """No ``kubectl`` on this machine (the tests skip and say so)."""


def render(path: Path) -> list[Doc]:
    """The documents of ``kubectl kustomize PATH``."""
    import yaml

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise KubectlMissing(
            "kubectl is not installed (Debian: apt-get install kubernetes-client), so the "
            "kustomize overlays cannot be rendered"
        )
    done = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {path} failed:\n{done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def entrypoint(dockerfile: Path = DOCKERFILE) -> list[str]:
    """The image's ``ENTRYPOINT`` (exec form), what a container without ``command`` runs."""
    for line in dockerfile.read_text().splitlines():
        if line.startswith("ENTRYPOINT "):
            value = json.loads(line.removeprefix("ENTRYPOINT "))
            assert isinstance(value, list), "ENTRYPOINT must be in exec form"
            return [str(word) for word in value]
    raise AssertionError(f"{dockerfile} has no ENTRYPOINT")


@dataclasses.dataclass(frozen=True)
class Workload:
    """A StatefulSet, Deployment or Job, and its one container."""

    doc: Doc

    @property
    def kind(self) -> str:
        return str(self.doc["kind"])

    @property
    def name(self) -> str:
        return str(self.doc["metadata"]["name"])

    @property
    def pod(self) -> Doc:
        return dict(self.doc["spec"]["template"]["spec"])

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.doc["spec"]["template"]["metadata"].get("labels", {}))

    @property
    def container(self) -> Doc:
        (container,) = self.pod["containers"]
        return dict(container)

    @property
    def replicas(self) -> int:
        return int(self.doc["spec"].get("replicas", 1))

    @property
    def argv(self) -> list[str]:
        """The command and arguments it runs (the image's entrypoint without ``command``)."""
        container = self.container
        command = container.get("command") or entrypoint()
        return [str(word) for word in (*command, *container.get("args", []))]

    @property
    def role(self) -> str | None:
        """``"dispatcher"``, ``"worker"`` (``feedline dispatcher``/``worker``) or None."""
        argv = self.argv
        if len(argv) > 1 and Path(argv[0]).name == "feedline":
            return argv[1] if argv[1] in ("dispatcher", "worker") else None
        return None

    def option(self, name: str) -> str | None:
        """The value of ``--name VALUE`` (or ``--name=VALUE``) in its arguments, else None."""
        argv = self.argv
        for index, word in enumerate(argv):
            if word == name and index + 1 < len(argv):
                return argv[index + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
        return None

    def mounts(self) -> dict[str, Doc]:
        """Each mount path and the volume behind it (``{"persistentVolumeClaim": ...}``, a
        ``volumeClaimTemplates`` entry as ``{"volumeClaimTemplate": ...}``)."""
        volumes = {v["name"]: v for v in self.pod.get("volumes", [])}
        for template in self.doc["spec"].get("volumeClaimTemplates", []):
            volumes[template["metadata"]["name"]] = {"volumeClaimTemplate": template}
        return {
            m["mountPath"]: volumes.get(m["name"], {})
            for m in self.container.get("volumeMounts", [])
        }

    def mount_of(self, path: str) -> tuple[str, Doc] | None:
        """The mount that ``path`` lies under (the longest), or None."""
        found = [(m, v) for m, v in self.mounts().items() if path == m or path.startswith(m + "/")]
        return max(found, key=lambda item: len(item[0])) if found else None


def workloads(docs: list[Doc]) -> list[Workload]:
    return [Workload(d) for d in docs if d["kind"] in ("StatefulSet", "Deployment", "Job")]


def by_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def probe_urls(workload: Workload) -> dict[str, str]:
    """Each probe of the container (``readinessProbe``, ``livenessProbe``) as the URL it
    requests: an ``exec`` probe's ``http(s)://`` argument, or an ``httpGet``'s path and port."""
    urls = {}
    for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
        probe = workload.container.get(kind)
        if not probe:
            continue
        if "httpGet" in probe:
            get = probe["httpGet"]
            scheme = str(get.get("scheme", "HTTP")).lower()
            urls[kind] = f"{scheme}://127.0.0.1:{get['port']}{get.get('path', '/')}"
        else:
            found = [w for w in probe["exec"]["command"] if re.match(r"https?://", str(w))]
            urls[kind] = found[0] if found else ""
    return urls


def hpa_metric_names(docs: list[Doc]) -> list[str]:
    """The metric names of every HorizontalPodAutoscaler (External and Pods metrics)."""
    names = []
    for hpa in by_kind(docs, "HorizontalPodAutoscaler"):
        for metric in hpa["spec"].get("metrics", []):
            kind = metric["type"]
            if kind in ("External", "Pods"):
                names.append(metric[kind[0].lower() + kind[1:]]["metric"]["name"])
    return names


def _selects(selector: Doc, labels: dict[str, str]) -> bool:
    wanted = selector.get("matchLabels", {})
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


def violations(docs: list[Doc]) -> list[str]:
    """Every invariant of the module docstring that ``docs`` break, in words."""
    found: list[str] = []
    servers = [w for w in workloads(docs) if w.role is not None]
    dispatchers = [w for w in servers if w.role == "dispatcher"]
    workers = [w for w in servers if w.role == "worker"]
    if len(dispatchers) != 1:
        found.append(
            f"{len(dispatchers)} dispatcher workloads ({[w.name for w in dispatchers]}): there "
            "must be exactly one, or two dispatchers share jobs and journals"
        )
    for dispatcher in dispatchers:
        found += _dispatcher_violations(dispatcher)
    if not workers:
        found.append("no worker workload")
    for worker in workers:
        found += _worker_violations(worker, docs)
    for workload in workloads(docs):
        found += _pod_violations(workload)
    for server in servers:
        found += _server_violations(server, docs)
    for hpa in by_kind(docs, "HorizontalPodAutoscaler"):
        target = hpa["spec"]["scaleTargetRef"]
        if (target["kind"], target["name"]) not in {(w.kind, w.name) for w in workers}:
            found.append(f"HorizontalPodAutoscaler {hpa['metadata']['name']} scales {target}, "
                         "not a worker workload")  # fmt: skip
        if any(w.kind == "StatefulSet" and w.name == target["name"] for w in dispatchers):
            found.append("a HorizontalPodAutoscaler scales the dispatcher")
    return found


def _dispatcher_violations(dispatcher: Workload) -> list[str]:
    found = []
    name = f"dispatcher {dispatcher.kind} {dispatcher.name}"
    if dispatcher.kind != "StatefulSet":
        found.append(f"{name}: must be a StatefulSet (one pod at a time, a stable volume)")
    if dispatcher.replicas != 1:
        found.append(
            f"{name}: replicas {dispatcher.replicas}, must be 1: two dispatchers on one journal "
            "would hand out the same splits twice"
        )
    if "--fault-tolerant" not in dispatcher.argv:
        found.append(f"{name}: no --fault-tolerant (its journal keeps jobs across restarts)")
    work_dir = dispatcher.option("--work-dir")
    mount = None if work_dir is None else dispatcher.mount_of(work_dir)
    if work_dir is None or mount is None:
        found.append(f"{name}: --work-dir {work_dir} is not on a mounted volume")
    elif not ({"persistentVolumeClaim", "volumeClaimTemplate"} & set(mount[1])):
        found.append(f"{name}: its journal ({work_dir}) is not on a PersistentVolumeClaim")
    return found


def _worker_violations(worker: Workload, docs: list[Doc]) -> list[str]:
    found = []
    name = f"worker {worker.kind} {worker.name}"
    drain = float(worker.option("--drain-seconds") or DEFAULT_DRAIN_SECONDS)
    grace = float(worker.pod.get("terminationGracePeriodSeconds", 30))
    if grace < drain:
        found.append(
            f"{name}: terminationGracePeriodSeconds {grace:g} < --drain-seconds {drain:g}: a "
            "worker would be killed in the middle of its drain"
        )
    shm = worker.mounts().get("/dev/shm", {})
    if shm.get("emptyDir", {}).get("medium") != "Memory":
        found.append(f"{name}: /dev/shm is not an emptyDir of medium Memory")
    if not any(_selects(p["spec"]["selector"], worker.labels)
               for p in by_kind(docs, "PodDisruptionBudget")):  # fmt: skip
        found.append(f"{name}: no PodDisruptionBudget selects its pods")
    return found


def _server_violations(server: Workload, docs: list[Doc]) -> list[str]:
    found = []
    name = f"{server.role} {server.kind} {server.name}"
    urls = probe_urls(server)
    status = server.option("--status-port")
    for kind in ("readinessProbe", "livenessProbe"):
        url = urls.get(kind)
        if not url:
            found.append(f"{name}: no {kind} on the status page")
        elif status is None or f":{status}/" not in url:
            found.append(f"{name}: {kind} {url} is not on --status-port {status}")
    if "--insecure" in server.argv:
        found.append(f"{name}: --insecure (anyone who reaches the port runs code)")
    if server.option("--bind") in (None, "127.0.0.1", "localhost"):
        found.append(f"{name}: bound to loopback, other pods cannot reach it")
    if not any(_selects(p["spec"]["podSelector"], server.labels)
               for p in by_kind(docs, "NetworkPolicy")):  # fmt: skip
        found.append(f"{name}: no NetworkPolicy selects its pods")
    return found


def _pod_violations(workload: Workload) -> list[str]:
    found = []
    name = f"{workload.kind} {workload.name}"
    pod, container = workload.pod, workload.container
    pod_security = pod.get("securityContext", {})
    security = {**pod_security, **container.get("securityContext", {})}
    if not security.get("runAsNonRoot") or security.get("runAsUser", 0) == 0:
        found.append(f"{name}: may run as root (runAsNonRoot and a runAsUser other than 0)")
    if security.get("privileged") or security.get("allowPrivilegeEscalation", True):
        found.append(f"{name}: privileged, or allows privilege escalation")
    requests = container.get("resources", {}).get("requests", {})
    if not {"cpu", "memory"} <= set(requests):
        found.append(f"{name}: no cpu and memory requests ({requests})")
    env = {e["name"]: e for e in container.get("env", [])}
    token = env.get("FEEDLINE_SERVICE_TOKEN")
    if token is None or "secretKeyRef" not in token.get("valueFrom", {}):
        found.append(f"{name}: FEEDLINE_SERVICE_TOKEN does not come from a Secret")
    for variable in ("FEEDLINE_TLS_CERT", "FEEDLINE_TLS_KEY", "FEEDLINE_TLS_CA"):
        if variable in env:
            path = str(env[variable].get("value", ""))
            mount = workload.mount_of(path)
            if mount is None or "secret" not in mount[1]:
                found.append(f"{name}: {variable}={path} is not on a mounted Secret")
    return found
