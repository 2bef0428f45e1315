"""Fault tolerance on 2 CPU workers: checkpoint costs, per-step overheads, SIGTERM to exit.

Usage (from the repository root)::

    .venv/bin/python benchmarks/fault_tolerance.py [--quick] [--steps N] [--repetitions R]

Every measurement runs 2 worker processes of ``MultiWorkerMirroredStrategy`` on 127.0.0.1
(torchrun's environment, gloo, one CPU replica and one compute thread per process) training
the tutorial's CNN (``feedline.examples.custom_training.create_model``) with Adam at a global
batch of 128 on ``_common``'s synthetic Fashion-MNIST-shaped images (60,000 random 28x28x1
uint8 images, scaled to [0, 1] by a ``map``), the input pipeline
``from_tensor_slices((x, y)).shuffle(60000).batch(128).map(normalise)`` distributed by
``experimental_distribute_dataset`` (AUTO sharding, DATA here).

1. **Save and restore**: the checkpoint holds the model, the optimizer (after one step, so with
   Adam's state) and the distributed iterator mid-epoch. ``checkpoint.save`` is timed on each
   worker from a barrier to its return (it is a collective: the chief writes, worker 1 writes
   and removes its temporary copy); the figure is the slower worker's. ``restore`` of the
   latest file is timed on each worker alone. Median of ``--repetitions``.
2. **Per-step overhead** against a bare loop ``step(next(iterator))``: the same loop through
   ``PreemptionCheckpointHandler.run`` (one all-reduce of two flags per step) and through
   ``BackupAndRestore(save_freq=100).run`` (a save every 100 steps). Each round runs one block
   of ``--steps`` steps of each loop, in an order that rotates from round to round; the
   overhead is the median over ``--rounds`` rounds of (loop - bare) / steps. The same for a
   tiny model (``Linear(4, 1)``, global batch 16, blocks of 10x the steps), whose step is short
   and steady enough to show the overhead itself; and the agreement's all-reduce timed alone
   (2,000 calls).
3. **SIGTERM to all workers exited**: both workers train through a
   ``PreemptionCheckpointHandler``; once both have run 5 steps, SIGTERM goes to worker 1, and
   the time until both processes have exited (code 42) is measured from the parent, which
   polls every millisecond. Each worker reports when its save began and ended, for the split.

Raw numbers go to ``benchmarks/results/fault_tolerance-*.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from feedline._net.ports import free_port

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
GLOBAL_BATCH = 128
CHILD_TIMEOUT = 900  # seconds a worker may live
SIGTERM_AT = 5  # steps every worker has run before the SIGTERM


# -- the workers --------------------------------------------------------------------------------


def _say(value: dict[str, Any]) -> None:
    print(json.dumps(value), flush=True)


class Training:
    """The tutorial's CNN, Adam, and its distributed input, in one worker."""

    def __init__(self) -> None:
        import numpy as np
        import torch

        import _common
        import feedline.data as fd
        import feedline.distribute as fdist
        import feedline.nn
        import feedline.train
        from feedline.examples.custom_training import create_model

        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.torch = torch
        self.strategy = fdist.MultiWorkerMirroredStrategy(
            communication_options=fdist.experimental.CommunicationOptions(timeout_seconds=120)
        )
        self.rank = self.strategy.extended.worker_index
        with self.strategy.scope():
            self.model = create_model(28)
            self.optimizer = torch.optim.Adam(self.model.parameters())
        images, labels = _common.make_images()
        images = np.ascontiguousarray(images.transpose(0, 3, 1, 2))  # channels first

        def normalise(image: Any, label: Any) -> Any:
            return image.astype(np.float32) / 255, label.astype(np.int64)

        dataset = (
            fd.Dataset.from_tensor_slices((images, labels))
            .shuffle(len(images), seed=1)
            .batch(GLOBAL_BATCH)
            .map(normalise)
            .repeat()
        )
        self.iterator = iter(self.strategy.experimental_distribute_dataset(dataset))
        self.checkpoint = feedline.train.Checkpoint(
            model=self.model, optimizer=self.optimizer, iterator=self.iterator
        )
        loss_object = torch.nn.CrossEntropyLoss(reduction="none")

        def replica_step(inputs: Any) -> Any:
            x, y = inputs
            self.optimizer.zero_grad()
            per_example = loss_object(self.model(x), y)
            loss = feedline.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
            loss.backward()
            self.optimizer.step()
            return loss.detach()

        self._replica_step = replica_step

    def step(self, inputs: Any) -> Any:
        return self.strategy.run(self._replica_step, args=(inputs,))

    def barrier(self) -> None:
        self.strategy.reduce("SUM", self.torch.tensor(0.0), axis=None)


