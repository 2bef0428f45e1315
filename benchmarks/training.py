"""Training throughput of the custom training tutorial: feedline, plain PyTorch and TensorFlow.

Usage (from the repository root)::

    .venv/bin/python benchmarks/training.py [--quick] [--no-tf] [--no-variants] [--no-profile]

Every loop trains the seed CNN (feedline's ``examples.custom_training.create_model``; in
TensorFlow the same layers in tf-keras) with Adam on ``_common``'s random Fashion-MNIST-shaped
data (60,000 28x28x1 images scaled to [0, 1], 10 classes) at a global batch of 128, over the
tutorial's pipeline ``from_tensor_slices((x, y)).shuffle(60000).batch(128)``, repeated:

  feedline      the tutorial's loop as written (``docs/custom_training.md``):
                ``MirroredStrategy(["cpu:0", "cpu:1"])``, model and optimizer made under
                ``strategy.scope()``, ``experimental_distribute_dataset``,
                ``strategy.run(train_step)`` with ``feedline.nn.compute_average_loss``,
                ``strategy.reduce(SUM)``, ``train_accuracy.update_state``, ``float(loss)`` each
                step;
  hand-written  one process, no feedline: batches of 128 gathered from one torch tensor (a
                NumPy array, ``torch.from_numpy``) in a fresh random order every epoch, the same
                model, loss, Adam, an accuracy count and ``float(loss)`` each step;
  TensorFlow    ``tf.distribute.MirroredStrategy`` over two logical CPU devices, the tutorial's
                ``tf.function`` custom loop (``_tf_training_peer.py`` under
                ``.venv-tf/bin/python``).

Each loop runs in worker processes of its own, so that thread settings, environment variables
and the allocator's state are its own, and no framework's global hooks touch another's loop. A
worker warms up, then runs blocks of steps when told; every worker takes one block per round, in
an order rotated every round, and a worker that is not running is stopped (SIGSTOP), so that its
threads cannot take CPU from the one that runs. Every round's blocks see about the same machine
load: ratios are taken round by round (paired) and their median reported, besides the best rates.

Two phases. The main loops (the three above, both PyTorch loops again with glibc's default
malloc, and the hand-written loop in two micro-batches of 64, feedline's arithmetic) run as
``--processes`` processes each (3; 1 with ``--quick``), a round's rate being their mean: processes
of the same loop differ persistently by several per cent on a small VM. Then the variants change
one setting at a time, one process each, beside the hand-written and TensorFlow loops run again:
threads, ``OMP_*``/``MKL_*`` variables, inter-op threads, ``channels_last``, oneDNN
(``torch.backends.mkldnn``), the allocator (tcmalloc, jemalloc where installed); feedline with
``channels_last``; TensorFlow on one device, with one inter-op thread, without oneDNN.

glibc's malloc adjusts its mmap and trim thresholds to what a process happens to allocate and
free; on this loop that leaves some processes page-faulting thousands of times a step and others
not at all, for the same code. The PyTorch loops therefore run with both thresholds fixed
(``GLIBC_TUNABLES``, see ``FIXED_MALLOC``) unless a row says "default malloc".

Then (``--no-profile`` skips it) cProfile runs feedline's and the hand-written loop (and the
``channels_last`` variant) for one block each: top functions by own time, feedline's functions by
cumulative time, and the two steps phase by phase (``PHASES``). Raw numbers go to
``benchmarks/results/training-*.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes.util
import dataclasses
import json
import os
import pathlib
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

import numpy as np

import _common
from _common import FIXED_MALLOC, TF_PYTHON
from _tf_training_peer import EpochBatches, serve
from distributed_input import (
    GLOBAL_BATCH,
    REPLICAS,
    _fmt,
    _short,
    profile_rows,
)

HERE = pathlib.Path(__file__).resolve().parent
TF_PEER = HERE / "_tf_training_peer.py"
TARGET_VS_TORCH = 1.0  # feedline / hand-written, examples/s (at or above the hand-written loop)


# -- the workers: the training loops ------------------------------------------------------------


def load_data() -> tuple[np.ndarray, np.ndarray]:
    """``_common.make_images`` as the tutorial prepares them for PyTorch: float32 NCHW in
    [0, 1], int64 labels."""
    x, y = _common.make_images()
    images = (x.transpose(0, 3, 1, 2) / np.float32(255)).astype(np.float32)
    return images, y.astype(np.int64)


def feedline_loop(args: argparse.Namespace) -> Callable[[int], dict[str, Any]]:
    """The tutorial's loop as ``docs/custom_training.md`` writes it, taking ``next`` of one
    iterator over the repeated dataset (the tutorial's explicit-iterator form)."""
    import torch

    import feedline.data as fd
    import feedline.distribute as fdist
    import feedline.metrics
    import feedline.nn
    from feedline.examples.custom_training import create_model

    torch.manual_seed(0)
    train_images, train_labels = load_data()
    strategy = fdist.MirroredStrategy(list(REPLICAS))
    global_batch_size = GLOBAL_BATCH
    train_dataset = (
        fd.Dataset.from_tensor_slices((train_images, train_labels))
        .shuffle(len(train_images), seed=0)
        .batch(global_batch_size)
        .repeat()
    )
    train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format

    with strategy.scope():
        model = create_model().to(memory_format=memory_format)
        optimizer = torch.optim.Adam(model.parameters())
    loss_object = torch.nn.CrossEntropyLoss(reduction="none")
    train_accuracy = feedline.metrics.SparseCategoricalAccuracy(name="train_accuracy")

    def compute_loss(labels: torch.Tensor, predictions: torch.Tensor) -> torch.Tensor:
        per_example_loss = loss_object(predictions, labels)
        return feedline.nn.compute_average_loss(
            per_example_loss, global_batch_size=global_batch_size
        )

    def train_step(inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        images, labels = inputs
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        optimizer.zero_grad()
        predictions = model(images)
        loss = compute_loss(labels, predictions)
        loss.backward()
        optimizer.step()
        train_accuracy.update_state(labels, predictions.detach())
        return loss.detach()

    def distributed_train_step(dataset_inputs: Any) -> torch.Tensor:
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce(fdist.ReduceOp.SUM, per_replica_losses, axis=None)

    train_iter = iter(train_dist_dataset)
    batch_sizes = EpochBatches(len(train_images), global_batch_size)

    def run_steps(steps: int) -> dict[str, Any]:
        total_loss = 0.0
        for _ in range(steps):
            total_loss += float(distributed_train_step(next(train_iter)))
        return {
            "examples": batch_sizes.take(steps),
            "loss": total_loss / steps,
            "accuracy": float(train_accuracy.result()),
        }

    return run_steps


def batch_indices(n: int, batch: int, seed: int) -> Iterator[np.ndarray]:
    """The indices of each batch of ``shuffle(n).batch(batch).repeat()``: every epoch a fresh
    permutation of ``n``, cut in batches, the last one partial."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(n)
        for start in range(0, n, batch):
            yield order[start : start + batch]


def torch_loop(args: argparse.Namespace) -> Callable[[int], dict[str, Any]]:
    """A hand-written single-process loop: the same model, loss, optimizer and accuracy, the
    batches gathered from plain tensors. ``--split K`` runs each global batch as K micro-batches
    that add up their gradients before the one step (the arithmetic of feedline's K replicas,
    which run one after another on the one CPU)."""
    import torch

    from feedline.examples.custom_training import create_model

    torch.manual_seed(0)
    train_images, train_labels = load_data()
    images_all = torch.from_numpy(train_images)
    labels_all = torch.from_numpy(train_labels)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format

    model = create_model().to(memory_format=memory_format)
    optimizer = torch.optim.Adam(model.parameters())
    if args.compile:
        model = torch.compile(model)
    loss_object = torch.nn.CrossEntropyLoss(reduction="none")
    correct = torch.zeros((), dtype=torch.int64)
    seen = 0

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for index in batch_indices(len(train_images), GLOBAL_BATCH, seed=0):
            index_tensor = torch.from_numpy(index)
            yield images_all.index_select(0, index_tensor), labels_all.index_select(0, index_tensor)

    def update_accuracy(labels: torch.Tensor, predictions: torch.Tensor) -> None:
        nonlocal correct, seen
        correct += (predictions.argmax(dim=1) == labels).sum()
        seen += len(labels)

    def train_step(inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        images, labels = inputs
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        optimizer.zero_grad()
        step_loss = torch.zeros(())
        for images_part, labels_part in zip(
            images.chunk(args.split), labels.chunk(args.split), strict=True
        ):
            predictions = model(images_part)
            loss = loss_object(predictions, labels_part).sum() / GLOBAL_BATCH
            loss.backward()
            update_accuracy(labels_part, predictions.detach())
            step_loss += loss.detach()
        optimizer.step()
        return step_loss

    inputs = batches()

    def run_steps(steps: int) -> dict[str, Any]:
        total_loss = 0.0
        examples = 0
        for _ in range(steps):
            batch = next(inputs)
            examples += len(batch[1])
            total_loss += float(train_step(batch))
        return {"examples": examples, "loss": total_loss / steps, "accuracy": int(correct) / seen}

    return run_steps


def profile_steps(run_steps: Callable[[int], Any], steps: int, top: int) -> dict[str, Any]:
    """cProfile of ``steps`` steps (this thread only): the top functions by own time, and the
    top feedline functions by cumulative time, in µs per step."""
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    run_steps(steps)
    profile.disable()
    seconds = time.perf_counter() - start
    stats = pstats.Stats(profile)
    entries = stats.stats  # type: ignore[attr-defined]
    feedline_cum = []
    cumulative_by_name: dict[str, float] = {}
    for (file, line, name), (_, calls, _, cumulative, _) in entries.items():
        key = f"{os.path.basename(file)}:{name}"
        cumulative_by_name[key] = max(cumulative_by_name.get(key, 0.0), 1e6 * cumulative / steps)
        if "/feedline/" in file:
            feedline_cum.append(
                {
                    "function": f"{_short(file)}:{line}({name})",
                    "cum_us_per_step": 1e6 * cumulative / steps,
                    "calls_per_step": calls / steps,
                }
            )
    feedline_cum.sort(key=lambda row: -row["cum_us_per_step"])
    return {
        "steps": steps,
        "us_per_step": 1e6 * seconds / steps,
        "own": profile_rows(stats, steps, top),
        "feedline_cumulative": feedline_cum[:top],
        "cumulative_by_name": {k: v for k, v in cumulative_by_name.items() if v >= 1.0},
    }


def worker_main(argv: list[str]) -> None:
    """``training.py --worker LOOP [options]``: one PyTorch loop served to the parent."""
    parser = argparse.ArgumentParser(prog="training.py --worker")
    parser.add_argument("--worker", choices=("feedline", "torch"), required=True)
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads")
    parser.add_argument("--interop", type=int, default=0, help="torch.set_num_interop_threads")
    parser.add_argument("--no-mkldnn", action="store_true", help="torch.backends.mkldnn off")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--split", type=int, default=1, help="micro-batches (torch loop)")
    parser.add_argument("--compile", action="store_true", help="torch.compile (torch loop)")
    parser.add_argument("--top", type=int, default=15, help="functions per profile list")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.interop:
        torch.set_num_interop_threads(args.interop)
    if args.no_mkldnn:
        torch.backends.mkldnn.enabled = False
    run_steps = (feedline_loop if args.worker == "feedline" else torch_loop)(args)
    info = {
        "framework": f"torch {torch.__version__}",
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "mkldnn": torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled,
        "channels_last": args.channels_last,
        "env": {
            k: v
            for k, v in os.environ.items()
            if k.startswith(("OMP_", "MKL_", "GOMP_", "GLIBC_TUNABLES", "LD_PRELOAD"))
        },
    }
    serve(
        run_steps,
        info,
        args.warmup_steps,
        {"profile": lambda steps: profile_steps(run_steps, steps, args.top)},
    )
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: the input pipeline's threads need not be joined


# -- the parent: workers taking turns -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Spec:
    """One loop to time: a worker command line and its environment."""

    key: str
    label: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    tf: bool = False


def torch_spec(
    key: str, label: str, *options: str, env: dict[str, str] | None = None, malloc: bool = True
) -> Spec:
    """A PyTorch worker; ``malloc``: with ``FIXED_MALLOC`` (added to ``env``)."""
    env = {**(FIXED_MALLOC if malloc else {}), **(env or {})}
    argv = (sys.executable, str(pathlib.Path(__file__).resolve()), *options)
    return Spec(key, label, argv, tuple(env.items()))


def tf_spec(key: str, label: str, *options: str, env: dict[str, str] | None = None) -> Spec:
    argv = (str(TF_PYTHON), str(TF_PEER), *options)
    return Spec(key, label, argv, tuple((env or {}).items()), tf=True)


def preload(name: str) -> dict[str, str] | None:
    """``LD_PRELOAD`` of an installed allocator library, or None where there is none."""
    found = ctypes.util.find_library(name)
    return {"LD_PRELOAD": found} if found else None


FEEDLINE = ("--worker", "feedline")
TORCH = ("--worker", "torch")
MAIN = (
    torch_spec(
        "feedline", 'feedline `MirroredStrategy(["cpu:0", "cpu:1"])`, the tutorial', *FEEDLINE
    ),
    torch_spec("torch", "hand-written PyTorch loop", *TORCH),
    tf_spec("tf", 'TensorFlow `MirroredStrategy(["/cpu:0", "/cpu:1"])`, `tf.function`'),
    torch_spec("feedline-malloc", "feedline, default malloc", *FEEDLINE, malloc=False),
    torch_spec("torch-malloc", "hand-written, default malloc", *TORCH, malloc=False),
    torch_spec(
        "torch-split2",
        "hand-written, 2 micro-batches of 64 (feedline's arithmetic)",
        *TORCH,
        "--split",
        "2",
    ),
)


def variants() -> list[Spec]:
    """One setting changed at a time (PyTorch loops: with ``FIXED_MALLOC`` unless the variant is
    the allocator itself)."""
    specs = [
        torch_spec("torch-threads1", "hand-written, `torch.set_num_threads(1)`", *TORCH,
                   "--threads", "1"),
        torch_spec("torch-threads4", "hand-written, `torch.set_num_threads(4)`", *TORCH,
                   "--threads", "4"),
        torch_spec("torch-omp1", "hand-written, `OMP_NUM_THREADS=1 MKL_NUM_THREADS=1`", *TORCH,
                   env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}),
        torch_spec("torch-interop1", "hand-written, `torch.set_num_interop_threads(1)`", *TORCH,
                   "--interop", "1"),
        torch_spec("torch-passive", "hand-written, `OMP_WAIT_POLICY=PASSIVE`", *TORCH,
                   env={"OMP_WAIT_POLICY": "PASSIVE"}),
        torch_spec("torch-active", "hand-written, `OMP_WAIT_POLICY=ACTIVE`", *TORCH,
                   env={"OMP_WAIT_POLICY": "ACTIVE"}),
        torch_spec("torch-nomkldnn", "hand-written, `torch.backends.mkldnn.enabled = False`",
                   *TORCH, "--no-mkldnn"),
        torch_spec("torch-cl", "hand-written, `channels_last`", *TORCH, "--channels-last"),
        torch_spec("torch-cl-malloc", "hand-written, `channels_last`, default malloc", *TORCH,
                   "--channels-last", malloc=False),
    ]  # fmt: skip
    for key, library in (("tcmalloc", "tcmalloc_minimal"), ("jemalloc", "jemalloc")):
        env = preload(library)
        if env is not None:
            specs.append(
                torch_spec(f"torch-{key}", f"hand-written, {key} (`LD_PRELOAD`)", *TORCH,
                           env=env, malloc=False)
            )  # fmt: skip
    specs += [
        torch_spec("feedline-cl", "feedline, `channels_last`", *FEEDLINE, "--channels-last"),
        tf_spec("tf-1replica", "TensorFlow, default strategy (one device)", "--replicas", "1"),
        tf_spec("tf-interop1", "TensorFlow, 1 inter-op thread", "--inter-op", "1"),
        tf_spec("tf-noonednn", "TensorFlow, `TF_ENABLE_ONEDNN_OPTS=0`",
                env={"TF_ENABLE_ONEDNN_OPTS": "0"}),
    ]  # fmt: skip
    return specs


OPTIONAL = (
    torch_spec("torch-compile", "hand-written, `torch.compile(model)`", *TORCH, "--compile"),
)


class Worker:
    """A running worker process, stopped (SIGSTOP) except while it answers a command."""

    def __init__(self, spec: Spec, warmup_steps: int) -> None:
        self.spec = spec
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **dict(spec.env))
        if spec.tf:
            env["PYTHONPATH"] = ""
        self.stderr: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in close)
        self.process = subprocess.Popen(
            [*spec.argv, "--warmup-steps", str(warmup_steps)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
            cwd=HERE,
        )
        self.info: dict[str, Any] | None = None

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                answer = json.loads(line)
                if "error" in answer:
                    raise RuntimeError(f"{self.spec.key}: {answer['error']}")
                return answer
        self.stderr.seek(0)
        tail = "\n".join(self.stderr.read().strip().splitlines()[-8:])
        raise RuntimeError(
            f"worker {self.spec.key} ended (exit code {self.process.wait()}):\n{tail}"
        )

    def _signal(self, signal_number: int) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal_number)

    def ready(self) -> dict[str, Any]:
        """Waits for the warm-up, then stops the process until its first block."""
        if self.info is None:
            self.info = self._answer()
            self._signal(signal.SIGSTOP)
        return self.info

    def command(self, name: str, steps: int) -> dict[str, Any]:
        """Wakes the process, has it run ``name steps``, and stops it again: a waiting worker
        takes no CPU, even where its threads would spin (``OMP_WAIT_POLICY=ACTIVE``)."""
        assert self.process.stdin is not None
        self._signal(signal.SIGCONT)
        try:
            self.process.stdin.write(f"{name} {steps}\n")
            self.process.stdin.flush()
            return self._answer()
        finally:
            self._signal(signal.SIGSTOP)

    def quit(self) -> None:
        """Wakes the process and tells it to end; ``close`` waits for it."""
        self._signal(signal.SIGCONT)
        stdin = self.process.stdin
        if self.process.poll() is None and stdin is not None and not stdin.closed:
            try:
                stdin.write("quit\n")
                stdin.close()
            except OSError:
                pass

    def close(self) -> None:
        self.quit()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.stderr.close()


@dataclasses.dataclass
class Series:
    """One loop's timed blocks: for each of its worker processes, one per round (``None`` where
    it failed). A round's rate is the mean over the processes."""

    spec: Spec
    infos: list[dict[str, Any]]
    copies: list[list[dict[str, Any] | None]]

    @staticmethod
    def _rate(block: dict[str, Any] | None) -> float | None:
        return None if block is None else block["examples"] / block["seconds"]

    def rates(self) -> list[float | None]:
        out = []
        for blocks in zip(*self.copies, strict=True):
            rates = [r for r in map(self._rate, blocks) if r]
            out.append(statistics.fmean(rates) if rates else None)
        return out

    def best(self) -> float | None:
        rates = [r for r in self.rates() if r]
        return max(rates) if rates else None

    def median(self) -> float | None:
        rates = [r for r in self.rates() if r]
        return statistics.median(rates) if rates else None

    def process_medians(self) -> list[float]:
        """Each process's median rate: how far processes of the same loop stay apart."""
        out = []
        for blocks in self.copies:
            rates = [r for r in map(self._rate, blocks) if r]
            if rates:
                out.append(statistics.median(rates))
        return out

    def spread(self) -> float | None:
        """(highest - lowest) / mean of the processes' median rates."""
        medians = self.process_medians()
        if len(medians) < 2:
            return None
        return (max(medians) - min(medians)) / statistics.fmean(medians)

    def _blocks(self) -> list[dict[str, Any]]:
        return [b for blocks in self.copies for b in blocks if b]

    def faults(self) -> float | None:
        """Page faults per step (median over the blocks)."""
        done = self._blocks()
        return statistics.median(b["minor_faults"] / b["steps"] for b in done) if done else None

    def cores(self) -> float | None:
        """CPU seconds per wall second, the median over the blocks: the cores the loop kept
        busy (CPU time that the hypervisor takes from this machine is not counted)."""
        done = self._blocks()
        return statistics.median(b["cpu_seconds"] / b["seconds"] for b in done) if done else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.spec.label,
            "argv": list(self.spec.argv[1:]),
            "env": dict(self.spec.env),
            "infos": self.infos,
            "blocks": self.copies,
            "rates": self.rates(),
            "process_medians": self.process_medians(),
        }


