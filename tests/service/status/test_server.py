"""The status pages of the dispatcher and the workers (``status_port``), over plain HTTP and in
a real headless Chromium.

A job runs while the pages are read: a named job whose name, and a registered dataset whose
id, are HTML (``<script>...``), which the pages must show as text. Every HTTP request, browser
run and process has a timeout.
"""

from __future__ import annotations

import os
import pathlib
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from feedline import service
from feedline._net import local_secret
from feedline.data import Dataset
from feedline.errors import InvalidArgumentError, UnavailableError
from tests.service.conftest import Cluster
from tests.service.http_helpers import fetch, table

pytestmark = pytest.mark.timeout(60)

JOB_NAME = '<script>alert("job")</script>'
DATASET_ID = "<b>bold</b>&co"
CHROMIUM = pathlib.Path("/usr/bin/chromium")
BROWSER_TIMEOUT_S = 40.0
WAIT_S = 10.0


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.05)


@pytest.fixture
def running(make_cluster) -> Iterator[Cluster]:
    """A dispatcher and a worker with status ports, and a consumer reading a long job on a
    thread (named ``JOB_NAME``, over the dataset registered as ``DATASET_ID``)."""
    cluster = make_cluster(num_workers=0, status_port=0)
    cluster.add_worker(status_port=0, heartbeat_interval_ms=200)
    dataset_id = service.register_dataset(
        cluster.target, Dataset.range(10**9), dataset_id=DATASET_ID
    )
    dataset = service.from_dataset_id(
        "distributed_epoch", cluster.target, dataset_id, job_name=JOB_NAME
    )
    stop = threading.Event()
    read = [0]
    iterator = iter(dataset)

    def consume() -> None:
        while not stop.is_set():
            next(iterator)
            read[0] += 1
            time.sleep(0.0005)

    reader = threading.Thread(target=consume, name="test-status-reader", daemon=True)
    reader.start()
    wait_for(lambda: read[0] > 100, "the consumer reads")
    try:
        yield cluster
    finally:
        stop.set()
        reader.join(timeout=WAIT_S)
        iterator.close()


def test_dispatcher_page_shows_workers_jobs_datasets_and_consumers(running: Cluster) -> None:
    url = running.dispatcher.status_url
    assert url is not None and url.startswith("http://127.0.0.1:")

    def job() -> dict[str, str]:
        (row,) = table(fetch(url)[2], "Jobs")
        return row

    def shows_progress() -> bool:
        row = job()
        served = int(row["elements"].replace(",", ""))
        return float(row["elements/s"].replace(",", "")) > 0 and served > 100

    # Workers report what they served with their heartbeats (every 200 ms here, so the page
    # may lag behind what the consumer read); the page shows it.
    wait_for(shows_progress, "the job's rate and the elements served show")
    status, headers, page = fetch(url)
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in headers["Content-Security-Policy"]  # no scripts at all
    row = job()
    assert row["mode"] == "DYNAMIC" and row["consumers"] == "1" and row["state"] == "running"
    assert row["tasks (running/done/lost)"] == "1/0/0"
    assert int(row["elements"].replace(",", "")) > 100
    assert int(row["bytes/s"].replace(",", "")) > 0
    assert row["progress"].endswith("units handed out (repetition 0)")
    # Names are text, never markup.
    # (from_dataset_id scopes a job's name by its dataset, as TensorFlow does)
    assert row["name"] == (
        "dataset_id=&lt;b&gt;bold&lt;/b&gt;&amp;co/"
        "&lt;script&gt;alert(&quot;job&quot;)&lt;/script&gt; #0"
    )
    assert row["dataset"] == "&lt;b&gt;bold&lt;/b&gt;&amp;co"
    assert "<script" not in page and "<b>" not in page
    (worker,) = running.workers
    (worker_row,) = table(page, "Workers")
    assert worker_row["address"] == worker.worker_address
    assert worker_row["running tasks"] == "1" and worker_row["state"] == "serving"
    (dataset_row,) = table(page, "Datasets")
    assert dataset_row["dataset"] == row["dataset"]
    assert dataset_row["cardinality"] == "1,000,000,000"
    (consumer,) = table(page, "Consumers")
    assert consumer["state"] == "reading"
    assert "Recent errors (0)" in page


