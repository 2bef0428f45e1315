"""What a collective inside ``strategy.run`` costs with several local replicas, against
TensorFlow's ``MirroredStrategy`` doing the same.

Usage (from the repository root)::

    .venv/bin/python benchmarks/replica_collectives.py [--rounds 7] [--no-tf]

Everything runs over two logical CPU replicas (``MirroredStrategy(["cpu:0", "cpu:1"])``; in
TensorFlow two virtual CPU devices). Per ``strategy.run``:

  empty run       a function that returns at once: feedline's path without collectives, which
                  calls the replicas one after another in the caller's thread;
  one all_reduce  a function that all-reduces one scalar: feedline's hand-over (a thread per
                  other replica, two hand-overs); TensorFlow eager runs its replica threads too;
  train step      one SGD step of a 784-256-10 MLP on a global batch of 128, the built-in
                  gradient summation against the step that all-reduces its gradients itself
                  (``ReplicaContext.all_reduce`` of every ``.grad``).

Each round times every variant in turn (blocks of runs, the best block kept), so that a ratio is
taken within one round; the medians over rounds are printed. TensorFlow runs eagerly (no
``tf.function``: feedline runs eagerly too) in its own interpreter (``.venv-tf``), in the same
run. Raw numbers go to ``benchmarks/results/replica_collectives-*.json``.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

import _common
import feedline.distribute as fdist

BATCH = 128

_TF_PEER = """
import json, sys, time
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

def empty():
    return None

def one_all_reduce():
    return tf.distribute.get_replica_context().all_reduce("SUM", tf.constant(1.0))

def best_us(fn, runs):
    for _ in range(5):
        strategy.run(fn)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(runs):
            strategy.run(fn)
        best = min(best, (time.perf_counter() - start) / runs * 1e6)
    return best

rounds = int(sys.argv[1])
out = {"empty": [], "all_reduce": []}
for _ in range(rounds):
    out["empty"].append(best_us(empty, 200))
    out["all_reduce"].append(best_us(one_all_reduce, 100))
print(json.dumps(out))
"""


def _best_us(run: Callable[[], Any], runs: int) -> float:
    for _ in range(5):
        run()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(runs):
            run()
        best = min(best, (time.perf_counter() - start) / runs * 1e6)
    return best


def _train_step(strategy: fdist.Strategy, own_all_reduce: bool) -> Callable[[], Any]:
    torch.manual_seed(0)
    with strategy.scope():
        model = torch.nn.Sequential(
            torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    params = list(model.parameters())
    half = BATCH // 2
    x = fdist.PerReplica([torch.randn(half, 784), torch.randn(half, 784)])
    y = fdist.PerReplica([torch.randint(0, 10, (half,)), torch.randint(0, 10, (half,))])

    def step(features: torch.Tensor, labels: torch.Tensor) -> None:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(features), labels, reduction="sum")
        (loss / BATCH).backward()
        if own_all_reduce:
            context = fdist.get_replica_context()
            assert context is not None
            grads = context.all_reduce("SUM", [p.grad for p in params])
            for param, grad in zip(params, grads, strict=True):
                param.grad = grad
        optimizer.step()

    return lambda: strategy.run(step, args=(x, y))


def _collective_supported(strategy: fdist.Strategy) -> bool:
    def one() -> Any:
        context = fdist.get_replica_context()
        assert context is not None
        return context.all_reduce("SUM", torch.tensor(1.0))

    try:
        strategy.run(one)
    except Exception as error:  # a feedline without hand-overs: the empty run alone
        print(f"collectives inside run are not supported here: {error}")
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-tf", action="store_true")
    options = parser.parse_args()
    torch.set_num_threads(1)
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
    supported = _collective_supported(strategy)

    def one_all_reduce() -> Any:
        context = fdist.get_replica_context()
        assert context is not None
        return context.all_reduce("SUM", torch.tensor(1.0))

    variants: dict[str, tuple[Callable[[], Any], int]] = {
        "empty": (lambda: strategy.run(lambda: None), 2000),
        "train_built_in": (_train_step(fdist.MirroredStrategy(["cpu:0", "cpu:1"]), False), 50),
    }
    if supported:
        variants["all_reduce"] = (lambda: strategy.run(one_all_reduce), 500)
        variants["train_own_all_reduce"] = (
            _train_step(fdist.MirroredStrategy(["cpu:0", "cpu:1"]), True),
            50,
        )
    rounds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(options.rounds):
        for name, (run, runs) in variants.items():
            rounds[name].append(_best_us(run, runs))
    medians = {name: statistics.median(values) for name, values in rounds.items()}
    print(f"{'per strategy.run (2 replicas)':32} {'median us':>10}")
    for name, value in medians.items():
        print(f"{name:32} {value:10.1f}")
    payload: dict[str, Any] = {"feedline_us": rounds, "feedline_median_us": medians}
    if supported:
        ratios = [
            own / built
            for own, built in zip(
                rounds["train_own_all_reduce"], rounds["train_built_in"], strict=True
            )
        ]
        payload["train_own_over_built_in"] = statistics.median(ratios)
        print(f"train step, own all_reduce / built-in: {statistics.median(ratios):.3f}")
    if not options.no_tf:
        with tempfile.TemporaryDirectory() as tmp:
            script = pathlib.Path(tmp) / "tf_replica_collectives.py"
            script.write_text(_TF_PEER)
            tf = _common.run_tf_script(script, [str(options.rounds)], "the TensorFlow peer")
        payload["tensorflow_us"] = tf
        if isinstance(tf, str):
            print(tf)
        else:
            for name in ("empty", "all_reduce"):
                if name in medians:
                    tf_median = statistics.median(tf[name])
                    print(
                        f"TensorFlow {name:21} {tf_median:10.1f}   "
                        f"feedline / TF {medians[name] / tf_median:.3f}"
                    )
    _common.write_results("replica_collectives", payload)


if __name__ == "__main__":
    main()
