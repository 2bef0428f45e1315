"""Feeding a GPU: feedline's device feed against torch's own copies and DataLoader.

Usage (from the repository root, on a machine with an NVIDIA GPU)::

    PYTHONPATH=src .venv/bin/python benchmarks/gpu_feed.py            # ~3 minutes
    PYTHONPATH=src .venv/bin/python benchmarks/gpu_feed.py --quick    # short runs
    PYTHONPATH=src .venv/bin/python benchmarks/gpu_feed.py --device cpu   # dry run, no GPU

Without CUDA it says so and exits 0, unless ``--device cpu`` asks for the dry run: the same code
with the device feed's ``HostBackend`` and logical CPU replicas, which checks that every row runs
(its numbers mean nothing). It prints one Markdown table and writes the raw numbers to
``benchmarks/results/gpu_feed-*.json``.

Rows (every ratio is taken between runs made in the same round, rounds alternate the order):

  H1  host->device GB/s of ``DeviceFeed.put`` (pageable NumPy batch -> ring of pinned buffers ->
      copy stream, two batches in flight) against torch's own copy of the same bytes from a
      pinned tensor (``pinned.to(device, non_blocking=True)``), for 4 MiB and 64 MiB batches.
      Goal: >= 90%.
  H2  the same through a pipeline: ``Dataset.from_tensors(batch).repeat().apply(
      prefetch_to_device(device, 2))``.
  T1  the tutorial CNN (``feedline.examples.custom_training.create_model``, Adam, batch 128,
      60,000 28x28 images) on one GPU, step time with feedline's input
      (``OneDeviceStrategy`` + ``experimental_distribute_dataset`` of
      ``from_tensor_slices.shuffle.batch.repeat``) against the same steps on data resident on
      the GPU (a random permutation gathered on the device). Goal: within 3%.
  T2  the same feedline loop against ``DataLoader(TensorDataset, batch_size=128, shuffle=True,
      pin_memory=True, num_workers=N, persistent_workers=True)`` with ``.to(device,
      non_blocking=True)``. Goal: >= 1.0x (feedline as fast or faster).
  T3  ``dataset.as_torch(device=...)`` in a plain loop against the resident data.
  M1, M2  T1 and T2 under ``MirroredStrategy`` over every GPU (global batch 128 per GPU); the
      resident peer runs the same ``strategy.run`` step on per-replica slices already on each
      GPU, the DataLoader peer splits its global batch and copies each slice to its GPU.

No step reads the loss back (``float(loss)``) until the end of a timed block, so the host can run
ahead of the GPU as a training loop that logs every N steps does.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import _common

BATCH = 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs, two rounds")
    parser.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cpu: a dry run of every row without a GPU",
    )
    parser.add_argument(
        "--workers", type=int, default=min(4, os.cpu_count() or 1), help="DataLoader's num_workers"
    )
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_feed: no CUDA device here (torch.cuda.is_available() is False); nothing to "
            "measure. Run it on a machine with an NVIDIA GPU, or with --device cpu for a dry "
            "run of the code."
        )
        return
    rounds = args.rounds or (2 if args.quick else 5)
    steps = 30 if args.quick else 200
    copies = 10 if args.quick else 50
    bench = Bench(args.device, rounds, steps, copies, args.workers, quick=args.quick)
    rows = bench.run()
    print_table(rows, bench.describe())
    _common.write_results("gpu_feed", {"machine_gpus": bench.describe(), "rows": rows})


class Bench:
    """Every row of the module's table, on CUDA or (``cpu``) a dry run on the host."""

    def __init__(
        self, device: str, rounds: int, steps: int, copies: int, workers: int, quick: bool
    ) -> None:
        import torch

        self.torch = torch
        self.dry = device == "cpu"
        self.rounds, self.steps, self.copies, self.workers = rounds, steps, copies, workers
        self.quick = quick
        count = 2 if self.dry else torch.cuda.device_count()
        self.devices = (
            [f"cpu:{i}" for i in range(count)] if self.dry else [f"cuda:{i}" for i in range(count)]
        )
        self.device = torch.device("cpu") if self.dry else torch.device("cuda", 0)

    def describe(self) -> str:
        if self.dry:
            return "dry run on the CPU (--device cpu): the numbers mean nothing"
        names = {self.torch.cuda.get_device_name(i) for i in range(len(self.devices))}
        return f"{len(self.devices)} x {', '.join(sorted(names))}, torch {self.torch.__version__}"

    def sync(self) -> None:
        if not self.dry:
            self.torch.cuda.synchronize()

    def run(self) -> list[dict[str, Any]]:
        rows = []
        for mib in (4, 64):
            rows += self.copy_rows(mib)
        rows += self.training_rows()
        return rows

    # -- H1, H2: host -> device bandwidth --------------------------------------------------------
    def copy_rows(self, mib: int) -> list[dict[str, Any]]:
        torch = self.torch
        from feedline.data import Dataset
        from feedline.data._device_feed import DeviceFeed, HostBackend
        from feedline.data.experimental import prefetch_to_device

        nbytes = mib << 20
        host = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
        pinned = torch.from_numpy(host).pin_memory() if not self.dry else torch.from_numpy(host)
        backend = HostBackend() if self.dry else None
        feed = DeviceFeed(depth=2, backend=backend)
        n = self.copies

        def torch_pinned() -> None:
            outs = (
                [pinned.to(self.device, non_blocking=True) for _ in range(n)]
                if not self.dry
                else [pinned.clone() for _ in range(n)]
            )
            self.sync()
            del outs

        def feedline_feed() -> None:
            ahead: collections.deque[Any] = collections.deque()
            for _ in range(n):
                ahead.append(feed.put(host, self.device))
                if len(ahead) > 2:
                    ahead.popleft().ready()
            while ahead:
                ahead.popleft().ready()
            self.sync()

        target = "/cpu:0" if self.dry else "cuda:0"
        pipeline = Dataset.from_tensors(host).repeat().apply(prefetch_to_device(target, 2))
        iterator = iter(pipeline)

        def feedline_pipeline() -> None:
            for _ in range(n):
                next(iterator)
            self.sync()

        times = paired(
            {"torch": torch_pinned, "feed": feedline_feed, "pipe": feedline_pipeline}, self.rounds
        )
        gbs = {k: n * nbytes / v / 1e9 for k, v in best(times).items()}
        ratio = median_ratio(times["torch"], times["feed"])
        ratio_pipe = median_ratio(times["torch"], times["pipe"])
        return [
            row(
                f"H1 {mib} MiB",
                "host->device GB/s, DeviceFeed vs torch pinned copy",
                f"{gbs['feed']:.1f} GB/s",
                f"{gbs['torch']:.1f} GB/s",
                ratio,
                ">= 0.90",
                0.90,
            ),
            row(
                f"H2 {mib} MiB",
                "host->device GB/s, prefetch_to_device pipeline vs torch",
                f"{gbs['pipe']:.1f} GB/s",
                f"{gbs['torch']:.1f} GB/s",
                ratio_pipe,
                ">= 0.90",
                0.90,
            ),
        ]

    # -- T, M: the tutorial CNN ------------------------------------------------------------------
    def training_rows(self) -> list[dict[str, Any]]:
        x, y = _common.make_images()
        images = (x.transpose(0, 3, 1, 2) / np.float32(255)).astype(np.float32)
        labels = y.astype(np.int64)
        if self.quick:
            images, labels = images[:8192], labels[:8192]
        one = [self.devices[0]]
        single = {
            "feedline": self.feedline_loop(images, labels, one),
            "resident": self.resident_loop(images, labels, one),
            "dataloader": self.dataloader_loop(images, labels, one),
            "as_torch": self.as_torch_loop(images, labels),
        }
        times = paired(single, self.rounds)
        ms = {k: v * 1e3 / self.steps for k, v in best(times).items()}
        rows = [
            row(
                "T1 1 GPU",
                "tutorial CNN step, feedline input vs data resident on the GPU",
                f"{ms['feedline']:.3f} ms",
                f"{ms['resident']:.3f} ms",
                median_ratio(times["resident"], times["feedline"]),
                ">= 0.97",
                0.97,
            ),
            row(
                "T2 1 GPU",
                f"same, vs DataLoader(pin_memory=True, num_workers={self.workers})",
                f"{ms['feedline']:.3f} ms",
                f"{ms['dataloader']:.3f} ms",
                median_ratio(times["dataloader"], times["feedline"]),
                ">= 1.00",
                1.0,
            ),
            row(
                "T3 1 GPU",
                "as_torch(device=...) loop vs data resident on the GPU",
                f"{ms['as_torch']:.3f} ms",
                f"{ms['resident']:.3f} ms",
                median_ratio(times["resident"], times["as_torch"]),
                ">= 0.97",
                0.97,
            ),
        ]
        n = len(self.devices)
        mirrored = {
            "feedline": self.feedline_loop(images, labels, self.devices),
            "resident": self.resident_loop(images, labels, self.devices),
            "dataloader": self.dataloader_loop(images, labels, self.devices),
        }
        times = paired(mirrored, self.rounds)
        ms = {k: v * 1e3 / self.steps for k, v in best(times).items()}
        rows += [
            row(
                f"M1 {n} GPUs",
                "MirroredStrategy step, feedline input vs resident data",
                f"{ms['feedline']:.3f} ms",
                f"{ms['resident']:.3f} ms",
                median_ratio(times["resident"], times["feedline"]),
                ">= 0.97",
                0.97,
            ),
            row(
                f"M2 {n} GPUs",
                "same, vs DataLoader (split, .to each GPU)",
                f"{ms['feedline']:.3f} ms",
                f"{ms['dataloader']:.3f} ms",
                median_ratio(times["dataloader"], times["feedline"]),
                ">= 1.00",
                1.0,
            ),
        ]
        return rows

    def _strategy(self, devices: list[str]) -> Any:
        import feedline.distribute as fdist

        if len(devices) == 1:
            return fdist.OneDeviceStrategy(devices[0])
        return fdist.MirroredStrategy(devices)

    def _step(self, strategy: Any, global_batch: int) -> tuple[Callable[[Any], Any], Any]:
        """A training step of the tutorial's model made under ``strategy.scope()``, and the
        running loss (on the device; read once per timed block)."""
        torch = self.torch
        import feedline.nn
        from feedline.examples.custom_training import create_model

        torch.manual_seed(0)
        with strategy.scope():
            model = create_model()
            optimizer = torch.optim.Adam(model.parameters())
        loss_object = torch.nn.CrossEntropyLoss(reduction="none")

        def train_step(inputs: tuple[Any, Any]) -> Any:
            images, labels = inputs
            optimizer.zero_grad()
            loss = feedline.nn.compute_average_loss(
                loss_object(model(images), labels), global_batch_size=global_batch
            )
            loss.backward()
            optimizer.step()
            return loss.detach()

        def step(inputs: Any) -> Any:
            return strategy.run(train_step, args=(inputs,))

        return step, strategy

    def _timed(self, run_step: Callable[[], Any]) -> Callable[[], None]:
        def block() -> None:
            last = None
            for _ in range(self.steps):
                last = run_step()
            self.sync()
            del last

        for _ in range(min(20, self.steps)):  # warm-up: kernels chosen, rings allocated
            run_step()
        self.sync()
        return block

    def feedline_loop(self, images: np.ndarray, labels: np.ndarray, devices: list[str]) -> Any:
        import feedline.data as fd

        strategy = self._strategy(devices)
        global_batch = BATCH * len(devices)
        step, _ = self._step(strategy, global_batch)
        dataset = (
            fd.Dataset.from_tensor_slices((images, labels))
            .shuffle(len(images), seed=0)
            .batch(global_batch, drop_remainder=True)
            .repeat()
            .prefetch(2)
        )
        iterator = iter(strategy.experimental_distribute_dataset(dataset))
        return self._timed(lambda: step(next(iterator)))

    def as_torch_loop(self, images: np.ndarray, labels: np.ndarray) -> Any:
        import feedline.data as fd

        strategy = self._strategy([self.devices[0]])
        step, _ = self._step(strategy, BATCH)
        dataset = (
            fd.Dataset.from_tensor_slices((images, labels))
            .shuffle(len(images), seed=0)
            .batch(BATCH, drop_remainder=True)
            .repeat()
            .prefetch(2)
        )
        target = "cpu" if self.dry else "cuda:0"
        iterator = iter(dataset.as_torch(device=target))
        return self._timed(lambda: step(next(iterator)))

    def resident_loop(self, images: np.ndarray, labels: np.ndarray, devices: list[str]) -> Any:
        torch = self.torch
        from feedline.distribute import PerReplica

        strategy = self._strategy(devices)
        step, _ = self._step(strategy, BATCH * len(devices))
        places = [torch.device("cpu") if self.dry else torch.device(d) for d in devices]
        data = [(torch.from_numpy(images).to(p), torch.from_numpy(labels).to(p)) for p in places]
        generator = torch.Generator(device=places[0]).manual_seed(0)
        order: Iterator[Any] = iter(())

        def next_step() -> Any:
            nonlocal order
            index = next(order, None)
            if index is None:
                perm = torch.randperm(len(images), device=places[0], generator=generator)
                usable = len(perm) // (BATCH * len(places)) * BATCH * len(places)
                order = iter(perm[:usable].view(-1, len(places), BATCH))
                index = next(order)
            parts = [
                (x.index_select(0, index[i].to(p)), y.index_select(0, index[i].to(p)))
                for i, ((x, y), p) in enumerate(zip(data, places, strict=True))
            ]
            if len(parts) == 1:
                return step(parts[0])
            return step(
                (PerReplica(tuple(x for x, _ in parts)), PerReplica(tuple(y for _, y in parts)))
            )

        return self._timed(next_step)

    def dataloader_loop(self, images: np.ndarray, labels: np.ndarray, devices: list[str]) -> Any:
        torch = self.torch
        from torch.utils.data import DataLoader, TensorDataset

        from feedline.distribute import PerReplica

        strategy = self._strategy(devices)
        n = len(devices)
        step, _ = self._step(strategy, BATCH * n)
        places = [torch.device("cpu") if self.dry else torch.device(d) for d in devices]
        loader = DataLoader(
            TensorDataset(torch.from_numpy(images), torch.from_numpy(labels)),
            batch_size=BATCH * n,
            shuffle=True,
            drop_last=True,
            pin_memory=not self.dry,
            num_workers=self.workers,
            persistent_workers=self.workers > 0,
        )

        def batches() -> Iterator[Any]:
            while True:
                yield from loader

        source = batches()

        def next_step() -> Any:
            x, y = next(source)
            xs = [part.to(p, non_blocking=True) for part, p in zip(x.chunk(n), places, strict=True)]
            ys = [part.to(p, non_blocking=True) for part, p in zip(y.chunk(n), places, strict=True)]
            if n == 1:
                return step((xs[0], ys[0]))
            return step((PerReplica(tuple(xs)), PerReplica(tuple(ys))))

        return self._timed(next_step)


def paired(blocks: dict[str, Callable[[], None]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each block, round by round, the order rotated every round."""
    names = list(blocks)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            blocks[name]()
            times[name].append(time.perf_counter() - start)
    return times


def best(times: dict[str, list[float]]) -> dict[str, float]:
    return {name: min(values) for name, values in times.items()}


def median_ratio(peer: list[float], ours: list[float]) -> float:
    """Median over rounds of peer time / feedline time (> 1: feedline faster)."""
    return statistics.median(p / o for p, o in zip(peer, ours, strict=True))


def row(
    name: str, what: str, ours: str, peer: str, ratio: float, goal: str, threshold: float
) -> dict[str, Any]:
    return {
        "row": name,
        "what": what,
        "feedline": ours,
        "peer": peer,
        "ratio": ratio,
        "goal": goal,
        "met": ratio >= threshold,
    }


def print_table(rows: list[dict[str, Any]], machine: str) -> None:
    print(f"\n{machine}\n")
    print("| row | what | feedline | peer | ratio (median of rounds) | goal | met |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        met = "yes" if r["met"] else "no"
        print(
            f"| {r['row']} | {r['what']} | {r['feedline']} | {r['peer']} | "
            f"{r['ratio']:.3f} | {r['goal']} | {met} |"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
