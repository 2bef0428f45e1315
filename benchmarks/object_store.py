"""Reading TFRecord files from an S3-compatible store with 20 ms added to every request.

Usage (from the repository root)::

    PYTHONPATH=src .venv/bin/python benchmarks/object_store.py
    PYTHONPATH=src .venv/bin/python benchmarks/object_store.py --files 16 --mb 4 --rounds 3

A moto S3 server (``python -m moto.server``) runs in a process of its own on 127.0.0.1, behind
``tests/fault_proxy.py``'s proxy (a process of its own too) that holds the first bytes of every
request ``--latency-ms`` (20) and every 64 KiB of an answer ``--latency-per-64k-ms`` (0). This
process writes ``--files`` TFRecord files of ``--mb`` MB each, then reads all of them, each way
in turn, for ``--rounds`` rounds after an untimed one (each round times the three ways one after
another, with a fresh S3 client every time, made before the clock starts):

* ``sequential``: a plain loop, ``fsspec.open(url).read()`` of one file after another;
* ``threads``: 8 plain readers on 8 threads, each ``fsspec.open(url).read()`` of a file;
* ``feedline``: ``Dataset.list_files(pattern, shuffle=False).interleave(TFRecordDataset,
  cycle_length=8, num_parallel_calls=AUTOTUNE)``, every record iterated (its CRC checked);
  ``--buffer-size`` sets the readers' ``buffer_size`` (each file read ahead by 16x it);
* with ``--one-request-per-object``, also ``feedline-1``: the same pipeline with one request of
  an object in flight at a time (``READ_AHEAD_REQUESTS = 1``), as the read-ahead was before
  it asked for several blocks of an object at once; each round times it right after
  ``feedline`` (right before it in odd rounds).

It prints one JSON line per way (MB/s, seconds, requests the proxy saw, CPU seconds of this
process, of the store and of the proxy (whole ticks of ``/proc``: 10 ms), peak RSS over the
RSS before, and for feedline the most bytes its read-aheads held at once; the fastest round of
each) and each round's ratios with
their medians: feedline / sequential (goal >= 5x) and feedline / threads (goal >= 0.8), and
with ``--one-request-per-object`` feedline / feedline-1.

The most bytes the read-aheads held is taken in one more, untimed, read per round: sampling it
(every 2 ms, while the read lasts) cost ~5% of feedline's CPU when the timed read carried it.
``--fixed-malloc`` runs this process (and the store and proxy it starts) with glibc's malloc
thresholds fixed (``_common.FIXED_MALLOC``): by default glibc maps the buffers of a read
(the HTTP client's 4 MB bodies, the reader's 1 MiB reads) afresh and faults them in page by page,
~15,000 page faults for the 64 MB feedline reads (2,000-7,000 for the threads' fewer copies).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from _common import FIXED_MALLOC, cpu_seconds, peak_memory_of  # noqa: E402

_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
BUCKET = "s3://bench"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def _serve_proxy(upstream: int, port_file: str, latency: float, per_64k: float) -> None:
    """The proxy's process: forwards to ``upstream`` until killed; writes its port, then its
    request count every 0.2 s, to ``port_file``."""
    from tests.fault_proxy import FaultProxy

    with FaultProxy(
        ("127.0.0.1", upstream), request_latency=latency, latency_per_64k=per_64k
    ) as proxy:
        while True:
            pathlib.Path(port_file + ".tmp").write_text(f"{proxy.port} {proxy.requests}")
            os.replace(port_file + ".tmp", port_file)
            time.sleep(0.2)


def _fresh_clients() -> None:
    """A fresh S3 client for the next way, made before its clock starts: each way pays for its
    reads, not for making botocore's client (which reads its model files: ~0.1 s of CPU a
    client, more than the 8 threads' reads of a round take in CPU besides). Every way then
    reads through this one client, feedline's too (``fsspec.open`` and feedline's file
    systems both take s3fs's cached instance). The client's first request finishes setting it
    up (~21 ms of CPU, whatever the request: credentials, the endpoint's rules), so it is made
    here too, a ``HeadBucket`` that reads no listing and no object. The clients before it are
    collected now: a client's model is ~10^5 objects, and a full collection that came due
    during a timed read doubled that read's time (every run's third round, before this)."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.connect()
    fs.call_s3("head_bucket", Bucket=BUCKET.removeprefix("s3://"))
    gc.collect()


def _requests(port_file: str) -> int:
    time.sleep(0.5)  # the proxy writes its count every 0.2 s
    return int(pathlib.Path(port_file).read_text().split()[1])


