"""feedline.data against tf.data and torch's DataLoader on the same input pipelines.

Usage (from the repository root)::

    .venv/bin/python benchmarks/data_pipeline.py [--quick] [--only B1,B2]

Each workload runs on feedline (in this process), then on tf.data (``benchmarks/_tf_peer.py`` under
``.venv-tf/bin/python``, the same data from the same seed) and, where there is an equivalent, on
``torch.utils.data.DataLoader`` (in this process), one after another, so that the peers of a row
see the same machine load. Every measurement is the best of ``--repetitions`` runs of at least
``--min-seconds`` after a warm-up; the table gives rows (images or elements) per second. B1's peak
memory is measured in a fresh process for each framework. Results are also written as JSON to
``benchmarks/results/``.

Workloads (x: 60000x28x28x1 uint8, y: 60000 uint8):

  B1  from_tensor_slices((x, y)).shuffle(60000).batch(64).prefetch(AUTOTUNE)
  B2  from_tensor_slices((x, y)).map(normalise, num_parallel_calls=AUTOTUNE).batch(64)
  B3  from_tensor_slices((x, y)).batch(64).map(normalise)
  B4  range(10_000_000).map(lambda i: (i, i)).batch(1024), a prefix of it
  B5  TFRecord of tf.train.Example (image bytes, label int64): read, batch(64), parse_example
  B6  range(N).map(<50 us pure-Python loop>, use_processes=True).batch(64): 2 workers vs 1
  W1  range(N).window(64, shift=1, drop_remainder=True).flat_map(lambda w: w.batch(64))
      .batch(32), a prefix of it (rows: windows)
  K1  50000 int64 sequences of lengths 1..100 (from_tensor_slices of rows and lengths, mapped
      to rows[:n]) through bucket_by_sequence_length(boundaries [20, 40, 60, 80], batches of 64)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

import _common
import feedline
from feedline.data import AUTOTUNE, Dataset, Options

TF_PEER = pathlib.Path(__file__).resolve().parent / "_tf_peer.py"

TARGETS = {"B1": 3.0, "B2": 4.0, "B3": 2.0, "B4": 4.0, "B5": 1.0, "B6": 1.7, "W1": 2.0, "K1": 2.0}


def normalise(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images to float32 in [0, 1]; labels unchanged."""
    return x.astype(np.float32) / np.float32(255), y


def _rows(batch: Any) -> int:
    return len(batch[1])


def _rows_first(batch: Any) -> int:
    return len(batch[0]) if isinstance(batch, tuple | list) else len(batch)


def _rows_array(batch: Any) -> int:
    return len(batch)


# -- feedline -----------------------------------------------------------------------------------


def feedline_b6(busy_iterations: int, workers: int) -> Dataset:
    """B6 on ``workers`` processes: the CPU budget caps the pool at ``workers``."""
    options = Options()
    options.autotune.cpu_budget = workers
    busy = _common.BusyLoop(busy_iterations)
    return (
        Dataset.range(_common.B6_RANGE)
        .map(busy, num_parallel_calls=workers, use_processes=True)
        .batch(_common.BATCH)
        .with_options(options)
    )


def feedline_dataset(name: str, data: dict[str, Any]) -> tuple[Dataset, Callable[[Any], int]]:
    """The feedline dataset of a workload and how to count the rows of one of its elements."""
    if name in ("B1", "B2", "B3"):
        base = Dataset.from_tensor_slices((data["x"], data["y"]))
        if name == "B1":
            ds = base.shuffle(_common.NUM_IMAGES).batch(_common.BATCH).prefetch(AUTOTUNE)
        elif name == "B2":
            ds = base.map(normalise, num_parallel_calls=AUTOTUNE).batch(_common.BATCH)
        else:
            ds = base.batch(_common.BATCH).map(normalise)
        return ds, _rows
    if name == "B4":
        ds = Dataset.range(_common.B4_RANGE).map(lambda i: (i, i)).batch(_common.B4_BATCH)
        return ds, _rows_first
    if name == "B5":
        import feedline.io as fio

        features = {
            "image": fio.FixedLenFeature([], feedline.string),
            "label": fio.FixedLenFeature([], feedline.int64),
        }
        ds = (
            feedline.data.TFRecordDataset(data["tfrecord"])
            .batch(_common.BATCH)
            .map(lambda s: fio.parse_example(s, features))
        )
        return ds, lambda b: len(b["label"])
    if name == "B6":
        return feedline_b6(data["busy_iterations"], 2), _rows_array
    if name == "W1":
        size = _common.W1_WINDOW
        ds = (
            Dataset.range(_common.W1_RANGE)
            .window(size, shift=1, drop_remainder=True)
            .flat_map(lambda w: w.batch(size))
            .batch(_common.W1_BATCH)
        )
        return ds, _rows_array
    if name == "K1":
        rows, lengths = data["sequences"]
        ds = (
            Dataset.from_tensor_slices((rows, lengths))
            .map(lambda x, n: x[:n])
            .bucket_by_sequence_length(
                element_length_func=lambda x: x.shape[0],
                bucket_boundaries=_common.K1_BOUNDARIES,
                bucket_batch_sizes=_common.K1_BATCH_SIZES,
            )
        )
        return ds, _rows_array
    raise ValueError(f"unknown workload {name}")


