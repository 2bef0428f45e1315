"""``feedline autoscale`` and ``feedline diagnose`` as processes against a real
``feedline dispatcher``, and their bad arguments."""

from __future__ import annotations

import signal
import time

import pytest

from feedline.cli import main
from feedline.cli._autoscale import load_source
from tests.launcher import FEEDLINE_CLI, Processes
from tests.service.procs import ServiceProcesses

pytestmark = pytest.mark.timeout(180)

WAIT_S = 90.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "local", "--max-workers", "0"], "--max-workers: must be >= 1"),
        (["--backend", "cloud", "--max-workers", "2"], "invalid choice: 'cloud'"),
        (["--max-workers", "2"], "--backend"),
        (["--backend", "local", "--max-workers", "2", "--interval", "-1"], "--interval"),
        (["--backend", "local", "--max-workers", "2", "--min-workers", "3"], "--min-workers 3"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_code_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["autoscale", "--dispatcher", "127.0.0.1:1", *argv])
    except SystemExit as exit_:
        code = exit_.code  # type: ignore[assignment]
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("feedline autoscale: error: ") and message in err, err
    assert len(err.splitlines()) == 1


def test_diagnose_of_an_unreachable_dispatcher_is_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["diagnose", "--dispatcher", "127.0.0.1:1", "--seconds", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("feedline diagnose: error: the dispatcher at 127.0.0.1:1 cannot be")


def test_autoscale_keeps_min_workers_and_drains_them_when_stopped() -> None:
    with ServiceProcesses() as cluster:
        cluster.start_dispatcher()
        argv = [
            "autoscale", "--dispatcher", cluster.address, "--backend", "local",
            "--min-workers", "2", "--max-workers", "3", "--interval", "0.2",
            "--drain-seconds", "2",
        ]  # fmt: skip
        load, close = load_source(cluster.address)
        with Processes(FEEDLINE_CLI, [("autoscale", {})], argv=argv, timeout=150) as procs:
            procs.wait_for_line("autoscale", "feedline autoscale: local workers", timeout=60)
            try:
                deadline = time.monotonic() + WAIT_S
                while load().live_workers < 2:
                    assert time.monotonic() < deadline, procs.output("autoscale", "stderr")
                    time.sleep(0.2)
                diagnosis = Processes(
                    FEEDLINE_CLI,
                    [("diagnose", {})],
                    argv=["diagnose", "--dispatcher", cluster.address, "--seconds", "0"],
                    timeout=60,
                )
                with diagnosis:
                    assert diagnosis.wait_exit("diagnose", 60) == 0
                    printed = diagnosis.output("diagnose")
                assert "workers: 2 serving, the jobs need 0" in printed, printed
                assert "bottleneck: idle" in printed and "the service is idle" in printed
                procs.send("autoscale", signal.SIGTERM)
                assert procs.wait_exit("autoscale", 60) == 0
                # Its workers drained and told the dispatcher they leave (a loaded dispatcher
                # may take a moment to apply the last leave; a worker it never heard leave
                # would stay registered for worker_timeout_ms).
                deadline = time.monotonic() + 8
                while load().workers and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert load().workers == ()
            finally:
                close()