def worker_checkpoint(args: argparse.Namespace) -> None:
    import feedline.train

    job = Training()
    job.step(next(job.iterator))
    prefix = os.path.join(args.folder, "ckpt")
    saves, restores, sizes = [], [], []
    for _ in range(args.repetitions):
        for _ in range(3):
            job.step(next(job.iterator))
        job.barrier()
        started = time.perf_counter()
        path = job.checkpoint.save(prefix)
        saves.append(time.perf_counter() - started)
        sizes.append(os.path.getsize(path))
        job.barrier()
        started = time.perf_counter()
        job.checkpoint.restore(feedline.train.latest_checkpoint(args.folder))
        restores.append(time.perf_counter() - started)
    _say({"rank": job.rank, "save": saves, "restore": restores, "bytes": sizes})


class Tiny:
    """A model whose step is short and steady: ``Linear(4, 1)`` at a global batch of 16."""

    def __init__(self, strategy: Any) -> None:
        import numpy as np
        import torch

        import feedline.data as fd
        import feedline.train

        self.strategy = strategy
        with strategy.scope():
            self.model = torch.nn.Linear(4, 1)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        x = np.random.default_rng(0).normal(size=(4096, 4)).astype(np.float32)
        dataset = fd.Dataset.from_tensor_slices(x).batch(16).repeat()
        self.iterator = iter(strategy.experimental_distribute_dataset(dataset))
        self.checkpoint = feedline.train.Checkpoint(
            model=self.model, optimizer=self.optimizer, iterator=self.iterator
        )

        def replica_step(x: Any) -> None:
            self.optimizer.zero_grad()
            self.model(x).pow(2).mean().backward()
            self.optimizer.step()

        self._replica_step = replica_step

    def step(self, inputs: Any) -> None:
        self.strategy.run(self._replica_step, args=(inputs,))


def _overheads(job: Any, folder: str, steps: int, rounds: int, barrier: Any) -> dict[str, Any]:
    """Seconds per block of ``steps`` steps of the bare loop, the handler's and the backup's."""
    from feedline.distribute.experimental import PreemptionCheckpointHandler, TerminationConfig
    from feedline.train import BackupAndRestore

    handler = PreemptionCheckpointHandler(
        job.strategy.cluster_resolver,
        job.checkpoint,
        os.path.join(folder, "handler"),
        TerminationConfig(termination_watcher_fn=lambda: False),
    )
    backup = BackupAndRestore(job.checkpoint, os.path.join(folder, "backup"), save_freq=100)
    loops = {
        "bare": job.step,
        "handler": lambda inputs: handler.run(job.step, inputs),
        "backup": lambda inputs: backup.run(job.step, inputs),
    }
    for _ in range(5):  # warm-up: the shuffle buffer fills, the allocator settles
        job.step(next(job.iterator))
    names = list(loops)
    times: dict[str, list[float]] = {name: [] for name in loops}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            loop = loops[name]
            barrier()
            started = time.perf_counter()
            for _ in range(steps):
                loop(next(job.iterator))
            barrier()
            times[name].append(time.perf_counter() - started)
    return times


