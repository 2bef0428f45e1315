"""The dispatcher's journal (``fault_tolerant_mode``): its cost per update, and restart time.

Usage (from the repository root)::

    .venv/bin/python benchmarks/service_journal.py [--jobs 1000] [--updates 2000]
        [--epoch-elements 100000] [--rounds 3] [--work-dir DIR]

Four measurements, each in this process, with the journal in ``--work-dir`` (default a fresh
folder under ``benchmarks/results/``, on the disk the repository is on):

1. *per update*, the journal alone (``_journal.Journal``): ``MoveSplitCursor`` updates (what a
   DYNAMIC job writes for each split), each appended and committed on its own (what one request
   that changes the state costs: one fsync with ``synchronous=FULL``), and appended in batches of
   100 per commit (the cost of the record itself), for ``synchronous`` FULL and NORMAL; against
   applying the update to the in-memory state only.
2. *per request*, a ``DispatchServer`` over gRPC on loopback, with and without the journal:
   ``--jobs`` named DYNAMIC jobs are made (``GetOrCreateJob``: a job, a task on each of 2
   registered workers and a consumer, 4 updates; with the journal they are exactly-once jobs,
   which also start a split ledger) and each is handed one split (``GetSplit`` of its first
   task, 1 update); the mean time of each call.
3. *restart*: the journaled dispatcher (``--jobs`` jobs) is stopped and a new one started on the
   same ``work_dir`` and port; the time to construct it (open, check and replay the journal) and
   to serve, once from the update log and once after the log was compacted into a snapshot.
4. *exactly-once epochs*: one ``distributed_epoch`` epoch of ``--epoch-elements`` 4 KB elements
   (``range(n).map(fill a float32[1024])``) read by one consumer from a dispatcher and 2 workers
   in this process, without the journal (one pipeline per worker, at most once) and with it
   (``_ledger``: the pipeline once per split, tagged elements, consumer reports every 0.1 s);
   elements/s, best of ``--rounds`` rounds, the two alternating.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import pathlib
import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from feedline._net import rpc as _rpc  # noqa: E402
from feedline.data import Dataset  # noqa: E402
from feedline.service import (  # noqa: E402
    DispatcherConfig,
    DispatchServer,
    ShardingPolicy,
    WorkerConfig,
    WorkerServer,
    distribute,
)
from feedline.service.client.dataset import register_dataset  # noqa: E402
from feedline.service.dispatcher import journal as _journal  # noqa: E402
from feedline.service.dispatcher import state as st  # noqa: E402
from feedline.service.protocol import DISPATCHER_SERVICE as SERVICE_NAME  # noqa: E402

WORKERS = ("127.0.0.1:1", "127.0.0.1:2")  # registered by one heartbeat each, never serving


def _cursor_updates(count: int) -> list[st.Update]:
    return [
        st.MoveSplitCursor(
            7, 0, {"num_units": 10**6, "split_size": 1024, "position": 1024 * i, "seed": None}
        )
        for i in range(count)
    ]


def per_update(folder: pathlib.Path, count: int) -> dict[str, float]:
    """Mean µs per update: memory only; journal with a commit per update; batches of 100."""
    results: dict[str, float] = {}
    updates = _cursor_updates(count)
    state = st.DispatcherState()
    started = time.perf_counter()
    for update in updates:
        state.apply(update)
    results["memory only"] = (time.perf_counter() - started) / count * 1e6
    for synchronous in ("FULL", "NORMAL"):
        for batch in (1, 100):
            work_dir = folder / f"per-update-{synchronous}-{batch}"
            shutil.rmtree(work_dir, ignore_errors=True)
            journal = _journal.open_journal(work_dir, 1, synchronous=synchronous)
            started = time.perf_counter()
            for index, update in enumerate(updates):
                journal.state.apply(update)
                journal.append(update)
                if (index + 1) % batch == 0:
                    journal.commit()
                    journal.sync(journal.commits)  # what a reply waits for (FULL: an fsync)
            journal.commit()
            journal.sync(journal.commits)
            elapsed = time.perf_counter() - started
            journal.close()
            label = "commit each" if batch == 1 else f"commit per {batch}"
            results[f"synchronous={synchronous}, {label}"] = elapsed / count * 1e6
    return results


def _populate(target: str, jobs: int) -> dict[str, float]:
    """Registers a dataset and 2 workers, makes ``jobs`` named DYNAMIC jobs and takes one split
    of each; mean ms per GetOrCreateJob and per GetSplit."""
    client = _rpc.RpcClient(_rpc.parse_service(target), SERVICE_NAME, _rpc.resolve_token(None))
    dataset_id = register_dataset(target, Dataset.range(10**6))
    for address in WORKERS:
        client.call("WorkerHeartbeat", {"address": address, "wait_ms": 0}, timeout=10)
    job_ids, times = [], {"GetOrCreateJob": 0.0, "GetSplit": 0.0}
    for index in range(jobs):
        header = {
            "dataset_id": dataset_id,
            "mode": int(ShardingPolicy.DYNAMIC),
            "job_name": f"job-{index}",
            "iteration": 0,
            "num_consumers": None,
            "target_workers": "AUTO",
        }
        started = time.perf_counter()
        reply, _ = client.call("GetOrCreateJob", header, timeout=10)
        times["GetOrCreateJob"] += time.perf_counter() - started
        job_ids.append((reply["job_id"], reply["tasks"][0][0]))
    for job_id, task_id in job_ids:
        request = {"job_id": job_id, "repetition": 0, "task_id": task_id, "request": 0}
        started = time.perf_counter()
        client.call("GetSplit", request, timeout=10)
        times["GetSplit"] += time.perf_counter() - started
    return {method: total / jobs * 1e3 for method, total in times.items()}


def concurrent_requests(
    folder: pathlib.Path, jobs: int, clients: Sequence[int], calls: int
) -> dict[int, dict[str, float]]:
    """GetSplit calls/s of ``clients`` client processes at once (each asking for the next
    split of its share of ``jobs`` named DYNAMIC jobs, ``calls`` calls in all), each call a
    journaled update: what many workers asking at once get from a fault-tolerant dispatcher;
    and the journal's fsyncs per call."""
    context = multiprocessing.get_context("spawn")
    results: dict[int, dict[str, float]] = {}
    for count in clients:
        work_dir = folder / f"concurrent-{count}"
        shutil.rmtree(work_dir, ignore_errors=True)
        with DispatchServer(_config(work_dir)) as dispatcher:
            _populate(dispatcher.target, jobs)
            tasks = _job_tasks(dispatcher)
            journal = dispatcher._journal
            assert journal is not None
            barrier = context.Barrier(count + 1)
            each = calls // count
            processes = [
                context.Process(
                    target=_ask,
                    args=(dispatcher.target, tasks[index::count], each, barrier),
                    daemon=True,
                )
                for index in range(count)
            ]
            for process in processes:
                process.start()
            barrier.wait(120)  # every client started and connected
            fsyncs = journal.fsyncs
            started = time.perf_counter()
            for process in processes:
                process.join(600)
                if process.exitcode != 0:
                    raise SystemExit(f"a client process ended with {process.exitcode}")
            seconds = time.perf_counter() - started
            results[count] = {
                "calls_per_s": each * count / seconds,
                "fsyncs_per_call": (journal.fsyncs - fsyncs) / (each * count),
            }
    return results


