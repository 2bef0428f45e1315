"""The TensorFlow side of ``parameter_server.py``; run under ``.venv-tf/bin/python``.

One run = one cluster on 127.0.0.1 with free ports: this script is the chief; ``--workers``
workers and 2 ps are ``tf.distribute.Server`` processes (this script with ``--serve``, each given
its ``TF_CONFIG``, in its own session, with 1 intra-op thread). The chief makes
``tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=MinSizePartitioner(
max_shards=2))`` and a ``ClusterCoordinator``, then the demo's model in tf-keras under the
strategy's scope: ``Embedding(200_000, 32)`` (N(0, 1), as torch's ``EmbeddingBag``; a
``ShardedVariable`` of 2 shards, one per ps) + the mean over the bag of 4 ids + ``Dense(1)``, and
Adagrad with torch's settings (lr 0.5, accumulators from 0, epsilon 1e-10; its state on the ps).
With ``--model torch-defaults``, the sum over the bag and plain SGD (lr 0.05): what feedline's
side writes as ``EmbeddingBag(mode="sum")`` with torch's defaults (a dense gradient) and SGD.

The data are the feedline demo's (``parameter_server_demo._synthetic_batch``, re-created here in
NumPy: the same seeds, ids, labels). A ``tf.numpy_function`` cannot run on a remote worker (its
Python function lives in the chief), so the chief makes the batches up front and the per-worker
dataset (``coordinator.create_per_worker_dataset`` of ``from_tensor_slices(...).repeat()``) holds
them as constants: ``warmup + steps`` batches of stream 0. TensorFlow traces ``dataset_fn`` once
for all workers, so every worker reads the same stream (feedline gives each worker its own).

The ``@tf.function`` step (``strategy.run`` of a ``GradientTape`` step on ``next(iterator)``) is
``schedule``d ``--warmup`` then ``--steps`` times, with 4 functions per worker in flight as in
``parameter_server.py``, then ``join``; the last line of stdout is one JSON object with the
steps/s of the timed steps. Every child is killed at the end, and on any error or on
``--timeout`` (``signal.alarm``); each also gets SIGKILL if this process dies
(``PR_SET_PDEATHSIG``).

With ``--closures N`` it measures dispatch instead: ``N`` tiny functions (a ``@tf.function``
returning a constant) scheduled, then ``join``, in closures/s, and the median schedule -> fetch
latency of one function at a time.

Standalone: ``.venv-tf/bin/python benchmarks/_tf_ps_peer.py --workers 2 --steps 200``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

ROWS, DIM, BATCH, BAG, LR = 200_000, 32, 256, 4, 0.5
SGD_LR = 0.05  # --model torch-defaults
CHILDREN: list[subprocess.Popen] = []


def synthetic_batch(seed: int, rows: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``feedline.examples.parameter_server_demo._synthetic_batch``, the same numbers."""
    rng = np.random.default_rng(seed)
    ids = (rows * rng.random((batch_size, BAG)) ** 3).astype(np.int64)
    target = np.sin(ids * 0.37).mean(axis=1) + 0.05 * rng.standard_normal(batch_size)
    return ids, target.astype(np.float32)


