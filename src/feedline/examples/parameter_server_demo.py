"""Parameter-server training on a local cluster: ``feedline demo --parameter-server``.

It starts a cluster on 127.0.0.1 with free ports: this process is the chief, and 2 ``worker``
and 2 ``ps`` tasks are ``feedline server`` processes, each given its ``TF_CONFIG``. The chief
makes a model with a large embedding, split by rows over the two ps tasks
(``MinSizePartitioner(max_shards=2)``), and Adagrad under ``ParameterServerStrategy.scope()``;
its ``ClusterCoordinator`` schedules ``--steps`` training steps on whichever worker is free.
Each worker reads its own synthetic data (made in code, a different seed per worker), pulls the
embedding rows its batch touches, and pushes their gradients; the ps tasks apply Adagrad. Every
``--print-every`` steps the chief prints the steps done, steps per second and the mean loss of
those steps::

    $ feedline demo --parameter-server
    cluster: chief (this process), 2 workers, 2 ps on 127.0.0.1 ...
    0.weight: 200000 x 32 float32, shards ['ps:0 rows 0-99999', 'ps:1 rows 100000-199999']
    step 100/1000: 18.5 steps/s (with start-up), loss 0.1970
    step 200/1000: 82.7 steps/s, loss 0.1517
    ...
    step 1000/1000: 73.8 steps/s, loss 0.0490
    done: 1000 steps in 17.2 s (58.2 steps/s)

Every child has a timeout on each wait, is stopped when the demo ends (normally, on an error or
on Ctrl-C: SIGTERM, then SIGKILL) and, on Linux, also when this process dies without cleaning up.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

import feedline.data as fd
import feedline.distribute as fdist
from feedline._net.ports import free_ports
from feedline.distribute.cluster_resolver import ClusterSpec, SimpleClusterResolver
from feedline.distribute.experimental.partitioners import MinSizePartitioner
from feedline.distribute.parameter_server.variables import PSParameter
from feedline.errors import InvalidArgumentError

__all__ = [
    "DemoSettings",
    "LocalCluster",
    "build_model",
    "dataset_fn",
    "free_ports",
    "make_train_step",
    "run",
]

#: Seconds a ``feedline server`` child may take to print that it serves.
START_TIMEOUT_S = 60.0
#: Seconds a child may take to exit after SIGTERM before it is killed.
STOP_TIMEOUT_S = 10.0
BAG = 4  # ids per example


# What each child runs first, on Linux: asks for SIGTERM when its parent (argv[1]) dies
# (``PR_SET_PDEATHSIG``, kept across exec), leaves if the parent died already, then execs the
# rest of its argv. Not a ``preexec_fn``: Python code run between fork and exec in a process
# whose gRPC is busy (a chief that has trained already) can abort there (gRPC's fork handlers),
# and the child never starts.
_EXIT_WITH_PARENT = """\
import ctypes, os, signal, sys
parent = int(sys.argv[1])
try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != parent:
    sys.exit(1)
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def _child_command(*args: str) -> list[str]:
    """``python ARGS``, on Linux through ``_EXIT_WITH_PARENT``: the child gets SIGTERM when
    this process dies, even by SIGKILL."""
    if not sys.platform.startswith("linux"):
        return [sys.executable, *args]
    return [sys.executable, "-c", _EXIT_WITH_PARENT, str(os.getpid()), *args]


class _Child:
    """One ``feedline server`` process and the last lines of its output."""

    def __init__(self, name: str, cluster: dict[str, list[str]], job: str, index: int) -> None:
        self.name = name
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})
        env.setdefault("OMP_NUM_THREADS", "1")
        self.process = subprocess.Popen(
            _child_command("-m", "feedline.cli", "server"),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # Ctrl-C reaches the chief only; it stops the children
        )
        self.lines: collections.deque[str] = collections.deque(maxlen=40)
        self.serving = threading.Event()
        self._reader = threading.Thread(
            target=self._read, name=f"feedline-demo-{name}-output", daemon=True
        )
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            if line.startswith("feedline server "):
                self.serving.set()

    def output(self) -> str:
        return "\n".join(self.lines)

    def terminate(self) -> None:
        """Sends SIGTERM (a server stops cleanly) unless the process has exited."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.terminate()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` s; the exit code. Its output is read on
        for a second at most (a process it started may hold the pipe open)."""
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        self._reader.join(1.0)
        return self.process.returncode


