"""Listing 10,000 objects of an S3-compatible store and handing out their DYNAMIC splits.

Usage (from the repository root)::

    PYTHONPATH=src .venv/bin/python benchmarks/remote_splits.py
    PYTHONPATH=src .venv/bin/python benchmarks/remote_splits.py --objects 10000 --repetitions 3 \
        --max-files-per-split auto,64,1 --journal-sync normal

The store is moto's S3 server on loopback, in a process of its own (as a store is another
machine); that process fills its bucket through moto's own back-end, which takes well under a
second for 10,000 small objects (``files/part-NNNNN.txt``, a few bytes each), where a PUT per
object through HTTP would take minutes. Clients find it through ``AWS_ENDPOINT_URL``.

Each repetition times, one after the other:

* **list**: ``Dataset.list_files("s3://bench/files/part-*.txt")``, the glob on the store (a fresh
  s3fs client each time, so nothing is cached), with the CPU seconds the store's process and this
  process spent meanwhile: what the store costs and what the client's parsing costs.
* **hand out**: the names of all the objects read by a consumer through the data service, with
  ``ShardingPolicy.DYNAMIC``: a dispatcher in this process, one ``feedline worker`` process, the
  dataset registered, a job made, every split handed out to the worker and every name delivered
  to the consumer. The same with a fault-tolerant dispatcher (``--work-dir``, exactly-once
  splits), and, as the floor, ``ShardingPolicy.OFF`` (no splits: the worker lists the names
  itself) for what delivering 10,000 elements costs without any split. Each row gives the CPU
  seconds of this process (the dispatcher and the consumer) and of the worker meanwhile, which
  the machine's load changes less than the wall time.

``--journal-sync normal`` runs the fault-tolerant dispatcher with ``journal_sync="normal"`` (its
commits not fsynced) instead of each commit fsynced. ``--max-files-per-split`` lists the bounds on
the files of a split to run the hand-out rows with: ``auto`` (the default) is feedline's (a
sixteenth of a worker's share, at most 64 files or, as here, where the listing gave the objects'
sizes, as many as hold 64 MiB, at most 1,024: ``splits._max_split``); a number is at most that
many files whatever their sizes: ``64`` is the bound before sizes counted, ``1`` one GetSplit per
file, as before splits of files held several files. ``list + hand out`` adds the median listing
to each row's median hand-out: the goal is that a pipeline over 10,000 objects has its listing
and every split handed out in at most 2 s. The process's first S3 client reads botocore's model
files (~0.1-0.3 s, once a process); that is done before the clock starts, as the worker's start
is.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import cpu_seconds

BUCKET = "bench"
PATTERN = f"s3://{BUCKET}/files/part-*.txt"


def _serve(objects: int, conn: Connection) -> None:
    """The store's process: a moto S3 server on 127.0.0.1 with ``objects`` small objects; sends
    its endpoint URL, then serves until told to stop."""
    from moto.backends import get_backend
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    backend = get_backend("s3")[DEFAULT_ACCOUNT_ID]["global"]
    backend.create_bucket(BUCKET, "us-east-1")
    for i in range(objects):
        backend.put_object(BUCKET, f"files/part-{i:05d}.txt", b"record %d\n" % i)
    conn.send(f"http://{host}:{port}")
    conn.recv()  # stop
    server.stop()


def _list(store_pid: int) -> dict[str, Any]:
    import s3fs

    from feedline.data import Dataset

    s3fs.S3FileSystem.clear_instance_cache()
    store_cpu, own_cpu = cpu_seconds(store_pid), time.process_time()
    started = time.perf_counter()
    files = Dataset.list_files(PATTERN, shuffle=False)
    return {
        "seconds": time.perf_counter() - started,
        "store_cpu_s": cpu_seconds(store_pid) - store_cpu,
        "client_cpu_s": time.process_time() - own_cpu,
        "objects": files.cardinality(),
    }


def _first_client() -> float:
    """Seconds of the process's first S3 call (a HEAD of the bucket), not a listing."""
    from feedline import _fs

    started = time.perf_counter()
    fs, _ = _fs.filesystem(f"s3://{BUCKET}")
    if not fs.exists(BUCKET):
        raise AssertionError(f"no bucket {BUCKET}")
    return time.perf_counter() - started


