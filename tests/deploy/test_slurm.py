"""deploy/slurm/feedline.sbatch: its static shape, and a real run on a local Slurm cluster
(Debian's slurm-wlm: munged, slurmctld and four slurmd "nodes" on this machine, on loopback,
configured in a temporary folder) where the tools are installed and the test runs as root;
otherwise that test skips and says why."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.launcher import ROOT, free_ports

SCRIPT = ROOT / "deploy" / "slurm" / "feedline.sbatch"
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "scontrol", "scancel")


def test_the_script_starts_the_service_and_the_trainers() -> None:
    text = SCRIPT.read_text()
    assert text.startswith("#!/bin/bash\n")
    assert subprocess.run(["bash", "-n", str(SCRIPT)], timeout=30).returncode == 0
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH ")]
    assert "#SBATCH --ntasks-per-node=1" in directives
    assert "feedline dispatcher" in text and "--fault-tolerant" in text and "--work-dir" in text
    assert "feedline worker" in text and "--drain-seconds" in text
    assert "torchrun" in text and "--rdzv-backend=c10d" in text
    assert "FEEDLINE_SERVICE_TOKEN" in text and "--insecure" not in text
    assert (ROOT / "deploy" / "kubernetes" / "base" / "train.py").exists()


def _missing() -> str | None:
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return (
            f"{', '.join(absent)} not installed (Debian: apt-get install slurm-wlm munge), so "
            "no local Slurm cluster can run the sbatch script"
        )
    if os.geteuid() != 0:
        return "a local Slurm cluster needs root here (slurmd runs jobs as their users)"
    return None


class LocalSlurm:
    """munged, slurmctld and ``nodes`` slurmd processes on loopback, from a temporary folder;
    ``env`` points Slurm's commands at it."""

    def __init__(self, folder: Path, nodes: int) -> None:
        self.folder = folder
        folder.mkdir(parents=True)
        self.names = [f"node{i}" for i in range(1, nodes + 1)]
        self.started: list[subprocess.Popen[bytes]] = []
        controller, *node_ports = free_ports(1 + nodes)
        key = folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.socket = folder / "munge.sock"
        (folder / "state").mkdir()
        (folder / "spool").mkdir()
        host = socket.gethostname()
        lines = [
            "ClusterName=feedlinetest",
            f"SlurmctldHost={host}(127.0.0.1)",
            "SlurmUser=root",
            f"SlurmctldPort={controller}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.socket}",
            "CredType=cred/munge",
            f"StateSaveLocation={folder}/state",
            f"SlurmdSpoolDir={folder}/spool/%n",
            f"SlurmctldPidFile={folder}/slurmctld.pid",
            f"SlurmdPidFile={folder}/slurmd-%n.pid",
            f"SlurmctldLogFile={folder}/slurmctld.log",
            f"SlurmdLogFile={folder}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            *(
                f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=4 "
                "RealMemory=2000 State=UNKNOWN"
                for name, port in zip(self.names, node_ports, strict=True)
            ),
            f"PartitionName=test Nodes={','.join(self.names)} Default=YES MaxTime=INFINITE "
            "State=UP OverSubscribe=FORCE",
        ]
        self.conf = folder / "slurm.conf"
        self.conf.write_text("\n".join(lines) + "\n")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def _daemon(self, *argv: str) -> None:
        # Each runs in the foreground (-D), so that it is this test's child and killed by it.
        self.started.append(
            subprocess.Popen(
                argv,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=open(self.folder / f"{Path(argv[0]).name}.{len(self.started)}.err", "wb"),  # noqa: SIM115
                start_new_session=True,
            )
        )

    def start(self, timeout: float = 60.0) -> None:
        folder = self.folder
        self._daemon(
            shutil.which("munged") or "munged", "--foreground", "--force",
            f"--key-file={folder}/munge.key", f"--socket={self.socket}",
            f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log",
            f"--seed-file={folder}/munge.seed",
        )  # fmt: skip
        self._wait(lambda: self.socket.exists(), timeout, "munged made no socket")
        self._daemon(shutil.which("slurmctld") or "slurmctld", "-D", "-f", str(self.conf))
        for name in self.names:
            self._daemon(shutil.which("slurmd") or "slurmd", "-D", "-f", str(self.conf), "-N", name)

        def idle() -> bool:
            done = subprocess.run(
                ["sinfo", "-h", "-o", "%D %t"], env=self.env, capture_output=True, text=True,
                timeout=30,
            )  # fmt: skip
            return done.stdout.split() == [str(len(self.names)), "idle"]

        self._wait(idle, timeout, "the Slurm nodes did not become idle")

    def _wait(self, ready: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():  # type: ignore[operator]
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.started):
                raise AssertionError(f"{what}:\n{self.logs()}")
            time.sleep(0.5)

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}"
            for path in sorted(self.folder.glob("*.log")) + sorted(self.folder.glob("*.err"))
        )

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            subprocess.run(["scancel", "--full", "--user", "root"], env=self.env, timeout=30)
        for process in reversed(self.started):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=10)


