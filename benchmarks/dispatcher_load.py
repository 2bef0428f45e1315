"""An unrelated dispatcher call while 256 workers heartbeat and 1,000 consumers wait for news.

Usage (from the repository root)::

    PYTHONPATH=src .venv/bin/python benchmarks/dispatcher_load.py
    PYTHONPATH=src .venv/bin/python benchmarks/dispatcher_load.py --workers 256 \\
        --consumers 1000 --seconds 15 --load-processes 2

Three kinds of processes, so that none measures another's GIL:

- the dispatcher: ``feedline dispatcher`` with its defaults;
- ``--load-processes`` (2) processes of simulated clients, asyncio gRPC calls sharing the
  ``--workers`` workers and the ``--consumers`` consumers between them. A worker heartbeats as
  ``WorkerServer`` does (``wait_ms`` 1000, listing the tasks it was given, again as soon as
  the dispatcher answers, or after what ``retry_after_ms`` says when the dispatcher answers
  without waiting); a consumer of the one shared job (``job_name``) heartbeats as a
  ``distribute`` consumer does (with the version of the job's view it has, ``wait_ms`` its
  interval: after a reply without news, ``unchanged`` or the same version, it waits out the
  rest of its interval, which doubles from 1 s up to ``--consumer-idle-s``, 2.5 s; news brings
  it back to 1 s);
- this process: the unrelated call (``GetElementSpec`` of another dataset) every 20 ms for
  ``--idle-seconds`` (3) before any worker or consumer joins, the same dispatcher idle (the
  peer of this run); then, once the load has run ``--warmup`` (3) seconds, every 20 ms for
  ``--seconds`` (15), each timed.

On a machine shared with other work, ``nice -n -10 ... --load-nice 10`` (as root) puts the
dispatcher and the probe ahead of the load's clients and of the rest of the machine, which is
what a dispatcher on a machine of its own gets.

It prints the unrelated call's p50 and p99 idle and under the load, how many heartbeats the
load made per second and how many failed (with their status codes: a benchmark whose
heartbeats are refused measures nothing), the dispatcher's CPU use under the load (in cores)
and the machine's load average, which on a shared machine says how much of the tail is the
machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import secrets
import time
from typing import Any

import grpc

from _common import cpu_seconds
from _load import LoadProcesses, percentiles, start_cli, stop, time_calls
from feedline._net.rpc import TOKEN_METADATA_KEY, RpcClient
from feedline._net.wire import decode_frame, encode_frame
from feedline.service.protocol import (
    DISPATCHER_SERVICE,
    GetOrCreateJobRequest,
    RegisterDatasetRequest,
)


async def _load(
    address: str,
    token: str,
    workers: list[str],
    consumers: list[tuple[int, int]],
    seconds: float,
    consumer_idle_s: float,
    counts: Any,
    codes: collections.Counter[str],
) -> None:
    channel = grpc.aio.insecure_channel(address)
    metadata = ((TOKEN_METADATA_KEY, token),)
    worker_call = channel.unary_unary(f"/{DISPATCHER_SERVICE}/WorkerHeartbeat")
    client_call = channel.unary_unary(f"/{DISPATCHER_SERVICE}/ClientHeartbeat")
    stop_at = time.monotonic() + seconds

    async def worker(address: str) -> None:
        tasks: list[int] = []
        while time.monotonic() < stop_at:
            header = {"address": address, "current_tasks": tasks, "wait_ms": 1000}
            try:
                reply, _ = decode_frame(
                    await worker_call(encode_frame(header), timeout=30, metadata=metadata)
                )
            except grpc.RpcError as error:
                counts[2] += 1
                codes[error.code().name] += 1
                await asyncio.sleep(0.05)  # as a worker does
                continue
            counts[0] += 1
            tasks += [task["task_id"] for task in reply.get("new_tasks", ())]
            retry = reply.get("retry_after_ms")
            if retry:
                await asyncio.sleep(retry / 1000)

    async def consumer(client_id: int, version: int) -> None:
        interval = 1.0
        while time.monotonic() < stop_at:
            started = time.monotonic()
            header = {"client_id": client_id, "version": version, "wait_ms": int(interval * 1000)}
            try:
                reply, _ = decode_frame(
                    await client_call(encode_frame(header), timeout=30, metadata=metadata)
                )
            except grpc.RpcError as error:
                counts[2] += 1
                codes[error.code().name] += 1
                if error.code() == grpc.StatusCode.NOT_FOUND:  # released: it missed heartbeats
                    counts[3] += 1
                    return
                await asyncio.sleep(0.5)  # as a consumer does
                continue
            counts[1] += 1
            if not reply.get("unchanged") and reply["version"] != version:
                version = reply["version"]
                interval = 1.0
            else:
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
                interval = min(interval * 2, consumer_idle_s)

    await asyncio.gather(*(worker(w) for w in workers), *(consumer(c, v) for c, v in consumers))
    await channel.close()


def _load_process(
    address: str,
    token: str,
    workers: list[str],
    consumers: list[tuple[int, int]],
    seconds: float,
    consumer_idle_s: float,
) -> tuple[list[int], dict[str, int]]:
    """Runs ``workers`` and ``consumers``: its counts and the codes of the failed calls."""
    counts = [0, 0, 0, 0]
    codes: collections.Counter[str] = collections.Counter()
    asyncio.run(_load(address, token, workers, consumers, seconds, consumer_idle_s, counts, codes))
    return counts, dict(codes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=256)
    parser.add_argument("--consumers", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--idle-seconds", type=float, default=3.0)
    parser.add_argument(
        "--load-nice",
        type=int,
        default=0,
        help="run the load's processes this much nicer than the dispatcher and the probe",
    )
    parser.add_argument("--load-processes", type=int, default=2)
    parser.add_argument(
        "--consumer-idle-s",
        type=float,
        default=2.5,
        help="the longest time between a consumer's heartbeats while its job does not change "
        "(a distribute consumer's, with the default client_timeout_ms; 1: no backoff)",
    )
    args = parser.parse_args()
    token = secrets.token_hex(16)  # every call is checked, as in a deployment
    dispatcher, banner = start_cli(["dispatcher", "--port", "0"], token)
    load = None
    try:
        address = banner.rpartition("://")[2]
        client = RpcClient(address, DISPATCHER_SERVICE, token)
        register = RegisterDatasetRequest(None, 1, None)
        shared, _ = client.upload(
            "RegisterDataset", register.to_header(), [b"shared", b"spec"], timeout=30
        )
        other, _ = client.upload(
            "RegisterDataset", register.to_header(), [b"unrelated", b"spec"], timeout=30
        )

        # The load's processes first, ready before any consumer joins: a consumer that
        # heartbeats only after client_timeout_ms is released.
        load = LoadProcesses(_load_process, (address, token), args.load_processes, args.load_nice)

        def unrelated_call() -> None:
            client.call("GetElementSpec", {"dataset_id": other["dataset_id"]}, timeout=60)

        idle = time_calls(unrelated_call, args.idle_seconds)
        load_average = [os.getloadavg()[0]]
        workers = [f"fake-worker-{i}:1" for i in range(args.workers)]
        for worker in workers:  # registered first: the shared job has a task on each
            client.call("WorkerHeartbeat", {"address": worker, "wait_ms": 0}, timeout=30)
        consumers = []
        join = GetOrCreateJobRequest(shared["dataset_id"], 0, "shared", 0, None, "AUTO")
        for _ in range(args.consumers):
            reply, _ = client.call("GetOrCreateJob", join.to_header(), timeout=30)
            consumers.append((reply["client_id"], reply["version"]))
        n = args.load_processes
        seconds = args.warmup + args.seconds + 1
        idle_s = args.consumer_idle_s
        load.send([(workers[i::n], consumers[i::n], seconds, idle_s) for i in range(n)])
        time.sleep(args.warmup)
        cpu = cpu_seconds(dispatcher.pid)
        latencies = time_calls(unrelated_call, args.seconds)
        cores = (cpu_seconds(dispatcher.pid) - cpu) / args.seconds
        load_average.append(os.getloadavg()[0])
        results = load.results()
        client.close()
    finally:
        if load is not None:
            load.close()
        stop(dispatcher)
    counts = [counts for counts, _ in results]
    codes: collections.Counter[str] = collections.Counter()
    for _, seen in results:
        codes.update(seen)
    total = args.warmup + args.seconds + 1
    idle_figures = percentiles(idle)
    result = {
        "workers": args.workers,
        "consumers": args.consumers,
        "consumer_idle_s": args.consumer_idle_s,
        "calls": len(latencies),
        "idle_p50_ms": idle_figures["p50_ms"],
        "idle_p99_ms": idle_figures["p99_ms"],
        **percentiles(latencies),
        "dispatcher_cores": cores,
        "nice": os.nice(0),
        "load_nice": os.nice(0) + args.load_nice,
        "load_average": load_average,
        "failed_codes": dict(codes),
        "worker_heartbeats_per_s": sum(c[0] for c in counts) / total,
        "consumer_heartbeats_per_s": sum(c[1] for c in counts) / total,
        "failed_heartbeats": sum(c[2] for c in counts),
        "consumers_released": sum(c[3] for c in counts),
        "cpus": os.cpu_count(),
    }
    print(
        f"{args.workers} workers, {args.consumers} consumers: unrelated call p50 "
        f"{result['p50_ms']:.2f} ms, p99 {result['p99_ms']:.2f} ms (max {result['max_ms']:.1f}, "
        f"{len(latencies)} calls; idle: p50 {result['idle_p50_ms']:.2f} ms, p99 "
        f"{result['idle_p99_ms']:.2f} ms); heartbeats/s: workers "
        f"{result['worker_heartbeats_per_s']:.0f}, consumers "
        f"{result['consumer_heartbeats_per_s']:.0f}; failed {result['failed_heartbeats']} "
        f"{dict(codes)}; consumers released for missed heartbeats "
        f"{result['consumers_released']}; dispatcher CPU {cores:.2f} cores; load average "
        f"{load_average[0]:.1f} -> {load_average[1]:.1f} on {os.cpu_count()} CPUs"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
