"""What TLS costs a GetElements call: plain gRPC against TLS on loopback, 4 KB and 1 MB elements.

Usage (from the repository root)::

    .venv/bin/python benchmarks/service_tls.py [--quick] [--rounds 5] [--min-seconds 2]

Two rows per element size, each run plain and with TLS in alternation (which goes first
alternates too), fresh servers for every run:

  rpc      the transport alone: a gRPC server of ``feedline._net`` whose one method answers every
           call with a frame of one element (4 KB or 1 MB of float32), called in a loop; the
           time per call
  service  the data service: ``range(10**9).map(f).apply(distribute("parallel_epochs", ...))``
           with ``f(i) = np.full(size, i, np.float32)``, one worker, dispatcher, worker and
           consumer in this process, ``data_transfer_protocol="grpc"`` (shared memory would skip
           the transport) and ``compression=None``; the time per element received
  shm      the same with the default transfer: this consumer is on the worker's host, so the
           elements come through shared memory and only the small GetElements messages
           travel over (TLS) gRPC

Plain is the token alone; TLS is the token over mutual TLS (server and client certificates of
a CA made for the run with ``openssl``, ECDSA P-256: what ``docs/security.md`` sets up). A run
warms up for ``--warmup-seconds`` and then counts for at least ``--min-seconds``. The report gives
the median over rounds of TLS / plain within a round (of wall time per call or element, and of
this process's CPU time per call or element, which load moves less) and the range. Results go to
``benchmarks/results/service_tls-*.json``. Goal (issue 22): at most 10% at 4 KB, 3% at 1 MB.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import _common

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIZES = {"4KB": 1_024, "1MB": 262_144}  # float32 values per element
TOKEN = "benchmark-token"
_TLS_ENV = ("FEEDLINE_TLS_CA", "FEEDLINE_TLS_CERT", "FEEDLINE_TLS_KEY")


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in (*_TLS_ENV, "FEEDLINE_SERVICE_TOKEN")}
    for name in saved:
        os.environ.pop(name, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _timed(step: Callable[[], int], warmup: float, seconds: float) -> tuple[float, float]:
    """``(wall s, CPU s)`` per unit of ``step`` (which returns how many units it did)."""
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        step()
    units = 0
    wall, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < seconds:
        units += step()
    return (time.perf_counter() - wall) / units, (time.process_time() - cpu) / units


def run_rpc(size: int, tls: Any, warmup: float, seconds: float) -> tuple[float, float]:
    from feedline._net import rpc
    from feedline._net.elements import pack_elements
    from feedline._net.wire import encode_frame

    element = [np.full(size, 7, np.float32)]
    meta, buffers = pack_elements([element])
    reply = encode_frame({"elements": meta}, buffers)

    server, port = rpc.start_server(
        "bench.Tls", {"Get": lambda header, views: reply}, bind="127.0.0.1", port=0,
        token=TOKEN, tls=tls,
    )  # fmt: skip
    client = rpc.RpcClient(f"127.0.0.1:{port}", "bench.Tls", TOKEN, tls)
    try:

        def step() -> int:
            client.call("Get", {}, timeout=30)
            return 1

        return _timed(step, warmup, seconds)
    finally:
        client.close()
        server.stop(0)


def run_service(
    size: int, tls: Any, warmup: float, seconds: float, transfer: str | None = "grpc"
) -> tuple[float, float]:
    from feedline import data as fd
    from feedline import service

    files = {} if tls is None else {"tls_cert": tls.cert, "tls_key": tls.key, "tls_ca": tls.ca}
    env = {"FEEDLINE_SERVICE_TOKEN": TOKEN}
    if tls is not None:
        env |= {"FEEDLINE_TLS_CA": tls.ca, "FEEDLINE_TLS_CERT": tls.cert,
                "FEEDLINE_TLS_KEY": tls.key}  # fmt: skip
    with _environment(env):
        dispatcher = service.DispatchServer(service.DispatcherConfig(token=TOKEN, **files))
        worker = service.WorkerServer(
            service.WorkerConfig(
                dispatcher_address=dispatcher.target.split("://")[1], token=TOKEN, **files
            )
        )
        try:
            dataset = (
                fd.Dataset.range(10**9)
                .map(lambda i: np.full(size, i, np.float32))
                .apply(
                    service.distribute(
                        "parallel_epochs",
                        dispatcher.target,
                        compression=None,
                        data_transfer_protocol=transfer,
                    )
                )
            )
            iterator = iter(dataset)

            def step() -> int:
                next(iterator)
                return 1

            try:
                return _timed(step, warmup, seconds)
            finally:
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()
        finally:
            worker.stop()
            dispatcher.stop()


def where_the_cost_goes(pki: Any, tls: Any) -> dict[str, Any]:
    """What bounds TLS's cost per MB here: the TLS version and cipher a ``feedline._net`` TLS
    server negotiates (asked by ``openssl s_client``, ALPN h2, the run's client certificate),
    AES-GCM's speed on one core (``openssl speed``, 16 KB records, as TLS sends them) and a
    1 MB copy's time."""
    import subprocess

    from feedline._net import rpc

    server, port = rpc.start_server(
        "bench.Tls", {"Get": lambda header, views: ({}, [])}, bind="127.0.0.1", port=0,
        token=TOKEN, tls=tls,
    )  # fmt: skip
    try:
        hello = subprocess.run(
            ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-alpn", "h2", "-brief",
             "-CAfile", pki.ca, "-cert", pki.client_cert, "-key", pki.client_key],
            input=b"", capture_output=True, timeout=30,
        )  # fmt: skip
    finally:
        server.stop(0)
    said = (hello.stdout + hello.stderr).decode("utf-8", "replace").splitlines()
    found = {k: line.split(":", 1)[1].strip() for line in said for k in ("Protocol version",
             "Ciphersuite") if line.startswith(k)}  # fmt: skip
    speeds = {}
    for cipher in ("aes-128-gcm", "aes-256-gcm"):
        out = subprocess.run(
            ["openssl", "speed", "-evp", cipher, "-bytes", "16384", "-seconds", "1"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.split()
        speeds[cipher] = float(out[-1].rstrip("k")) * 1000 / 1e9  # GB/s
    source, target = np.ones(1 << 20, np.uint8), np.empty(1 << 20, np.uint8)
    started = time.perf_counter()
    for _ in range(1000):
        np.copyto(target, source)
    copy_us = (time.perf_counter() - started) / 1000 * 1e6
    return {**found, "gb_per_s": speeds, "copy_1mb_us": copy_us}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 s runs, 3 rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-seconds", type=float, default=2.0)
    parser.add_argument("--warmup-seconds", type=float, default=0.5)
    parser.add_argument("--only", default="rpc,service,shm", help="rows: rpc,service,shm")
    parser.add_argument(
        "--where",
        action="store_true",
        help="first print the negotiated TLS cipher, AES-GCM's speed and a 1 MB copy's time",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.min_seconds = 3, 1.0
    sys.path.insert(0, str(ROOT))
    from tests._net.pki import make_pki

    from feedline._net.security import TlsConfig

    pki = make_pki(pathlib.Path(tempfile.mkdtemp(prefix="feedline-tls-bench-")))
    tls = TlsConfig(pki.server_cert, pki.server_key, pki.ca)
    if args.where:
        where = where_the_cost_goes(pki, tls)
        gcm = ", ".join(f"{name} {speed:.2f} GB/s" for name, speed in where["gb_per_s"].items())
        print(
            f"negotiated (openssl s_client): {where.get('Protocol version')} "
            f"{where.get('Ciphersuite')}; one core: {gcm} (16 KB records); 1 MB copy "
            f"{where['copy_1mb_us']:.0f} µs"
        )
    rows: dict[str, Callable[..., tuple[float, float]]] = {
        "rpc": run_rpc,
        "service": run_service,
        "shm": lambda *a: run_service(*a, transfer=None),
    }
    results: dict[str, Any] = {}
    print("| row | element | plain per unit | TLS per unit | TLS / plain (wall) | range | "
          "TLS / plain (CPU) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for row in args.only.split(","):
        for label, size in SIZES.items():
            walls: list[float] = []
            cpus: list[float] = []
            runs: list[dict[str, float]] = []
            for index in range(args.rounds):
                order = ("plain", "tls") if index % 2 == 0 else ("tls", "plain")
                got = {
                    variant: rows[row](
                        size,
                        None if variant == "plain" else tls,
                        args.warmup_seconds,
                        args.min_seconds,
                    )
                    for variant in order
                }
                walls.append(got["tls"][0] / got["plain"][0])
                cpus.append(got["tls"][1] / got["plain"][1])
                runs.append(
                    {f"{v}_{k}": got[v][i] for v in got for i, k in enumerate(("wall", "cpu"))}
                )
            plain = statistics.median(r["plain_wall"] for r in runs)
            secure = statistics.median(r["tls_wall"] for r in runs)
            print(
                f"| {row} | {label} | {plain * 1e6:.0f} µs | {secure * 1e6:.0f} µs | "
                f"{statistics.median(walls):.3f} | {min(walls):.3f}-{max(walls):.3f} | "
                f"{statistics.median(cpus):.3f} |"
            )
            results[f"{row}-{label}"] = {"wall_ratios": walls, "cpu_ratios": cpus, "runs": runs}
    _common.write_results("service_tls", {"args": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