class LocalCluster:
    """A cluster on 127.0.0.1: this process is the chief; ``workers`` worker and ``ps`` ps
    tasks run ``feedline server`` in child processes. A context manager that stops them all.

    Args:
      workers: number of worker tasks.
      ps: number of ps tasks.
      start_timeout: seconds each child may take to serve.

    Raises:
      RuntimeError: a child exited or did not serve within ``start_timeout`` (with its output).
    """

    def __init__(self, workers: int = 2, ps: int = 2, start_timeout: float = START_TIMEOUT_S):
        ports = iter(free_ports(1 + workers + ps))
        self.cluster: dict[str, list[str]] = {
            "chief": [f"127.0.0.1:{next(ports)}"],
            "worker": [f"127.0.0.1:{next(ports)}" for _ in range(workers)],
            "ps": [f"127.0.0.1:{next(ports)}" for _ in range(ps)],
        }
        self._start_timeout = start_timeout
        self.children: list[_Child] = []

    @property
    def spec(self) -> ClusterSpec:
        return ClusterSpec(self.cluster)

    def start(self) -> LocalCluster:
        """Starts every child and waits until each serves."""
        try:
            for job in ("ps", "worker"):
                for index in range(len(self.cluster[job])):
                    self.children.append(_Child(f"{job}:{index}", self.cluster, job, index))
            deadline = time.monotonic() + self._start_timeout
            for child in self.children:
                while not child.serving.wait(0.1):
                    if child.process.poll() is not None or time.monotonic() > deadline:
                        how = (
                            f"exited with code {child.process.returncode}"
                            if child.process.poll() is not None
                            else f"did not serve within {self._start_timeout:g} s"
                        )
                        raise RuntimeError(
                            f"feedline server {child.name} {how}; its output:\n{child.output()}"
                        )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> dict[str, int | None]:
        """Stops every child (the workers, then the ps tasks, each group at once, killed
        where it has not stopped within ``STOP_TIMEOUT_S``); their exit codes by name.
        Idempotent."""
        codes = {}
        for job in ("worker", "ps"):
            group = [child for child in self.children if child.name.startswith(job)]
            for child in group:
                child.terminate()
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for child in group:
                codes[child.name] = child.stop(max(0.0, deadline - time.monotonic()))
        return codes

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def build_model(
    strategy: fdist.ParameterServerStrategy,
    rows: int,
    dim: int,
    lr: float = 0.5,
    torch_defaults: bool = False,
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """``EmbeddingBag(rows, dim, mode="mean", sparse=True)`` + ``Linear(dim, 1)`` and Adagrad,
    under the strategy's scope (so their values and Adagrad's state live on the ps). With
    ``torch_defaults``, the model as PyTorch users write it by default:
    ``EmbeddingBag(rows, dim, mode="sum")`` (a dense gradient) and plain SGD."""
    torch.manual_seed(0)
    with strategy.scope():
        if torch_defaults:
            table = torch.nn.EmbeddingBag(rows, dim, mode="sum")
        else:
            table = torch.nn.EmbeddingBag(rows, dim, mode="mean", sparse=True)
        model = torch.nn.Sequential(table, torch.nn.Linear(dim, 1))
        if torch_defaults:
            optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        else:
            optimizer = torch.optim.Adagrad(model.parameters(), lr=lr)
    return model, optimizer


def _synthetic_batch(seed: int, rows: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A batch of ``BAG`` ids per example (skewed towards small ids, as real ids are) and a
    label: the mean over the bag of a fixed function of each id, plus a little noise."""
    rng = np.random.default_rng(seed)
    ids = (rows * rng.random((batch_size, BAG)) ** 3).astype(np.int64)
    target = np.sin(ids * 0.37).mean(axis=1) + 0.05 * rng.standard_normal(batch_size)
    return ids, target.astype(np.float32)


def dataset_fn(
    rows: int, batch_size: int, seed: int = 0
) -> Callable[[fdist.InputContext], fd.Dataset]:
    """A ``dataset_fn(input_context)`` for ``create_per_worker_dataset``: endless synthetic
    batches ``(ids [batch, BAG], labels [batch])``, a different stream on each worker."""

    def make(context: fdist.InputContext) -> fd.Dataset:
        base = (seed * 1_000_003 + context.input_pipeline_id) * 1_000_000_007
        return fd.Dataset.range(1 << 62).map(
            lambda i: _synthetic_batch(int(base + i), rows, batch_size)
        )

    return make


def make_train_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> Callable[[Iterator[Any]], float]:
    """The function the coordinator schedules: one step on the worker's next batch; its loss."""

    def train_step(iterator: Iterator[Any]) -> float:
        ids, labels = next(iterator)
        optimizer.zero_grad()
        prediction = model(torch.as_tensor(ids)).squeeze(1)
        loss = torch.nn.functional.mse_loss(prediction, torch.as_tensor(labels))
        loss.backward()
        optimizer.step()  # pushed to the ps, which apply Adagrad
        return loss.item()

    return train_step


@dataclasses.dataclass(frozen=True)
class DemoSettings:
    """What ``feedline demo --parameter-server`` trains, and on how large a cluster (the
    command line's options; their defaults are its own).

    Attributes:
      steps: steps to train.
      print_every: print the rate and the loss every this many steps.
      batch_size: examples per step.
      rows: embedding rows.
      dim: embedding width.
      workers: worker tasks.
      ps: ps tasks.
      timeout: seconds the training may take in all.

    Raises:
      InvalidArgumentError: a count is below 1, or the timeout is not positive.
    """

    steps: int
    print_every: int
    batch_size: int
    rows: int
    dim: int
    workers: int
    ps: int
    timeout: float

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name != "timeout" and value < 1:
                raise InvalidArgumentError(f"DemoSettings.{field.name} must be >= 1, got {value}")
        if not self.timeout > 0:
            raise InvalidArgumentError(f"DemoSettings.timeout must be > 0, got {self.timeout}")


def train(cluster: LocalCluster, settings: DemoSettings, say: Callable[[str], None]) -> float:
    """Trains ``settings.steps`` steps on ``cluster``, printing progress; the steps per
    second."""
    resolver = SimpleClusterResolver(cluster.spec, task_type="chief", task_id=0)
    strategy = fdist.ParameterServerStrategy(
        resolver, variable_partitioner=MinSizePartitioner(max_shards=2), connect_timeout=30
    )
    model, optimizer = build_model(strategy, settings.rows, settings.dim)
    for name, param in model.named_parameters():
        if not isinstance(param, PSParameter):  # made under the strategy's scope: never
            raise TypeError(f"{name} is not a parameter-server variable")
        shards = [f"ps:{ps} rows {first}-{first + n - 1}" for ps, first, n in param.spec.shard_list]
        shape = " x ".join(map(str, param.shape))
        say(f"{name}: {shape} {str(param.dtype).removeprefix('torch.')}, shards {shards}")
    coordinator = fdist.coordinator.ClusterCoordinator(
        strategy, function_timeout=60.0, worker_timeout=60.0
    )
    try:
        return _run_steps(coordinator, model, optimizer, settings, say)
    finally:  # no call is left in flight: the servers stop at once
        coordinator.close()


def _run_steps(
    coordinator: fdist.coordinator.ClusterCoordinator,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    settings: DemoSettings,
    say: Callable[[str], None],
) -> float:
    """The training loop of ``train``; the steps per second."""
    iterator = iter(
        coordinator.create_per_worker_dataset(dataset_fn(settings.rows, settings.batch_size))
    )
    train_step = make_train_step(model, optimizer)
    deadline = time.monotonic() + settings.timeout
    start = last = time.perf_counter()
    # A few functions per worker in flight: the workers never wait for the chief, and the
    # chief's pickling is spread over the run instead of all before it.
    in_flight: collections.deque[Any] = collections.deque()
    scheduled = 0
    window: list[float] = []
    for step in range(1, settings.steps + 1):
        while scheduled < settings.steps and len(in_flight) < 4 * settings.workers:
            in_flight.append(coordinator.schedule(train_step, args=(iterator,)))
            scheduled += 1
        remote = in_flight.popleft()
        window.append(remote.fetch(timeout=max(0.1, deadline - time.monotonic())))
        if step % settings.print_every == 0 or step == settings.steps:
            now = time.perf_counter()
            first = " (with start-up)" if step <= settings.print_every else ""
            say(
                f"step {step}/{settings.steps}: {len(window) / (now - last):.1f} steps/s{first}, "
                f"loss {sum(window) / len(window):.4f}"
            )
            window, last = [], now
    coordinator.join(timeout=max(0.1, deadline - time.monotonic()))
    elapsed = time.perf_counter() - start
    say(f"done: {settings.steps} steps in {elapsed:.1f} s ({settings.steps / elapsed:.1f} steps/s)")
    return settings.steps / elapsed


def run(settings: DemoSettings) -> int:
    """``feedline demo --parameter-server``: starts the cluster, trains on it and stops it; the
    exit code: 0 when trained, 1 on an error (said on stderr), 130 on Ctrl-C."""
    torch.set_num_threads(1)
    cluster = LocalCluster(workers=settings.workers, ps=settings.ps)
    print(
        f"cluster: chief (this process), {settings.workers} workers, {settings.ps} ps on 127.0.0.1 "
        f"({json.dumps(cluster.cluster)})",
        flush=True,
    )
    try:
        with cluster:
            train(cluster, settings, lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        print("interrupted: the cluster is stopped", file=sys.stderr)
        return 130
    except Exception as error:  # the demo's answer to any failure: say it, exit 1
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        for child in cluster.children:
            if child.process.returncode not in (0, None):
                print(f"--- {child.name} (exit {child.process.returncode}) ---", file=sys.stderr)
                print(child.output(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # python -m feedline.examples.parameter_server_demo [OPTIONS]
    from feedline.cli import main

    raise SystemExit(main(["demo", "--parameter-server", *sys.argv[1:]]))
