"""The tf.data service side of ``data_service.py``; run under ``.venv-tf/bin/python``.

It builds the same workloads (``data_service.py``'s docstring) with tf.data, serves them with an
in-process ``DispatchServer`` and in-process ``WorkerServer``s (S4, and S1-S3 with
``--process-workers``: worker processes, this script with ``--worker-process``), times them with
the same ``data_service.repeat_group`` and prints one JSON object on its last line of stdout:
``{"tensorflow": ..., "rows": [{"row": ..., "result": ...}]}``.

Standalone: ``.venv-tf/bin/python benchmarks/_tf_service_peer.py --quick [--only S1,S3]``.

The client iterates eagerly (``for element in dataset``). Open-source TensorFlow talks to an
in-process worker over gRPC too (its "local" transfer is only taken inside Google), so both
systems move the elements over loopback gRPC.

S4's per-element function is the same ``_common.BusyLoop`` as feedline's, wrapped in
``tf.numpy_function``. A ``PyFunc`` op names its Python function by a token ("pyfunc_0", the n-th
registered in the process) that only the process that traced it can resolve, so tf.data service
cannot normally run it in another process; each worker process therefore traces the same map
first, which registers the same function under the same token, and keeps it alive.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import _common
import data_service as spec

service = tf.data.experimental.service

# S4's map must be traced once per process, so that its PyFunc token is "pyfunc_0" in the client
# and in every worker process.
_S4_BASE: dict[int, tf.data.Dataset] = {}


def s4_base(busy_iterations: int) -> tf.data.Dataset:
    """``range(RANGE).map(numpy_function(BusyLoop))``, traced once per process."""
    if busy_iterations not in _S4_BASE:
        if _S4_BASE:
            raise RuntimeError("S4 can be built with one busy-iteration count per process")
        busy = _common.BusyLoop(busy_iterations)

        def fn(i: tf.Tensor) -> tf.Tensor:
            out = tf.numpy_function(lambda x: np.int64(busy(x)), [i], tf.int64, stateful=False)
            out.set_shape([])
            return out

        _S4_BASE[busy_iterations] = tf.data.Dataset.range(spec.RANGE).map(fn)
    return _S4_BASE[busy_iterations]


def base_dataset(row: spec.Row, kind: str, busy_iterations: int) -> tf.data.Dataset:
    """The dataset of ``row`` before ``distribute``."""
    if row.scenario == "S4":
        return s4_base(busy_iterations)
    size = spec.ELEMENT_SIZES[row.scenario]
    if kind == "full":

        def fn(i: tf.Tensor) -> tf.Tensor:
            return tf.fill([size], tf.cast(i, tf.float32))
    else:

        def fn(i: tf.Tensor) -> tf.Tensor:
            return tf.range(size, dtype=tf.float32) + tf.cast(i, tf.float32)

    return tf.data.Dataset.range(spec.RANGE).map(fn)


def session_factory(
    row: spec.Row, kind: str, busy_iterations: int, log_dir: str
) -> Callable[[], contextlib.AbstractContextManager[Iterator[Any]]]:
    """Fresh TF servers and a fresh distributed dataset of ``row`` for each run."""
    base = base_dataset(row, kind, busy_iterations)
    compression = None if row.compression == "none" else row.compression

    @contextlib.contextmanager
    def session() -> Iterator[Iterator[Any]]:
        dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
        workers: list[Any] = []
        processes: list[subprocess.Popen] = []
        log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed below)
            prefix="tf-worker-", suffix=".log", dir=log_dir, delete=False
        )
        try:
            address = dispatcher.target.split("://", 1)[1]
            if row.process_workers:
                command = [
                    sys.executable,
                    __file__,
                    "--worker-process",
                    address,
                    "--busy-iterations",
                    str(busy_iterations if row.scenario == "S4" else 0),
                ]
                env = dict(spec.worker_env(), TF_CPP_MIN_LOG_LEVEL="2")
                processes.extend(spec.start_process(command, log, env) for _ in range(row.workers))
            else:
                for _ in range(row.workers):
                    workers.append(
                        service.WorkerServer(service.WorkerConfig(dispatcher_address=address))
                    )
            spec.wait_until(
                lambda: dispatcher._num_workers() >= row.workers, "tf workers", processes, log
            )
            dataset = base.apply(
                service.distribute(
                    processing_mode="distributed_epoch",
                    service=dispatcher.target,
                    compression=compression,
                    max_outstanding_requests=None,
                )
            )
            iterator = iter(dataset)
            try:
                yield iterator
            finally:
                del iterator, dataset
        finally:
            for worker in workers:
                worker._stop()
            for process in processes:
                spec.stop_process(process)
            dispatcher._stop()
            log.close()
            os.unlink(log.name)

    return session


def run_group(
    group: list[spec.Row], args: argparse.Namespace, log_dir: str
) -> dict[spec.Row, dict[str, Any]]:
    """The results for the rows of ``group``, timed in alternation."""
    return spec.repeat_group(
        [(row, session_factory(row, args.data, args.busy_iterations, log_dir)) for row in group],
        repetitions=args.repetitions,
        warmup_seconds=args.warmup_seconds,
        min_seconds=args.min_seconds,
        check=lambda row, element: spec.check_element(row, args.data, element.numpy()),
    )


def worker_process(address: str, busy_iterations: int) -> None:
    """A tf.data service worker (in its own process), until SIGTERM."""
    if busy_iterations:  # S4: registers the PyFunc under the client's token
        s4_base(busy_iterations)
    worker = service.WorkerServer(service.WorkerConfig(dispatcher_address=address))
    print(f"worker {worker._address} serving {address}", flush=True)
    while True:  # sleep, not join(): the PyFunc needs the GIL
        time.sleep(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs, one repetition")
    parser.add_argument("--only", default=",".join(spec.SCENARIOS))
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--compression", default=",".join(spec.COMPRESSIONS))
    parser.add_argument("--data", choices=spec.DATA_KINDS, default="full")
    parser.add_argument("--process-workers", action="store_true", help="S1-S3 too")
    parser.add_argument("--min-seconds", type=float, default=None)
    parser.add_argument("--warmup-seconds", type=float, default=None)
    parser.add_argument("--repetitions", type=int, default=None)
    parser.add_argument("--busy-iterations", type=int, default=0, help="S4 (0: calibrate)")
    parser.add_argument("--worker-process", metavar="DISPATCHER", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker_process:
        worker_process(args.worker_process, args.busy_iterations)
        return
    args.min_seconds = args.min_seconds or (0.5 if args.quick else 2.0)
    args.warmup_seconds = args.warmup_seconds or (0.2 if args.quick else 0.5)
    args.repetitions = args.repetitions or (1 if args.quick else 3)
    scenarios = [s.strip().upper() for s in args.only.split(",") if s.strip()]
    if "S4" in scenarios and not args.busy_iterations:
        args.busy_iterations = _common.calibrate_busy(spec.BUSY_SECONDS)
    groups = spec.make_groups(
        scenarios,
        [int(w) for w in args.workers.split(",")],
        [c.strip() for c in args.compression.split(",") if c.strip()],
        args.process_workers,
    )
    out: dict[str, Any] = {"tensorflow": tf.__version__, "rows": []}
    with tempfile.TemporaryDirectory(prefix="tf-service-bench-") as log_dir:
        for group in groups:
            for row, result in run_group(group, args, log_dir).items():
                out["rows"].append({"row": dataclasses.asdict(row), "result": result})
                value = spec.headline(row, result)
                print(f"tf.data service {row.label}: {value:,.1f} {row.unit}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
