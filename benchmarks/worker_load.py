"""A worker's unrelated GetElements while many GetElements requests wait at it.

Usage (from the repository root)::

    PYTHONPATH=src .venv/bin/python benchmarks/worker_load.py
    PYTHONPATH=src .venv/bin/python benchmarks/worker_load.py --waiting 48 --seconds 10

Processes, so that none measures another's GIL:

- a ``feedline dispatcher`` and a ``feedline worker`` with their defaults (a worker serves
  GetElements on 32 threads);
- one process of ``--waiting`` (48) simulated consumers, asyncio gRPC calls, each asking
  again and again for a task the worker has not heard of yet (a consumer that learned of its
  task before the worker did), with ``wait_ms`` 1000 as a consumer does: such a request waits
  at the worker for its task, as one waits for elements of a slow pipeline; a reply with
  ``retry_after_ms`` (the worker did not wait) is waited out on the consumer's side;
- this process: a GetElements that does not wait (``wait_ms`` 0) every 20 ms, for
  ``--idle-seconds`` (3) with the worker idle (the peer of this run), then, once the load has
  run ``--warmup`` (2) seconds, for ``--seconds`` (10), each timed.

It prints the unrelated request's p50 and p99 idle and under the load, how many of the load's
requests waited at the worker and how many were told to wait on their side, and the machine's
load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import time

import grpc

from _load import LoadProcesses, percentiles, start_cli, stop, time_calls
from feedline._net.rpc import TOKEN_METADATA_KEY, RpcClient
from feedline._net.wire import decode_frame, encode_frame
from feedline.service.protocol import INCARNATION_SHIFT, WORKER_SERVICE, GetElementsRequest

# Tasks of a dispatcher life the worker has not heard of: requests for them wait for them.
_WAITED_TASK = (12345 << INCARNATION_SHIFT) + 1
_UNRELATED_TASK = (12345 << INCARNATION_SHIFT) + 2


async def _load(address: str, token: str, waiting: int, seconds: float) -> list[int]:
    channel = grpc.aio.insecure_channel(address)
    call = channel.unary_unary(f"/{WORKER_SERVICE}/GetElements")
    metadata = ((TOKEN_METADATA_KEY, token),)
    frame = encode_frame(GetElementsRequest(_WAITED_TASK, wait_ms=1000).to_header())
    counts = [0, 0, 0]  # waited, told to wait on its side, failed
    stop_at = time.monotonic() + seconds

    async def consumer() -> None:
        while time.monotonic() < stop_at:
            try:
                reply, _ = decode_frame(await call(frame, timeout=30, metadata=metadata))
            except grpc.RpcError:
                counts[2] += 1
                await asyncio.sleep(0.1)
                continue
            retry = reply.get("retry_after_ms", 0)
            counts[1 if retry else 0] += 1
            if retry:
                await asyncio.sleep(retry / 1000)

    await asyncio.gather(*(consumer() for _ in range(waiting)))
    await channel.close()
    return counts


def _load_process(address: str, token: str, waiting: int, seconds: float) -> list[int]:
    """Runs ``waiting`` consumers for ``seconds``: how many of their requests waited, were told
    to retry, failed."""
    return asyncio.run(_load(address, token, waiting, seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--idle-seconds", type=float, default=3.0)
    args = parser.parse_args()
    token = secrets.token_hex(16)
    dispatcher, banner = start_cli(["dispatcher", "--port", "0"], token)
    worker = None
    load = None
    try:
        dispatcher_address = banner.rpartition("://")[2]
        worker, banner = start_cli(["worker", "--dispatcher", dispatcher_address], token)
        address = banner.split(" serving at ")[1].split()[0]
        load = LoadProcesses(_load_process, (address, token), 1)
        client = RpcClient(address, WORKER_SERVICE, token)
        unrelated = GetElementsRequest(_UNRELATED_TASK, wait_ms=0).to_header()

        def unrelated_call() -> None:
            client.call("GetElements", unrelated, timeout=60)

        idle = time_calls(unrelated_call, args.idle_seconds)
        load_average = [os.getloadavg()[0]]
        load.send([(args.waiting, args.warmup + args.seconds + 1)])
        time.sleep(args.warmup)
        latencies = time_calls(unrelated_call, args.seconds)
        load_average.append(os.getloadavg()[0])
        ((waited, told, failed),) = load.results()
        client.close()
    finally:
        if load is not None:
            load.close()
        if worker is not None:
            stop(worker)
        stop(dispatcher)
    idle_figures = percentiles(idle)
    result = {
        "waiting": args.waiting,
        "calls": len(latencies),
        "idle_p50_ms": idle_figures["p50_ms"],
        "idle_p99_ms": idle_figures["p99_ms"],
        **percentiles(latencies),
        "load_requests_waited": waited,
        "load_requests_told_to_retry": told,
        "load_requests_failed": failed,
        "load_average": load_average,
        "cpus": os.cpu_count(),
    }
    print(
        f"{args.waiting} waiting consumers: unrelated GetElements p50 {result['p50_ms']:.2f} ms, "
        f"p99 {result['p99_ms']:.2f} ms (max {result['max_ms']:.1f}, {len(latencies)} calls; "
        f"idle: p50 {result['idle_p50_ms']:.2f} ms, p99 {result['idle_p99_ms']:.2f} ms); the "
        f"load's requests: {waited} waited, {told} told to retry, {failed} failed; load "
        f"average {load_average[0]:.1f} -> {load_average[1]:.1f} on {os.cpu_count()} CPUs"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
