"""Tests of feedline/cli/_parser.py and _main.py: sub-commands, their ``--help``, one-line
errors with exit code 2, ``--version``; in this process through ``main(argv)``."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

import feedline
from feedline.cli import _parser, main

OPTIONS = {
    "demo": ["--epochs", "--replicas", "--workers", "--data-dir", "--checkpoint-dir", "--resume",
             "--seed", "--parameter-server"],
    "pipeline-demo": ["--examples", "--batch-size"],
    "dispatcher": ["--port", "--bind", "--work-dir", "--fault-tolerant", "--journal-sync",
                   "--worker-addresses", "--worker-timeout-ms", "--status-port"],
    "worker": ["--dispatcher", "--port", "--bind", "--worker-address", "--heartbeat-interval-ms",
               "--drain-seconds", "--dispatcher-timeout", "--wait-forever", "--status-port"],
    "server": ["--cluster-spec", "--job", "--task"],
}  # fmt: skip
PARAMETER_SERVER_OPTIONS = ["--steps", "--print-every", "--batch-size", "--rows", "--dim",
                            "--workers", "--ps", "--timeout"]  # fmt: skip


def _exit_code(argv: list[str]) -> int | str | None:
    with pytest.raises(SystemExit) as raised:
        main(argv)
    return raised.value.code


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: feedline ")
    for command in OPTIONS:
        assert f"\n    {command} " in out or f"\n    {command}\n" in out, command


@pytest.mark.parametrize("command", sorted(OPTIONS))
def test_help_of_a_command_lists_its_options(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_code([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: feedline {command} ")
    assert "{demo,pipeline-demo" not in out  # not the top-level usage
    for option in OPTIONS[command]:
        assert f"  {option}" in out, option


def test_help_of_the_parameter_server_demo_lists_its_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _exit_code(["demo", "--parameter-server", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: feedline demo --parameter-server ")
    for option in PARAMETER_SERVER_OPTIONS:
        assert f"  {option}" in out, option
    assert "--checkpoint-dir" not in out


@pytest.mark.parametrize(
    ("argv", "prefix", "says"),
    [
        ([], "feedline: error:", "required: COMMAND"),
        (["train"], "feedline: error:", "invalid choice: 'train'"),
        (["dispatcher", "--nope"], "feedline dispatcher: error:", "unrecognized arguments"),
        (["dispatcher", "--port", "x"], "feedline dispatcher: error:", "--port"),
        (["dispatcher", "--worker-timeout-ms", "0"], "feedline dispatcher: error:",
         "--worker-timeout-ms: must be >= 1, got 0"),
        (["dispatcher", "--worker-timeout-ms", "1.5"], "feedline dispatcher: error:",
         "--worker-timeout-ms: expected an int >= 1, got '1.5'"),
        (["worker"], "feedline worker: error:", "--dispatcher"),
        (["worker", "--dispatcher", "h:1", "--drain-seconds", "soon"], "feedline worker: error:",
         "--drain-seconds"),
        (["worker", "--dispatcher", "h:1", "--heartbeat-interval-ms", "0"],
         "feedline worker: error:", "--heartbeat-interval-ms: must be >= 1, got 0"),
        (["server", "--cluster-spec", "{x"], "feedline server: error:", "not JSON"),
        (["server", "--cluster-spec", "[1]"], "feedline server: error:", "a JSON object"),
        (["server", "--task", "first"], "feedline server: error:", "--task"),
        (["demo", "--epochs", "0"], "feedline demo: error:", "--epochs: must be >= 1, got 0"),
        (["demo", "--workers", "two"], "feedline demo: error:", "--workers"),
        (["pipeline-demo", "--batch-size", "-1"], "feedline pipeline-demo: error:",
         "--batch-size"),
        (["demo", "--parameter-server", "--steps", "0"],
         "feedline demo --parameter-server: error:", "--steps: must be >= 1, got 0"),
        (["demo", "--parameter-server", "--epochs", "3"],
         "feedline demo --parameter-server: error:", "unrecognized arguments: --epochs 3"),
    ],
)  # fmt: skip
def test_a_bad_argument_is_one_error_line_and_exit_code_2(
    argv: list[str], prefix: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_code(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(prefix) and says in lines[0], lines[0]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(["--version"]) == 0
    assert capsys.readouterr().out == f"feedline {metadata.version('feedline')}\n"


def test_version_without_an_installed_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert _parser.version() == feedline.__version__


def test_building_the_parser_reads_no_package_metadata() -> None:
    """Every ``feedline dispatcher`` and ``feedline worker`` builds the parser at its start;
    the version (``importlib.metadata``, ~0.1 s of a start's CPU) is looked up for
    ``--version`` only."""
    code = (
        "import sys\n"
        "from feedline.cli._parser import build_parser\n"
        "build_parser().parse_command(['worker', '--dispatcher', '127.0.0.1:1'])\n"
        "print('importlib.metadata' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout == "False\n", done.stderr


def test_the_parameter_server_demo_refuses_settings_before_starting_a_cluster(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--parameter-server", "--timeout", "0"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "feedline demo: error: DemoSettings.timeout must be > 0, got 0.0\n"
    assert "cluster:" not in captured.out


def test_service_commands_do_not_load_torch() -> None:
    """A data service worker is a plain Python process: its command imports no torch."""
    code = (
        "import sys\n"
        "from feedline.cli._main import _runner\n"
        "for command in ('dispatcher', 'worker'):\n"
        "    _runner(f'feedline.cli._service:{command}')\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "False\n"