def _ask(target: str, tasks: list[tuple[int, int]], calls: int, barrier: Any) -> None:
    """(A client process.) ``calls`` GetSplits, each the next split of one of ``tasks``."""
    client = _rpc.RpcClient(_rpc.parse_service(target), SERVICE_NAME, _rpc.resolve_token(None))
    barrier.wait(120)
    for call in range(calls):
        job_id, task_id = tasks[call % len(tasks)]
        number = 1 + call // len(tasks)  # request 0 was _populate's
        request = {"job_id": job_id, "repetition": 0, "task_id": task_id, "request": number}
        client.call("GetSplit", request, timeout=30)


def _job_tasks(dispatcher: DispatchServer) -> list[tuple[int, int]]:
    """(job_id, first task_id) of every job of ``dispatcher``."""
    with dispatcher._lock:
        state = dispatcher._state
        return [(job_id, min(job.task_ids)) for job_id, job in sorted(state.jobs.items())]


def _config(work_dir: pathlib.Path | None, port: int = 0) -> DispatcherConfig:
    return DispatcherConfig(
        port=port,
        work_dir=None if work_dir is None else str(work_dir),
        fault_tolerant_mode=work_dir is not None,
        job_gc_timeout_ms=-1,  # keep every job, and the two silent workers and their consumers
        worker_timeout_ms=3_600_000,
        client_timeout_ms=3_600_000,
    )