@pytest.fixture
def slurm() -> Iterator[LocalSlurm]:
    why = _missing()
    if why:
        pytest.skip(why)
    # Slurm's Unix sockets live under its spool folder, and a socket path has at most 108 bytes:
    # pytest's tmp_path (deeper under xdist) is too long for them, so the cluster gets a short one.
    short = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
    cluster = LocalSlurm(short / "s", nodes=4)
    try:
        try:
            cluster.start()
        except AssertionError as error:
            # The daemons themselves would not run here (no hostname, no munge, ...): that is
            # this machine, not the script under test.
            pytest.skip(f"a local Slurm cluster could not start on this machine: {error}"[:2000])
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(short, ignore_errors=True)


def _commands(folder: Path) -> Path:
    """A bin folder whose ``feedline`` and ``torchrun`` run in this interpreter."""
    folder.mkdir()
    for name, module in (("feedline", "feedline.cli"), ("torchrun", "torch.distributed.run")):
        path = folder / name
        path.write_text(f'#!/bin/sh\nexec {sys.executable} -m {module} "$@"\n')
        path.chmod(0o755)
    return folder


@pytest.mark.timeout(300)
def test_the_sbatch_script_runs_on_a_local_slurm_cluster(slurm: LocalSlurm, tmp_path: Path) -> None:
    """Four nodes: the dispatcher, two workers and one trainer node with two torchrun
    processes, which together train on every example once; then the workers drain and leave."""
    pytest.importorskip("torch")
    examples = 640
    work = tmp_path / "work"
    dispatcher, status, rdzv = free_ports(3)
    env = {
        **slurm.env,
        "PATH": f"{_commands(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")])
        ),
        "OMP_NUM_THREADS": "1",
        "FEEDLINE_WORKER_NODES": "2",
        "FEEDLINE_PROCS_PER_NODE": "2",
        "FEEDLINE_TRAIN_ARGS": f"--examples {examples}",
        "FEEDLINE_WORK_DIR": str(work),
        "FEEDLINE_BIND": "127.0.0.1",
        "FEEDLINE_PORT": str(dispatcher),
        "FEEDLINE_STATUS_PORT": str(status),
        "FEEDLINE_WORKER_PORT": "0",
        "FEEDLINE_WORKER_STATUS_PORT": "0",
        "FEEDLINE_DRAIN_SECONDS": "5",
        "FEEDLINE_RDZV_PORT": str(rdzv),
    }
    output = tmp_path / "job.out"
    # Submitted, then watched with scontrol: `sbatch --wait` looks at the job only after 2, 10
    # and 42 s, which would hold this test half a minute past the job's end.
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodes=4", "--time=10", f"--output={output}", str(SCRIPT)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job = _wait_for_job(slurm, submitted.stdout.strip().split(";")[0], timeout=240)
    if job is None:
        queue = subprocess.run(
            ["squeue", "-a", "-o", "%i %T %r %N"], env=slurm.env, capture_output=True, text=True,
            timeout=30,
        )  # fmt: skip
        raise AssertionError(
            f"the job did not end in time:\n{queue.stdout}{queue.stderr}\n"
            f"{_job_logs(output, work)}\n{slurm.logs()}"
        )
    text = output.read_text() if output.exists() else ""
    assert job == ("COMPLETED", "0:0"), f"{job}\n{_job_logs(output, work)}"
    # The two trainer processes share the job's output file, so their lines may interleave.
    ranks = [json.loads(found) for found in re.findall(r'\{"rank": [^{}]*\}', text)]
    assert sorted(r["rank"] for r in ranks) == [0, 1], text
    assert sum(r["examples"] for r in ranks) == examples
    assert sum(r["index_sum"] for r in ranks) == examples * (examples - 1) // 2
    assert "dispatcher on node1" in text and "workers on node2,node3, trainers on node4" in text
    workers = (work / "logs" / "workers.log").read_text()
    assert workers.count("feedline worker serving at 127.0.0.1:") == 2
    assert (work / "dispatcher").is_dir()  # its journal
    # Once the trainers ended, the workers were stopped with SIGTERM and drained.
    assert (work / "logs" / "dispatcher.log").read_text().count("removed: it left") == 2


def _wait_for_job(slurm: LocalSlurm, job_id: str, timeout: float) -> tuple[str, str] | None:
    """The state and exit code of Slurm job ``job_id`` once it ended, None if it did not
    within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], env=slurm.env, capture_output=True,
            text=True, timeout=30,
        )  # fmt: skip
        state = re.search(r"\bJobState=(\S+)", shown.stdout)
        code = re.search(r"\bExitCode=(\S+)", shown.stdout)
        if state and code and state[1] not in _UNDER_WAY:
            return state[1], code[1]
        time.sleep(0.5)
    return None


#: The states of a job that has not ended yet.
_UNDER_WAY = {
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
    "SIGNALING", "STAGE_OUT",
}  # fmt: skip


def _job_logs(output: Path, work: Path) -> str:
    paths = [output, *sorted((work / "logs").glob("*.log"))]
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in paths if p.exists()
    )
