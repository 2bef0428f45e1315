"""One launcher for every multi-process test: real processes on 127.0.0.1, always cleaned up.

A test gives Python code and a list of process names with their environments (torchrun's
variables, a ``TF_CONFIG``, or anything else); each process runs the code in a fresh interpreter
in its own session, reports a JSON result with ``report(value)``, and is killed (with its
children) if it outlives the timeout or the test. Every process's failure reaches the test with
its stderr, so a rank's traceback is never lost.

A process can also be torchrun's launcher (``torchrun=Torchrun(nproc_per_node, max_restarts)``):
it starts its workers, restarts them all when one fails, and keeps each attempt's output per
worker (``worker_outputs``); the workers report as ``rank:N`` (``reports``).

Servers are processes too: ``FEEDLINE_CLI`` runs the ``feedline`` command line with the
process's ``argv`` (``feedline dispatcher``, ``feedline worker``); ``wait_for_line`` reads a
server's banner, ``send`` signals it (a kill -9, a SIGTERM), ``wait_exit`` takes its exit code.

Example:
  >>> results = run(
  ...     "from tests.launcher import report; import os; report(int(os.environ['RANK']))",
  ...     torchrun_envs(2),
  ... )
  >>> [results[name].result for name in sorted(results)]
  [0, 1]
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_RESULT_DIR = "FEEDLINE_TEST_RESULT_DIR"
_NAME = "FEEDLINE_TEST_NAME"


def report(value: Any) -> None:
    """Called in a launched process: its result for the test, as JSON."""
    name = os.environ.get(_NAME) or f"rank:{os.environ['RANK']}"
    path = Path(os.environ[_RESULT_DIR]) / f"{name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)


#: Code that runs the ``feedline`` command line (what the ``feedline`` script runs) with the
#: process's arguments: ``Processes(FEEDLINE_CLI, [("dispatcher", {})], argv=["dispatcher"])``.
FEEDLINE_CLI = "import sys\nfrom feedline.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def _ephemeral_low() -> int:
    """The first port of the range that the kernel gives outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports handed out by this process: never twice, even after their first user let them go.
_handed_out: set[int] = set()
_port_lock = threading.Lock()


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that nothing listens on now.

    They are drawn below the kernel's ephemeral range, so that a port chosen here is not taken
    by an outgoing connection (which the kernel gives a port of that range) before the server
    it is meant for binds it.
    """
    high = _ephemeral_low()
    low = max(1024, high - 12000)
    chosen: list[int] = []
    with _port_lock:
        while len(chosen) < count:
            port = random.randrange(low, high)
            if port in _handed_out:
                continue
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            chosen.append(port)
    return chosen


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (see ``free_ports``)."""
    return free_ports(1)[0]


def torchrun_envs(world_size: int, port: int | None = None) -> list[tuple[str, dict[str, str]]]:
    """Names and environments of ``world_size`` processes as torchrun starts them on one host."""
    port = port or free_port()
    return [
        (
            f"rank:{rank}",
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            },
        )
        for rank in range(world_size)
    ]


def tf_config_cluster(jobs: Mapping[str, int]) -> dict[str, list[str]]:
    """A ``TF_CONFIG`` cluster of free loopback ports, e.g. ``{"chief": 1, "worker": 2}``."""
    ports = iter(free_ports(sum(jobs.values())))
    return {job: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for job, n in jobs.items()}


def tf_config_envs(
    jobs: Mapping[str, int] | Mapping[str, list[str]],
) -> list[tuple[str, dict[str, str]]]:
    """One process per task of a cluster, each with its ``TF_CONFIG``; names are ``type:index``."""
    cluster = (
        {job: list(tasks) for job, tasks in jobs.items()}  # type: ignore[arg-type]
        if all(isinstance(v, list) for v in jobs.values())
        else tf_config_cluster(jobs)  # type: ignore[arg-type]
    )
    return [
        (
            f"{job}:{index}",
            {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})},
        )
        for job, tasks in cluster.items()
        for index in range(len(tasks))
    ]


# Quick rounds: a lost node noticed within about three seconds; a store read (an agent waiting
# for the master's address) waits 120 s, not torch's 60, since an agent starved under a loaded
# full run published it late once. How long a round waits for late nodes is ``last_call_timeout``.
_ELASTIC_RENDEZVOUS = (
    "close_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=3,read_timeout=120"
)