def stream(count: int, pipeline_id: int = 0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The first ``count`` batches of the demo's ``dataset_fn`` on input pipeline
    ``pipeline_id``, stacked: ids ``[count, BATCH, BAG]``, labels ``[count, BATCH]``."""
    base = (seed * 1_000_003 + pipeline_id) * 1_000_000_007
    batches = [synthetic_batch(base + i, ROWS, BATCH) for i in range(count)]
    return np.stack([b[0] for b in batches]), np.stack([b[1] for b in batches])


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _pdeathsig() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    return lambda: prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def kill_children() -> None:
    for child in CHILDREN:
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
    for child in CHILDREN:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(10)


def serve() -> None:
    """A worker or ps task: ``tf.distribute.Server`` of the cluster in ``TF_CONFIG``."""
    import tensorflow as tf

    config = json.loads(os.environ["TF_CONFIG"])
    task = config["task"]
    server = tf.distribute.Server(
        tf.train.ClusterSpec(config["cluster"]),
        job_name=task["type"],
        task_index=task["index"],
        protocol="grpc",
        config=tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=1, inter_op_parallelism_threads=2
        ),
        start=True,
    )
    print(f"serving {task['type']}:{task['index']}", flush=True)
    server.join()


def _read(child: Any) -> None:
    for line in child.stdout:
        child.lines.append(line)
        if line.startswith("serving "):
            child.serving.set()


def start_cluster(workers: int, ps: int, timeout: float) -> dict[str, list[str]]:
    ports = iter(free_ports(1 + workers + ps))
    cluster = {
        "chief": [f"127.0.0.1:{next(ports)}"],
        "worker": [f"127.0.0.1:{next(ports)}" for _ in range(workers)],
        "ps": [f"127.0.0.1:{next(ports)}" for _ in range(ps)],
    }
    for job in ("ps", "worker"):
        for index in range(len(cluster[job])):
            env = dict(os.environ, OMP_NUM_THREADS="1")
            env["TF_CONFIG"] = json.dumps(
                {"cluster": cluster, "task": {"type": job, "index": index}}
            )
            CHILDREN.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--serve"],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                    preexec_fn=_pdeathsig(),
                )
            )
            child = CHILDREN[-1]
            child.lines = collections.deque(maxlen=40)  # type: ignore[attr-defined]
            child.serving = threading.Event()  # type: ignore[attr-defined]
            threading.Thread(target=_read, args=(child,), daemon=True).start()
    deadline = time.monotonic() + timeout
    for child in CHILDREN:  # each prints "serving ..." once it listens
        while not child.serving.wait(0.1):  # type: ignore[attr-defined]
            if child.poll() is not None or time.monotonic() > deadline:
                output = "".join(child.lines)  # type: ignore[attr-defined]
                raise RuntimeError(f"a tf.distribute.Server child did not serve: {output}")
    return cluster


def run(args: argparse.Namespace) -> dict[str, Any]:
    import tensorflow as tf
    import tf_keras as keras

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    cluster = start_cluster(args.workers, 2, args.start_timeout)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.ParameterServerStrategy(
        resolver,
        variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
            max_shards=2
        ),
    )
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    if args.closures:
        return closure_rate(tf, coordinator, args)

    tf.random.set_seed(0)
    with strategy.scope():
        embedding = keras.layers.Embedding(
            ROWS, DIM, embeddings_initializer=keras.initializers.RandomNormal(0.0, 1.0)
        )
        dense = keras.layers.Dense(1)
        embedding.build((None, BAG))
        dense.build((None, DIM))
        if args.model == "torch-defaults":  # the sum over the bag, plain SGD
            optimizer = keras.optimizers.SGD(learning_rate=SGD_LR)
        else:
            optimizer = keras.optimizers.Adagrad(
                learning_rate=LR, initial_accumulator_value=0.0, epsilon=1e-10
            )
    variables = embedding.trainable_variables + dense.trainable_variables
    shards = {v.name: list(v.shape) for v in variables}  # the embedding: one entry per shard

    ids, labels = stream(args.warmup + args.steps)
    combine = tf.reduce_sum if args.model == "torch-defaults" else tf.reduce_mean

    def dataset_fn() -> Any:
        return tf.data.Dataset.from_tensor_slices((ids, labels)).repeat().prefetch(2)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def train_step(iterator: Any) -> Any:
        def replica_fn(ids: Any, labels: Any) -> Any:
            with tf.GradientTape() as tape:
                bags = combine(embedding(ids), axis=1)  # over the bag
                prediction = tf.squeeze(dense(bags), axis=1)
                loss = tf.reduce_mean(tf.square(prediction - labels))
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables, strict=True))
            return loss

        return strategy.run(replica_fn, args=next(iterator))

    def timed(count: int) -> tuple[float, list[float]]:
        in_flight: collections.deque[Any] = collections.deque()
        losses = []
        start = time.perf_counter()
        for _ in range(count):
            if len(in_flight) >= 4 * args.workers:
                losses.append(float(in_flight.popleft().fetch()))
            in_flight.append(coordinator.schedule(train_step, args=(iterator,)))
        while in_flight:
            losses.append(float(in_flight.popleft().fetch()))
        coordinator.join()
        return count / (time.perf_counter() - start), losses

    timed(args.warmup)
    rate, losses = timed(args.steps)
    return {
        "framework": f"tensorflow {tf.__version__}, tf-keras {keras.__version__}",
        "workers": args.workers,
        "steps_per_s": rate,
        "last_loss": float(np.mean(losses[-20:])),
        "shards": shards,
    }


def closure_rate(tf: Any, coordinator: Any, args: argparse.Namespace) -> dict[str, Any]:
    """``--closures N``: N tiny functions (``@tf.function`` returning a constant) scheduled,
    then ``join``; closures/s, and the median schedule -> fetch latency of one function alone
    (``--latency-samples`` of them)."""

    @tf.function
    def tiny() -> Any:
        return tf.constant(1)

    for _ in range(max(1, args.warmup)):  # traced, and sent to every worker
        coordinator.schedule(tiny)
    coordinator.join()
    start = time.perf_counter()
    for _ in range(args.closures):
        coordinator.schedule(tiny)
    coordinator.join()
    rate = args.closures / (time.perf_counter() - start)
    latencies = []
    for _ in range(args.latency_samples):
        start = time.perf_counter()
        coordinator.schedule(tiny).fetch()
        latencies.append(time.perf_counter() - start)
    return {
        "framework": f"tensorflow {tf.__version__}",
        "workers": args.workers,
        "closures": args.closures,
        "closures_per_s": rate,
        "latency_ms": float(np.median(latencies)) * 1e3,
    }


def _on_alarm(signum: int, frame: Any) -> None:
    kill_children()
    print(f"timed out: the TensorFlow cluster ran past {ARGS.timeout} s", file=sys.stderr)
    sys.stderr.flush()
    os._exit(3)


def main() -> None:
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--start-timeout", type=float, default=60.0)
    parser.add_argument("--timeout", type=int, default=300, help="seconds for the whole run")
    parser.add_argument("--closures", type=int, default=0, help="measure closure dispatch")
    parser.add_argument("--latency-samples", type=int, default=200)
    parser.add_argument("--model", choices=("demo", "torch-defaults"), default="demo")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ARGS = args = parser.parse_args()
    if args.serve:
        serve()
        return
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGTERM, lambda *_: (kill_children(), os._exit(143)))
    signal.alarm(args.timeout)
    code = 0
    try:
        print(json.dumps(run(args)), flush=True)
    except BaseException as error:  # any failure: say it, kill the cluster, exit 1
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        code = 1
    finally:
        kill_children()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # TensorFlow's teardown of a coordinator can hang on its threads


ARGS: argparse.Namespace

if __name__ == "__main__":
    main()
