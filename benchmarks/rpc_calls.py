"""What one call of feedline's gRPC layer (``feedline._net.rpc``) costs the server, against a bare
grpcio server of the same bytes in the same run.

Usage (from the repository root)::

    .venv/bin/python benchmarks/rpc_calls.py [--calls 5000] [--rounds 4] [--bytes 8000]

A server process (forked from this one before any gRPC object exists) serves, on loopback:

* *grpcio*: a bare ``grpc.server`` whose generic unary handler returns a fixed reply: the peer,
  what any Python gRPC service costs at the least;
* *call*: feedline's server (a token, a frame of a JSON header and buffers decoded and encoded,
  the reply of 4 KiB), called with ``RpcClient.call``;
* *upload*: the same handler as an upload method (``upload_limits``), called with
  ``RpcClient.upload`` with a request of one chunk (a unary call of the method);
* *stream of one*: the same request sent as a stream of one message to the method's chunked
  form (how an upload of one chunk was served before: the handler reads a request iterator).

Each round, every kind in turn (each round starting one kind later): ``--calls`` calls of a
``--bytes`` request after 500 to warm up, one at a time from this process. Prints per kind the
server's CPU per call (its ``/proc/<pid>/stat``, user + system) and the caller's wall time per
call, medians over the rounds, and the CPU ratio to the bare grpcio server; writes
``benchmarks/results/rpc_calls-*.json``.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import cpu_seconds, write_results  # noqa: E402

KINDS = ("grpcio", "call", "upload", "stream of one")
SERVICE = "bench.Rpc"
TOKEN = "benchmark-token"
REPLY = b"r" * 4096


def _serve(ports_w: int) -> None:
    """The server process: both servers, their ports written to ``ports_w``, until killed."""
    import grpc

    from feedline._net import rpc

    def echo(header: dict[str, Any], buffers: list[memoryview]) -> tuple[dict[str, Any], list]:
        return {"sizes": [len(b) for b in buffers]}, [REPLY]

    feedline_server, feedline_port = rpc.start_server(
        SERVICE,
        {"Call": echo, "Upload": echo},
        bind="127.0.0.1",
        port=0,
        token=TOKEN,
        upload_limits={"Upload": 1 << 30},
    )
    from concurrent import futures

    def bare(request: bytes, context: grpc.ServicerContext) -> bytes:
        return REPLY

    bare_server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=32),
        handlers=[
            grpc.method_handlers_generic_handler(
                SERVICE, {"Bare": grpc.unary_unary_rpc_method_handler(bare)}
            )
        ],
    )
    bare_port = bare_server.add_insecure_port("127.0.0.1:0")
    bare_server.start()
    os.write(ports_w, f"{feedline_port} {bare_port}\n".encode())
    os.close(ports_w)
    signal.sigwait({signal.SIGTERM})
    feedline_server.stop(0.0)
    bare_server.stop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--bytes", type=int, default=8000)
    args = parser.parse_args()
    if not os.path.exists("/proc/self/stat"):
        sys.exit("rpc_calls.py reads a process's CPU time from /proc (Linux)")

    read, write = os.pipe()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            _serve(write)
        finally:
            os._exit(0)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os.close(write)
    try:
        with os.fdopen(read) as ports:
            feedline_port, bare_port = (int(p) for p in ports.readline().split())
        results = _measure(pid, feedline_port, bare_port, args)
    finally:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
    print(f"{'kind':<14} {'server CPU us/call':>19} {'/ grpcio':>9} {'caller us/call':>15}")
    base = statistics.median(results["grpcio"]["server_cpu_us"])
    summary: dict[str, Any] = {}
    for kind in KINDS:
        cpu = statistics.median(results[kind]["server_cpu_us"])
        wall = statistics.median(results[kind]["caller_us"])
        summary[kind] = {"server_cpu_us": cpu, "caller_us": wall, "cpu_vs_grpcio": cpu / base}
        print(f"{kind:<14} {cpu:>19.1f} {cpu / base:>8.2f}x {wall:>15.1f}")
    write_results("rpc_calls", {"args": vars(args), "rounds": results, "median": summary})


def _measure(
    pid: int, feedline_port: int, bare_port: int, args: argparse.Namespace
) -> dict[str, dict[str, list[float]]]:
    import grpc

    from feedline._net import rpc
    from feedline._net.wire import encode_frame

    client = rpc.RpcClient(f"127.0.0.1:{feedline_port}", SERVICE, token=TOKEN)
    channel = grpc.insecure_channel(f"127.0.0.1:{bare_port}")
    payload = b"q" * args.bytes
    frame = encode_frame({"n": 1}, [payload])
    bare = channel.unary_unary(f"/{SERVICE}/Bare")
    stream = client._channel.stream_unary(f"/{SERVICE}/Upload{rpc.CHUNKED_SUFFIX}")
    metadata = ((rpc.TOKEN_METADATA_KEY, TOKEN),)
    calls: dict[str, Callable[[], Any]] = {
        "grpcio": lambda: bare(frame, timeout=10),
        "call": lambda: client.call("Call", {"n": 1}, [payload], timeout=10),
        "upload": lambda: client.upload("Upload", {"n": 1}, [payload], timeout=10),
        "stream of one": lambda: stream(iter([frame]), timeout=10, metadata=metadata),
    }
    results: dict[str, dict[str, list[float]]] = {
        kind: {"server_cpu_us": [], "caller_us": []} for kind in KINDS
    }
    for round_ in range(args.rounds):
        for kind in KINDS[round_ % 4 :] + KINDS[: round_ % 4]:
            call = calls[kind]
            for _ in range(500):
                call()
            cpu = cpu_seconds(pid)
            started = time.perf_counter()
            for _ in range(args.calls):
                call()
            elapsed = time.perf_counter() - started
            results[kind]["server_cpu_us"].append((cpu_seconds(pid) - cpu) / args.calls * 1e6)
            results[kind]["caller_us"].append(elapsed / args.calls * 1e6)
    client.close()
    channel.close()
    return results


if __name__ == "__main__":
    main()