def _write_files(files: int, mb: float, record_bytes: int) -> list[str]:
    from feedline.io import TFRecordWriter

    urls = []
    per_file = max(1, int(mb * 1e6) // record_bytes)
    for k in range(files):
        url = f"{BUCKET}/train-{k:05d}.tfrecord"
        with TFRecordWriter(url) as writer:
            for j in range(per_file):
                writer.write(bytes([k % 251]) * (record_bytes - 8) + j.to_bytes(8, "little"))
        urls.append(url)
    return urls


def _read_one(url: str) -> int:
    import fsspec

    with fsspec.open(url, "rb") as f:
        return len(f.read())


def _sequential(urls: list[str]) -> int:
    return sum(_read_one(url) for url in urls)


def _threads(urls: list[str]) -> int:
    with ThreadPoolExecutor(8) as pool:
        return sum(pool.map(_read_one, urls))


class _ReadAheadWatch:
    """The most bytes all of feedline's read-aheads held at once, sampled every 2 ms while a
    run lasts (each ``_fs._ReadAhead`` is registered as it is made)."""

    def __init__(self) -> None:
        from feedline import _fs

        self.peak = 0
        self._live: weakref.WeakSet[Any] = weakref.WeakSet()
        self._done = threading.Event()
        original = _fs._ReadAhead.__init__
        live = self._live

        def register(ahead: Any, *args: Any, **kwargs: Any) -> None:
            original(ahead, *args, **kwargs)
            live.add(ahead)

        self._restore = lambda: setattr(_fs._ReadAhead, "__init__", original)
        _fs._ReadAhead.__init__ = register  # type: ignore[method-assign]
        self._thread = threading.Thread(target=self._sample, name="read-ahead-watch", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.002):
            self.peak = max(self.peak, sum(a.buffered for a in list(self._live)))

    def stop(self) -> int:
        self._done.set()
        self._thread.join(timeout=10)
        self._restore()
        return self.peak


def _feedline(
    urls: list[str],
    buffer_size: int | None = None,
    watch: dict[str, int] | None = None,
    parallel: int = -1,
) -> int:
    from feedline.data import AUTOTUNE, Dataset, TFRecordDataset

    watcher = _ReadAheadWatch() if watch is not None else None
    files = Dataset.list_files(f"{BUCKET}/train-*.tfrecord", shuffle=False)
    dataset = files.interleave(
        lambda name: TFRecordDataset(name, buffer_size=buffer_size),
        cycle_length=8,
        num_parallel_calls=AUTOTUNE if parallel == -1 else parallel,
    )
    total = 0
    try:
        for record in dataset:
            total += len(record.item()) + 16  # the record and its 16 framing bytes, as stored
    finally:
        if watcher is not None and watch is not None:
            watch["read_ahead_peak"] = watcher.stop()
    return total


def _one_request(urls: list[str], buffer_size: int | None, parallel: int) -> int:
    """``_feedline`` with one request of an object in flight at a time."""
    from feedline.data.readers import _files

    saved = _files.READ_AHEAD_REQUESTS
    _files.READ_AHEAD_REQUESTS = 1
    try:
        return _feedline(urls, buffer_size, None, parallel)
    finally:
        _files.READ_AHEAD_REQUESTS = saved


def _measure(
    name: str,
    run: Callable[[list[str]], int],
    urls: list[str],
    port_file: str,
    server_pids: tuple[int, int],
) -> dict[str, Any]:
    """One timed read of every file one way, with fresh S3 clients; with the CPU seconds of
    the store and of the proxy (``server_pids``) during it."""
    _fresh_clients()
    before = _requests(port_file)
    got: dict[str, Any] = {}

    def timed() -> None:
        servers = {pid: cpu_seconds(pid) for pid in server_pids}
        start, cpu = time.perf_counter(), time.process_time()
        got["bytes"] = run(urls)
        got["seconds"] = time.perf_counter() - start
        got["cpu"] = time.process_time() - cpu
        got["servers"] = [cpu_seconds(pid) - servers[pid] for pid in server_pids]

    memory = peak_memory_of(timed)
    seconds = got["seconds"]
    return {
        "way": name,
        "seconds": round(seconds, 3),
        "MB/s": round(got["bytes"] / seconds / 1e6, 1),
        "bytes": got["bytes"],
        "requests": _requests(port_file) - before,
        "client_cpu_s": round(got["cpu"], 3),
        "store_cpu_s": round(got["servers"][0], 2),
        "proxy_cpu_s": round(got["servers"][1], 2),
        "peak_rss_over_start_MB": round((memory["peak_rss"] - memory["rss_before"]) / 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--mb", type=float, default=4.0, help="MB per file")
    parser.add_argument("--record-bytes", type=int, default=65536)
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added per request")
    parser.add_argument("--latency-per-64k-ms", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--buffer-size",
        type=int,
        default=None,
        help="TFRecordDataset's buffer_size (read-ahead: 16x it per file); default 1 MiB",
    )
    parser.add_argument(
        "--parallel", type=int, default=-1, help="interleave's num_parallel_calls (-1: AUTOTUNE)"
    )
    parser.add_argument(
        "--one-request-per-object",
        action="store_true",
        help="also time feedline with one request of an object in flight at a time",
    )
    parser.add_argument(
        "--fixed-malloc",
        action="store_true",
        help="run with glibc's malloc thresholds fixed (GLIBC_TUNABLES, _common.FIXED_MALLOC)",
    )
    parser.add_argument("--serve-proxy", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fixed_malloc and os.environ.get("GLIBC_TUNABLES") != FIXED_MALLOC["GLIBC_TUNABLES"]:
        # glibc reads its tunables when a process starts: this one starts again with them.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **FIXED_MALLOC})
    if args.serve_proxy:
        upstream, port_file = args.serve_proxy
        _serve_proxy(
            int(upstream), port_file, args.latency_ms / 1000, args.latency_per_64k_ms / 1000
        )
        return

    server_port = _free_port()
    port_file = f"/tmp/feedline-object-store-bench-{os.getpid()}.port"
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(server_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    try:
        _wait_for_port(server_port)
        children.append(
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--latency-ms",
                    str(args.latency_ms),
                    "--latency-per-64k-ms",
                    str(args.latency_per_64k_ms),
                    "--serve-proxy",
                    str(server_port),
                    port_file,
                ],
                env={**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"},
            )
        )
        deadline = time.monotonic() + 60
        while not os.path.exists(port_file):
            if time.monotonic() > deadline:
                raise TimeoutError("the proxy did not start within 60 s")
            time.sleep(0.1)
        proxy_port = int(pathlib.Path(port_file).read_text().split()[0])
        os.environ.update(_ENV, AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy_port}")

        import s3fs

        import feedline.data  # noqa: F401  (imported before the clocks, as s3fs is for the others)

        s3fs.S3FileSystem(skip_instance_cache=True).mkdir(BUCKET.removeprefix("s3://"))
        urls = _write_files(args.files, args.mb, args.record_bytes)
        ways: list[tuple[str, Callable[[list[str]], int]]] = [
            ("sequential", _sequential),
            ("threads", _threads),
            ("feedline", lambda urls: _feedline(urls, args.buffer_size, None, args.parallel)),
        ]
        if args.one_request_per_object:
            ways.append(
                ("feedline-1", lambda urls: _one_request(urls, args.buffer_size, args.parallel))
            )
        # Round after round of the three ways, so that each round sees the same load; the
        # ratios are each round's, the rows each way's fastest round.
        best: dict[str, dict[str, Any]] = {}
        watch: dict[str, int] = {}
        ratios: list[tuple[float, float]] = []
        serial: list[float] = []
        for _, run in ways:  # an untimed warm-up: the first reads' imports and connections
            _fresh_clients()
            run(urls)
        for round_number in range(args.rounds):
            # feedline-1 right after feedline in even rounds, right before it in odd ones.
            order = ways if round_number % 2 == 0 else [*ways[:2], *reversed(ways[2:])]
            pids = (children[0].pid, children[1].pid)
            rows = {name: _measure(name, run, urls, port_file, pids) for name, run in order}
            _fresh_clients()
            _feedline(urls, args.buffer_size, watch, args.parallel)  # untimed: the peak held
            rows["feedline"]["read_ahead_peak_MB"] = round(watch["read_ahead_peak"] / 1e6, 1)
            if "feedline-1" in rows:
                serial.append(rows["feedline"]["MB/s"] / rows["feedline-1"]["MB/s"])
            for name, row in rows.items():
                if name not in best or row["seconds"] < best[name]["seconds"]:
                    best[name] = row
            rate = {name: row["MB/s"] for name, row in rows.items()}
            ratios.append(
                (rate["feedline"] / rate["sequential"], rate["feedline"] / rate["threads"])
            )
        for row in best.values():
            print(json.dumps(row))
        print(
            json.dumps(
                {
                    "feedline/sequential": [round(r[0], 2) for r in ratios],
                    "feedline/threads": [round(r[1], 2) for r in ratios],
                    "median": [
                        round(statistics.median(r[0] for r in ratios), 2),
                        round(statistics.median(r[1] for r in ratios), 2),
                    ],
                    "files": args.files,
                    "MB_per_file": args.mb,
                    "latency_ms_per_request": args.latency_ms,
                    "latency_ms_per_64k": args.latency_per_64k_ms,
                    "buffer_size": args.buffer_size,
                    "num_parallel_calls": args.parallel,
                    "fixed_malloc": args.fixed_malloc,
                    **(
                        {
                            "feedline/feedline-1": [round(r, 2) for r in serial],
                            "median feedline/feedline-1": round(statistics.median(serial), 2),
                        }
                        if serial
                        else {}
                    ),
                }
            )
        )
    finally:
        for child in reversed(children):
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
        for path in (port_file, port_file + ".tmp"):
            if os.path.exists(path):
                os.remove(path)


if __name__ == "__main__":
    main()