def write_tfrecord(path: str, x: np.ndarray, y: np.ndarray) -> None:
    """The images as ``tf.train.Example`` records, written with feedline's TFRecordWriter."""
    import feedline.io as fio
    import feedline.train as ftrain

    with fio.TFRecordWriter(path) as writer:
        for image, label in zip(x, y, strict=True):
            example = ftrain.Example(
                features=ftrain.Features(
                    feature={
                        "image": ftrain.Feature(
                            bytes_list=ftrain.BytesList(value=[image.tobytes()])
                        ),
                        "label": ftrain.Feature(int64_list=ftrain.Int64List(value=[int(label)])),
                    }
                )
            )
            writer.write(example.SerializeToString())


def b5_unavailable() -> str | None:
    """Why B5 cannot run yet, or None."""
    try:
        import feedline.io as fio
        import feedline.train as ftrain

        for owner, names in (
            (fio, ("TFRecordWriter", "parse_example", "FixedLenFeature")),
            (ftrain, ("Example", "Features", "Feature", "BytesList", "Int64List")),
            (feedline.data, ("TFRecordDataset",)),
        ):
            missing = [n for n in names if not hasattr(owner, n)]
            if missing:
                return f"{owner.__name__} has no {', '.join(missing)} yet"
    except ImportError as error:
        return f"feedline's TFRecord support is not importable yet ({error})"
    return None


# -- torch DataLoader -------------------------------------------------------------------------


def dataloader(name: str, data: dict[str, Any], workers: int = 2) -> Any | None:
    """The DataLoader peer of a workload, or None where there is none."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    if name == "B1":
        tensors = TensorDataset(torch.from_numpy(data["x"]), torch.from_numpy(data["y"]))
        return DataLoader(tensors, batch_size=_common.BATCH, shuffle=True)
    if name == "B2":
        return DataLoader(_NormalisedImages(data["x"], data["y"]), batch_size=_common.BATCH)
    if name == "B6":
        return DataLoader(
            _BusyRange(data["busy_iterations"]),
            batch_size=_common.BATCH,
            num_workers=workers,
            persistent_workers=True,
        )
    return None


class _NormalisedImages:
    """A map-style dataset that normalises one image per ``__getitem__``."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        import torch

        return torch.from_numpy(self.x[i]).to(torch.float32).div_(255), int(self.y[i])


class _BusyRange:
    """``BusyLoop`` over ``range(B6_RANGE)`` as a map-style dataset."""

    def __init__(self, iterations: int) -> None:
        self.busy = _common.BusyLoop(iterations)

    def __len__(self) -> int:
        return _common.B6_RANGE

    def __getitem__(self, i: int) -> int:
        return self.busy(i)


# -- the tf.data peer -----------------------------------------------------------------------------


def run_tf_peer(args: list[str]) -> dict[str, Any] | str:
    """The JSON that ``_tf_peer.py`` prints, or why it could not run."""
    return _common.run_tf_script(TF_PEER, args, "the tf.data peer")


# -- memory ---------------------------------------------------------------------------------


def memory_probe(framework: str) -> dict[str, Any]:
    """Peak RSS of building B1 and running one epoch, measured in this (fresh) process."""
    x, y = _common.make_images()
    if framework == "feedline":
        import tracemalloc

        def epoch() -> None:
            ds = Dataset.from_tensor_slices((x, y))
            ds = ds.shuffle(_common.NUM_IMAGES).batch(_common.BATCH).prefetch(AUTOTUNE)
            for _ in ds:
                pass

        tracemalloc.start()
        epoch()
        traced = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        result = _common.peak_memory_of(epoch)
        result["tracemalloc_peak"] = traced
        return result
    loader = dataloader("B1", {"x": x, "y": y})

    def loader_epoch() -> None:
        for _ in loader:
            pass

    return _common.peak_memory_of(loader_epoch)


