"""Parameter-server training: steps/s with 1 and 2 workers, and what a step moves.

Usage (from the repository root)::

    .venv/bin/python benchmarks/parameter_server.py [--quick] [--tf] [--steps 400] [--rounds 2]

Three parts, in one run:

1. **Scaling.** The demo's model (``feedline demo --parameter-server``: ``EmbeddingBag(200_000,
   32, mode="mean", sparse=True)`` split over 2 ps by ``MinSizePartitioner(max_shards=2)``, then
   ``Linear(32, 1)``, Adagrad, batches of 256 synthetic examples of 4 ids each; with
   ``--model torch-defaults``, ``EmbeddingBag(200_000, 32, mode="sum")`` as torch makes it by
   default, ``sparse=False``, and plain SGD lr 0.05, the peer summing over the bag with SGD
   too) trained through
   ``ClusterCoordinator.schedule`` on a local cluster (``LocalCluster``: this benchmark's child
   is the chief; the workers and the 2 ps are ``feedline server`` processes on 127.0.0.1) with
   1 and with 2 workers. Each worker reads the batches of its stream of the demo's
   ``dataset_fn``, made up front when its per-worker dataset is made, through
   ``from_tensor_slices(...).repeat().prefetch(2)``: the TensorFlow peer's input pipeline, so
   that both sides do the same work per step (``--generated-input``: each batch generated in
   Python as the step asks for it, as the demo does; the peer cannot do that). Each cluster
   runs in a child process (killed after ``--child-timeout``) that warms up for ``--warmup``
   steps, then times ``--steps`` steps with 4 functions per worker in flight; the clusters take
   turns for ``--rounds`` rounds and each keeps its best. Beside
   it, the machine's own 2-process scaling (``_common.process_scaling``: two processes of pure
   Python work against one), measured in the same run.
2. **What a step moves.** With 2 ps (``feedline server`` processes) and this process as the
   chief: a dense model of ~10 MB (``Linear(1600, 1600)``, split over the 2 ps) and a 1M x 64
   ``EmbeddingBag`` (256 MB, split over the 2 ps) whose steps each touch 4,096 distinct rows. A
   step is ``zero_grad`` (local values go stale), the forward (which pulls), ``backward`` and
   ``optimizer.step()`` (SGD; the push, answered once the ps applied it). Pull latency is the
   forward's time, push latency the ``step``'s; bytes are counted at the RPC layer (every frame
   this process sends and receives: headers, row ids and values), per step, median of
   ``--transfer-steps`` steps.
3. **TensorFlow** (``--tf``). ``_tf_ps_peer.py`` under ``.venv-tf/bin/python``:
   ``tf.distribute.ParameterServerStrategy`` (``MinSizePartitioner(max_shards=2)``) +
   ``ClusterCoordinator`` on a local cluster of ``tf.distribute.Server`` processes (the peer the
   chief, 1 or 2 workers, 2 ps), the same model in tf-keras (``Embedding(200_000, 32)`` + mean over
   the bag + ``Dense(1)``, Adagrad lr 0.5) on the same synthetic batches, the same warm-up, steps
   and functions in flight; it runs in the same rounds, right after feedline's cluster of the same
   size, and the run reports feedline / TensorFlow steps/s. Skipped, with a message, when
   ``.venv-tf/bin/python`` is missing.

Raw numbers go to ``benchmarks/results/parameter_server-*.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import deque
from typing import Any

import _common
from _common import TF_PYTHON

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TF_PEER = os.path.join(ROOT, "benchmarks", "_tf_ps_peer.py")


# -- 1. scaling: one cluster per child process -------------------------------------------------
def premade_dataset_fn(rows: int, batch_size: int, count: int) -> Any:
    """The TensorFlow peer's input pipeline, for feedline: each worker makes the first
    ``count`` batches of its stream of the demo's ``dataset_fn`` up front (when its per-worker
    dataset is made, before the warm-up), then reads them through
    ``from_tensor_slices(...).repeat().prefetch(2)``, as the peer does."""
    from feedline.examples import parameter_server_demo as demo

    make_stream = demo.dataset_fn(rows, batch_size)

    def make(context: Any) -> Any:
        import numpy as np

        import feedline.data as fd

        stream = iter(make_stream(context))
        batches = [next(stream) for _ in range(count)]
        ids, labels = (np.stack([batch[i] for batch in batches]) for i in (0, 1))
        return fd.Dataset.from_tensor_slices((ids, labels)).repeat().prefetch(2)

    return make


def child_steps_per_second(
    workers: int,
    warmup: int,
    steps: int,
    generated: bool = False,
    torch_defaults: bool = False,
) -> dict[str, Any]:
    """In a child: the demo's model (with ``torch_defaults``, as written with torch's
    defaults: ``demo.build_model``) on a fresh local cluster of ``workers`` workers and 2 ps;
    steps per second over ``steps`` steps after ``warmup``, and the CPU milliseconds a step of
    each process (the chief is this one). The batches are made up front (as the TensorFlow
    peer's are), or with ``generated`` by the demo's ``dataset_fn`` step by step."""
    import torch

    import feedline.distribute as fdist
    from feedline.distribute.cluster_resolver import SimpleClusterResolver
    from feedline.distribute.experimental.partitioners import MinSizePartitioner
    from feedline.examples import parameter_server_demo as demo

    torch.set_num_threads(1)
    with demo.LocalCluster(workers=workers, ps=2) as cluster:
        strategy = fdist.ParameterServerStrategy(
            SimpleClusterResolver(cluster.spec, task_type="chief", task_id=0),
            variable_partitioner=MinSizePartitioner(max_shards=2),
            connect_timeout=30,
        )
        if torch_defaults:
            model, optimizer = demo.build_model(strategy, 200_000, 32, 0.05, torch_defaults=True)
        else:
            model, optimizer = demo.build_model(strategy, 200_000, 32)
        coordinator = fdist.coordinator.ClusterCoordinator(
            strategy, function_timeout=60.0, worker_timeout=60.0
        )
        if generated:
            dataset_fn = demo.dataset_fn(200_000, 256)
        else:
            dataset_fn = premade_dataset_fn(200_000, 256, warmup + steps)
        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
        step = demo.make_train_step(model, optimizer)

        def run(count: int) -> tuple[float, list[float]]:
            in_flight: deque[Any] = deque()
            losses = []
            start = time.perf_counter()
            for _ in range(count):
                if len(in_flight) >= 4 * workers:
                    losses.append(in_flight.popleft().fetch(timeout=120))
                in_flight.append(coordinator.schedule(step, args=(iterator,)))
            while in_flight:
                losses.append(in_flight.popleft().fetch(timeout=120))
            coordinator.join(timeout=120)
            return count / (time.perf_counter() - start), losses

        run(warmup)
        pids = {"chief": os.getpid(), **{c.name: c.process.pid for c in cluster.children}}
        before = {name: _common.cpu_seconds(pid) for name, pid in pids.items()}
        rate, losses = run(steps)
        cpu = {n: 1000 * (_common.cpu_seconds(p) - before[n]) / steps for n, p in pids.items()}
        coordinator.close()  # the cluster goes next
    return {
        "workers": workers,
        "steps_per_s": rate,
        "last_loss": statistics.fmean(losses[-20:]),
        "cpu_ms_per_step": cpu,
    }


def _last_json_line(done: subprocess.CompletedProcess[str], what: str) -> dict[str, Any]:
    """The JSON result a child printed last; RuntimeError with its stderr if it failed."""
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def _child(command: list[str], args: argparse.Namespace, what: str) -> dict[str, Any]:
    """Runs a feedline child in a fresh interpreter, with a timeout; its JSON line."""
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=args.child_timeout, cwd=ROOT,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    return _last_json_line(done, what)


def _tf_child(workers: int, flags: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Runs the TensorFlow peer (``_tf_ps_peer.py``) on a cluster of ``workers`` workers and
    2 ps; its JSON line."""
    done = subprocess.run(
        [str(TF_PYTHON), TF_PEER, "--workers", str(workers), *flags,
         "--timeout", str(int(args.child_timeout))],
        capture_output=True, text=True, timeout=args.child_timeout + 30, cwd=ROOT,
        env=dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=""),
    )  # fmt: skip
    return _last_json_line(done, f"the TensorFlow {workers}-worker peer")