def worker_overhead(args: argparse.Namespace) -> None:
    from feedline.distribute import collective

    job = Training()
    cnn = _overheads(job, os.path.join(args.folder, "cnn"), args.steps, args.rounds, job.barrier)
    tiny_job = Tiny(job.strategy)
    tiny = _overheads(
        tiny_job, os.path.join(args.folder, "tiny"), 10 * args.steps, args.rounds, job.barrier
    )
    workers = collective.active()
    assert workers is not None
    job.barrier()
    started = time.perf_counter()
    for _ in range(2000):
        workers.agree_any((False, False), "the preemption agreement")
    agreement = (time.perf_counter() - started) / 2000
    _say({"rank": job.rank, "cnn": cnn, "tiny": tiny, "agreement": agreement})


def worker_preempt(args: argparse.Namespace) -> None:
    from feedline.distribute.experimental import PreemptionCheckpointHandler

    job = Training()
    handler = PreemptionCheckpointHandler(
        job.strategy.cluster_resolver, job.checkpoint, os.path.join(args.folder, "ckpt")
    )
    save = handler._state.save

    def timed_save() -> str:
        began = time.time()
        path = save()
        _say({"rank": job.rank, "save_began": began, "save_ended": time.time()})
        return path

    handler._state.save = timed_save  # type: ignore[method-assign]
    for step in range(100_000):
        handler.run(job.step, next(job.iterator))
        if step + 1 == SIGTERM_AT:
            _say({"rank": job.rank, "ready": time.time()})


WORKERS = {"checkpoint": worker_checkpoint, "overhead": worker_overhead, "preempt": worker_preempt}


# -- the parent ---------------------------------------------------------------------------------


class Pair:
    """Two worker processes of one mode; their JSON lines as they come."""

    def __init__(self, mode: str, args: argparse.Namespace, folder: str) -> None:
        port = free_port()
        self.procs = []
        for rank in range(2):
            env = {
                **os.environ,
                "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(HERE)]),
            }  # fmt: skip
            command = [
                sys.executable, __file__, "--worker", mode, "--folder", folder,
                "--steps", str(args.steps), "--repetitions", str(args.repetitions),
                "--rounds", str(args.rounds),
            ]  # fmt: skip
            self.procs.append(
                subprocess.Popen(
                    command, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
                )
            )

    def line(self, rank: int) -> dict[str, Any]:
        text = self.procs[rank].stdout.readline()  # type: ignore[union-attr]
        if not text:
            raise RuntimeError(f"worker {rank} ended without answering (exit {self.wait(rank)})")
        return json.loads(text)

    def wait(self, rank: int) -> int:
        return self.procs[rank].wait(timeout=CHILD_TIMEOUT)

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def measure_checkpoint(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="feedline-ft-") as folder:
        pair = Pair("checkpoint", args, folder)
        try:
            results = [pair.line(rank) for rank in range(2)]
        finally:
            pair.kill()
    slower = {
        key: [max(pair) for pair in zip(results[0][key], results[1][key], strict=True)]
        for key in ("save", "restore")
    }
    return {
        "save_s": statistics.median(slower["save"]),
        "restore_s": statistics.median(slower["restore"]),
        "bytes": results[0]["bytes"][-1],
        "raw": results,
    }


def measure_overhead(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="feedline-ft-") as folder:
        pair = Pair("overhead", args, folder)
        try:
            result = pair.line(0)
            pair.line(1)
        finally:
            pair.kill()
    out: dict[str, Any] = {"agreement_s": result["agreement"], "raw": result}
    for model, steps in (("cnn", args.steps), ("tiny", 10 * args.steps)):
        times = result[model]
        out[model] = {
            "step_s": {name: statistics.median(t) / steps for name, t in times.items()},
            "overhead_s": {
                name: statistics.median(
                    (t - bare) / steps for t, bare in zip(times[name], times["bare"], strict=True)
                )
                for name in ("handler", "backup")
            },
        }
    return out