def measure_memory() -> dict[str, Any]:
    """B1's peak memory for each framework, each in a fresh process."""
    out: dict[str, Any] = {}
    for framework in ("feedline", "dataloader"):
        done = subprocess.run(
            [sys.executable, __file__, "--memory-probe", framework],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        lines = done.stdout.strip().splitlines()
        out[framework] = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    tf = run_tf_peer(["--memory"])
    out["tf.data"] = tf["memory"] if isinstance(tf, dict) else None
    return out


# -- the run ----------------------------------------------------------------------------------


def _fmt_rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _fmt_ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="short runs, one repetition")
    parser.add_argument("--only", default=",".join(_common.WORKLOADS), help="e.g. B1,B2")
    parser.add_argument("--min-seconds", type=float, default=None)
    parser.add_argument("--repetitions", type=int, default=None)
    parser.add_argument("--no-tf", action="store_true", help="skip the tf.data peer")
    parser.add_argument("--no-torch", action="store_true", help="skip the DataLoader peer")
    parser.add_argument(
        "--b6-chunk-seconds",
        type=float,
        default=None,
        help="what-if experiment: the target seconds per chunk that map hands to worker "
        "processes in B6 (patches feedline.data.ops.map._CHUNK_SECONDS; default: unchanged)",
    )
    parser.add_argument(
        "--per-element",
        action="store_true",
        help="what-if experiment: map functions never run once on a whole batch (patches "
        "feedline.data.ops._vectorise.screen), so B2 and B4 show the fused per-element loop",
    )
    parser.add_argument(
        "--memory-probe", choices=["feedline", "dataloader"], help=argparse.SUPPRESS
    )
    args = parser.parse_args()

    if args.memory_probe:
        print(json.dumps(memory_probe(args.memory_probe)))
        return

    if args.per_element:
        import feedline.data.ops._vectorise as vectorise

        vectorise.screen = lambda fn: False
    min_seconds = args.min_seconds or (0.4 if args.quick else 1.5)
    repetitions = args.repetitions or (1 if args.quick else 3)
    names = [n.strip().upper() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(_common.WORKLOADS))
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {', '.join(_common.WORKLOADS)}")

    x, y = _common.make_images()
    data: dict[str, Any] = {"x": x, "y": y}
    if "B6" in names:
        data["busy_iterations"] = _common.calibrate_busy()
    if "K1" in names:
        data["sequences"] = _common.make_sequences()
    timing = {"min_seconds": min_seconds, "repetitions": repetitions}
    peer_args = ["--min-seconds", str(min_seconds), "--repetitions", str(repetitions)]
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    tmp = tempfile.TemporaryDirectory(prefix="feedline-bench-")

    def timed(make: Callable[[], Any], rows_of: Callable[[Any], int], whole: bool) -> float:
        return _common.measure(
            make, rows_of, min_seconds=min_seconds, repetitions=repetitions, whole_epochs=whole
        ).rate

    for name in names:
        row: dict[str, Any] = {
            "workload": name,
            "feedline": None,
            "tf.data": None,
            "dataloader": None,
        }
        note = ""
        if name == "B5":
            reason = b5_unavailable()
            if reason is not None:
                print(f"B5 skipped: {reason}", file=sys.stderr)
                row["note"] = f"skipped: {reason}"
                rows.append(row)
                continue
            data["tfrecord"] = os.path.join(tmp.name, "images.tfrecord")
            write_tfrecord(data["tfrecord"], x, y)
        whole = name not in ("B4", "B6", "W1")
        print(f"{name}: feedline ...", file=sys.stderr, flush=True)
        ds, rows_of = feedline_dataset(name, data)
        if name == "B6" and args.b6_chunk_seconds:
            import feedline.data.ops.map as map_module

            map_module._CHUNK_SECONDS = args.b6_chunk_seconds
            extra["b6_chunk_seconds"] = args.b6_chunk_seconds
        row["feedline"] = timed(lambda ds=ds: ds, rows_of, whole)
        if name == "B6":
            one = feedline_b6(data["busy_iterations"], 1)
            row["feedline_1_worker"] = timed(lambda one=one: one, _rows_array, whole)
            row["machine_2_over_1"] = _common.process_scaling(
                data["busy_iterations"], min_seconds, repetitions
            )
        if not args.no_tf:
            print(f"{name}: tf.data ...", file=sys.stderr, flush=True)
            tf_args = [*peer_args, "--only", name]
            if name == "B5":
                tf_args += ["--tfrecord", data["tfrecord"]]
            if name == "B6":
                tf_args += ["--busy-iterations", str(data["busy_iterations"]), "--parallel", "2"]
            tf = run_tf_peer(tf_args)
            if isinstance(tf, dict):
                row["tf.data"] = tf[name]["rate"]
                extra["tensorflow"] = tf.get("tensorflow")
            else:
                note = tf
                print(f"{name}: {tf}", file=sys.stderr)
        if not args.no_torch:
            loader = dataloader(name, data)
            if loader is not None:
                print(f"{name}: DataLoader ...", file=sys.stderr, flush=True)
                row["dataloader"] = timed(lambda loader=loader: loader, _rows_first, whole)
                if name == "B6":
                    one_loader = dataloader(name, data, workers=1)
                    row["dataloader_1_worker"] = timed(
                        lambda one_loader=one_loader: one_loader, _rows_first, whole
                    )
                    del one_loader
                del loader
        if note:
            row["note"] = note
        rows.append(row)
        print(
            f"{name}: feedline {_fmt_rate(row['feedline'])}  tf.data {_fmt_rate(row['tf.data'])}"
            f"  DataLoader {_fmt_rate(row['dataloader'])} rows/s",
            file=sys.stderr,
            flush=True,
        )

    memory = measure_memory() if "B1" in names else None
    print_report(rows, memory, timing, data.get("busy_iterations"))
    _common.write_results(
        "data_pipeline",
        {
            "per_element": args.per_element,
            "timing": timing,
            "busy_iterations": data.get("busy_iterations"),
            "rows": rows,
            "memory": memory,
            **extra,
        },
    )