def _hand_out(policy: str, fault_tolerant: bool, journal_sync: str = "full") -> dict[str, Any]:
    """One consumer reads every name through a dispatcher in this process and a worker process."""
    from tests.service.procs import ServiceProcesses

    from feedline import service
    from feedline.data import Dataset
    from feedline.service.splits import SplitCursor, split_plan

    files = Dataset.list_files(PATTERN, shuffle=False)
    with ServiceProcesses() as cluster, tempfile.TemporaryDirectory() as work_dir:
        config: dict[str, Any] = {"port": cluster.port}
        if fault_tolerant:
            config.update(work_dir=work_dir, fault_tolerant_mode=True, journal_sync=journal_sync)
        dispatcher = service.DispatchServer(service.DispatcherConfig(**config))
        try:
            worker = cluster.start_worker()
            # A first, small job: the worker is registered and warm before the clock starts.
            warm = Dataset.range(4).apply(service.distribute(policy, cluster.target))
            assert [int(x) for x in warm] == [0, 1, 2, 3]
            own_cpu, worker_cpu = time.process_time(), cluster.cpu_seconds(worker)
            started = time.perf_counter()
            names = [x.item() for x in files.apply(service.distribute(policy, cluster.target))]
            seconds = time.perf_counter() - started
            own_cpu = time.process_time() - own_cpu
            worker_cpu = cluster.cpu_seconds(worker) - worker_cpu
        finally:
            dispatcher.stop()
    if sorted(names) != sorted(os.fsencode(n) for n in files._filenames):
        raise AssertionError(f"{policy}: {len(names)} names, not each of the objects once")
    split_size = SplitCursor.start(split_plan(files), 0, 1).split_size
    splits = -(-len(names) // split_size) if policy == "distributed_epoch" else 0
    return {
        "seconds": seconds,
        "split_size": split_size,
        "splits": splits,
        "cpu_s": own_cpu,  # the dispatcher's and the consumer's (this process)
        "worker_cpu_s": worker_cpu,
    }


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument(
        "--max-files-per-split",
        default="auto",
        help="comma-separated bounds on the files of a split to run the hand-out with",
    )
    parser.add_argument(
        "--journal-sync",
        choices=("full", "normal"),
        default="full",
        help="the fault-tolerant dispatcher's journal_sync (full: each commit fsynced)",
    )
    args = parser.parse_args()

    from feedline.service import splits

    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    store = context.Process(target=_serve, args=(args.objects, theirs), daemon=True)
    started = time.perf_counter()
    store.start()
    if not ours.poll(120):
        raise SystemExit("the S3 server did not start within 120 s")
    endpoint = ours.recv()
    print(f"store: {args.objects:,} objects at {endpoint} in {time.perf_counter() - started:.1f} s")
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    results: dict[str, Any] = {"objects": args.objects, "load": os.getloadavg()}
    try:
        # The process's first S3 client reads botocore's model files (0.1-0.3 s, once a process:
        # its clients share them); before the clock, as the worker's start is.
        results["first_client_s"] = _first_client()
        listing = [_list(store.pid) for _ in range(args.repetitions)]
        results["list"] = listing
        print(
            f"list_files: median {_median(listing, 'seconds'):.3f} s (runs "
            + ", ".join(f"{r['seconds']:.3f}" for r in listing)
            + f"); CPU meanwhile: store {_median(listing, 'store_cpu_s'):.2f} s, "
            f"client {_median(listing, 'client_cpu_s'):.2f} s"
        )
        rows: list[tuple[str, bool, int | None]] = [("parallel_epochs", False, None)]
        for given in args.max_files_per_split.split(","):
            bound = None if given == "auto" else int(given)
            rows += [("distributed_epoch", False, bound), ("distributed_epoch", True, bound)]
        default_bound, default_bytes = splits._MAX_FILE_SPLIT, splits._FILE_SPLIT_BYTES
        print(
            "| policy | dispatcher | files per split | splits | hand out: median s (runs) "
            "| CPU s: dispatcher + consumer / worker | list + hand out: s |\n"
            "|---|---|---|---|---|---|---|"
        )
        for policy, fault_tolerant, bound in rows:
            if bound is not None:  # at most `bound` files a split, whatever their sizes
                splits._MAX_FILE_SPLIT, splits._FILE_SPLIT_BYTES = bound, 0
            runs = [
                _hand_out(policy, fault_tolerant, args.journal_sync)
                for _ in range(args.repetitions)
            ]
            splits._MAX_FILE_SPLIT, splits._FILE_SPLIT_BYTES = default_bound, default_bytes
            name = f"{policy}/{'fault-tolerant' if fault_tolerant else 'plain'}/{bound}"
            results[name] = runs
            median = _median(runs, "seconds")
            print(
                f"| {policy} | {'fault-tolerant' if fault_tolerant else 'plain'} | "
                f"{runs[0]['split_size'] if policy == 'distributed_epoch' else '-'} | "
                f"{runs[0]['splits']:,} | {median:.3f} ("
                + ", ".join(f"{r['seconds']:.3f}" for r in runs)
                + f") | {_median(runs, 'cpu_s'):.2f} / {_median(runs, 'worker_cpu_s'):.2f} "
                f"| {median + _median(listing, 'seconds'):.3f} |",
                flush=True,
            )
    finally:
        ours.send("stop")
        store.join(30)
        if store.is_alive():
            store.kill()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
