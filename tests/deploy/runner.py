"""Rendered Kubernetes manifests run as local processes: each pod's container, its command
and environment as the manifests say, on this machine.

``LocalCluster(docs, secrets, root)`` maps what a cluster would provide onto local things:

==========================  =====================================================================
Kubernetes                  here
==========================  =====================================================================
the image's entrypoint      the ``Dockerfile``'s ``ENTRYPOINT``; ``feedline``, ``torchrun`` and
                            ``python`` run in this interpreter (``python -m feedline.cli``,
                            ``python -m torch.distributed.run``)
a PersistentVolumeClaim     a folder under ``root`` per claim and pod, kept across restarts
an emptyDir                 a fresh folder per pod start
a ConfigMap / Secret volume its files, written from the rendered ConfigMap / the given secrets
an env ``secretKeyRef``     the given secret's value; ``fieldRef`` status.podIP: 127.0.0.1
``$(VAR)`` in arguments     expanded from the container's environment, as the kubelet does
a container port            a free port on 127.0.0.1 per pod (kept when a StatefulSet's pod
                            starts again, new for a Deployment's replacement pod)
a Service ``NAME:PORT``     127.0.0.1 and the local port of a pod it selects
``--bind 0.0.0.0``          127.0.0.1
==========================  =====================================================================

A mount path in an argument or a variable becomes its local folder. Probes run their ``exec``
commands the same way (``probe``), each a short child with the probe's ``timeoutSeconds`` (and
30 s of slack). Every container's process is one of the test launcher's
(``tests.launcher.Processes``): a timeout on each, all killed when the cluster closes.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from tests.deploy.manifests import Doc, Workload, by_kind, workloads
from tests.launcher import Processes, free_port

#: Runs ``sys.argv[1:]`` as a command: ``module NAME ARGS`` or ``path FILE ARGS``.
_COMMAND = """
import runpy, sys
how, target, *args = sys.argv[1:]
sys.argv = [target, *args]
if how == "module":
    runpy.run_module(target, run_name="__main__", alter_sys=True)
else:
    runpy.run_path(target, run_name="__main__")