def paired(a: Series, b: Series) -> list[float]:
    """``a``'s rate over ``b``'s, round by round (the rounds where both ran)."""
    return [x / y for x, y in zip(a.rates(), b.rates(), strict=True) if x and y]


@dataclasses.dataclass
class Phase:
    """Loops timed together: every process of every loop takes one block per round."""

    specs: list[Spec]
    processes: dict[str, int]  # loop key -> worker processes (default 1)
    steps: int
    rounds: int
    warmup_steps: int
    profile: tuple[str, ...] = ()  # loops whose first process is then profiled

    def run(self, name: str) -> tuple[dict[str, Series], dict[str, Any]]:
        instances = [
            (spec, copy) for spec in self.specs for copy in range(self.processes.get(spec.key, 1))
        ]
        print(
            f"{name}: {len(instances)} worker processes for {len(self.specs)} loops, "
            f"{self.warmup_steps} warm-up steps each ...",
            file=sys.stderr,
            flush=True,
        )
        workers = {(spec.key, copy): Worker(spec, self.warmup_steps) for spec, copy in instances}
        series: dict[str, Series] = {}
        profiles: dict[str, Any] = {}
        try:
            for (key, copy), worker in list(workers.items()):
                try:
                    info = worker.ready()
                except RuntimeError as error:
                    print(f"{key} did not start: {error}", file=sys.stderr)
                    worker.close()
                    del workers[key, copy]
                    continue
                entry = series.setdefault(key, Series(worker.spec, [], []))
                entry.infos.append(info)
                entry.copies.append([])
            self._rounds(workers, series)
            for key in self.profile:
                if (key, 0) in workers:
                    print(f"profiling {key} ...", file=sys.stderr, flush=True)
                    profiles[key] = workers[key, 0].command("profile", self.steps)
        finally:
            for worker in workers.values():
                worker.quit()
            for worker in workers.values():
                worker.close()
        return series, profiles

    def _rounds(self, workers: dict[tuple[str, int], Worker], series: dict[str, Series]) -> None:
        """One block per worker per round, in an order rotated by one every round."""
        order = list(workers)
        slots = {}
        for key in series:
            copies = [copy for k, copy in order if k == key]
            slots.update({(key, copy): i for i, copy in enumerate(copies)})
        for round_index in range(self.rounds):
            shift = round_index % len(order) if order else 0
            started = time.perf_counter()
            for instance in order[shift:] + order[:shift]:
                key = instance[0]
                try:
                    block = workers[instance].command("run", self.steps)
                except (RuntimeError, OSError) as error:
                    print(f"{key} failed: {error}", file=sys.stderr)
                    block = None
                series[key].copies[slots[instance]].append(block)
            rates = ", ".join(f"{k} {_fmt(s.rates()[-1])}" for k, s in series.items())
            print(
                f"round {round_index + 1}/{self.rounds} ({time.perf_counter() - started:.0f} s): "
                f"{rates}",
                file=sys.stderr,
                flush=True,
            )