def test_dispatcher_page_names_the_input_bottleneck(running: Cluster) -> None:
    """The Input section says what holds each running job back (``feedline diagnose``): this
    consumer takes elements as fast as a range makes them, so it is not the trainer."""
    url = running.dispatcher.status_url
    assert url is not None

    def verdict() -> dict[str, str]:
        (row,) = table(fetch(url)[2], "Input")
        return row

    wait_for(lambda: verdict()["bottleneck"] != "idle", "the job's load is reported")
    row = verdict()
    assert row["bottleneck"] in ("trainer", "workers", "reader", "network"), row
    assert "elements/s (predicted)" in row["one more worker"]
    assert "the jobs need" in fetch(url)[2]


def test_an_idle_dispatcher_page_says_so(make_cluster) -> None:
    cluster = make_cluster(num_workers=0, status_port=0)
    (row,) = table(fetch(cluster.dispatcher.status_url)[2], "Input")
    assert row["bottleneck"] == "idle"
    assert "the service is idle" in row["measured"]


def test_an_exactly_once_job_shows_its_splits(make_cluster, tmp_path: pathlib.Path) -> None:
    cluster = make_cluster(1, status_port=0, work_dir=str(tmp_path), fault_tolerant_mode=True)
    iterator = iter(
        Dataset.range(10_000).apply(service.distribute("distributed_epoch", cluster.target))
    )
    for _ in range(3_000):
        next(iterator)
    url = cluster.dispatcher.status_url
    assert url is not None

    def progress() -> str:
        (row,) = table(fetch(url)[2], "Jobs")
        return row["progress"]

    # The consumer reports what it received every 0.1 s: splits become delivered.
    wait_for(lambda: "splits: 0 delivered" not in progress(), "a split is delivered")
    assert re.search(
        r"units handed out \(repetition 0\); splits: \d+ delivered, \d+ open, 0 to hand out again",
        progress(),
    )
    iterator.close()


def test_worker_page_shows_its_tasks(running: Cluster) -> None:
    (worker,) = running.workers
    status, _, page = fetch(worker.status_url)
    assert status == 200 and "<h1>feedline worker</h1>" in page
    (task,) = table(page, "Tasks")
    assert task["dataset"] == "&lt;b&gt;bold&lt;/b&gt;&amp;co" and "<b>" not in page
    assert task["mode"] == "DYNAMIC" and task["state"] == "running"
    assert task["shard"] == "0 of 1" and task["consumers"] == "shared"
    assert int(task["elements served"].replace(",", "")) > 100
    assert running.address in page  # its dispatcher


def test_unknown_paths_are_404_and_the_server_is_read_only(make_cluster) -> None:
    cluster = make_cluster(num_workers=1, status_port=0)
    url = cluster.dispatcher.status_url
    for path in ("favicon.ico", "metrics/x", "..%2f", "index.php?a=<script>"):
        status, _, body = fetch(url + path)
        assert status == 404, path
        assert "<script" not in body
    assert fetch(url, method="HEAD")[0] == 200
    assert fetch(url, method="POST")[0] == 501
    assert fetch(url + "?refresh=1")[0] == 200


def test_a_status_port_in_use_is_a_clear_error(make_cluster) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UnavailableError, match=rf"status port {port} .*already in use"):
            service.DispatchServer(service.DispatcherConfig(status_port=port))
        cluster = make_cluster(num_workers=0)
        with pytest.raises(UnavailableError, match=r"WorkerConfig.status_port") as caught:
            cluster.add_worker(status_port=port)
        assert "--status-port" in str(caught.value)
    # The failed servers left nothing behind: the dispatcher has no worker.
    assert "Workers (0)" in _page_of(make_cluster)


