"""The data service's resources: a server's memory under a flood of oversized requests, and the
cost of a job as jobs and datasets come and go.

Usage (from the repository root)::

    .venv/bin/python benchmarks/service_resources.py                 # all three, ~5 minutes
    .venv/bin/python benchmarks/service_resources.py --only flood    # one part (or flood,jobs)
    .venv/bin/python benchmarks/service_resources.py --only jobs --jobs 1000

Every server is a process of its own (``DispatchServer`` / ``WorkerServer`` started by
``python -c``, stopped by closing its stdin), so that its RSS is its own; the clients run in this
process.

flood     A dispatcher and a worker with a token. For each row, ``--requests`` (16) concurrent
          requests of ``--request-mib`` (250) MiB each from this process, with the token or
          without it, to one method: each server's RSS before, its peak during the row (VmHWM,
          reset through ``/proc/PID/clear_refs`` before the row) and after, the status codes the
          requests got, and whether the cluster still serves (a dataset registered and read
          through it with the token) once the row is over.
jobs      A dispatcher and ``--workers`` (2) workers with the default configuration; ``--jobs``
          (10,000) jobs one after the other, each ``list(dataset)`` of ``range(2).apply(
          distribute("parallel_epochs", ...))`` (each iteration is a new anonymous job; 2
          elements from each worker). Per-job time is the mean over the 100 jobs that end at
          job 100, 1,000 and 10,000; the servers' RSS is taken at those points.
datasets  The same with a new dataset of ~1 MiB per job (``from_tensor_slices`` of a distinct
          float32 array of 262,144 values, read as 1 element), ``--datasets`` (2,000) of them,
          the dispatcher with ``job_gc_timeout_ms=--gc-timeout-ms`` (2,000) and
          ``job_gc_check_interval_ms=500``: the servers' RSS every 250 datasets, and once more
          after the timeout and the worker's cache time have passed.

The JSON written to ``benchmarks/results/`` has every number.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import numpy as np

import _common

PARTS = ("flood", "jobs", "datasets")
TOKEN = "benchmark-secret"
_TOKEN_KEY = "feedline-token"
_DISPATCHER = "feedline.service.Dispatcher"
_WORKER = "feedline.service.Worker"
MIB = 1 << 20

# A server process: builds the server from the JSON config in argv, prints its address, serves
# until its stdin is closed.
_SERVER_CODE = """
import json, sys
from feedline import service
kind, config = sys.argv[1], json.loads(sys.argv[2])
if kind == "dispatcher":
    server = service.DispatchServer(service.DispatcherConfig(**config))
    address = server.target.split("://")[1]
else:
    server = service.WorkerServer(service.WorkerConfig(**config))
    address = server.worker_address