def measure_sigterm(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    for _ in range(args.repetitions):
        with tempfile.TemporaryDirectory(prefix="feedline-ft-") as folder:
            pair = Pair("preempt", args, folder)
            try:
                for rank in range(2):
                    pair.line(rank)  # both have run SIGTERM_AT steps
                sent = time.time()
                os.kill(pair.procs[1].pid, signal.SIGTERM)
                exited = [0.0, 0.0]
                while not all(exited):
                    for rank, proc in enumerate(pair.procs):
                        if not exited[rank] and proc.poll() is not None:
                            exited[rank] = time.time()
                    if time.time() - sent > 120:
                        raise RuntimeError("the workers did not exit within 120 s of SIGTERM")
                    time.sleep(0.001)
                codes = [pair.wait(rank) for rank in range(2)]
                saves = [pair.line(rank) for rank in range(2)]
            finally:
                pair.kill()
        if codes != [42, 42]:
            raise RuntimeError(f"the workers exited with {codes}, not 42")
        runs.append(
            {
                "to_all_exited_s": max(exited) - sent,
                "to_save_began_s": min(s["save_began"] for s in saves) - sent,
                "save_s": max(s["save_ended"] - s["save_began"] for s in saves),
                "save_ended_to_exit_s": max(exited) - max(s["save_ended"] for s in saves),
            }
        )
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]} | {"raw": runs}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and repetitions")
    parser.add_argument("--steps", type=int, default=None, help="CNN steps a block (50)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of blocks (15)")
    parser.add_argument("--repetitions", type=int, default=None, help="saves, SIGTERMs (5)")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.steps = args.steps or (20 if args.quick else 50)
    args.rounds = args.rounds or (3 if args.quick else 15)
    args.repetitions = args.repetitions or (2 if args.quick else 5)
    if args.worker:
        signal.alarm(CHILD_TIMEOUT)
        WORKERS[args.worker](args)
        return

    import _common

    print(f"2 workers, tutorial CNN, global batch {GLOBAL_BATCH}; {args.steps} steps a block, "
          f"{args.rounds} rounds, {args.repetitions} repetitions")  # fmt: skip
    checkpoint = measure_checkpoint(args)
    print("\n| checkpoint (model, Adam, iterator) | ms |\n|---|---:|")
    print(f"| save on 2 workers (slower worker) | {_ms(checkpoint['save_s'])} |")
    print(f"| restore (slower worker) | {_ms(checkpoint['restore_s'])} |")
    print(f"| file size | {checkpoint['bytes'] / 2**20:.2f} MiB |")

    overhead = measure_overhead(args)
    print("\n| loop | CNN: ms per step | overhead | tiny: µs per step | overhead |")
    print("|---|---:|---:|---:|---:|")
    cnn, tiny = overhead["cnn"], overhead["tiny"]
    for name, label in (
        ("bare", "bare `step(next(iterator))`"),
        ("handler", "`handler.run`"),
        ("backup", "`BackupAndRestore(save_freq=100).run`"),
    ):
        extra = ("", "") if name == "bare" else (
            _ms(cnn["overhead_s"][name]), f"{tiny['overhead_s'][name] * 1e6:,.0f}"
        )  # fmt: skip
        print(f"| {label} | {_ms(cnn['step_s'][name])} | {extra[0]} | "
              f"{tiny['step_s'][name] * 1e6:,.0f} | {extra[1]} |")  # fmt: skip
    print("| a blocking all-reduce of the two flags, alone (what `run` does not wait for) "
          f"| | | | {overhead['agreement_s'] * 1e6:,.0f} |")  # fmt: skip

    sigterm = measure_sigterm(args)
    print("\n| SIGTERM to worker 1 -> | ms |\n|---|---:|")
    print(f"| first save begins | {_ms(sigterm['to_save_began_s'])} |")
    print(f"| save (slower worker) | {_ms(sigterm['save_s'])} |")
    print(f"| save ended -> both exited | {_ms(sigterm['save_ended_to_exit_s'])} |")
    print(f"| **both workers exited (code 42)** | **{_ms(sigterm['to_all_exited_s'])}** |")
    _common.write_results(
        "fault_tolerance",
        {
            "steps": args.steps,
            "rounds": args.rounds,
            "repetitions": args.repetitions,
            "checkpoint": checkpoint,
            "overhead": overhead,
            "sigterm": sigterm,
        },
    )


if __name__ == "__main__":
    main()