"""

_MODULES = {"feedline": "feedline.cli", "torchrun": "torch.distributed.run"}
_ADDRESS = re.compile(r"(?P<host>[A-Za-z0-9][A-Za-z0-9.-]*):(?P<port>\d+)")
_VARIABLE = re.compile(r"\$\((?P<name>[A-Za-z_][A-Za-z0-9_]*)\)")


class Pod:
    """One pod of a workload: its ports, folders and the process of its container."""

    def __init__(self, workload: Workload, name: str, labels: dict[str, str]) -> None:
        self.workload = workload
        self.name = name
        self.labels = labels
        self.ports = {
            int(p["containerPort"]): free_port() for p in workload.container.get("ports", [])
        }
        self.named_ports = {
            p["name"]: int(p["containerPort"])
            for p in workload.container.get("ports", [])
            if "name" in p
        }
        self.process: Processes | None = None
        self.env: dict[str, str] = {}
        self.paths: dict[str, Path] = {}
        self.starts = 0

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll(self.name) is None

    def local_port(self, port: int | str) -> int:
        number = self.named_ports[port] if isinstance(port, str) else int(port)
        return self.ports[number]


class LocalCluster:
    """Runs the pods of rendered manifests as local processes (see the module docstring).

    Args:
      docs: the rendered documents (``manifests.render``).
      secrets: each Secret's name and its keys' values.
      root: a folder for volumes.
      timeout: the longest any process may live.
    """

    def __init__(
        self,
        docs: list[Doc],
        secrets: Mapping[str, Mapping[str, bytes]],
        root: Path,
        timeout: float = 240.0,
    ) -> None:
        self.docs = docs
        self.secrets = secrets
        self.root = root
        self.timeout = timeout
        self.workloads = {w.name: w for w in workloads(docs)}
        self.pods: dict[str, Pod] = {}
        self._stack = contextlib.ExitStack()
        self._counts: dict[str, int] = {}
        self._uids: dict[str, str] = {}

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    # Starting and stopping pods.

    def start(self, workload: str, *, replace: Doc | None = None) -> Pod:
        """Starts a new pod of ``workload``: a StatefulSet's next ordinal (``NAME-0``), a
        Deployment's or Job's pod with a new name. ``replace`` patches its container (a test
        that changes one argument says so with it)."""
        spec = self.workloads[workload]
        if replace is not None:
            doc = {**spec.doc}
            template = {**doc["spec"]["template"]}
            pod_spec = {**template["spec"], "containers": [{**spec.container, **replace}]}
            doc["spec"] = {**doc["spec"], "template": {**template, "spec": pod_spec}}
            spec = Workload(doc)
        index = self._counts.get(workload, 0)
        self._counts[workload] = index + 1
        name = (
            f"{workload}-{index}"
            if spec.kind == "StatefulSet"
            else f"{workload}-{uuid.uuid4().hex[:5]}"
        )
        labels = dict(spec.labels)
        if spec.kind == "Job":
            uid = self._uids.setdefault(workload, str(uuid.uuid4()))
            labels.update({"controller-uid": uid, "job-name": workload})
        pod = Pod(spec, name, labels)
        self.pods[name] = pod
        self._run(pod)
        return pod

    def start_all(self, workload: str) -> list[Pod]:
        """Starts the workload's ``replicas`` pods."""
        return [self.start(workload) for _ in range(self.workloads[workload].replicas)]

    def restart(self, pod: Pod) -> None:
        """Starts ``pod`` again after its process ended (a StatefulSet pod: same name, ports
        and claims; emptyDirs are new)."""
        if pod.running:
            raise AssertionError(f"{pod.name} is still running")
        self._run(pod)

    def kill(self, pod: Pod, sig: int = signal.SIGKILL) -> None:
        assert pod.process is not None
        pod.process.send(pod.name, sig)

    def terminate(self, pod: Pod) -> int | None:
        """What the kubelet does to a pod that goes: SIGTERM, then SIGKILL after
        ``terminationGracePeriodSeconds``; its exit code (None: it had to be killed)."""
        assert pod.process is not None
        grace = float(pod.workload.pod.get("terminationGracePeriodSeconds", 30))
        pod.process.send(pod.name, signal.SIGTERM)
        code = pod.process.wait_exit(pod.name, timeout=grace)
        if code is None:
            pod.process.send(pod.name, signal.SIGKILL)
            pod.process.wait_exit(pod.name, timeout=10)
        return code

    def wait_exit(self, pod: Pod, timeout: float) -> int | None:
        assert pod.process is not None
        return pod.process.wait_exit(pod.name, timeout)

    def output(self, pod: Pod, stream: str = "stdout") -> str:
        assert pod.process is not None
        return pod.process.output(pod.name, stream)

    def wait_for_line(self, pod: Pod, prefix: str, timeout: float = 60.0) -> str:
        assert pod.process is not None
        return pod.process.wait_for_line(pod.name, prefix, timeout=timeout)

    # Probes and services.

    def probe(
        self, pod: Pod, kind: str = "readinessProbe", env: Mapping[str, str] | None = None
    ) -> tuple[int, str]:
        """Runs the pod's ``exec`` probe ``kind`` once: its exit code and stderr."""
        import subprocess

        probe = pod.workload.container[kind]
        argv = self._argv(pod, [str(w) for w in probe["exec"]["command"]])
        done = subprocess.run(
            argv,
            env={**os.environ, **pod.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=float(probe.get("timeoutSeconds", 1)) + 30,
        )
        return done.returncode, done.stderr

    def wait_ready(self, pod: Pod, timeout: float = 60.0) -> None:
        """Runs the readiness probe until it passes; fails if the pod ends or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            if not pod.running:
                raise AssertionError(f"{pod.name} ended before it was ready:\n{self._dump(pod)}")
            code, why = self.probe(pod)
            if code == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{pod.name} not ready after {timeout} s: {why}\n{self._dump(pod)}"
                )
            time.sleep(0.5)

    def service_address(self, name: str, port: str | int) -> str:
        """``127.0.0.1:PORT``: the local address of Service ``name``'s ``port`` (its name or
        number), on the first running pod it selects."""
        (service,) = [s for s in by_kind(self.docs, "Service") if s["metadata"]["name"] == name]
        (spec,) = [p for p in service["spec"]["ports"] if port in (p.get("name"), p["port"])]
        selector = service["spec"]["selector"]
        pods = [
            p for p in self.pods.values() if all(p.labels.get(k) == v for k, v in selector.items())
        ]
        running = [p for p in pods if p.running] or pods
        if not running:
            raise AssertionError(f"Service {name} selects no pod that was started")
        return f"127.0.0.1:{running[0].local_port(spec.get('targetPort', spec['port']))}"

    def env_of(self, workload: str) -> dict[str, str]:
        """The environment a new pod of ``workload`` would get (no process started): for
        a test's own client in that pod's place."""
        pod = Pod(
            self.workloads[workload], f"{workload}-client", dict(self.workloads[workload].labels)
        )
        self._prepare(pod)
        return pod.env

    # The mapping.

    def _run(self, pod: Pod) -> None:
        self._prepare(pod)
        argv = self._argv(pod, pod.workload.argv)
        if argv[0] != sys.executable:
            raise AssertionError(f"{pod.name}: cannot run {argv[0]!r} here")
        how = ["module", *argv[2:]] if argv[1] == "-m" else ["path", *argv[1:]]
        pod.process = self._stack.enter_context(
            Processes(_COMMAND, [(pod.name, pod.env)], argv=how, timeout=self.timeout)
        )

    def _prepare(self, pod: Pod) -> None:
        pod.starts += 1
        paths: dict[str, Path] = {}
        volumes = {v["name"]: v for v in pod.workload.pod.get("volumes", [])}
        claims = {
            t["metadata"]["name"] for t in pod.workload.doc["spec"].get("volumeClaimTemplates", [])
        }
        for mount in pod.workload.container.get("volumeMounts", []):
            volume = volumes.get(mount["name"], {})
            if mount["name"] in claims or "persistentVolumeClaim" in volume:
                claim = volume.get("persistentVolumeClaim", {}).get(
                    "claimName", f"{mount['name']}-{pod.name}"
                )
                local = self.root / "claims" / claim
            else:
                local = self.root / "pods" / f"{pod.name}.{pod.starts}" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                self._write_config_map(volume["configMap"], local)
            elif "secret" in volume:
                self._write_secret(volume["secret"], local)
            paths[mount["mountPath"]] = local
        pod.paths = paths
        env: dict[str, str] = {}
        for variable in pod.workload.container.get("env", []):
            env[variable["name"]] = self._value(pod, variable, env)
        pod.env = {name: self._local(pod, value) for name, value in env.items()}

    def _value(self, pod: Pod, variable: Doc, env: dict[str, str]) -> str:
        if "value" in variable:
            return _expand(str(variable["value"]), env)
        source = variable["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            return self.secrets[ref["name"]][ref["key"]].decode()
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            if path == "status.podIP":
                return "127.0.0.1"
            if path == "metadata.name":
                return pod.name
            label = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
            if label:
                return pod.labels.get(label.group(1), "")
        raise AssertionError(f"{pod.name}: cannot provide {variable}")

    def _write_config_map(self, ref: Doc, folder: Path) -> None:
        (config,) = [
            c for c in by_kind(self.docs, "ConfigMap") if c["metadata"]["name"] == ref["name"]
        ]
        for key, text in config.get("data", {}).items():
            (folder / key).write_text(text)

    def _write_secret(self, ref: Doc, folder: Path) -> None:
        for key, value in self.secrets[ref["secretName"]].items():
            path = folder / key
            path.write_bytes(value)
            path.chmod(int(ref.get("defaultMode", 0o644)) & 0o600 | 0o400)

    def _argv(self, pod: Pod, words: list[str]) -> list[str]:
        argv = [self._local(pod, _expand(word, pod.env)) for word in words]
        argv = ["127.0.0.1" if word == "0.0.0.0" else word for word in argv]
        for index in range(1, len(argv)):  # --port 5050: the pod's local port
            if (
                argv[index - 1].startswith("--")
                and argv[index].isdigit()
                and int(argv[index]) in pod.ports
            ):
                argv[index] = str(pod.ports[int(argv[index])])
        program = Path(argv[0]).name
        if program in _MODULES:
            return [sys.executable, "-m", _MODULES[program], *argv[1:]]
        if program in ("python", "python3"):
            return [sys.executable, *argv[1:]]
        return argv

    def _local(self, pod: Pod, word: str) -> str:
        """``word`` with mount paths as local folders and addresses as local ones."""
        for mount in sorted(pod.paths, key=len, reverse=True):
            if word == mount or word.startswith(mount + "/"):
                word = str(pod.paths[mount]) + word[len(mount) :]
                break
        return _ADDRESS.sub(lambda match: self._address(pod, match), word)

    def _address(self, pod: Pod, match: re.Match[str]) -> str:
        host, port = match.group("host"), int(match.group("port"))
        if host in ("127.0.0.1", "localhost", "0.0.0.0") and port in pod.ports:
            return f"127.0.0.1:{pod.ports[port]}"
        service = host.split(".")[0]
        if any(s["metadata"]["name"] == service for s in by_kind(self.docs, "Service")):
            return self.service_address(service, port)
        return match.group(0)

    def _dump(self, pod: Pod) -> str:
        if pod.process is None:
            return ""
        return f"stdout:\n{self.output(pod)[-3000:]}\nstderr:\n{self.output(pod, 'stderr')[-5000:]}"


def _expand(word: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` replaced by its value, as the kubelet does (unknown ones are left)."""
    return _VARIABLE.sub(lambda m: env.get(m.group("name"), m.group(0)), word)
