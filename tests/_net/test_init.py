"""Tests of feedline/_net/__init__.py: gRPC's INFO log stays quiet unless the user asks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Servers that stop without grace while their clients' calls wait: gRPC's C core logs "Got
# goaway [2] ... Cancelling all calls" at INFO for some of those connections (a few in 30).
CHURN = """
import os, threading, time
from feedline._net import rpc

print(os.environ.get("GRPC_VERBOSITY"))

def slow(header, buffers):
    time.sleep(0.3)
    return {}, ()

for i in range(30):
    server, port = rpc.start_server("S", {"M": slow}, bind="127.0.0.1", port=0, token="t")
    client = rpc.RpcClient(f"127.0.0.1:{port}", "S", token="t")
    def call():
        try:
            client.call("M", {}, timeout=10)
        except Exception:
            pass
    threads = [threading.Thread(target=call) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.05 * (i % 7))
    server.stop(0)
    for thread in threads:
        thread.join(timeout=15)
time.sleep(0.5)
"""


def _run(env_value: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    if env_value is not None:
        env["GRPC_VERBOSITY"] = env_value
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", CHURN], env=env, capture_output=True, text=True, timeout=120
    )


def test_servers_stopping_under_their_clients_log_nothing_by_default() -> None:
    result = _run(None)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "ERROR"
    assert result.stderr == "", result.stderr


def test_the_users_grpc_verbosity_is_kept() -> None:
    result = _run("NONE")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "NONE"