def steps_per_second(workers: int, args: argparse.Namespace) -> dict[str, Any]:
    """Runs ``child_steps_per_second`` in a fresh interpreter, with a timeout."""
    return _child(
        [sys.executable, __file__, "--child-workers", str(workers), "--warmup",
         str(args.warmup), "--steps", str(args.steps), "--model", args.model,
         *(["--generated-input"] if args.generated_input else [])],
        args, f"the {workers}-worker child",
    )  # fmt: skip


def tf_steps_per_second(workers: int, args: argparse.Namespace) -> dict[str, Any]:
    """The TensorFlow peer (``_tf_ps_peer.py``): the same model and data on a TensorFlow
    cluster of ``workers`` workers and 2 ps; its JSON line."""
    flags = ["--warmup", str(args.warmup), "--steps", str(args.steps), "--model", args.model]
    return _tf_child(workers, flags, args)


def _tf_note(args: argparse.Namespace) -> str | None:
    """Why the TensorFlow peer does not run, or None when it does."""
    if not args.tf:
        return "not measured (run with --tf)"
    if not TF_PYTHON.exists():
        note = f"{TF_PYTHON} is missing (see benchmarks/README.md): no TensorFlow peer"
        print(note, file=sys.stderr)
        return note
    return None


# -- dispatch: --closures ----------------------------------------------------------------------
def tiny() -> int:
    """The function ``--closures`` schedules: no arguments, no work."""
    return 1