@dataclasses.dataclass(frozen=True)
class Torchrun:
    """Run a process as torchrun's launcher on one node: ``python -m torch.distributed.run
    --nnodes 1 --nproc-per-node N --max-restarts R --master-addr 127.0.0.1 --master-port P``,
    each worker's output of each attempt kept in its own file.

    With ``nnodes`` (``"MIN:MAX"``) it is one elastic agent of several, each a process of its
    own ("node"), meeting at ``port`` through torchrun's c10d rendezvous (``--rdzv-backend
    c10d``): the agents restart their workers when a node joins or is lost."""

    nproc_per_node: int
    max_restarts: int = 0
    port: int | None = None
    nnodes: str | None = None
    join_timeout: int = 60  # how long agents wait for MIN nodes at a rendezvous
    # How long a round with MIN nodes waits for more (MAX ends it at once): agents started
    # together on a loaded machine can arrive seconds apart.
    last_call_timeout: int = 1
    # Whether this agent hosts the rendezvous store (None: the first on ``port`` does): agents
    # told False only connect, so that they can start with the host, not after it listens.
    is_host: bool | None = None
    # "feedline": launched as ``feedline torchrun`` (``python -m feedline.cli torchrun``).
    launcher: str = "torch"

    def command(self, log_dir: Path) -> list[str]:
        module = (
            ["feedline.cli", "torchrun"]
            if self.launcher == "feedline"
            else ["torch.distributed.run"]
        )
        common = [
            sys.executable, "-m", *module, "--nproc-per-node",
            str(self.nproc_per_node), "--max-restarts", str(self.max_restarts), "--log-dir",
            str(log_dir), "--redirects", "3",
        ]  # fmt: skip
        if self.nnodes is None:
            return [
                *common, "--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port",
                str(self.port or free_port()),
            ]  # fmt: skip
        if self.port is None:
            raise ValueError("elastic agents meet at one port: give Torchrun(port=...)")
        host = "" if self.is_host is None else f",is_host={int(self.is_host)}"
        timeouts = f"join_timeout={self.join_timeout},last_call_timeout={self.last_call_timeout}"
        return [
            *common, "--nnodes", self.nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"127.0.0.1:{self.port}", "--rdzv-id", "feedline-test", "--local-addr", "127.0.0.1",
            "--rdzv-conf", f"{timeouts},{_ELASTIC_RENDEZVOUS}{host}",
            "--monitor-interval", "0.2",
        ]  # fmt: skip


@dataclasses.dataclass
class ProcessResult:
    """How one launched process ended: exit code (None if it had to be killed), output and the
    value it reported (None if it reported nothing)."""

    name: str
    returncode: int | None
    stdout: str
    stderr: str
    result: Any

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe(self) -> str:
        how = "timed out and was killed" if self.returncode is None else f"exit {self.returncode}"
        return (
            f"--- {self.name} ({how}) ---\n"
            f"stdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-6000:]}"
        )


