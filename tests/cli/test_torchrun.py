"""``feedline torchrun`` (``feedline.cli._torchrun``): torchrun itself, in real processes, with
its agents' store not shared with the workers unless the environment says otherwise."""

from __future__ import annotations

import sys

import pytest

from feedline.cli import main
from feedline.cli._torchrun import SHARE_STORE_VARIABLE, launcher_command
from tests.launcher import Processes, Torchrun, free_port

_REPORT = """
import os, sys
from tests.launcher import report
report({"shared": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
        "variable": os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE"),
        "argv": sys.argv[1:], "world": os.environ["WORLD_SIZE"]})
sys.exit(int(sys.argv[1]))
"""


def test_the_command_is_torchrun_with_the_store_not_shared_unless_set() -> None:
    command, env = launcher_command(["--nnodes", "2:4", "train.py"], {"HOME": "/h"})
    assert command == [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2:4", "train.py"]
    assert env == {"HOME": "/h", SHARE_STORE_VARIABLE: "1"}
    _, env = launcher_command([], {SHARE_STORE_VARIABLE: "0"})
    assert env == {SHARE_STORE_VARIABLE: "0"}  # the environment's own choice is kept


def test_help_lists_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "\n    torchrun " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("outer", "variable", "shared"), [(None, "1", "False"), ("0", "0", "True")]
)
def test_workers_run_under_torchrun_with_its_arguments_and_exit_code(
    outer: str | None, variable: str, shared: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if outer is None:
        monkeypatch.delenv(SHARE_STORE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(SHARE_STORE_VARIABLE, outer)
    # An elastic agent (c10d rendezvous, where the store may be shared) of 2 workers.
    torchrun = Torchrun(nproc_per_node=2, port=free_port(), nnodes="1:1", launcher="feedline")
    with Processes(_REPORT, [("node", {})], argv=["0"], torchrun=torchrun, timeout=90) as node:
        result = node.wait()["node"]
        reports = node.reports()
    assert result.returncode == 0, result.describe()
    assert sorted(reports) == ["rank:0", "rank:1"]
    expected = {"shared": shared, "variable": variable, "argv": ["0"], "world": "2"}
    assert all(report == expected for report in reports.values()), reports


def test_a_failed_worker_fails_the_launcher() -> None:
    torchrun = Torchrun(nproc_per_node=1, launcher="feedline")
    with Processes(_REPORT, [("node", {})], argv=["3"], torchrun=torchrun, timeout=90) as node:
        result = node.wait()["node"]
    assert result.returncode == 1, result.describe()  # torchrun's own report and exit code
    assert "ChildFailedError" in result.stderr and "exitcode  : 3" in result.stderr