def child_closure_rate(workers: int, count: int, warmup: int, samples: int) -> dict[str, Any]:
    """In a child: ``count`` tiny functions scheduled on a fresh cluster of ``workers`` workers
    and 2 ps, then ``join``; closures/s, and the median schedule -> fetch latency of one
    function at a time (``samples`` of them)."""
    import torch

    import feedline.distribute as fdist
    from feedline.distribute.cluster_resolver import SimpleClusterResolver
    from feedline.examples import parameter_server_demo as demo

    torch.set_num_threads(1)
    with demo.LocalCluster(workers=workers, ps=2) as cluster:
        strategy = fdist.ParameterServerStrategy(
            SimpleClusterResolver(cluster.spec, task_type="chief", task_id=0),
            connect_timeout=30,
        )
        coordinator = fdist.coordinator.ClusterCoordinator(
            strategy, function_timeout=60.0, worker_timeout=60.0
        )
        for _ in range(max(1, warmup)):
            coordinator.schedule(tiny)
        coordinator.join(timeout=120)
        start = time.perf_counter()
        for _ in range(count):
            coordinator.schedule(tiny)
        coordinator.join(timeout=120)
        rate = count / (time.perf_counter() - start)
        latencies = []
        for _ in range(samples):
            start = time.perf_counter()
            coordinator.schedule(tiny).fetch(timeout=60)
            latencies.append(time.perf_counter() - start)
        coordinator.close()
    return {"workers": workers, "closures": count, "closures_per_s": rate,
            "latency_ms": statistics.median(latencies) * 1e3}  # fmt: skip