print("serving at", address, flush=True)
sys.stdin.read()
server.stop()
"""


class ServerProcess:
    """A dispatcher or worker in a process of its own."""

    def __init__(self, kind: str, config: dict[str, Any], env: dict[str, str]) -> None:
        self.kind = kind
        # The server's log, for when a run fails.
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            "w+", prefix=f"feedline-{kind}-", suffix=".log", delete=False
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SERVER_CODE, kind, json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )
        self.address = self._banner(timeout=60.0)

    def _banner(self, timeout: float) -> str:
        lines: list[str] = []
        reader = threading.Thread(
            target=lambda: lines.append(self.process.stdout.readline()),  # type: ignore[union-attr]
            daemon=True,
        )
        reader.start()
        reader.join(timeout)
        if not lines or not lines[0].startswith("serving at "):
            self.stop()
            raise RuntimeError(f"the {self.kind} process did not start: {lines}")
        return lines[0].split()[-1]

    @property
    def pid(self) -> int:
        return self.process.pid

    def status(self, key: str) -> int:
        """A ``/proc/PID/status`` size (``VmRSS``, ``VmHWM``) in bytes."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise KeyError(key)

    def rss(self) -> int:
        return self.status("VmRSS")

    def reset_peak(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def stop(self, keep_log: bool = False) -> None:
        """Stops the server; its log is deleted unless ``keep_log``."""
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()  # type: ignore[union-attr]
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(15)
        self.log.close()
        if keep_log:
            print(f"  the {self.kind}'s log: {self.log.name}")
        else:
            os.unlink(self.log.name)


@contextlib.contextmanager
def cluster(
    dispatcher_config: dict[str, Any], token: str | None, num_workers: int = 1
) -> Iterator[tuple[ServerProcess, list[ServerProcess]]]:
    """A dispatcher process and ``num_workers`` worker processes."""
    env = {k: v for k, v in os.environ.items() if k != "FEEDLINE_SERVICE_TOKEN"}
    if token is not None:
        env["FEEDLINE_SERVICE_TOKEN"] = token
    dispatcher = ServerProcess("dispatcher", dispatcher_config, env)
    workers: list[ServerProcess] = []
    failed = True
    try:
        for _ in range(num_workers):
            workers.append(ServerProcess("worker", {"dispatcher_address": dispatcher.address}, env))
        yield dispatcher, workers
        failed = False
    finally:
        for worker in workers:
            worker.stop(keep_log=failed)
        dispatcher.stop(keep_log=failed)


def mib(size: int) -> float:
    return round(size / MIB, 1)


# -- flood --------------------------------------------------------------------------------------


def _flood(address: str, path: str, payload: bytes, count: int, token: str | None) -> list[str]:
    """``count`` concurrent unary calls of ``payload`` to ``path``; their status codes."""
    channel = grpc.insecure_channel(
        address,
        options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
    )
    stub = channel.unary_unary(path)
    metadata = () if token is None else ((_TOKEN_KEY, token),)

    def one(_: int) -> str:
        try:
            stub(payload, timeout=300, metadata=metadata)
            return "OK"
        except grpc.RpcError as error:
            return error.code().name  # type: ignore[attr-defined]

    try:
        with futures.ThreadPoolExecutor(count) as pool:
            return list(pool.map(one, range(count)))
    finally:
        channel.close()


def _still_serves(target: str) -> bool:
    from feedline import service
    from feedline.data import Dataset

    dataset = Dataset.range(5).map(lambda x: x * 3)
    try:
        read = dataset.apply(service.distribute("parallel_epochs", target))
        return sorted(int(x) for x in read) == [0, 3, 6, 9, 12]
    except Exception as error:  # reported, not raised: the row's result
        print(f"    the cluster does not serve: {error!r}")
        return False


def run_flood(args: argparse.Namespace) -> list[dict[str, Any]]:
    payload = b"\x00" * (args.request_mib * MIB)
    rows = [
        ("dispatcher", "RegisterDataset", None),
        ("dispatcher", "ClientHeartbeat", None),
        ("worker", "GetElements", None),
        ("dispatcher", "ClientHeartbeat", TOKEN),
        ("worker", "GetElements", TOKEN),
    ]
    results = []
    os.environ["FEEDLINE_SERVICE_TOKEN"] = TOKEN  # for this process's own reads
    try:
        with cluster({}, TOKEN) as (dispatcher, (worker,)):
            target = f"grpc://{dispatcher.address}"
            if not _still_serves(target):
                raise RuntimeError("the cluster does not serve before the flood")
            servers = {"dispatcher": dispatcher, "worker": worker}
            for role, method, token in rows:
                server = servers[role]
                service_name = _DISPATCHER if role == "dispatcher" else _WORKER
                before = {name: s.rss() for name, s in servers.items()}
                exact = all(s.reset_peak() for s in servers.values())
                start = time.perf_counter()
                codes = _flood(
                    server.address, f"/{service_name}/{method}", payload, args.requests, token
                )
                seconds = time.perf_counter() - start
                peak = {name: s.status("VmHWM") for name, s in servers.items()}
                after = {name: s.rss() for name, s in servers.items()}
                serves = _still_serves(target)
                row = {
                    "server": role,
                    "method": method,
                    "token": token is not None,
                    "requests": args.requests,
                    "request_mib": args.request_mib,
                    "codes": sorted(set(codes)),
                    "seconds": round(seconds, 2),
                    "rss_before_mib": {k: mib(v) for k, v in before.items()},
                    "peak_rss_mib": {k: mib(v) for k, v in peak.items()},
                    "peak_growth_mib": {k: mib(peak[k] - before[k]) for k in servers},
                    "rss_after_mib": {k: mib(v) for k, v in after.items()},
                    "exact_peak": exact,
                    "still_serves": serves,
                }
                results.append(row)
                print(
                    f"  {role:10s} {method:16s} token={'yes' if token else 'no ':3s} "
                    f"{row['codes']}: {role} RSS {mib(before[role])} -> peak {mib(peak[role])} "
                    f"(+{row['peak_growth_mib'][role]}) -> {mib(after[role])} MiB; "
                    f"{seconds:.1f} s; still serves: {serves}",
                    flush=True,
                )
    finally:
        del os.environ["FEEDLINE_SERVICE_TOKEN"]
    return results


# -- jobs and datasets --------------------------------------------------------------------------


def run_jobs(args: argparse.Namespace) -> dict[str, Any]:
    from feedline import service
    from feedline.data import Dataset

    marks = sorted({m for m in (100, 1_000, 10_000, args.jobs) if m <= args.jobs})
    times = np.zeros(args.jobs)
    points = []
    expected = sorted([0, 1] * args.workers)
    wrong: list[dict[str, Any]] = []  # jobs that read something else (reported, not raised)
    with cluster({}, None, args.workers) as (dispatcher, workers):
        dataset = Dataset.range(2).apply(
            service.distribute("parallel_epochs", f"grpc://{dispatcher.address}")
        )
        for i in range(args.jobs):
            start = time.perf_counter()
            elements = sorted(int(x) for x in dataset)
            times[i] = time.perf_counter() - start
            if elements != expected:
                wrong.append({"job": i, "read": elements})
                print(f"  job {i} read {elements}, not {expected}", flush=True)
            if i + 1 in marks:
                window = times[max(0, i + 1 - 100) : i + 1]
                point = {
                    "jobs": i + 1,
                    "ms_per_job": round(float(window.mean()) * 1000, 2),
                    "median_ms": round(float(np.median(window)) * 1000, 2),
                    "dispatcher_rss_mib": mib(dispatcher.rss()),
                    "worker_rss_mib": [mib(worker.rss()) for worker in workers],
                    "load_1min": round(os.getloadavg()[0], 1),
                }
                points.append(point)
                print(
                    f"  jobs {i + 1:6,d}: {point['ms_per_job']:6.2f} ms/job (median "
                    f"{point['median_ms']:.2f}) over the last 100; dispatcher "
                    f"{point['dispatcher_rss_mib']} MiB, workers {point['worker_rss_mib']} MiB; "
                    f"load {point['load_1min']}",
                    flush=True,
                )
    return {
        "workers": args.workers,
        "points": points,
        "total_seconds": round(float(times.sum()), 1),
        "wrong_reads": wrong,
    }


def run_datasets(args: argparse.Namespace) -> dict[str, Any]:
    from feedline import service
    from feedline.data import Dataset

    config = {"job_gc_timeout_ms": args.gc_timeout_ms, "job_gc_check_interval_ms": 500}
    points = []
    with cluster(config, None) as (dispatcher, (worker,)):
        target = f"grpc://{dispatcher.address}"

        def measure(count: int, note: str = "") -> None:
            point = {
                "datasets": count,
                "dispatcher_rss_mib": mib(dispatcher.rss()),
                "worker_rss_mib": mib(worker.rss()),
                "note": note,
            }
            points.append(point)
            print(
                f"  datasets {count:6,d}{note}: dispatcher {point['dispatcher_rss_mib']} MiB, "
                f"worker {point['worker_rss_mib']} MiB",
                flush=True,
            )

        measure(0)
        start = time.perf_counter()
        for i in range(args.datasets):
            values = np.arange(262_144, dtype=np.float32) + np.float32(i)
            dataset = Dataset.from_tensor_slices(values[None]).apply(
                service.distribute("parallel_epochs", target)
            )
            (element,) = list(dataset)
            if float(element[0]) != float(i):
                raise RuntimeError(f"dataset {i} read {element[:2]}")
            if (i + 1) % 250 == 0 or i + 1 == args.datasets:
                measure(i + 1)
        seconds = time.perf_counter() - start
        wait = args.gc_timeout_ms / 1000 + args.settle_seconds
        time.sleep(wait)
        measure(args.datasets, f" + {wait:.0f} s idle")
    return {"points": points, "seconds": round(seconds, 1), "config": config}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated of {PARTS}")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--request-mib", type=int, default=250)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2, help="worker processes for jobs")
    parser.add_argument("--datasets", type=int, default=2_000)
    parser.add_argument("--gc-timeout-ms", type=int, default=2_000)
    parser.add_argument(
        "--settle-seconds", type=float, default=8.0, help="idle time after the last dataset"
    )
    args = parser.parse_args()
    parts = [part.strip() for part in args.only.split(",") if part.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    payload: dict[str, Any] = {"load_average": os.getloadavg()}
    if "flood" in parts:
        print(f"flood: {args.requests} concurrent requests of {args.request_mib} MiB per row")
        payload["flood"] = run_flood(args)
    if "jobs" in parts:
        print(f"jobs: {args.jobs:,} jobs of range(2) on {args.workers} workers, one by one")
        payload["jobs"] = run_jobs(args)
    if "datasets" in parts:
        print(f"datasets: {args.datasets:,} datasets of ~1 MiB, one job each")
        payload["datasets"] = run_datasets(args)
    _common.write_results("service_resources", payload)


if __name__ == "__main__":
    main()
