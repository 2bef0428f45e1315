"""feedline and PyTorch's data API, both ways: torch datasets as feedline sources
(``Dataset.from_torch``) and feedline pipelines as torch iterables (``Dataset.as_torch``).

Usage (from the repository root)::

    .venv/bin/python benchmarks/torch_interop.py [--quick] [--min-seconds S] [--repetitions N]

Everything runs on B1 of ``data_pipeline.py`` (x: 60000x28x28x1 uint8, y: 60000 uint8, from
``_common.make_images``): ``<source>.shuffle(60000).batch(64).prefetch(AUTOTUNE)``, whole epochs.

Sources, against ``from_tensor_slices((x, y))`` (target for ``TensorDataset``: >= 0.5x):

  from_torch(TensorDataset(x, y))           the tensors' NumPy views, gathered per batch
  from_torch(<map-style, __getitems__>)     one __getitems__ call per batch, columns stacked
  from_torch(<map-style, __getitem__>)      one __getitem__ call per row

Loaders, against ``DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)`` (target for
``as_torch``: >= 3x): B1 ``.as_torch()`` in a plain loop and under ``DataLoader(...,
batch_size=None)``; B1 itself (NumPy batches) shows what the conversion costs.

Every variant is timed once per round, in the same order, for ``--repetitions`` rounds (each
``--min-seconds`` of whole epochs after a warm-up), so all of them see the same machine load; a
rate is the best of its rounds, in rows per second. Results are also written as JSON to
``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

import _common
from feedline.data import AUTOTUNE, Dataset

SOURCE_TARGET = 0.5
LOADER_TARGET = 3.0


class ImagesWithGetitems(torch.utils.data.Dataset):
    """A map-style dataset of the B1 tensors with a batched ``__getitems__``, as torch's
    ``DataLoader`` calls it: one call per batch, a list of ``(image, label)`` items back."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        rows = torch.as_tensor(indices)
        return list(zip(self.x[rows], self.y[rows], strict=True))


class ImagesWithGetitem(torch.utils.data.Dataset):
    """The same without ``__getitems__``: every row is one ``__getitem__`` call."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


def b1(source: Dataset) -> Dataset:
    return source.shuffle(_common.NUM_IMAGES).batch(_common.BATCH).prefetch(AUTOTUNE)


def _rows(batch: Any) -> int:
    return len(batch[1])


def variants(x: np.ndarray, y: np.ndarray) -> dict[str, tuple[str, Callable[[], Any]]]:
    """Name -> (group, a function that makes the iterable of one epoch)."""
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    slices = b1(Dataset.from_tensor_slices((x, y)))
    tensors = b1(Dataset.from_torch(TensorDataset(tx, ty)))
    getitems = b1(Dataset.from_torch(ImagesWithGetitems(tx, ty)))
    getitem = b1(Dataset.from_torch(ImagesWithGetitem(tx, ty)))
    as_torch = slices.as_torch()
    loader_of_feedline = DataLoader(slices.as_torch(), batch_size=None)
    loader = DataLoader(TensorDataset(tx, ty), batch_size=_common.BATCH, shuffle=True)
    return {
        "from_tensor_slices((x, y))": ("source", lambda: slices),
        "from_torch(TensorDataset(x, y))": ("source", lambda: tensors),
        "from_torch(map-style with __getitems__)": ("source", lambda: getitems),
        "from_torch(map-style with __getitem__ only)": ("source", lambda: getitem),
        "B1 (NumPy batches)": ("loader", lambda: slices),
        "B1.as_torch(), plain loop": ("loader", lambda: as_torch),
        "DataLoader(B1.as_torch(), batch_size=None)": ("loader", lambda: loader_of_feedline),
        "DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)": ("loader", lambda: loader),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="short runs, one round")
    parser.add_argument("--min-seconds", type=float, default=None)
    parser.add_argument("--repetitions", type=int, default=None)
    args = parser.parse_args()
    min_seconds = args.min_seconds or (0.4 if args.quick else 1.5)
    repetitions = args.repetitions or (1 if args.quick else 3)

    x, y = _common.make_images()
    runs = variants(x, y)
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for round_index in range(repetitions):
        for name, (_, make) in runs.items():
            measured = _common.measure(
                make, _rows, min_seconds=min_seconds, repetitions=1, whole_epochs=True
            )
            rates[name].append(measured.rate)
            print(f"round {round_index + 1}: {name}: {measured.rate:,.0f} rows/s", flush=True)

    best = {name: max(values) for name, values in rates.items()}
    baselines = {
        "source": "from_tensor_slices((x, y))",
        "loader": "DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)",
    }
    print(
        f"\nrows/s, B1 = <source>.shuffle(60000).batch(64).prefetch(AUTOTUNE), best of "
        f"{repetitions} rounds of >= {min_seconds} s ({os.cpu_count()} CPUs)\n"
    )
    print("| pipeline | rows/s | rounds | against | ratio | target |")
    print("|---|---:|---|---|---:|---:|")
    targets = {
        "from_torch(TensorDataset(x, y))": f"≥ {SOURCE_TARGET}x",
        "B1.as_torch(), plain loop": f"≥ {LOADER_TARGET}x",
        "DataLoader(B1.as_torch(), batch_size=None)": f"≥ {LOADER_TARGET}x",
    }
    for name, (group, _) in runs.items():
        baseline = baselines[group]
        ratio = best[name] / best[baseline]
        spread = ", ".join(f"{r / 1000:,.0f}k" for r in rates[name])
        print(
            f"| `{name}` | {best[name]:,.0f} | {spread} | {group} baseline | {ratio:.2f}x "
            f"| {targets.get(name, '')} |"
        )
    per_batch = (
        1e6
        * _common.BATCH
        * (1 / best["B1.as_torch(), plain loop"] - 1 / best["B1 (NumPy batches)"])
    )
    print(f"\nas_torch's conversion beyond the NumPy pipeline: {per_batch:.1f} µs per batch of 64")
    _common.write_results(
        "torch_interop",
        {
            "timing": {"min_seconds": min_seconds, "repetitions": repetitions},
            "rates": rates,
            "best": best,
            "baselines": baselines,
        },
    )


if __name__ == "__main__":
    main()