def closure_rates(args: argparse.Namespace) -> int:
    """``--closures N``: feedline's and (``--tf``) TensorFlow's dispatch rate and latency
    with 1 and 2 workers, in rounds; medians over the rounds."""
    tf_note = _tf_note(args)
    sides = ["feedline"] + (["tensorflow"] if tf_note is None else [])
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {s: {1: [], 2: []} for s in sides}
    for round_ in range(args.rounds):
        for workers in (1, 2) if round_ % 2 == 0 else (2, 1):
            for side in sides if round_ % 2 == 0 else sides[::-1]:
                flags = ["--closures", str(args.closures), "--warmup", str(args.warmup),
                         "--latency-samples", str(args.latency_samples)]  # fmt: skip
                if side == "feedline":
                    result = _child([sys.executable, __file__, "--child-workers", str(workers),
                                     *flags], args, f"the {workers}-worker child")  # fmt: skip
                else:
                    result = _tf_child(workers, flags, args)
                runs[side][workers].append(result)
                print(f"round {round_ + 1}: {workers} worker(s), {side}: "
                      f"{result['closures_per_s']:.0f} closures/s, median latency "
                      f"{result['latency_ms']:.2f} ms", flush=True)  # fmt: skip
    median = {
        side: {w: {k: statistics.median(r[k] for r in rs) for k in ("closures_per_s",
               "latency_ms")} for w, rs in by_workers.items()}
        for side, by_workers in runs.items()
    }  # fmt: skip
    print(f"\n{os.cpu_count()} CPUs; {args.closures} tiny functions scheduled, then join; "
          f"medians of {args.rounds} rounds\n")  # fmt: skip
    print("| workers (2 ps) | feedline closures/s | TensorFlow closures/s | feedline / TF | "
          "feedline latency ms | TensorFlow latency ms |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|")
    for workers in (1, 2):
        mine = median["feedline"][workers]
        theirs = median.get("tensorflow", {}).get(workers)
        ratio = f"**{mine['closures_per_s'] / theirs['closures_per_s']:.2f}x**" if theirs else "-"
        print(f"| {workers} | {mine['closures_per_s']:.0f} | "
              f"{theirs['closures_per_s'] if theirs else float('nan'):.0f} | {ratio} | "
              f"{mine['latency_ms']:.2f} | "
              f"{theirs['latency_ms'] if theirs else float('nan'):.2f} |")  # fmt: skip
    if tf_note is not None:
        print(f"\nTensorFlow peer: {tf_note}")
    _common.write_results(
        "parameter_server_closures",
        {"closures": args.closures, "rounds": args.rounds, "runs": runs, "median": median,
         "tensorflow_note": tf_note},
    )  # fmt: skip
    return 0


# -- 2. what a step moves ---------------------------------------------------------------------
class _WireCounter:
    """Counts the bytes of every RPC frame this process sends and receives."""

    def __init__(self) -> None:
        from feedline._net import rpc

        self.sent = 0
        self.received = 0
        self._rpc = rpc
        self._encode, self._decode = rpc.encode_frame, rpc.decode_frame

        def encode(*a: Any, **k: Any) -> Any:
            frame = self._encode(*a, **k)
            self.sent += len(frame)
            return frame

        def decode(frame: Any, *a: Any, **k: Any) -> Any:
            self.received += len(frame)
            return self._decode(frame, *a, **k)

        rpc.encode_frame, rpc.decode_frame = encode, decode

    def take(self) -> tuple[int, int]:
        sent, received, self.sent, self.received = self.sent, self.received, 0, 0
        return sent, received


def transfers(steps: int) -> dict[str, Any]:
    """Pull/push latency and bytes per step for the dense and the embedding model."""
    import torch

    import feedline.distribute as fdist
    from feedline.distribute.cluster_resolver import SimpleClusterResolver
    from feedline.distribute.experimental.partitioners import FixedShardsPartitioner
    from feedline.examples import parameter_server_demo as demo

    torch.set_num_threads(1)
    counter = _WireCounter()
    results: dict[str, Any] = {}
    with demo.LocalCluster(workers=1, ps=2) as cluster:
        strategy = fdist.ParameterServerStrategy(
            SimpleClusterResolver(cluster.spec, task_type="chief", task_id=0),
            variable_partitioner=FixedShardsPartitioner(2),
            connect_timeout=30,
        )
        torch.manual_seed(0)
        generator = torch.Generator().manual_seed(1)
        with strategy.scope():
            dense = torch.nn.Linear(1600, 1600)
            table = torch.nn.EmbeddingBag(1_000_000, 64, mode="sum", sparse=True)
            dense_opt = torch.optim.SGD(dense.parameters(), lr=0.01)
            table_opt = torch.optim.SGD(table.parameters(), lr=0.01)

        def dense_input() -> tuple[torch.Tensor, ...]:
            return (torch.randn(32, 1600, generator=generator),)

        def table_input() -> tuple[torch.Tensor, ...]:
            ids = torch.randperm(1_000_000, generator=generator)[:4096]
            return (ids.view(1024, 4),)

        cases = [
            ("dense Linear(1600, 1600)", dense, dense_opt, dense_input),
            ("EmbeddingBag(1M, 64), 4,096 rows a step", table, table_opt, table_input),
        ]
        for name, model, optimizer, make_input in cases:
            size = sum(p.numel() * p.element_size() for p in model.parameters())
            rows: dict[str, list[float]] = {k: [] for k in ("pull_ms", "push_ms")}
            keys = ("pull_sent", "pull_received", "push_sent", "push_received")
            wire: dict[str, list[int]] = {k: [] for k in keys}
            for i in range(steps + 2):  # the first two: creation and warm-up
                inputs = make_input()
                optimizer.zero_grad()
                counter.take()
                start = time.perf_counter()
                out = model(*inputs)
                pulled = time.perf_counter()
                pull = counter.take()
                out.square().mean().backward()
                counter.take()
                pushing = time.perf_counter()
                optimizer.step()
                pushed = time.perf_counter()
                push = counter.take()
                if i < 2:
                    continue
                rows["pull_ms"].append((pulled - start) * 1e3)
                rows["push_ms"].append((pushed - pushing) * 1e3)
                for key, value in zip(wire, (*pull, *push), strict=True):
                    wire[key].append(value)
            results[name] = {
                "model_bytes": size,
                **{k: statistics.median(v) for k, v in rows.items()},
                **{k: statistics.median(v) for k, v in wire.items()},
            }
    return results