class Processes:
    """Processes started together; a context manager that kills all of them on the way out.

    Use ``run`` for the common case; use this directly to signal a process mid-run
    (``send(name, signal.SIGKILL)``) or to wait for a file it writes.
    """

    def __init__(
        self,
        code: str,
        processes: Sequence[tuple[str, Mapping[str, str]]],
        *,
        timeout: float = 120.0,
        argv: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        torchrun: Torchrun | None = None,
    ) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="feedline-launch-")
        self.dir = Path(self._dir.name)
        script = self.dir / "main.py"
        script.write_text(textwrap.dedent(code))
        self._deadline = time.monotonic() + timeout
        self._procs: dict[str, subprocess.Popen[str]] = {}
        self._outputs: dict[str, tuple[Any, Any]] = {}
        base = {k: v for k, v in os.environ.items() if k not in _CLUSTER_VARIABLES}
        base.update(env or {})
        base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH")]))
        base[_RESULT_DIR] = str(self.dir)
        base.setdefault("OMP_NUM_THREADS", "1")
        base.setdefault("PYTHONUNBUFFERED", "1")  # output printed before a kill is kept
        for name, extra in processes:
            stdout = open(self.dir / f"{_safe(name)}.out", "w+")  # noqa: SIM115
            stderr = open(self.dir / f"{_safe(name)}.err", "w+")  # noqa: SIM115
            self._outputs[name] = (stdout, stderr)
            prefix = [sys.executable]
            if torchrun is not None:
                prefix = torchrun.command(self.dir / f"{_safe(name)}-logs")
            self._procs[name] = subprocess.Popen(
                [*prefix, str(script), *argv],
                cwd=ROOT,
                # A launcher's workers report as rank:N.
                env={**base, **extra, _NAME: "" if torchrun else name},
                stdout=stdout,
                stderr=stderr,
                text=True,
                start_new_session=True,
            )

    @property
    def names(self) -> list[str]:
        return list(self._procs)

    def pid(self, name: str) -> int:
        return self._procs[name].pid

    def send(self, name: str, sig: int) -> None:
        """Sends ``sig`` to process ``name`` and its children (if still running), also those
        in sessions of their own (torchrun's workers)."""
        proc = self._procs[name]
        if proc.poll() is None:
            for pid in [proc.pid, *_descendants(proc.pid)]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, sig)

    def reports(self) -> dict[str, Any]:
        """Every value reported so far, by reporter (``rank:N`` for a launcher's workers)."""
        return {path.stem: json.loads(path.read_text()) for path in self.dir.glob("*.json")}

    def worker_outputs(self, name: str, stream: str = "stdout") -> dict[tuple[int, int], str]:
        """What each worker of launcher ``name`` printed, by (attempt, rank)."""
        outputs = {}
        for path in (self.dir / f"{_safe(name)}-logs").glob(f"*/attempt_*/*/{stream}.log"):
            attempt = int(path.parent.parent.name.removeprefix("attempt_"))
            outputs[(attempt, int(path.parent.name))] = path.read_text()
        return dict(sorted(outputs.items()))

    def poll(self, name: str) -> int | None:
        return self._procs[name].poll()

    def wait_for(self, path: Path, timeout: float = 60.0) -> None:
        """Waits until ``path`` exists, failing if a process died first or time ran out."""
        end = min(self._deadline, time.monotonic() + timeout)
        while not path.exists():
            failed = [n for n, p in self._procs.items() if p.poll() not in (None, 0)]
            if failed:
                raise AssertionError(
                    f"{failed} exited before {path.name} appeared:\n{self._dump()}"
                )
            if time.monotonic() > end:
                raise AssertionError(f"{path.name} did not appear in time:\n{self._dump()}")
            time.sleep(0.05)

    def output(self, name: str, stream: str = "stdout") -> str:
        """What process ``name`` has printed so far on ``stream``."""
        return (self.dir / f"{_safe(name)}.{'out' if stream == 'stdout' else 'err'}").read_text()

    def wait_for_line(self, name: str, prefix: str, timeout: float = 60.0) -> str:
        """The first line process ``name`` prints on stdout that starts with ``prefix`` (a
        server's banner, say), waiting for it; fails if the process ends first or time runs
        out."""
        end = min(self._deadline, time.monotonic() + timeout)
        while True:
            ended = self._procs[name].poll() is not None  # before reading: then all is read
            text = self.output(name)
            # Whole lines only while it runs: an unbuffered print writes its parts one by one,
            # and a line read half written would lose its end.
            for line in (text if ended else text[: text.rfind("\n") + 1]).splitlines():
                if line.startswith(prefix):
                    return line
            if ended:
                raise AssertionError(f"{name} ended before printing {prefix!r}:\n{self._dump()}")
            if time.monotonic() > end:
                raise AssertionError(f"{name} printed no {prefix!r} in time:\n{self._dump()}")
            time.sleep(0.02)

    def wait_exit(self, name: str, timeout: float = 30.0) -> int | None:
        """Waits up to ``timeout`` s for process ``name`` to end; its exit code, or None."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self._procs[name].wait(timeout=timeout)
        return None

    def wait(self) -> dict[str, ProcessResult]:
        """Waits for every process until the deadline; kills what is left; their results."""
        codes: dict[str, int | None] = {}
        for name, proc in self._procs.items():
            try:
                codes[name] = proc.wait(timeout=max(0.0, self._deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[name] = None
        self.kill_all()
        return {name: self._result(name, code) for name, code in codes.items()}

    def kill_all(self) -> None:
        for name, proc in self._procs.items():
            # Its descendants are listed while it lives: once it is reaped, its pid may name
            # another process, whose children are not this test's to kill.
            family = _descendants(proc.pid) if proc.poll() is None else []
            self.send(name, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            for pid in family:  # orphans of a killed launcher, if any
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)

    def _result(self, name: str, code: int | None) -> ProcessResult:
        stdout, stderr = self._outputs[name]
        stdout.seek(0)
        stderr.seek(0)
        path = self.dir / f"{name}.json"
        value = json.loads(path.read_text()) if path.exists() else None
        return ProcessResult(name, code, stdout.read(), stderr.read(), value)

    def _dump(self) -> str:
        return "\n".join(
            self._result(name, proc.poll()).describe() for name, proc in self._procs.items()
        )

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill_all()
        for stdout, stderr in self._outputs.values():
            stdout.close()
            stderr.close()
        self._dir.cleanup()

    def __iter__(self) -> Iterator[str]:
        return iter(self._procs)


def run(
    code: str,
    processes: Sequence[tuple[str, Mapping[str, str]]],
    *,
    timeout: float = 120.0,
    argv: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    check: bool = True,
    torchrun: Torchrun | None = None,
) -> dict[str, ProcessResult]:
    """Runs ``code`` in one process per ``(name, environment)`` and waits for all of them.

    With ``check`` (the default), any process that failed, timed out or reported nothing fails
    the test with every process's output.
    """
    with Processes(
        code, processes, timeout=timeout, argv=argv, env=env, torchrun=torchrun
    ) as procs:
        results = procs.wait()
    if check and not all(r.ok for r in results.values()):
        raise AssertionError("\n".join(r.describe() for r in results.values()))
    return results


def _descendants(pid: int) -> list[int]:
    """The live descendants of ``pid`` (Linux ``/proc``; empty elsewhere or once it is gone)."""
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError):
                children = [int(c) for c in (task / "children").read_text().split()]
                found.extend(children)
                stack.extend(children)
    return found


def _safe(name: str) -> str:
    return name.replace(":", "_").replace("/", "_")


_CLUSTER_VARIABLES = frozenset(
    {
        "TF_CONFIG",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
    }
)


def local_auth() -> tuple[tuple[str, str], ...]:
    """The metadata of a raw gRPC call to a loopback server of this user that runs without a
    token: the user's local secret, which feedline's own clients send by themselves."""
    from feedline._net import local_secret

    return (("feedline-token", local_secret.ensure()),)