def _page_of(make_cluster: Callable[..., Cluster]) -> str:
    return fetch(make_cluster(num_workers=0, status_port=0).dispatcher.status_url)[2]


@pytest.mark.parametrize("port", [-1, 65536, "8080", True, 1.5])
def test_status_port_is_checked(port: object) -> None:
    with pytest.raises(InvalidArgumentError, match="status_port"):
        service.DispatcherConfig(status_port=port)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="status_port"):
        service.WorkerConfig(dispatcher_address="localhost:1", status_port=port)  # type: ignore[arg-type]


def test_status_port_must_differ_from_the_port() -> None:
    with pytest.raises(InvalidArgumentError, match="port of its own"):
        service.DispatcherConfig(port=5050, status_port=5050)


def test_command_line_status_port() -> None:
    """``feedline dispatcher --status-port``: the page serves; a port in use is exit code 2."""
    env = dict(os.environ)
    env.pop("FEEDLINE_SERVICE_TOKEN", None)
    command = [sys.executable, "-m", "feedline.cli", "dispatcher", "--port", "0"]
    process = subprocess.Popen(
        [*command, "--status-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        url = _status_url_of(process)
        status, _, page = fetch(url)
        assert status == 200 and "feedline dispatcher" in page
        port = int(url.rsplit(":", 1)[1].strip("/"))
        taken = subprocess.run(
            [*command, "--status-port", str(port)],
            capture_output=True,
            text=True,
            env=env,
            timeout=WAIT_S * 3,
        )
        assert taken.returncode == 2, taken.stdout + taken.stderr
        assert f"error: the dispatcher's status port {port}" in taken.stdout
        assert "--status-port" in taken.stdout
    finally:
        process.terminate()
        try:
            process.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=WAIT_S)


def _status_url_of(process: subprocess.Popen) -> str:
    """The status page's URL from the server's log (read on a thread, with a timeout)."""
    found: list[str] = []
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "status page at " in line:
                found.append(line.split("status page at ", 1)[1].split(",")[0])
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=WAIT_S * 2)
    assert found, f"no status page line; output: {lines}"
    return found[0]


# -- in a browser ---------------------------------------------------------------------------


def _with_token(url: str | None) -> str:
    """``url`` with the local secret in its query, as a user opens the page in a browser."""
    assert url is not None
    return f"{url}?token={local_secret.read()}"


def _chromium(tmp_path: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S)


@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's chromium is not installed (/usr/bin/chromium; `apt-get install chromium`, "
    "which .ci/run does where it can); the plain HTTP tests above cover the page",
)
def test_pages_render_in_headless_chromium(running: Cluster, tmp_path: pathlib.Path) -> None:
    url = running.dispatcher.status_url
    result = _chromium(tmp_path, "--dump-dom", _with_token(url))
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert "<h1>feedline dispatcher</h1>" in dom
    assert "Workers (1)" in dom and "Jobs (1)" in dom and "Consumers (1)" in dom
    (worker,) = running.workers
    assert worker.worker_address in dom
    # The job's name is rendered as text: the browser made no script element of it.
    assert '&lt;script&gt;alert("job")&lt;/script&gt; #0' in dom
    assert "<script" not in dom and "<b>" not in dom

    result = _chromium(tmp_path, "--dump-dom", _with_token(worker.status_url))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "<h1>feedline worker</h1>" in result.stdout and "Tasks (1)" in result.stdout

    screenshot = tmp_path / "dispatcher.png"
    result = _chromium(
        tmp_path, f"--screenshot={screenshot}", "--window-size=1400,900", _with_token(url)
    )
    assert result.returncode == 0, result.stderr[-2000:]
    image = screenshot.read_bytes()
    assert image.startswith(b"\x89PNG\r\n\x1a\n") and len(image) > 10_000, len(image)