# -- the report ---------------------------------------------------------------------------------


def _median_ratio(values: list[float]) -> str:
    return "—" if not values else f"{statistics.median(values):.2f}x"


def _best_ratio(a: Series, b: Series) -> str:
    best_a, best_b = a.best(), b.best()
    return "—" if not best_a or not best_b else f"{best_a / best_b:.2f}x"


def print_table(
    title: str, rows: list[Series], torch_base: Series | None, tf_base: Series | None
) -> None:
    print(f"\n{title}\n")
    print(
        "| loop | examples/s, best | median | ms/step | processes (spread) | cores busy "
        "| page faults/step | / hand-written | / TF |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in rows:
        median = s.median()
        ms = None if not median else 1e3 * GLOBAL_BATCH / median
        vs_torch = paired(s, torch_base) if torch_base is not None else []
        vs_tf = paired(s, tf_base) if tf_base is not None else []
        cores, spread = s.cores(), s.spread()
        processes = f"{len(s.copies)}" + ("" if spread is None else f" ({spread:.0%})")
        print(
            f"| {s.spec.label} | {_fmt(s.best())} | {_fmt(median)} | {_fmt(ms, 1)} | "
            f"{processes} | {'—' if cores is None else f'{cores:.2f}'} | {_fmt(s.faults())} | "
            f"{_median_ratio(vs_torch)} | {_median_ratio(vs_tf)} |"
        )


def print_ratio(name: str, a: Series | None, b: Series | None, target: float | None) -> Any:
    if a is None or b is None:
        return None
    ratios = paired(a, b)
    value = statistics.median(ratios) if ratios else None
    verdict = ""
    if target is not None and value is not None:
        verdict = f" (target >= {target}x: {'met' if value >= target else 'NOT met'})"
    print(
        f"{name}: {_median_ratio(ratios)} (round by round "
        f"{', '.join(f'{r:.3f}' for r in ratios)}; best / best {_best_ratio(a, b)}){verdict}"
    )
    return {"paired": ratios, "median": value}


# (phase, feedline's functions, the hand-written loop's functions): cumulative µs/step of
# "file:function" (the largest entry of that name), a leading "-" subtracts.
PHASES = (
    ("whole step", ["training.py:run_steps"], ["training.py:run_steps"]),
    ("input: the next batch", ["distributed_dataset.py:__next__"], ["training.py:batches"]),
    (
        "strategy.run, around the replicas' train_step and the deferred step",
        ["strategy.py:run", "-training.py:train_step", "-mirroring.py:after_run"],
        [],
    ),
    (
        "mirroring.after_run beyond the optimizer step",
        ["mirroring.py:after_run", "-adam.py:step"],
        [],
    ),
    ("train_step (every replica)", ["training.py:train_step"], ["training.py:train_step"]),
    ("· optimizer.zero_grad()", ["mirroring.py:mirrored_zero_grad"], ["optimizer.py:zero_grad"]),
    (
        "· forward: model and loss modules, hooks included",
        ["module.py:_wrapped_call_impl"],
        ["module.py:_wrapped_call_impl"],
    ),
    ("·· of which mirroring's forward pre-hook", ["mirroring.py:_check_forward"], []),
    ("· compute_average_loss", ["losses.py:compute_average_loss"], []),
    ("· loss.backward()", ["_tensor.py:backward"], ["_tensor.py:backward"]),
    ("· accuracy update", ["reduction_metrics.py:update_state"], ["training.py:update_accuracy"]),
    ("optimizer step (Adam.step)", ["adam.py:step"], ["adam.py:step"]),
    ("strategy.reduce and float()", ["training.py:distributed_train_step", "-strategy.py:run"], []),
)


def phase_value(cumulative: dict[str, float], names: list[str]) -> float | None:
    if not names:
        return None
    total = 0.0
    for name in names:
        sign = -1.0 if name.startswith("-") else 1.0
        total += sign * cumulative.get(name.lstrip("-"), 0.0)
    return total


def print_phases(profiles: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """feedline's step against the hand-written loop's, phase by phase (cProfile, cumulative)."""
    mine = profiles["feedline"]["cumulative_by_name"]
    theirs = profiles["torch"]["cumulative_by_name"]
    print("\nphase by phase, cProfile cumulative µs/step (feedline, hand-written)\n")
    print("| phase | feedline | hand-written | difference |")
    print("|---|---:|---:|---:|")
    rows = []
    for label, feedline_names, torch_names in PHASES:
        a, b = phase_value(mine, feedline_names), phase_value(theirs, torch_names)
        diff = None if a is None else a - (b or 0.0)
        rows.append({"phase": label, "feedline": a, "hand_written": b, "difference": diff})
        print(f"| {label} | {_fmt(a)} | {_fmt(b)} | {'—' if diff is None else f'{diff:+,.0f}'} |")
    return rows


def print_profiles(profiles: dict[str, dict[str, Any]]) -> None:
    print(
        "\ncProfile of the main thread, µs per step (wall-clock: a call that waits for the GIL "
        "or a lock is charged the wait)"
    )
    for key, profile in profiles.items():
        print(f"\n{key}: {profile['us_per_step']:,.0f} µs/step under the profiler; by own time\n")
        _common.print_profile_tables(key, profile)


def main() -> None:
    if "--worker" in sys.argv[1:]:
        worker_main(sys.argv[1:])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="short blocks, fewer rounds")
    parser.add_argument("--processes", type=int, default=None, help="per main loop (default 3)")
    parser.add_argument("--steps", type=int, default=None, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--warmup-steps", type=int, default=None)
    parser.add_argument("--no-tf", action="store_true", help="skip the TensorFlow loops")
    parser.add_argument("--no-variants", action="store_true", help="the main loops only")
    parser.add_argument("--no-profile", action="store_true", help="skip cProfile")
    all_variants = variants() + list(OPTIONAL)
    parser.add_argument(
        "--variants",
        default=None,
        help="comma-separated variant keys (default: all but torch-compile); known: "
        + ", ".join(s.key for s in all_variants),
    )
    args = parser.parse_args()

    processes = args.processes or (1 if args.quick else 3)
    warmup_steps = 10 if args.quick else 20
    if args.warmup_steps is not None:
        warmup_steps = args.warmup_steps
    main_phase = Phase(
        [*MAIN],
        {spec.key: processes for spec in MAIN},
        args.steps or (20 if args.quick else 50),
        args.rounds or (3 if args.quick else 8),
        warmup_steps,
        () if args.no_profile else ("feedline", "torch"),
    )
    variant_specs: list[Spec] = []
    if not args.no_variants:
        known = {s.key: s for s in all_variants}
        chosen = args.variants.split(",") if args.variants else [s.key for s in variants()]
        unknown = set(chosen) - set(known)
        if unknown:
            parser.error(f"unknown variants: {', '.join(sorted(unknown))}")
        # The baselines again, in the same rounds as the variants.
        baselines = [spec for spec in MAIN if spec.key in ("torch", "tf")]
        variant_specs = [*baselines, *(known[k] for k in chosen)]
    variant_phase = Phase(
        variant_specs,
        {},
        args.steps or (30 if args.quick else 100),
        args.rounds or (2 if args.quick else 4),
        warmup_steps,
        () if args.no_profile else ("torch-cl",),
    )
    for phase in (main_phase, variant_phase):
        if args.no_tf or not TF_PYTHON.exists():
            phase.specs = [s for s in phase.specs if not s.tf]
    if not args.no_tf and not TF_PYTHON.exists():
        print(f"{TF_PYTHON} is missing (see benchmarks/README.md): no TensorFlow", file=sys.stderr)

    series, profiles = main_phase.run("main loops")
    variant_series: dict[str, Series] = {}
    if variant_phase.specs:
        variant_series, variant_profiles = variant_phase.run("variants")
        profiles.update(variant_profiles)

    get = series.get
    print(
        f"\nexamples/s training the seed CNN (Adam, global batch {GLOBAL_BATCH}) on "
        f"{os.cpu_count()} CPUs, after {warmup_steps} warm-up steps. Each loop's worker processes "
        "take turns, one block each per round; a round's rate is the mean over a loop's "
        "processes, ratios the median of the round-by-round ratios. PyTorch loops with fixed "
        "malloc thresholds (GLIBC_TUNABLES) unless 'default malloc'."
    )
    main_rows = [series[spec.key] for spec in MAIN if spec.key in series]
    print_table(
        f"Main loops: {main_phase.rounds} rounds of {main_phase.steps} steps",
        main_rows,
        get("torch"),
        get("tf"),
    )
    print()
    summary = {
        "feedline_vs_torch": print_ratio(
            "feedline / hand-written", get("feedline"), get("torch"), TARGET_VS_TORCH
        ),
        "feedline_vs_tf": print_ratio("feedline / TensorFlow", get("feedline"), get("tf"), None),
        "torch_vs_tf": print_ratio("hand-written / TensorFlow", get("torch"), get("tf"), None),
        "feedline_vs_torch_default_malloc": print_ratio(
            "feedline / hand-written, both default malloc",
            get("feedline-malloc"),
            get("torch-malloc"),
            None,
        ),
        "feedline_vs_split2": print_ratio(
            "feedline / hand-written in 2 micro-batches", get("feedline"), get("torch-split2"), None
        ),
        "split2_vs_torch": print_ratio(
            "hand-written in 2 micro-batches / hand-written",
            get("torch-split2"),
            get("torch"),
            None,
        ),
    }
    if variant_series:
        print_table(
            f"Variants, one setting changed: {variant_phase.rounds} rounds of "
            f"{variant_phase.steps} steps, one process each, against the two baselines run again",
            list(variant_series.values()),
            variant_series.get("torch"),
            variant_series.get("tf"),
        )
    if profiles:
        print_profiles(profiles)
        if "feedline" in profiles and "torch" in profiles:
            summary["phases"] = print_phases(profiles)

    def phase_dict(phase: Phase, loops: dict[str, Series]) -> dict[str, Any]:
        return {
            "steps": phase.steps,
            "rounds": phase.rounds,
            "loops": {k: s.as_dict() for k, s in loops.items()},
        }

    _common.write_results(
        "training",
        {
            "warmup_steps": warmup_steps,
            "global_batch": GLOBAL_BATCH,
            "fixed_malloc": FIXED_MALLOC,
            "main": phase_dict(main_phase, series),
            "variants": phase_dict(variant_phase, variant_series),
            "summary": summary,
            "profiles": profiles,
        },
    )


if __name__ == "__main__":
    main()
