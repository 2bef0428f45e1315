"""Multi-worker training: feedline's MultiWorkerMirroredStrategy against DDP and tf.distribute.

Usage (from the repository root)::

    .venv/bin/python benchmarks/multi_worker.py [--quick] [--no-tf] [--no-variants] [--no-profile]

Every loop trains the seed CNN (``feedline.examples.custom_training.create_model``; in
TensorFlow the same layers in tf-keras) with Adam at a global batch of 128 on ``_common``'s
synthetic Fashion-MNIST-shaped data (60,000 random 28x28x1 images scaled to [0, 1], 10 classes;
not the 8x8 digits), one CPU replica and one compute thread per process
(``torch.set_num_threads(1)``; TensorFlow: one intra-op and one inter-op thread):

  feedline  the tutorial's loop under ``MultiWorkerMirroredStrategy()`` (torchrun's environment,
            gloo): ``experimental_distribute_dataset`` of ``from_tensor_slices((x, y))
            .shuffle(60000).batch(128).repeat()`` (auto-sharded by DATA: every worker cuts the
            global batch and keeps its half), model, Adam and the accuracy metric made under
            ``strategy.scope()``, ``strategy.run(train_step)`` with
            ``feedline.nn.compute_average_loss``, ``strategy.reduce(SUM)`` and ``float(loss)``
            every step;
  what-if   the same loop with a change to feedline patched in (``--what-if``): no
            prefetch thread in the step source;
  DDP       hand-written ``torch.nn.parallel.DistributedDataParallel`` (gloo) on the same model:
            every rank draws the same permutation per epoch, cuts the same global batches of 128
            and gathers its half (``index_select``), ``CrossEntropyLoss()`` (mean over the rank's
            half; DDP averages the gradients: the same update), Adam, an accuracy count and
            ``float(loss)`` (the rank's own loss) every step;
  DDP, loss all-reduced  the same, the loss all-reduced every step before ``float`` (what the
            tutorial's ``strategy.reduce`` gives: the global loss);
  TF        ``tf.distribute.MultiWorkerMirroredStrategy`` (``TF_CONFIG`` on 127.0.0.1, RING
            collectives), the tutorial's ``tf.function`` step over
            ``experimental_distribute_dataset`` of the same pipeline (``_tf_multi_worker_peer.py``
            under ``.venv-tf/bin/python``; skipped when that virtualenv is missing).

Each loop runs as a group of 2 processes and, for the 1 -> 2 process scaling, as a group of 1
(the whole global batch of 128 in one process). Processes get torchrun's variables (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``, ...) or a ``TF_CONFIG``, read
commands on stdin and answer JSON lines; each has an alarm (``--child-timeout``) and is killed
with its session when the benchmark ends. The groups warm up, then take turns: every round,
every group runs one block of ``--steps`` steps (both ranks start after a barrier and stop after
another; TensorFlow: after one untimed step, which lines its workers up), in one order in even
rounds and in the reverse order in odd ones, so that the pairs compared most are neighbours,
while the other groups wait idle on stdin. Ratios are medians of round-by-round ratios.

Then (feedline only) the end-of-data agreement: ``strategy._agree`` and a bare gloo
``all_reduce`` of one int timed alone, and a distributed dataset over a cheap in-memory pipeline
(``from_tensor_slices(np.arange(60000)).batch(128).repeat()``) stepped with the agreement and
with it replaced by the local answer (in the same processes, alternating), with and without the
step source's prefetch thread, and on one process. Then phase timers (``perf_counter`` between
the phases of a step, rank 0) and, unless ``--no-profile``, cProfile of rank 0 of the feedline
and DDP groups. Last, the machine's own 2-process scaling (``_common.process_scaling``). Raw
numbers go to ``benchmarks/results/multi_worker-*.json``.

The PyTorch processes run with glibc's malloc thresholds fixed (``_common.FIXED_MALLOC``; see
the training section of ``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

import numpy as np

import _common
from _common import FIXED_MALLOC, TF_PYTHON
from _tf_training_peer import EpochBatches
from feedline._net.ports import free_port, free_ports
from training import batch_indices, load_data, profile_steps

HERE = pathlib.Path(__file__).resolve().parent
TF_PEER = HERE / "_tf_multi_worker_peer.py"
GLOBAL_BATCH = 128
TARGET_VS_DDP = 1.0  # feedline / DDP, examples/s, 2 processes (at or above plain DDP)
COLLECTIVE_TIMEOUT = 120.0  # seconds a rendezvous or collective may wait in a worker
PROBE_N = 60_000  # elements of the cheap pipeline of the agreement probe

Lap = Callable[[str], None]


def _no_lap(name: str) -> None:
    return None


class Laps:
    """Wall time between consecutive ``lap(name)`` calls, summed per name."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.last = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.totals[name] = self.totals.get(name, 0.0) + now - self.last
        self.last = now


