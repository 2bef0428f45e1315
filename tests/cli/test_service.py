"""Tests of feedline/cli/_service.py: ``feedline dispatcher`` and ``feedline worker`` as real
processes on loopback.

Each test starts its servers with ``python -m feedline.cli``, learns their ports from the banner
line they print, reads from them in this process, and stops them with a signal. Every read of a
process's output and every wait has a timeout, and every process is killed at teardown.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from feedline.data import Dataset
from feedline.errors import PermissionDeniedError
from feedline.service import ShardingPolicy, distribute
from tests.launcher import free_port
from tests.service.http_helpers import scrape

pytestmark = pytest.mark.timeout(60)

TOKEN_ENV = "FEEDLINE_SERVICE_TOKEN"
BANNER_TIMEOUT_S = 20.0
EXIT_TIMEOUT_S = 10.0


class Server:
    """One ``feedline`` server process; a daemon thread reads its stdout into a queue."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.args = args
        self.process = subprocess.Popen(
            [sys.executable, "-m", "feedline.cli", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # the servers log to stderr; keep it with the banner
            text=True,
            env=env,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._read, name=f"read-{args[0]}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def wait_for_line(self, prefix: str, timeout: float = BANNER_TIMEOUT_S) -> str:
        """The first line of output starting with ``prefix`` (waiting for it); fails after
        ``timeout`` seconds or when the process ends without printing it."""
        return self.wait_for(lambda line: line.startswith(prefix), repr(prefix), timeout)

    def wait_for(self, match: Callable[[str], bool], what: str, timeout: float) -> str:
        """The first line of output that ``match``es (waiting for it), as ``wait_for_line``."""
        for line in self.output:
            if match(line):
                return line
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(
                    f"`feedline {' '.join(self.args)}` printed no {what} line in "
                    f"{timeout} s; output so far: {self.output}"
                )
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                pytest.fail(
                    f"`feedline {' '.join(self.args)}` ended (exit code "
                    f"{self.process.wait(EXIT_TIMEOUT_S)}) before printing {what}; "
                    f"output: {self.output}"
                )
            self.output.append(line)
            if match(line):
                return line

    def address(self) -> str:
        """``host:port`` from the banner, ``feedline ROLE serving at [grpc://]HOST:PORT``."""
        line = self.wait_for_line(f"feedline {self.args[0]} serving at ")
        return line.rsplit(" ", 1)[-1].split("://")[-1]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(EXIT_TIMEOUT_S)
        self._reader.join(EXIT_TIMEOUT_S)  # it reaches the end of the output once none is left
        if self.process.stdout is not None and not self._reader.is_alive():
            self.process.stdout.close()


@pytest.fixture(autouse=True)
def _no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start without a shared secret, whatever the environment running them holds."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)


@pytest.fixture
def spawn() -> Iterator[Callable[..., Server]]:
    """``spawn(*args, token=None)`` starts ``feedline ARGS``; all are killed at teardown."""
    servers: list[Server] = []

    def start(*args: str, token: str | None = None) -> Server:
        env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
        if token is not None:
            env[TOKEN_ENV] = token
        server = Server(list(args), env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill()


def _cluster(
    spawn: Callable[..., Server], num_workers: int, token: str | None = None
) -> tuple[Server, str, list[Server]]:
    """A dispatcher and ``num_workers`` workers; returns (dispatcher, target, workers)."""
    dispatcher = spawn("dispatcher", "--port", "0", token=token)
    address = dispatcher.address()
    workers = [
        spawn("worker", "--dispatcher", address, "--port", "0", token=token)
        for _ in range(num_workers)
    ]
    for worker in workers:
        worker.address()
    return dispatcher, f"grpc://{address}", workers


def _read(dataset: Dataset) -> list[int]:
    return sorted(int(x) for x in dataset)


def test_banners_name_the_addresses(spawn: Callable[..., Server]) -> None:
    dispatcher = spawn("dispatcher", "--port", "0")
    line = dispatcher.wait_for_line("feedline dispatcher serving at ")
    assert line.startswith("feedline dispatcher serving at grpc://127.0.0.1:")
    worker = spawn("worker", "--dispatcher", dispatcher.address(), "--port", "0")
    line = worker.wait_for_line("feedline worker serving at ")
    assert line.startswith("feedline worker serving at 127.0.0.1:")


def test_distributed_epoch_reads_each_element_once(spawn: Callable[..., Server]) -> None:
    _, target, _ = _cluster(spawn, num_workers=2)
    dataset = (
        Dataset.range(20)
        .map(lambda x: x * 3)  # runs in the worker processes
        .apply(distribute("distributed_epoch", target))
    )
    assert _read(dataset) == [3 * i for i in range(20)]


def test_parallel_epochs_on_two_workers_reads_each_element_twice(
    spawn: Callable[..., Server],
) -> None:
    _, target, _ = _cluster(spawn, num_workers=2)
    dataset = Dataset.range(10).map(lambda x: x + 100).apply(distribute("parallel_epochs", target))
    assert _read(dataset) == sorted(2 * [100 + i for i in range(10)])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_both_servers_cleanly(spawn: Callable[..., Server], signum: int) -> None:
    dispatcher, target, (worker,) = _cluster(spawn, num_workers=1)
    assert _read(Dataset.range(5).apply(distribute("parallel_epochs", target))) == [0, 1, 2, 3, 4]
    worker.process.send_signal(signum)
    dispatcher.process.send_signal(signum)
    assert worker.process.wait(EXIT_TIMEOUT_S) == 0
    assert dispatcher.process.wait(EXIT_TIMEOUT_S) == 0


def test_fixed_worker_list_shards_by_data(spawn: Callable[..., Server]) -> None:
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    dispatcher = spawn("dispatcher", "--port", "0", "--worker-addresses", ",".join(addresses))
    dispatcher_address = dispatcher.address()
    for address in addresses:
        worker = spawn(
            "worker",
            "--dispatcher",
            dispatcher_address,
            "--port",
            address.rsplit(":", 1)[1],
            "--worker-address",
            address,
        )
        assert worker.address() == address
    dataset = Dataset.range(12).apply(
        distribute(ShardingPolicy.DATA, f"grpc://{dispatcher_address}")
    )
    # Worker i keeps elements i, i + 2, ...: together, each element once.
    assert _read(dataset) == list(range(12))


def test_worker_outside_the_fixed_list_exits_with_an_error(spawn: Callable[..., Server]) -> None:
    dispatcher = spawn("dispatcher", "--port", "0", "--worker-addresses", "127.0.0.1:1")
    worker = spawn("worker", "--dispatcher", dispatcher.address(), "--port", "0")
    line = worker.wait_for_line("feedline worker: error: ")
    assert "not in the dispatcher's worker_addresses" in line
    assert worker.process.wait(EXIT_TIMEOUT_S) == 2


def test_worker_timeout_ms_drops_a_killed_worker_sooner(spawn: Callable[..., Server]) -> None:
    """``--worker-timeout-ms 300``: a worker killed with kill -9 is dropped after about a
    second (the dispatcher looks every second), not after the default 10 s."""
    dispatcher = spawn("dispatcher", "--port", "0", "--worker-timeout-ms", "300")
    worker = spawn("worker", "--dispatcher", dispatcher.address(), "--port", "0")
    address = worker.address()
    dispatcher.wait_for(lambda line: f"worker {address} registered" in line, "registered", 20)
    worker.process.kill()
    line = dispatcher.wait_for(
        lambda line: f"worker {address} missed heartbeats for " in line, "a drop", 30
    )
    missed = float(line.split("missed heartbeats for ", 1)[1].split(" s", 1)[0])
    assert 0.3 <= missed < 5.0, line  # the default would wait past 10 s


def test_heartbeat_interval_ms_sets_how_often_a_worker_heartbeats(
    spawn: Callable[..., Server],
) -> None:
    """``feedline worker --heartbeat-interval-ms 50``: with no job to wait for, each heartbeat
    waits at the dispatcher that long, so 20 come within 5 s (at the default, 1 s, 5 s see 7 at
    most); the dispatcher's metrics count them."""
    status_port = free_port()
    dispatcher = spawn("dispatcher", "--port", "0", "--status-port", str(status_port))
    worker = spawn(
        "worker", "--dispatcher", dispatcher.address(), "--port", "0",
        "--heartbeat-interval-ms", "50",
    )  # fmt: skip
    address = worker.address()
    dispatcher.wait_for(lambda line: f"worker {address} registered" in line, "registered", 20)
    started = time.monotonic()
    count = 0.0
    while count < 20 and time.monotonic() - started < 5.0:
        time.sleep(0.2)
        count = _worker_heartbeats(status_port)
    assert count >= 20, f"{count:.0f} heartbeats in {time.monotonic() - started:.1f} s"


def _worker_heartbeats(status_port: int) -> float:
    """The WorkerHeartbeat calls the dispatcher's metrics count."""
    samples = scrape(f"http://127.0.0.1:{status_port}/")
    key = (
        "feedline_dispatcher_request_duration_seconds_count",
        frozenset({("method", "WorkerHeartbeat")}),
    )
    return samples.get(key, 0.0)


def test_client_timeout_ms_releases_a_killed_consumer_sooner(
    spawn: Callable[..., Server],
) -> None:
    """``--client-timeout-ms 500``: a consumer killed with kill -9 is released after about a
    second (the dispatcher looks every second), not after the default 10 s."""
    dispatcher = spawn("dispatcher", "--port", "0", "--client-timeout-ms", "500")
    address = dispatcher.address()
    spawn("worker", "--dispatcher", address, "--port", "0").address()
    code = (
        "from feedline.data import Dataset\n"
        "from feedline.service import distribute\n"
        f"it = iter(Dataset.range(10**9).apply(distribute('parallel_epochs', 'grpc://{address}')))\n"
        "next(it)\n"
        "print('reading', flush=True)\n"
        "import time; time.sleep(60)\n"
    )
    consumer = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert consumer.stdout is not None
        assert consumer.stdout.readline() == "reading\n"  # the test's timeout bounds it
        killed = time.monotonic()
        consumer.kill()
        dispatcher.wait_for(lambda line: "missed heartbeats; releasing it" in line, "a release", 30)
        assert time.monotonic() - killed < 5.0  # the default would wait past 10 s
    finally:
        consumer.kill()
        consumer.wait(EXIT_TIMEOUT_S)
        if consumer.stdout is not None:
            consumer.stdout.close()


def test_bad_arguments_exit_with_code_2(spawn: Callable[..., Server]) -> None:
    dispatcher = spawn("dispatcher", "--port", "70000")
    assert "DispatcherConfig.port" in dispatcher.wait_for_line("feedline dispatcher: error: ")
    assert dispatcher.process.wait(EXIT_TIMEOUT_S) == 2
    worker = spawn("worker")  # --dispatcher is required
    assert "--dispatcher" in worker.wait_for_line("feedline worker: error:")
    assert worker.process.wait(EXIT_TIMEOUT_S) == 2


def test_a_worker_started_before_its_dispatcher_waits_for_it_or_says_why_it_stops(
    spawn: Callable[..., Server],
) -> None:
    """Pods start in any order. A worker whose dispatcher is not up yet says so in its log
    after its first attempt; with --wait-forever it registers whenever the dispatcher comes up,
    past its --dispatcher-timeout; without, it stops after it with one line that names the
    address and the options."""
    port = free_port()
    dispatcher_at = [
        "--dispatcher",
        f"127.0.0.1:{port}",
        "--port",
        "0",
        "--dispatcher-timeout",
        "1",
    ]
    bounded = spawn("worker", *dispatcher_at)
    patient = spawn("worker", *dispatcher_at, "--wait-forever")
    line = bounded.wait_for_line("feedline worker: error: ")
    assert f"127.0.0.1:{port}" in line and "registering" in line and "--wait-forever" in line, line
    assert bounded.process.wait(EXIT_TIMEOUT_S) == 2
    patient.wait_for(lambda text: "trying again until it answers" in text, "waiting", 20.0)
    time.sleep(1.5)  # past its --dispatcher-timeout
    assert patient.process.poll() is None, patient.output
    dispatcher = spawn("dispatcher", "--port", str(port))
    dispatcher.address()
    patient.address()  # its banner: it registered and serves
    dataset = Dataset.range(6).apply(distribute("distributed_epoch", f"grpc://127.0.0.1:{port}"))
    assert _read(dataset) == list(range(6))


def test_token_from_the_environment(
    spawn: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, target, _ = _cluster(spawn, num_workers=1, token="s3cret")
    dataset = Dataset.range(6).apply(distribute("distributed_epoch", target))
    with pytest.raises(PermissionDeniedError):
        _read(dataset)
    monkeypatch.setenv(TOKEN_ENV, "wrong")
    with pytest.raises(PermissionDeniedError):
        _read(dataset)
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    assert _read(dataset) == list(range(6))


def test_worker_without_the_token_is_refused(spawn: Callable[..., Server]) -> None:
    dispatcher = spawn("dispatcher", "--port", "0", token="s3cret")
    worker = spawn("worker", "--dispatcher", dispatcher.address(), "--port", "0")
    assert "token" in worker.wait_for_line("feedline worker: error: ")
    assert worker.process.wait(EXIT_TIMEOUT_S) == 2


def test_a_work_dir_it_cannot_use_is_one_error_line_and_exit_code_2(
    spawn: Callable[..., Server], tmp_path: Path
) -> None:
    """No traceback: one line a supervisor's log shows, and exit code 2."""
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    cases = [str(not_a_folder / "work")]
    if os.geteuid() != 0:  # root writes read-only folders
        read_only = tmp_path / "read-only"
        read_only.mkdir(mode=0o500)
        cases.append(str(read_only / "work"))
    for work_dir in cases:
        dispatcher = spawn("dispatcher", "--port", "0", "--work-dir", work_dir, "--fault-tolerant")
        line = dispatcher.wait_for_line("feedline dispatcher: error: ")
        assert work_dir.rsplit("/", 1)[0] in line, line
        assert dispatcher.process.wait(EXIT_TIMEOUT_S) == 2
        dispatcher.kill()
        assert not any("Traceback" in text for text in dispatcher.output), dispatcher.output
