"""Tests of feedline/examples/parameter_server_demo.py: ``feedline demo --parameter-server``
as a user runs it (a real cluster of ``feedline server`` processes on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}


def _servers_of(banner: str) -> set[int]:
    """Process ids of the live processes whose ``TF_CONFIG`` names the cluster that the demo's
    first line (``cluster: ... ({"chief": [...], ...})``) describes."""
    cluster = json.loads(banner[banner.index("({") + 1 : banner.rindex(")")])
    address = cluster["ps"][0].encode()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if any(v.startswith(b"TF_CONFIG=") and address in v for v in environ):
            found.add(int(entry))
    return found


@pytest.mark.timeout(300)
def test_demo_trains_on_a_local_cluster_and_stops_it() -> None:
    """~24 s and ~40 s of CPU on an idle 2-core machine (five processes that import torch); a
    full run of the tests beside it (``-n 4``) made it ~5x slower, so its bound is generous."""
    result = subprocess.run(
        [sys.executable, "-m", "feedline.cli", "demo", "--parameter-server",
         "--steps", "60", "--print-every", "20", "--rows", "20000"],
        env=_env(), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("cluster: chief (this process), 2 workers, 2 ps on 127.0.0.1")
    assert lines[1] == (
        "0.weight: 20000 x 32 float32, shards ['ps:0 rows 0-9999', 'ps:1 rows 10000-19999']"
    )
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split(":")[0] for line in steps] == ["step 20/60", "step 40/60", "step 60/60"]
    pattern = r"step \d+/60: \d+\.\d steps/s( \(with start-up\))?, loss \d+\.\d{4}"
    assert all(re.fullmatch(pattern, line) for line in steps), steps
    assert re.fullmatch(r"done: 60 steps in \d+\.\d s \(\d+\.\d steps/s\)", lines[-1])
    assert _servers_of(lines[0]) == set()  # every child stopped


# Runs the rest of its argv with SIGINT handled by default and not blocked, whatever this test
# process has come to (an ignored or blocked SIGINT is inherited across exec, and Python then
# leaves Ctrl-C ignored). A program that execs, not a preexec_fn: Python code run between fork
# and exec in this many-threaded process can die or hang before the demo starts.
_CTRL_C_AS_IN_A_TERMINAL = (
    "import os, signal, sys; "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


@pytest.mark.timeout(200)
def test_ctrl_c_stops_the_cluster() -> None:
    """Ctrl-C stops the servers and exits 130 (in ~3.5 s on an idle machine, 6-8 s at a load of
    8). The demo's output is read to its end, as a terminal would: a demo printing into a pipe
    nobody reads blocks in ``print`` once the pipe is full, and a Ctrl-C that the kernel hands
    to another of its threads cannot interrupt that write (what hung this test in a full run).
    And the demo starts with Ctrl-C as a terminal gives it (``_CTRL_C_AS_IN_A_TERMINAL``)."""
    process = subprocess.Popen(
        [sys.executable, "-c", _CTRL_C_AS_IN_A_TERMINAL, "-m", "feedline.cli", "demo",
         "--parameter-server", "--steps", "100000", "--print-every", "1", "--rows", "20000"],
        env={**_env(), "PYTHONFAULTHANDLER": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stderr is not None
        banner = process.stdout.readline()
        if not banner.startswith("cluster: "):  # it ended first: say how
            process.wait(30)
            raise AssertionError(
                f"the demo printed {banner!r} first, exit code {process.returncode}; its "
                f"stderr:\n{process.stderr.read()}"
            )
        deadline = time.monotonic() + 60
        for line in process.stdout:  # training has begun once a step is reported
            if line.startswith("step ") or time.monotonic() > deadline:
                break
        threading.Thread(target=process.stdout.read, daemon=True).start()  # the rest
        assert len(_servers_of(banner)) == 4
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=60)
        except subprocess.TimeoutExpired:  # where it hangs: faulthandler's dump on SIGABRT
            process.send_signal(signal.SIGABRT)
            process.wait(30)
            threads = process.stderr.read()
            here = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []))
            raise AssertionError(
                f"no exit 60 s after Ctrl-C (this process's SIGINT handler and blocked signals: "
                f"{here}); its threads:\n{threads}"
            ) from None
        assert code == 130
        assert "interrupted: the cluster is stopped" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert _servers_of(banner) == set()


# A chief whose gRPC is busy (as after training on a first cluster) starts a local cluster; then
# it is killed (kill -9) and its servers, which it never stopped, follow it.
_CHIEF = """
import sys, threading
from feedline import service
from feedline.data import Dataset
from feedline.examples.parameter_server_demo import LocalCluster

dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
worker = service.WorkerServer(
    service.WorkerConfig(dispatcher_address=dispatcher.target.split("://")[1]))

def read():
    while True:
        list(Dataset.range(1000).apply(service.distribute("parallel_epochs", dispatcher.target)))

for _ in range(2):
    threading.Thread(target=read, daemon=True).start()
cluster = LocalCluster(workers=3, ps=3).start()
print(" ".join(str(child.process.pid) for child in cluster.children), flush=True)
threading.Event().wait()
"""


@pytest.mark.timeout(240)
def test_a_busy_chief_starts_its_cluster_and_the_cluster_dies_with_it() -> None:
    """A child started with a ``preexec_fn`` aborted in about 1 of 5 starts here, before it
    ran anything (gRPC's fork handlers, in a process whose gRPC threads are busy); the six
    children now all serve, and each gets SIGTERM when the chief is killed."""
    chief = subprocess.Popen(
        [sys.executable, "-c", _CHIEF], env=_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert chief.stdout is not None and chief.stderr is not None
        line = chief.stdout.readline()  # the test's timeout bounds it
        if not line.strip():
            chief.kill()
            raise AssertionError(f"the chief did not start its cluster:\n{chief.stderr.read()}")
        children = [int(pid) for pid in line.split()]
        assert len(children) == 6
        chief.kill()
        chief.wait(30)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in children if _alive(pid)]
    finally:
        if chief.poll() is None:
            chief.kill()
            chief.wait(30)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped by init, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_bad_arguments_are_refused() -> None:
    from feedline.cli import main

    with pytest.raises(SystemExit) as raised:
        main(["demo", "--parameter-server", "--steps", "0"])
    assert raised.value.code == 2