def per_request_and_restart(folder: pathlib.Path, jobs: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with DispatchServer(_config(None)) as dispatcher:
        results["memory"] = _populate(dispatcher.target, jobs)
    work_dir = folder / "dispatcher"
    shutil.rmtree(work_dir, ignore_errors=True)
    dispatcher = DispatchServer(_config(work_dir))
    results["journal"] = _populate(dispatcher.target, jobs)
    port = int(dispatcher.target.rsplit(":", 1)[1])
    dispatcher.stop()
    for label in ("log", "snapshot"):
        time.sleep(1.0)  # the port is free again
        started = time.perf_counter()
        dispatcher = DispatchServer(_config(work_dir, port))
        restart = time.perf_counter() - started
        journal = dispatcher._journal
        assert journal is not None and len(dispatcher._state.jobs) == jobs
        results[f"restart from {label}"] = {
            "seconds": restart,
            "replay_seconds": journal.replay_seconds,
            "updates_replayed": journal.replayed,
            "journal_bytes": sum(p.stat().st_size for p in work_dir.glob("*.sqlite*")),
        }
        if label == "log":
            with dispatcher._lock:
                journal.compact()
        dispatcher.stop()
    return results


def _epoch(work_dir: pathlib.Path | None, elements: int) -> float:
    """Elements/s of one DYNAMIC epoch read from a fresh dispatcher and 2 workers."""
    if work_dir is not None:
        shutil.rmtree(work_dir, ignore_errors=True)
    with DispatchServer(_config(work_dir)) as dispatcher:
        address = dispatcher.target.split("://")[1]
        workers = [WorkerServer(WorkerConfig(dispatcher_address=address)) for _ in range(2)]
        try:
            dataset = (
                Dataset.range(elements)
                .map(lambda i: np.full(1024, i, np.float32))
                .apply(distribute("distributed_epoch", dispatcher.target))
            )
            started = time.perf_counter()
            count = sum(1 for _ in dataset)
            seconds = time.perf_counter() - started
        finally:
            for worker in workers:
                worker.stop()
    assert count == elements, (count, elements)
    return elements / seconds


def exactly_once_epochs(folder: pathlib.Path, elements: int, rounds: int) -> dict[str, float]:
    best = {"at most once": 0.0, "exactly once": 0.0}
    for _ in range(rounds):
        best["at most once"] = max(best["at most once"], _epoch(None, elements))
        best["exactly once"] = max(best["exactly once"], _epoch(folder / "epoch", elements))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--updates", type=int, default=2000)
    parser.add_argument("--work-dir", type=pathlib.Path, default=None)
    parser.add_argument("--epoch-elements", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--clients", default="1,4,8", help="client processes asking at once, per run"
    )
    parser.add_argument("--calls", type=int, default=2000, help="GetSplit calls per run")
    parser.add_argument("--only-concurrent", action="store_true", help="only that measurement")
    args = parser.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = args.work_dir or ROOT / "benchmarks" / "results" / f"service-journal-{stamp}"
    folder.mkdir(parents=True, exist_ok=True)
    clients = [int(c) for c in args.clients.split(",")]
    concurrent = concurrent_requests(folder, min(args.jobs, 256), clients, args.calls)
    print(f"\n{args.calls} GetSplit calls (each a journaled update) from processes at once:\n")
    print("| client processes | calls/s | fsyncs per call |\n|---:|---:|---:|")
    for count, row in concurrent.items():
        print(f"| {count} | {row['calls_per_s']:,.0f} | {row['fsyncs_per_call']:.2f} |")
    if args.only_concurrent:
        return
    updates = per_update(folder, args.updates)
    print(f"\nper update ({args.updates} MoveSplitCursor updates), mean µs:\n")
    print("| journal | µs per update |\n|---|---:|")
    for label, value in updates.items():
        print(f"| {label} | {value:.1f} |")
    dispatcher = per_request_and_restart(folder, args.jobs)
    print(f"\nper request, {args.jobs} named DYNAMIC jobs, mean ms per call:\n")
    print("| call | no journal | journal (FULL) |\n|---|---:|---:|")
    for method in ("GetOrCreateJob", "GetSplit"):
        memory, journal = dispatcher["memory"][method], dispatcher["journal"][method]
        print(f"| {method} | {memory:.2f} | {journal:.2f} |")
    print(f"\nrestart with {args.jobs} jobs:\n")
    print("| from | updates replayed | journal size | replay | restart (to serving) |")
    print("|---|---:|---:|---:|---:|")
    for label in ("log", "snapshot"):
        row = dispatcher[f"restart from {label}"]
        print(
            f"| {label} | {row['updates_replayed']} | {row['journal_bytes'] / 1e6:.2f} MB | "
            f"{row['replay_seconds'] * 1e3:.0f} ms | {row['seconds'] * 1e3:.0f} ms |"
        )
    epochs = exactly_once_epochs(folder, args.epoch_elements, args.rounds)
    print(f"\none distributed_epoch of {args.epoch_elements} 4 KB elements, 2 workers:\n")
    print("| dispatcher | elements/s (best of rounds) |\n|---|---:|")
    for label, value in epochs.items():
        print(f"| {label} | {value:,.0f} |")
    print(
        f"| exactly once / at most once | {epochs['exactly once'] / epochs['at most once']:.2f}x |"
    )
    out = folder / "results.json"
    out.write_text(
        json.dumps(
            {
                "per_update_us": updates,
                **dispatcher,
                "concurrent_getsplit": concurrent,
                "epoch_elements_per_s": epochs,
            },
            indent=2,
        )
    )
    print(f"\nraw numbers: {out}")


if __name__ == "__main__":
    main()