# -- the workers --------------------------------------------------------------------------------


@dataclasses.dataclass
class Loop:
    """A worker's training loop: ``run_steps(n, lap)``, and the rest of what it can answer."""

    rank: int
    world: int
    run_steps: Callable[[int, Lap], dict[str, Any]]
    commands: dict[str, Callable[[int], dict[str, Any]]]
    info: dict[str, Any]


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


WHAT_IFS = ("prefetch",)


def distribute_unprefetched(strategy: Any, dataset: Any) -> Any:
    """``strategy.experimental_distribute_dataset(dataset)`` less the step source's prefetch
    thread (a private piece of feedline: its steps are ``prefetch(split(dataset))``)."""
    import dataclasses

    distributed = strategy.experimental_distribute_dataset(dataset)
    source = distributed._source
    distributed._source = dataclasses.replace(source, steps=source.steps._inputs[0])
    return distributed


def feedline_loop(args: argparse.Namespace) -> Loop:
    """The tutorial's loop under ``MultiWorkerMirroredStrategy`` (torchrun's environment)."""
    import torch
    import torch.distributed as dist

    import feedline.data as fd
    import feedline.distribute as fdist
    import feedline.metrics
    import feedline.nn
    from feedline.distribute.experimental import CommunicationOptions
    from feedline.examples.custom_training import create_model

    torch.manual_seed(0)
    train_images, train_labels = load_data()
    strategy = fdist.MultiWorkerMirroredStrategy(
        communication_options=CommunicationOptions(timeout_seconds=COLLECTIVE_TIMEOUT)
    )
    rank, world = strategy.extended.worker_index, strategy.extended.num_workers
    global_batch_size = GLOBAL_BATCH
    train_dataset = (
        fd.Dataset.from_tensor_slices((train_images, train_labels))
        .shuffle(len(train_images), seed=0)
        .batch(global_batch_size)
        .repeat()
    )
    changes = set(args.what_if.split(",")) if args.what_if else set()
    if "prefetch" in changes:
        train_dist_dataset = distribute_unprefetched(strategy, train_dataset)
    else:
        train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)

    with strategy.scope():
        model = create_model()
        optimizer = torch.optim.Adam(model.parameters())
        loss_object = torch.nn.CrossEntropyLoss(reduction="none")
        train_accuracy = feedline.metrics.SparseCategoricalAccuracy(name="train_accuracy")

    def compute_loss(labels: torch.Tensor, predictions: torch.Tensor) -> torch.Tensor:
        per_example_loss = loss_object(predictions, labels)
        return feedline.nn.compute_average_loss(
            per_example_loss, global_batch_size=global_batch_size
        )

    lap: Lap = _no_lap

    def train_step(inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        lap("strategy.run: before the replica's function")
        images, labels = inputs
        optimizer.zero_grad()
        lap("zero_grad")
        predictions = model(images)
        lap("forward")
        loss = compute_loss(labels, predictions)
        lap("loss")
        loss.backward()
        lap("backward (gradient all-reduce started in a hook)")
        optimizer.step()
        lap("optimizer.step() (deferred)")
        train_accuracy.update_state(labels, predictions.detach())
        lap("accuracy")
        return loss.detach()

    def distributed_train_step(dataset_inputs: Any) -> torch.Tensor:
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        lap("strategy.run: after (wait for the all-reduce, gradients back, Adam)")
        return strategy.reduce(fdist.ReduceOp.SUM, per_replica_losses, axis=None)

    train_iter = iter(train_dist_dataset)
    batch_sizes = EpochBatches(len(train_images), global_batch_size)

    def run_steps(steps: int, step_lap: Lap) -> dict[str, Any]:
        nonlocal lap
        lap = step_lap
        total_loss = 0.0
        try:
            for _ in range(steps):
                inputs = next(train_iter)
                lap("input: next() (the agreement included, where there is one)")
                loss = distributed_train_step(inputs)
                lap("strategy.reduce(SUM)")
                total_loss += float(loss)
                lap("float(loss)")
        finally:
            lap = _no_lap
        return {
            "examples": batch_sizes.take(steps),
            "loss": total_loss / steps,
            "accuracy": float(train_accuracy.result()),
        }

    # The agreement probe: a distributed dataset over a cheap in-memory pipeline.
    def probe_input_dataset() -> fd.Dataset:
        return fd.Dataset.from_tensor_slices(np.arange(PROBE_N)).batch(GLOBAL_BATCH).repeat()

    probe = strategy.experimental_distribute_dataset(probe_input_dataset())
    # The same steps without the step source's prefetch thread.
    unprefetched = distribute_unprefetched(strategy, probe_input_dataset())
    probes = {"prefetch": (probe, iter(probe)), "no_prefetch": (unprefetched, iter(unprefetched))}
    agree = probe._agree  # the strategy's agreement, as the iterator calls it
    probe_calls = 0

    def probe_steps(name: str, steps: int, with_agreement: bool) -> float:
        dataset, iterator = probes[name]
        dataset._agree = agree if with_agreement else (lambda local_has_data: local_has_data)
        try:
            _barrier(world)
            start = time.perf_counter()
            for _ in range(steps):
                next(iterator)
            seconds = time.perf_counter() - start
            _barrier(world)
        finally:
            dataset._agree = agree
        return 1e6 * seconds / steps

    def input_command(steps: int) -> dict[str, Any]:
        """The probe's µs/step with the agreement and with the local answer, with and without
        the prefetch thread, in an order reversed every call."""
        nonlocal probe_calls
        probe_calls += 1
        cases = [(name, a) for name in probes for a in (True, False)]
        out: dict[str, Any] = {}
        for name, with_agreement in cases if probe_calls % 2 else cases[::-1]:
            key = f"{name}_{'with_agreement' if with_agreement else 'local_answer'}_us"
            out[key] = probe_steps(name, steps, with_agreement)
        return out

    def agree_command(calls: int) -> dict[str, Any]:
        """``strategy._agree(True)`` and a bare gloo all-reduce of one int32, µs per call."""
        out: dict[str, Any] = {}
        _barrier(world)
        start = time.perf_counter()
        for _ in range(calls):
            strategy._agree(True)
        out["agree_us"] = 1e6 * (time.perf_counter() - start) / calls
        if world > 1:
            flag = torch.ones(1, dtype=torch.int32)
            _barrier(world)
            start = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(flag)
            out["all_reduce_us"] = 1e6 * (time.perf_counter() - start) / calls
        _barrier(world)
        return out

    return Loop(
        rank,
        world,
        run_steps,
        {"input": input_command, "agree": agree_command},
        {"strategy": repr(strategy), "replicas_in_sync": strategy.num_replicas_in_sync},
    )


def ddp_loop(args: argparse.Namespace) -> Loop:
    """A hand-written DistributedDataParallel loop on the same model and data."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from feedline.examples.custom_training import create_model

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo", init_method="env://", timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT)
    )
    torch.manual_seed(0)
    train_images, train_labels = load_data()
    images_all = torch.from_numpy(train_images)
    labels_all = torch.from_numpy(train_labels)
    model = DistributedDataParallel(create_model())
    optimizer = torch.optim.Adam(model.parameters())
    loss_object = torch.nn.CrossEntropyLoss()
    correct = torch.zeros((), dtype=torch.int64)
    seen = 0

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for index in batch_indices(len(train_images), GLOBAL_BATCH, seed=0):
            mine = torch.from_numpy(np.array_split(index, world)[rank])
            yield images_all.index_select(0, mine), labels_all.index_select(0, mine)

    inputs = batches()
    batch_sizes = EpochBatches(len(train_images), GLOBAL_BATCH)

    def run_steps(steps: int, lap: Lap) -> dict[str, Any]:
        nonlocal correct, seen
        total_loss = 0.0
        for _ in range(steps):
            images, labels = next(inputs)
            lap("input: next()")
            optimizer.zero_grad()
            lap("zero_grad")
            predictions = model(images)
            lap("forward")
            loss = loss_object(predictions, labels)
            lap("loss")
            loss.backward()
            lap("backward (gradient all-reduce in DDP's hooks, waited for at its end)")
            optimizer.step()
            lap("optimizer.step()")
            correct += (predictions.detach().argmax(dim=1) == labels).sum()
            seen += len(labels)
            lap("accuracy")
            step_loss = loss.detach()
            if args.reduce_loss:
                step_loss = step_loss.clone()
                dist.all_reduce(step_loss)
                step_loss /= world
                lap("the loss all-reduced (the tutorial's reduce)")
            total_loss += float(step_loss)
            lap("float(loss)")
        counts = torch.tensor([int(correct), seen], dtype=torch.int64)
        dist.all_reduce(counts)
        return {
            "examples": batch_sizes.take(steps),
            "loss": total_loss / steps,
            "accuracy": int(counts[0]) / max(1, int(counts[1])),
        }

    return Loop(rank, world, run_steps, {}, {"ddp": True})


def worker_main(argv: list[str]) -> None:
    """``multi_worker.py --worker feedline|ddp``: one rank of a group, served to the parent."""
    parser = argparse.ArgumentParser(prog="multi_worker.py --worker")
    parser.add_argument("--worker", choices=("feedline", "ddp"), required=True)
    parser.add_argument("--warmup-steps", type=int, default=15)
    parser.add_argument("--child-timeout", type=int, default=900)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--what-if", default="", help=f"feedline: changes patched in, some of {','.join(WHAT_IFS)}"
    )
    parser.add_argument("--reduce-loss", action="store_true", help="DDP: all-reduce the loss")
    args = parser.parse_args(argv)
    signal.alarm(args.child_timeout)  # the last resort: the default action ends the process
    import torch

    torch.set_num_threads(1)
    loop = (feedline_loop if args.worker == "feedline" else ddp_loop)(args)
    if args.warmup_steps > 0:
        loop.run_steps(args.warmup_steps, _no_lap)

    def timed(steps: int) -> dict[str, Any]:
        _barrier(loop.world)
        cpu = time.process_time()
        start = time.perf_counter()
        result = loop.run_steps(steps, _no_lap)
        _barrier(loop.world)
        seconds = time.perf_counter() - start
        return {
            "steps": steps,
            "seconds": seconds,
            "cpu_seconds": time.process_time() - cpu,
            **result,
        }

    def timers(steps: int) -> dict[str, Any]:
        laps = Laps()
        _barrier(loop.world)
        start = laps.last = time.perf_counter()
        loop.run_steps(steps, laps)
        seconds = time.perf_counter() - start
        _barrier(loop.world)
        return {
            "steps": steps,
            "us_per_step": 1e6 * seconds / steps,
            "phases_us": {k: 1e6 * v / steps for k, v in laps.totals.items()},
        }

    def profile(steps: int) -> dict[str, Any]:
        _barrier(loop.world)
        if loop.rank == 0:
            out = profile_steps(lambda n: loop.run_steps(n, _no_lap), steps, args.top)
        else:
            loop.run_steps(steps, _no_lap)
            out = {}
        _barrier(loop.world)
        return out

    commands = {"run": timed, "timers": timers, "profile": profile, **loop.commands}
    info = {
        "ready": True,
        "rank": loop.rank,
        "world": loop.world,
        "framework": f"torch {torch.__version__}",
        "threads": torch.get_num_threads(),
        "pid": os.getpid(),
        **loop.info,
    }
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        if len(words) == 2 and words[0] in commands:
            answer = commands[words[0]](int(words[1]))
        else:
            answer = {"error": f"unknown command {line.strip()!r}"}
        print(json.dumps(answer), flush=True)
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: the pipeline's threads and gloo need no goodbye


# -- the parent: groups of processes taking turns -----------------------------------------------


@dataclasses.dataclass(frozen=True)
class Spec:
    """One group to time: a loop and its number of processes."""

    key: str
    label: str
    kind: str  # "feedline", "ddp" or "tf"
    world: int
    options: tuple[str, ...] = ()  # more worker arguments


class Process:
    """One rank: a child in its own session, stdout read by a thread, stderr to a file."""

    def __init__(self, argv: list[str], env: dict[str, str], name: str) -> None:
        self.name = name
        self.stderr: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in close)
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
            cwd=HERE,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, name=f"read-{name}", daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self.lines.put(line)
        self.lines.put(None)

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def answer(self, timeout: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"{self.name}: no answer within {timeout:g} s") from None
        if line is None:
            self.stderr.seek(0)
            tail = "\n".join(self.stderr.read().strip().splitlines()[-10:])
            raise RuntimeError(f"{self.name} ended (exit code {self.process.wait()}):\n{tail}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"{self.name}: {answer['error']}")
        return answer

    def cpu_seconds(self) -> float:
        """User + system time of the process so far (all its threads)."""
        try:
            with open(f"/proc/{self.process.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return 0.0

    def close(self) -> None:
        """Asks the process to quit; kills its session if it has not ended within 5 s."""
        stdin = self.process.stdin
        if self.process.poll() is None and stdin is not None and not stdin.closed:
            with contextlib.suppress(OSError):
                stdin.write("quit\n")
                stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)  # its own session: only its own
            self.process.wait()
        self.stderr.close()


class Group:
    """The processes of one loop; a command goes to every rank, and every rank answers."""

    def __init__(self, spec: Spec, args: argparse.Namespace) -> None:
        self.spec = spec
        self.failed: str | None = None
        self.infos: list[dict[str, Any]] = []
        self.processes: list[Process] = []
        world = spec.world
        if spec.kind == "tf":
            ports = free_ports(world)
            base = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH="")
            for rank in range(world):
                env = dict(base)
                env.pop("TF_CONFIG", None)
                if world > 1:
                    env["TF_CONFIG"] = json.dumps(
                        {
                            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                            "task": {"type": "worker", "index": rank},
                        }
                    )
                argv = [
                    str(TF_PYTHON),
                    str(TF_PEER),
                    "--warmup-steps",
                    str(args.warmup_steps),
                    "--child-timeout",
                    str(args.child_timeout),
                ]
                self.processes.append(Process(argv, env, f"{spec.key} rank {rank}"))
            return
        port = free_port()
        for rank in range(world):
            env = dict(os.environ, **FIXED_MALLOC)
            env.pop("TF_CONFIG", None)
            env.update(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(world),
                GROUP_RANK="0",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
            argv = [
                sys.executable,
                str(pathlib.Path(__file__).resolve()),
                "--worker",
                spec.kind,
                "--warmup-steps",
                str(args.warmup_steps),
                "--child-timeout",
                str(args.child_timeout),
                *spec.options,
            ]
            self.processes.append(Process(argv, env, f"{spec.key} rank {rank}"))

    def ready(self, timeout: float) -> None:
        try:
            self.infos = [p.answer(timeout) for p in self.processes]
        except RuntimeError as error:
            self.fail(str(error))

    def fail(self, why: str) -> None:
        self.failed = why
        print(f"{self.spec.key} failed: {why}", file=sys.stderr, flush=True)
        self.close()

    def command(self, name: str, n: int, timeout: float) -> list[dict[str, Any]] | None:
        if self.failed is not None:
            return None
        try:
            for p in self.processes:
                p.send(f"{name} {n}")
            return [p.answer(timeout) for p in self.processes]
        except (RuntimeError, OSError) as error:
            self.fail(str(error))
            return None

    def cpu_seconds(self) -> float:
        return sum(p.cpu_seconds() for p in self.processes)

    def close(self) -> None:
        for p in self.processes:
            p.close()
        self.processes = []


@dataclasses.dataclass
class Series:
    """One group's timed blocks, one per round (None where it failed)."""

    spec: Spec
    blocks: list[list[dict[str, Any]] | None]
    idle_cpu: list[float]  # CPU seconds the other groups used during this group's blocks

    def rates(self) -> list[float | None]:
        """Global examples per second of each round (rank 0's wall time)."""
        return [None if b is None else b[0]["examples"] / b[0]["seconds"] for b in self.blocks]

    def done(self) -> list[float]:
        return [r for r in self.rates() if r]

    def median(self) -> float | None:
        return statistics.median(self.done()) if self.done() else None

    def best(self) -> float | None:
        return max(self.done()) if self.done() else None

    def cores(self) -> float | None:
        """CPU seconds per wall second of the group's ranks together (median over blocks)."""
        values = [
            sum(r["cpu_seconds"] for r in b) / b[0]["seconds"] for b in self.blocks if b is not None
        ]
        return statistics.median(values) if values else None

    def loss(self) -> float | None:
        last = next((b for b in reversed(self.blocks) if b is not None), None)
        return None if last is None else last[0]["loss"]


def paired(a: Series | None, b: Series | None) -> list[float]:
    if a is None or b is None:
        return []
    return [x / y for x, y in zip(a.rates(), b.rates(), strict=True) if x and y]


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


FEEDLINE_LABEL = "feedline `MultiWorkerMirroredStrategy`, the tutorial's loop"
DDP_LABEL = "hand-written `DistributedDataParallel` loop"
DDP_REDUCE_LABEL = "hand-written DDP, the loss all-reduced every step (as the tutorial's reduce)"
TF_LABEL = "TF `MultiWorkerMirroredStrategy`, `tf.function` step"
WHAT_IF_LABEL = "feedline, what-if: no prefetch thread in the step source"
# In this order in every other round, reversed in the others: the pairs compared most are
# neighbours (feedline and DDP on 2 processes above all).
SPECS = (
    Spec("feedline-2-what-if", WHAT_IF_LABEL, "feedline", 2, ("--what-if", "prefetch")),
    Spec("feedline-2", FEEDLINE_LABEL, "feedline", 2),
    Spec("ddp-2", DDP_LABEL, "ddp", 2),
    Spec("ddp-2-reduce", DDP_REDUCE_LABEL, "ddp", 2, ("--reduce-loss",)),
    Spec("tf-2", TF_LABEL, "tf", 2),
    Spec("feedline-1", FEEDLINE_LABEL, "feedline", 1),
    Spec("ddp-1", DDP_LABEL, "ddp", 1),
    Spec("tf-1", TF_LABEL, "tf", 1),
)
TIMED_PHASES = ("feedline-2", "feedline-2-what-if", "ddp-2", "ddp-2-reduce")
TABLE_ORDER = (
    "feedline-2",
    "feedline-2-what-if",
    "ddp-2",
    "ddp-2-reduce",
    "tf-2",
    "feedline-1",
    "ddp-1",
    "tf-1",
)


# (what, group a, group b, target): a's rate over b's, round by round.
RATIOS = (
    ("feedline / DDP, 2 processes", "feedline-2", "ddp-2", TARGET_VS_DDP),
    ("feedline / DDP, 1 process", "feedline-1", "ddp-1", None),
    ("feedline what-if / DDP, 2 processes", "feedline-2-what-if", "ddp-2", None),
    ("feedline what-if / feedline, 2 processes", "feedline-2-what-if", "feedline-2", None),
    ("feedline / DDP with the loss all-reduced", "feedline-2", "ddp-2-reduce", None),
    ("feedline what-if / DDP, loss all-reduced", "feedline-2-what-if", "ddp-2-reduce", None),
    ("DDP with the loss all-reduced / DDP", "ddp-2-reduce", "ddp-2", None),
    ("feedline / TF, 2 processes", "feedline-2", "tf-2", None),
    ("DDP / TF, 2 processes", "ddp-2", "tf-2", None),
    ("feedline 2 / 1 processes", "feedline-2", "feedline-1", None),
    ("DDP 2 / 1 processes", "ddp-2", "ddp-1", None),
    ("TF 2 / 1 processes", "tf-2", "tf-1", None),
)


def run_rounds(
    groups: dict[str, Group], steps: int, rounds: int, timeout: float, loads: list[float]
) -> dict[str, Series]:
    """Every group one block per round, in one order and then the reverse; ``loads`` gets the
    1-minute load average at the start of every round."""
    series = {key: Series(g.spec, [], []) for key, g in groups.items()}
    order = list(groups)
    for index in range(rounds):
        loads.append(os.getloadavg()[0])
        started = time.perf_counter()
        for key in order if index % 2 == 0 else order[::-1]:
            group = groups[key]
            others = [g for k, g in groups.items() if k != key]
            idle_before = sum(g.cpu_seconds() for g in others)
            block = group.command("run", steps, timeout)
            series[key].blocks.append(block)
            series[key].idle_cpu.append(sum(g.cpu_seconds() for g in others) - idle_before)
        rates = ", ".join(f"{k} {_fmt(s.rates()[-1])}" for k, s in series.items())
        print(
            f"round {index + 1}/{rounds} ({time.perf_counter() - started:.0f} s): {rates}",
            file=sys.stderr,
            flush=True,
        )
    return series


def agreement(groups: dict[str, Group], args: argparse.Namespace) -> dict[str, Any]:
    """The end-of-data agreement's cost: alone, and per step of a cheap distributed dataset."""
    out: dict[str, Any] = {"probe_steps": args.probe_steps, "repetitions": args.probe_reps}
    two, one = groups.get("feedline-2"), groups.get("feedline-1")
    if two is None:
        return out
    calls: list[dict[str, Any]] = []
    probe2: list[dict[str, Any]] = []
    probe1: list[dict[str, Any]] = []
    for _ in range(args.probe_reps):
        answer = two.command("agree", args.probe_steps, args.command_timeout)
        if answer:
            calls.append(answer[0])
        answer = two.command("input", args.probe_steps, args.command_timeout)
        if answer:
            probe2.append(answer[0])
        if one is not None:
            answer = one.command("input", args.probe_steps, args.command_timeout)
            if answer:
                probe1.append(answer[0])
    out["calls"], out["probe_2"], out["probe_1"] = calls, probe2, probe1

    def med(rows: list[dict[str, Any]], key: str) -> float | None:
        return median_or_none([r[key] for r in rows if key in r])

    summary: dict[str, float | None] = {
        "agree_us": med(calls, "agree_us"),
        "all_reduce_us": med(calls, "all_reduce_us"),
    }
    for name in ("prefetch", "no_prefetch"):
        with_key, local_key = f"{name}_with_agreement_us", f"{name}_local_answer_us"
        summary[f"probe_2_{with_key}"] = med(probe2, with_key)
        summary[f"probe_2_{local_key}"] = med(probe2, local_key)
        summary[f"probe_2_{name}_difference_us"] = median_or_none(
            [r[with_key] - r[local_key] for r in probe2]
        )
        summary[f"probe_1_{name}_us"] = med(probe1, with_key)
    out["summary"] = summary
    return out


def timers(groups: dict[str, Group], args: argparse.Namespace) -> dict[str, Any]:
    """Phase timers of rank 0 in the 2-process feedline and DDP groups, alternating."""
    out: dict[str, list[dict[str, Any]]] = {}
    keys = [k for k in TIMED_PHASES if k in groups]
    for rep in range(args.timer_reps):
        for key in keys if rep % 2 == 0 else keys[::-1]:
            answer = groups[key].command("timers", args.steps, args.command_timeout)
            if answer:
                out.setdefault(key, []).append(answer[0])
    return out


def phase_medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    names = list(runs[0]["phases_us"])
    return {n: statistics.median(r["phases_us"].get(n, 0.0) for r in runs) for n in names}


def print_main_table(series: dict[str, Series], steps: int, rounds: int) -> dict[str, Any]:
    get = series.get
    print(
        f"\nexamples/s training the seed CNN (Adam, global batch {GLOBAL_BATCH}, synthetic "
        f"28x28x1 data), one CPU replica and one compute thread per process, {rounds} rounds of "
        f"{steps} steps per group; ratios are medians of round-by-round ratios\n"
    )
    print(
        "| loop | processes | examples/s, median | best | ms/step | cores busy "
        "| / DDP, same processes | 2 / 1 processes |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    summary: dict[str, Any] = {}
    for key in TABLE_ORDER:
        spec = next(spec for spec in SPECS if spec.key == key)
        s = get(spec.key)
        if s is None:
            continue
        kind, world = spec.kind, spec.world
        vs_ddp = paired(s, get(f"ddp-{world}"))
        scale = paired(s, get(f"{kind}-1")) if world == 2 else []
        median = s.median()
        ms = None if not median else 1e3 * GLOBAL_BATCH / median
        print(
            f"| {spec.label} | {world} | {_fmt(median)} | {_fmt(s.best())} | {_fmt(ms, 1)} "
            f"| {_fmt(s.cores(), 2)} | {_x(median_or_none(vs_ddp))} "
            f"| {_x(median_or_none(scale))} |"
        )
        summary[spec.key] = {
            "median": median,
            "best": s.best(),
            "vs_ddp": vs_ddp,
            "scaling": scale,
        }
    print()
    for name, a, b, target in RATIOS:
        ratios = paired(get(a), get(b))
        if not ratios:
            continue
        value = statistics.median(ratios)
        verdict = (
            ""
            if target is None
            else f" (target >= {target}x: {'met' if value >= target else 'NOT met'})"
        )
        print(
            f"{name}: {value:.3f}x (round by round {', '.join(f'{r:.2f}' for r in ratios)})"
            f"{verdict}"
        )
        summary[f"{a}/{b}"] = {"median": value, "paired": ratios}
    losses = {k: s.loss() for k, s in series.items()}
    print("last block's mean loss: " + ", ".join(f"{k} {_fmt(v, 3)}" for k, v in losses.items()))
    idle = [c for s in series.values() for c in s.idle_cpu]
    if idle:
        print(f"CPU seconds the waiting groups used during a block: max {max(idle):.2f}")
    return summary


def print_agreement(result: dict[str, Any]) -> None:
    s = result.get("summary")
    if not s:
        return
    print(
        f"\nend-of-data agreement (feedline), median of {result['repetitions']} repetitions of "
        f"{result['probe_steps']} calls or steps\n"
    )
    print("| what | µs |")
    print("|---|---:|")
    for label, value in (
        ("`strategy._agree(True)`, 2 processes, per call", s["agree_us"]),
        ("bare gloo `dist.all_reduce` of one int32, 2 processes, per call", s["all_reduce_us"]),
    ):
        print(f"| {label} | {_fmt(value, 1)} |")
    print(
        "\n`experimental_distribute_dataset(from_tensor_slices(np.arange(60000)).batch(128)"
        ".repeat())`, µs per step (`next()`)\n"
    )
    print(
        "| step source | 2 processes, with the agreement | 2 processes, agreement replaced "
        "by the local answer | the agreement's cost | 1 process |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, label in (
        ("prefetch", "as shipped (prefetch thread)"),
        ("no_prefetch", "without the prefetch thread"),
    ):
        print(
            f"| {label} | {_fmt(s[f'probe_2_{name}_with_agreement_us'], 1)} "
            f"| {_fmt(s[f'probe_2_{name}_local_answer_us'], 1)} "
            f"| {_fmt(s[f'probe_2_{name}_difference_us'], 1)} "
            f"| {_fmt(s[f'probe_1_{name}_us'], 1)} |"
        )


def print_timers(result: dict[str, list[dict[str, Any]]]) -> None:
    if not result:
        return
    print("\nphase timers, rank 0, µs per step (median over repetitions)\n")
    for key, runs in result.items():
        phases = phase_medians(runs)
        total = statistics.median(r["us_per_step"] for r in runs)
        print(f"{key}: {total:,.0f} µs/step")
        print("| phase | µs/step |")
        print("|---|---:|")
        for name, value in phases.items():
            print(f"| {name} | {value:,.0f} |")
        print()


def print_profile(key: str, profile: dict[str, Any]) -> None:
    if not profile:
        return
    print(f"\ncProfile of {key}, rank 0: {profile['us_per_step']:,.0f} µs/step; by own time\n")
    _common.print_profile_tables(key, profile)


def main() -> None:
    if "--worker" in sys.argv[1:]:
        worker_main(sys.argv[1:])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="~1 minute: short blocks")
    parser.add_argument("--steps", type=int, default=None, help="per block (default 30)")
    parser.add_argument("--rounds", type=int, default=None, help="default 14 (quick: 4)")
    parser.add_argument("--warmup-steps", type=int, default=None, help="default 15 (quick: 8)")
    parser.add_argument("--no-tf", action="store_true", help="skip the TensorFlow groups")
    parser.add_argument("--no-profile", action="store_true", help="skip cProfile")
    parser.add_argument(
        "--no-variants", action="store_true", help="skip the what-if and ddp-2-reduce groups"
    )
    parser.add_argument("--only", default=None, help="comma-separated group keys")
    parser.add_argument("--probe-steps", type=int, default=None, help="default 2000 (quick: 500)")
    parser.add_argument("--probe-reps", type=int, default=None, help="default 5 (quick: 3)")
    parser.add_argument("--timer-reps", type=int, default=None, help="default 4 (quick: 2)")
    parser.add_argument("--child-timeout", type=int, default=900, help="seconds, per process")
    parser.add_argument("--command-timeout", type=float, default=180.0)
    args = parser.parse_args()
    quick = args.quick
    args.steps = args.steps or (15 if quick else 30)
    args.rounds = args.rounds or (4 if quick else 14)
    args.warmup_steps = args.warmup_steps if args.warmup_steps is not None else (8 if quick else 15)
    args.probe_steps = args.probe_steps or (500 if quick else 2000)
    args.probe_reps = args.probe_reps or (3 if quick else 5)
    args.timer_reps = args.timer_reps or (2 if quick else 4)

    specs = list(SPECS)
    if args.only:
        keys = set(args.only.split(","))
        unknown = keys - {s.key for s in SPECS}
        if unknown:
            parser.error(f"unknown groups: {', '.join(sorted(unknown))}")
        specs = [s for s in specs if s.key in keys]
    tf_note = None
    if args.no_variants:
        specs = [s for s in specs if not s.options]
    if args.no_tf:
        specs = [s for s in specs if s.kind != "tf"]
    elif not TF_PYTHON.exists():
        tf_note = f"{TF_PYTHON} is missing (see benchmarks/README.md): no TensorFlow"
        print(tf_note, file=sys.stderr)
        specs = [s for s in specs if s.kind != "tf"]

    started = time.perf_counter()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_before = os.getloadavg()
    groups: dict[str, Group] = {}
    loads: list[float] = []
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict[str, Any] = {}
    try:
        print(f"starting {len(specs)} groups ...", file=sys.stderr, flush=True)
        for spec in specs:
            groups[spec.key] = Group(spec, args)
        for group in groups.values():
            group.ready(args.command_timeout + 120)
        live = {k: g for k, g in groups.items() if g.failed is None}
        print(
            f"ready after {time.perf_counter() - started:.0f} s; rounds ...",
            file=sys.stderr,
            flush=True,
        )
        series = run_rounds(live, args.steps, args.rounds, args.command_timeout, loads)
        live = {k: g for k, g in groups.items() if g.failed is None}
        print("agreement ...", file=sys.stderr, flush=True)
        agreement_result = agreement(live, args)
        print("timers ...", file=sys.stderr, flush=True)
        timer_result = timers(live, args)
        profiles: dict[str, Any] = {}
        if not args.no_profile:
            for key in ("feedline-2", "ddp-2"):
                if key in live:
                    print(f"profiling {key} ...", file=sys.stderr, flush=True)
                    answer = live[key].command("profile", args.steps, args.command_timeout)
                    if answer:
                        profiles[key] = answer[0]
        infos = {k: g.infos for k, g in groups.items()}
        failures = {k: g.failed for k, g in groups.items() if g.failed}
    finally:
        for group in groups.values():
            group.close()
        signal.signal(signal.SIGTERM, previous)
    print("the machine's own 2-process scaling ...", file=sys.stderr, flush=True)
    busy = _common.calibrate_busy(50e-6)
    machine = _common.process_scaling(busy, 0.5 if quick else 1.0, 2 if quick else 4)

    print(
        f"\n{stamp}, {os.cpu_count()} CPUs, 1-minute load average {load_before[0]:.2f} before, "
        f"{min(loads or [0]):.2f}-{max(loads or [0]):.2f} at the rounds' starts (this "
        f"benchmark's own processes included); {time.perf_counter() - started:.0f} s in all"
    )
    if tf_note:
        print(tf_note)
    for key, why in failures.items():
        print(f"{key} FAILED: {why.splitlines()[0]}")
    summary = print_main_table(series, args.steps, args.rounds)
    print(
        f"the machine itself: 2 processes of a pure-Python loop do {machine:.2f}x the work of 1 "
        "(_common.process_scaling, best of its repetitions)"
    )
    print_agreement(agreement_result)
    print_timers(timer_result)
    for key, profile in profiles.items():
        print_profile(key, profile)

    results = {
        "stamp": stamp,
        "load_before": load_before,
        "round_loads": loads,
        "steps": args.steps,
        "rounds": args.rounds,
        "warmup_steps": args.warmup_steps,
        "global_batch": GLOBAL_BATCH,
        "fixed_malloc": FIXED_MALLOC,
        "infos": infos,
        "failures": failures,
        "blocks": {k: dataclasses.asdict(s) for k, s in series.items()},
        "summary": summary,
        "machine_scaling": machine,
        "agreement": agreement_result,
        "timers": timer_result,
        "profiles": profiles,
    }
    _common.write_results("multi_worker", results)


if __name__ == "__main__":
    main()