# -- the run -----------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    parser.add_argument("--steps", type=int, default=400, help="timed steps per cluster")
    parser.add_argument("--warmup", type=int, default=60, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=2, help="turns of the 1- and 2-worker runs")
    parser.add_argument("--transfer-steps", type=int, default=20)
    parser.add_argument("--child-timeout", type=float, default=300.0)
    parser.add_argument("--tf", action="store_true", help="also run the TensorFlow peer")
    parser.add_argument(
        "--generated-input",
        action="store_true",
        help="feedline's workers generate each batch in Python (the demo's dataset_fn) instead "
        "of reading batches made up front, as the TensorFlow peer does",
    )
    parser.add_argument(
        "--closures",
        type=int,
        default=0,
        help="measure dispatch instead: N tiny functions scheduled, then join (closures/s)",
    )
    parser.add_argument("--latency-samples", type=int, default=200)
    parser.add_argument(
        "--model",
        choices=("demo", "torch-defaults"),
        default="demo",
        help="the demo's model (sparse EmbeddingBag, mean, Adagrad), or the same written with "
        "torch's defaults (EmbeddingBag(mode='sum'), a dense gradient, plain SGD lr 0.05)",
    )
    parser.add_argument("--child-workers", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_workers is not None and args.closures:
        result = child_closure_rate(
            args.child_workers, args.closures, args.warmup, args.latency_samples
        )
        print(json.dumps(result))
        return 0
    if args.child_workers is not None:
        result = child_steps_per_second(
            args.child_workers,
            args.warmup,
            args.steps,
            args.generated_input,
            args.model == "torch-defaults",
        )
        print(json.dumps(result))
        return 0
    if args.quick:
        args.steps, args.warmup, args.rounds, args.transfer_steps = 100, 20, 1, 5
    if args.closures:
        return closure_rates(args)

    tf_note = _tf_note(args)
    runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    tf_runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    for round_ in range(args.rounds):
        for workers in (1, 2) if round_ % 2 == 0 else (2, 1):
            runs[workers].append(steps_per_second(workers, args))
            print(f"round {round_ + 1}: {workers} worker(s): "
                  f"{runs[workers][-1]['steps_per_s']:.1f} steps/s", flush=True)  # fmt: skip
            if tf_note is None:
                tf_runs[workers].append(tf_steps_per_second(workers, args))
                print(f"round {round_ + 1}: {workers} worker(s), TensorFlow: "
                      f"{tf_runs[workers][-1]['steps_per_s']:.1f} steps/s", flush=True)  # fmt: skip
    best = {w: max(r["steps_per_s"] for r in rs) for w, rs in runs.items()}
    tf_best = {w: max(r["steps_per_s"] for r in rs) for w, rs in tf_runs.items() if rs}
    busy = _common.calibrate_busy()
    machine = _common.process_scaling(busy, seconds=1.0, repetitions=3)
    moved = transfers(args.transfer_steps)

    cpus = os.cpu_count()
    how = "generated step by step" if args.generated_input else "made up front"
    print(f"\n{cpus} CPUs; cluster: this process the chief, workers and 2 ps as `feedline "
          f"server` processes on 127.0.0.1; feedline's batches {how}\n")  # fmt: skip
    print("| workers (2 ps) | steps/s (best of rounds) | rounds |")
    print("|---:|---:|---|")
    for workers in (1, 2):
        rates = ", ".join(f"{r['steps_per_s']:.1f}" for r in runs[workers])
        print(f"| {workers} | {best[workers]:.1f} | {rates} |")
    print(f"| **2 / 1** | **{best[2] / best[1]:.2f}x** | machine's own 2-process scaling: "
          f"{machine:.2f}x ({cpus} cores) |")  # fmt: skip
    print("\nCPU ms a step by process in each cluster's best round (x steps/s: the cores busy)\n")
    print("| workers (2 ps) | chief | each worker | ps 0 / ps 1 | all | cores busy |")
    print("|---:|---:|---:|---:|---:|---:|")
    for workers in (1, 2):
        top = max(runs[workers], key=lambda r: r["steps_per_s"])
        cpu = top["cpu_ms_per_step"]
        each = [v for k, v in cpu.items() if k.startswith("worker")]
        total = sum(cpu.values())
        print(f"| {workers} | {cpu['chief']:.2f} | {', '.join(f'{v:.2f}' for v in each)} | "
              f"{cpu['ps:0']:.2f} / {cpu['ps:1']:.2f} | {total:.2f} | "
              f"{total * top['steps_per_s'] / 1000:.2f} |")  # fmt: skip
    print("\n| model | size | pull ms | push ms | pull: sent / received | "
          "push: sent / received |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in moved.items():
        print(
            f"| {name} | {_mb(r['model_bytes'])} | {r['pull_ms']:.2f} | {r['push_ms']:.2f} | "
            f"{_mb(r['pull_sent'])} / {_mb(r['pull_received'])} | "
            f"{_mb(r['push_sent'])} / {_mb(r['push_received'])} |"
        )
    print(f"\n4,096 rows x 64 x 4 bytes = {_mb(4096 * 64 * 4)} (+ 4,096 x 8 bytes of row ids = "
          f"{_mb(4096 * 8)})")  # fmt: skip
    if tf_note is not None:
        print(f"\nTensorFlow peer: {tf_note}")
    else:
        print(f"\nTensorFlow: {tf_runs[1][0]['framework']}, `_tf_ps_peer.py` (a cluster of "
              "`tf.distribute.Server` processes, the peer the chief)\n")  # fmt: skip
        print("| workers (2 ps) | feedline steps/s | TensorFlow steps/s | feedline / TF | "
              "TF rounds |")  # fmt: skip
        print("|---:|---:|---:|---:|---|")
        for workers in (1, 2):
            rates = ", ".join(f"{r['steps_per_s']:.1f}" for r in tf_runs[workers])
            print(f"| {workers} | {best[workers]:.1f} | {tf_best[workers]:.1f} | "
                  f"**{best[workers] / tf_best[workers]:.2f}x** | {rates} |")  # fmt: skip
        print(f"| **2 / 1** | {best[2] / best[1]:.2f}x | {tf_best[2] / tf_best[1]:.2f}x | | |")
    _common.write_results(
        "parameter_server",
        {"steps": args.steps, "warmup": args.warmup, "runs": runs, "best": best,
         "input": "generated" if args.generated_input else "premade",
         "ratio": best[2] / best[1], "machine_2_process_scaling": machine,
         "transfers": moved, "tensorflow": {"note": tf_note, "runs": tf_runs, "best": tf_best,
         "ratio": {w: best[w] / tf_best[w] for w in tf_best}}},
    )  # fmt: skip
    return 0


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


if __name__ == "__main__":
    raise SystemExit(main())