def print_report(
    rows: list[dict[str, Any]],
    memory: dict[str, Any] | None,
    timing: dict[str, Any],
    busy_iterations: int | None,
) -> None:
    """The table of rates and ratios, B6's scaling and B1's memory, as Markdown."""
    print(
        f"\nrows/s, best of {timing['repetitions']} runs of >= {timing['min_seconds']} s "
        f"({os.cpu_count()} CPUs)\n"
    )
    print(
        "| workload | feedline | tf.data | DataLoader | feedline / tf.data "
        "| feedline / DataLoader | target (vs tf.data) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        name = row["workload"]
        if "note" in row and row["feedline"] is None:
            print(f"| {name} | {row['note']} | | | | | ≥ {TARGETS[name]}x |")
            continue
        ratio = _fmt_ratio(row["feedline"], row["tf.data"])
        print(
            f"| {name} | {_fmt_rate(row['feedline'])} | {_fmt_rate(row['tf.data'])} | "
            f"{_fmt_rate(row['dataloader'])} | {ratio} | "
            f"{_fmt_ratio(row['feedline'], row['dataloader'])} | ≥ {TARGETS[name]}x |"
        )
    for row in rows:
        if row["workload"] == "B6" and row["feedline"] is not None:
            print(
                f"\nB6 ({busy_iterations} loop iterations, ~50 µs/element): feedline 2 workers / 1 "
                f"worker = {_fmt_ratio(row['feedline'], row.get('feedline_1_worker'))} "
                f"(target ≥ {TARGETS['B6']}x; 1 worker: {_fmt_rate(row.get('feedline_1_worker'))} "
                f"rows/s); DataLoader 2 / 1 workers = "
                f"{_fmt_ratio(row['dataloader'], row.get('dataloader_1_worker'))}; tf.data is "
                "num_parallel_calls=2 with tf.py_function; the machine itself: 2 processes of "
                f"the same loop do {row.get('machine_2_over_1', 0):.2f}x the work of 1"
            )
    if memory:
        size = _common.NUM_IMAGES * (int(np.prod(_common.IMAGE_SHAPE)) + 1)
        print(f"\nB1 peak memory (one epoch, fresh process; arrays: {size / 2**20:.1f} MiB)\n")
        print("| framework | peak RSS - RSS before | / arrays | tracemalloc peak |")
        print("|---|---:|---:|---:|")
        for framework, probe in memory.items():
            if not probe:
                print(f"| {framework} | failed | | |")
                continue
            delta = probe["peak_delta"]
            traced = probe.get("tracemalloc_peak")
            traced_text = (
                "—" if traced is None else f"{traced / 2**20:.1f} MiB ({traced / size:.2f}x)"
            )
            print(
                f"| {framework} | {delta / 2**20:.1f} MiB | {delta / size:.2f}x | {traced_text} |"
            )


if __name__ == "__main__":
    main()
