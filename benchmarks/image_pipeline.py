"""An image pipeline as PyTorch users write it: feedline.data against torch's DataLoader.

Usage (from the repository root; needs the ``bench`` extra, i.e. Pillow)::

    PYTHONPATH=src .venv/bin/python benchmarks/image_pipeline.py [--quick] [--rounds N]

JPEG bytes (``--images`` random-ish images of 256-400 px a side, made once at start with Pillow
and kept in memory) -> decode (Pillow) -> random crop 224x224 + random horizontal flip ->
normalised float32 CHW (ImageNet mean and std) -> batches of 64, with an int64 label per image.

Ways, each in a fresh child process (so that the memory of one is not the other's), one after
another in every round so that they see the same machine load:

  feedline-recipe     the documented way (docs/data.md): from_tensor_slices((jpegs, labels))
                      .shuffle(n).map(augment, num_parallel_calls=AUTOTUNE).batch(64)
                      .map(normalise_batch, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE):
                      decode, crop and flip per image to uint8, the float arithmetic per batch
                      (the same float32 operations, so the same bits)
  feedline-threads    the per-image transform as DataLoader runs it:
                      from_tensor_slices((jpegs, labels)).shuffle(n)
                      .map(decode_and_augment, num_parallel_calls=AUTOTUNE).batch(64)
                      .prefetch(AUTOTUNE)
  feedline-processes  the same with map(..., use_processes=True)
  feedline-unfused    (only with --ways) feedline-threads with
                      Options.experimental_optimization.map_and_batch_fusion = False: map's
                      threads hand each element to batch, which stacks them
  dataloader          DataLoader(<map-style dataset applying decode_and_augment>, batch_size=64,
                      shuffle=True, num_workers=2, persistent_workers=True)
  dataloader-recipe   (only with --ways) the recipe's two halves in DataLoader: the dataset
                      returns augment's uint8 image, the collate_fn stacks and normalise_batch-es
                      in the workers: the like-for-like check of the recipe

Each child takes its first batches as a warm-up (worker start-up is reported apart, as the time
to the first batch), then counts images for ``--seconds`` over as many epochs as that takes (each
epoch a fresh iterator, as a training loop makes them). The parent samples the child's process
tree every 20 ms: the sum of RSS of the child and all its descendants, and the sum of PSS (which
counts pages shared between a parent and its forked workers once, shared out). The child also
reports the CPU seconds (user + system) its process tree used in the timed seconds, per image:
on a shared machine a steadier figure of what each way costs than its rate.

Then, in this process, where the time goes: one thread, per stage (decode, crop + flip,
normalise, batching with np.stack), and feedline's other costs: the wall time of an inline
(``num_parallel_calls=None``) feedline epoch less the time spent in the function and the stack.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import pickle
import random
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

import _common

BATCH = 64
CROP = 224
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
WAYS = ("feedline-recipe", "feedline-threads", "feedline-processes", "dataloader")
OTHER_WAYS = ("feedline-unfused", "dataloader-recipe")
GOAL = 1.5


# -- the data and the transform ---------------------------------------------------------------


def make_jpegs(n: int, seed: int = _common.SEED) -> tuple[list[bytes], np.ndarray]:
    """``n`` JPEGs (quality 90) of smooth random colour fields with some noise, 256-400 px a
    side, and int64 labels in [0, 1000); the same for a seed."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    jpegs = []
    for _ in range(n):
        w, h = (int(v) for v in rng.integers(256, 401, size=2))
        coarse = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
        image = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BILINEAR))
        noisy = np.clip(image + rng.normal(0, 12, size=image.shape), 0, 255).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(noisy).save(out, format="JPEG", quality=90)
        jpegs.append(out.getvalue())
    labels = rng.integers(0, 1000, size=n, dtype=np.int64)
    return jpegs, labels


def decode(data: bytes) -> Any:
    """The JPEG as an RGB Pillow image, decoded (Pillow releases the GIL while decoding)."""
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def crop_flip(image: Any) -> Any:
    """A random 224x224 crop, flipped left-right half of the time (Pillow operations)."""
    from PIL import Image

    w, h = image.size
    left = random.randrange(w - CROP + 1)
    top = random.randrange(h - CROP + 1)
    image = image.crop((left, top, left + CROP, top + CROP))
    if random.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return image


def normalise(image: Any) -> np.ndarray:
    """The image as float32 CHW, scaled to [0, 1] and normalised per channel."""
    array = np.asarray(image, dtype=np.float32)
    array *= np.float32(1 / 255)
    array -= MEAN
    array /= STD
    return np.ascontiguousarray(array.transpose(2, 0, 1))


def decode_and_augment(data: Any, label: Any) -> tuple[np.ndarray, Any]:
    """One element: JPEG bytes (a 0-d object array from feedline, bytes from DataLoader's
    dataset) to a normalised 3x224x224 float32 array, and the label."""
    if isinstance(data, np.ndarray):
        data = data.item()
    return normalise(crop_flip(decode(data))), label


def augment(data: Any, label: Any) -> tuple[np.ndarray, Any]:
    """The recipe's per-element half: JPEG bytes to the cropped, flipped 224x224x3 uint8 image."""
    if isinstance(data, np.ndarray):
        data = data.item()
    return np.asarray(crop_flip(decode(data))), label


def normalise_batch(images: np.ndarray, labels: Any) -> tuple[np.ndarray, Any]:
    """The recipe's per-batch half: uint8 NHWC images to normalised float32 NCHW, the same
    float32 operations as :func:`normalise` (so the same bits), fused into three passes over the
    batch: the cast, the CHW transpose and the scale in one, then the subtraction and the division.
    """
    images = np.asarray(images)
    out = np.empty((images.shape[0], 3, *images.shape[1:3]), dtype=np.float32)
    np.multiply(images.transpose(0, 3, 1, 2), np.float32(1 / 255), out=out, casting="unsafe")
    out -= MEAN[:, None, None]
    out /= STD[:, None, None]
    return out, labels


class JpegDataset:
    """The DataLoader peer's map-style dataset: the same transform per item."""

    def __init__(self, jpegs: list[bytes], labels: np.ndarray) -> None:
        self.jpegs = jpegs
        self.labels = labels

    def __len__(self) -> int:
        return len(self.jpegs)

    def __getitem__(self, i: int) -> tuple[np.ndarray, Any]:
        return decode_and_augment(self.jpegs[i], self.labels[i])


class JpegCropDataset(JpegDataset):
    """The same split for the peer: uint8 crops per item, normalised per batch by the collate."""

    def __getitem__(self, i: int) -> tuple[np.ndarray, Any]:
        return augment(self.jpegs[i], self.labels[i])


def collate_and_normalise(items: list[tuple[np.ndarray, Any]]) -> tuple[Any, Any]:
    """DataLoader's collate for :class:`JpegCropDataset`: stack, then :func:`normalise_batch`."""
    import torch

    images, labels = normalise_batch(np.stack([x for x, _ in items]), [y for _, y in items])
    return torch.from_numpy(images), torch.as_tensor(np.asarray(labels))


# -- one way, in a child process ----------------------------------------------------------------


def build(way: str, jpegs: list[bytes], labels: np.ndarray) -> Any:
    """The iterable (one epoch per ``iter``) of a way."""
    if way == "feedline-recipe":
        from feedline.data import AUTOTUNE, Dataset

        return (
            Dataset.from_tensor_slices((jpegs, labels))
            .shuffle(len(jpegs))
            .map(augment, num_parallel_calls=AUTOTUNE)
            .batch(BATCH)
            .map(normalise_batch, num_parallel_calls=AUTOTUNE)
            .prefetch(AUTOTUNE)
        )
    if way.startswith("feedline"):
        from feedline.data import AUTOTUNE, Dataset, Options

        dataset = (
            Dataset.from_tensor_slices((jpegs, labels))
            .shuffle(len(jpegs))
            .map(
                decode_and_augment,
                num_parallel_calls=AUTOTUNE,
                use_processes=way == "feedline-processes",
            )
            .batch(BATCH)
            .prefetch(AUTOTUNE)
        )
        if way == "feedline-unfused":
            options = Options()
            options.experimental_optimization.map_and_batch_fusion = False
            dataset = dataset.with_options(options)
        return dataset
    from torch.utils.data import DataLoader

    recipe = way == "dataloader-recipe"
    return DataLoader(
        (JpegCropDataset if recipe else JpegDataset)(jpegs, labels),
        batch_size=BATCH,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        collate_fn=collate_and_normalise if recipe else None,
    )


def child(way: str, data_path: str, seconds: float, warmup_batches: int) -> None:
    """Measures one way and prints its figures as JSON on the last line."""
    with open(data_path, "rb") as f:
        jpegs, labels = pickle.load(f)
    rss_before = _common.rss_bytes()
    iterable = build(way, jpegs, labels)

    def batches() -> Any:
        while True:
            iterator = iter(iterable)
            yield from iterator
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    stream = batches()
    start = time.perf_counter()
    first = next(stream)
    first_batch = time.perf_counter() - start
    assert tuple(first[0].shape) == (BATCH, 3, CROP, CROP), first[0].shape
    assert str(first[0].dtype).endswith("float32"), first[0].dtype
    for _ in range(warmup_batches):
        next(stream)
    images = 0
    cpu = _tree_cpu_seconds(os.getpid())
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        images += len(next(stream)[1])
    elapsed = time.perf_counter() - start
    cpu = _tree_cpu_seconds(os.getpid()) - cpu
    print(
        json.dumps(
            {
                "way": way,
                "images_per_s": images / elapsed,
                "images": images,
                "seconds": elapsed,
                "cpu_ms_per_image": cpu / images * 1e3,
                "first_batch_s": first_batch,
                "rss_before": rss_before,
            }
        ),
        flush=True,
    )
    os._exit(0)  # no waiting on pools' shutdown: the parent has what it needs


# -- the parent: memory of a process tree -------------------------------------------------------


def _descendants(root: int) -> list[int]:
    """``root`` and every process below it, from /proc/*/stat."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(parents.get(pid, ()))
    return tree


def _tree_cpu_seconds(root: int) -> float:
    """User and system CPU seconds of ``root`` and the live processes below it."""
    total = 0
    for pid in _descendants(root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def _rss_pss(pid: int) -> tuple[int, int]:
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        pss = 0
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                    break
        return rss, pss
    except (OSError, ValueError):
        return 0, 0


class TreeSampler(threading.Thread):
    """Samples the summed RSS and PSS of a process tree every ``interval`` seconds; keeps the
    peaks and the most processes seen at once."""

    def __init__(self, root: int, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.interval = interval
        self.peak_rss = 0
        self.peak_pss = 0
        self.processes = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            pids = _descendants(self.root)
            sizes = [_rss_pss(pid) for pid in pids]
            self.peak_rss = max(self.peak_rss, sum(r for r, _ in sizes))
            self.peak_pss = max(self.peak_pss, sum(p for _, p in sizes))
            self.processes = max(self.processes, sum(1 for r, _ in sizes if r))
            self.stop.wait(self.interval)


def run_way(way: str, data_path: str, seconds: float, warmup_batches: int) -> dict[str, Any]:
    """One way in a child process, with its process tree's peak memory."""
    env = dict(os.environ)
    src = str(pathlib.Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--child",
            way,
            "--data",
            data_path,
            "--seconds",
            str(seconds),
            "--warmup-batches",
            str(warmup_batches),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    sampler = TreeSampler(proc.pid)
    sampler.start()
    out, err = proc.communicate(timeout=600)
    sampler.stop.set()
    sampler.join()
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = "\n".join(err.strip().splitlines()[-8:])
        raise RuntimeError(f"{way} failed (exit code {proc.returncode}):\n{tail}")
    result = json.loads(lines[-1])
    result.update(
        peak_tree_rss=sampler.peak_rss,
        peak_tree_pss=sampler.peak_pss,
        processes=sampler.processes,
    )
    return result


# -- where the time goes ------------------------------------------------------------------------


def stages(jpegs: list[bytes], labels: np.ndarray, n: int) -> dict[str, float]:
    """Per-image µs of each stage on one thread (best of 3 passes over ``n`` images), and
    feedline's own per-image cost in an inline epoch over the same images."""
    from feedline.data import Dataset

    jpegs, labels = jpegs[:n], labels[:n]
    best: dict[str, float] = {}
    for _ in range(3):
        times = {"decode": 0.0, "crop_flip": 0.0, "normalise": 0.0, "batch": 0.0}
        rows: list[np.ndarray] = []
        for data in jpegs:
            t0 = time.perf_counter()
            image = decode(data)
            t1 = time.perf_counter()
            image = crop_flip(image)
            t2 = time.perf_counter()
            rows.append(normalise(image))
            t3 = time.perf_counter()
            times["decode"] += t1 - t0
            times["crop_flip"] += t2 - t1
            times["normalise"] += t3 - t2
            if len(rows) == BATCH:
                t4 = time.perf_counter()
                np.stack(rows)
                times["batch"] += time.perf_counter() - t4
                rows = []
        for key, value in times.items():
            best[key] = min(best.get(key, float("inf")), value / len(jpegs) * 1e6)

    # feedline inline: its wall time less the time inside the function.
    inside = [0.0]

    def timed(data: Any, label: Any) -> tuple[np.ndarray, Any]:
        t0 = time.perf_counter()
        try:
            return decode_and_augment(data, label)
        finally:
            inside[0] += time.perf_counter() - t0

    dataset = (
        Dataset.from_tensor_slices((jpegs, labels)).shuffle(len(jpegs)).map(timed).batch(BATCH)
    )
    overhead = float("inf")
    for _ in range(3):
        inside[0] = 0.0
        start = time.perf_counter()
        count = sum(len(b[1]) for b in dataset)
        wall = time.perf_counter() - start
        overhead = min(overhead, (wall - inside[0]) / count * 1e6)
    # The stack of each batch is part of that wall time: the rest is feedline's own.
    best["feedline_other"] = max(0.0, overhead - best["batch"])
    return best


def consumer_cpu(jpegs: list[bytes], labels: np.ndarray, n: int) -> dict[str, float]:
    """CPU µs per image of the thread that takes the batches (the serial part of the pipeline:
    pulling the input, handing out work, collecting and stacking), with ``map`` on 2 threads
    fused with ``batch`` and unfused; the best of 3 epochs over ``n`` images each. Waiting is
    not CPU time, so this holds on a loaded machine."""
    from feedline.data import Dataset, Options

    jpegs, labels = jpegs[:n], labels[:n]
    out = {}
    for name, fused in (("fused", True), ("unfused", False)):
        options = Options()
        options.experimental_optimization.map_and_batch_fusion = fused
        dataset = (
            Dataset.from_tensor_slices((jpegs, labels))
            .shuffle(n)
            .map(decode_and_augment, num_parallel_calls=2)
            .batch(BATCH)
            .with_options(options)
        )
        best = float("inf")
        for _ in range(3):
            iterator = iter(dataset)
            next(iterator)  # the first batch starts the threads
            start, count = time.thread_time(), 0
            for batch in iterator:
                count += len(batch[1])
            best = min(best, (time.thread_time() - start) / max(count, 1) * 1e6)
            iterator.close()
        out[name] = best
    return out


# -- main ---------------------------------------------------------------------------------------


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="500 images, 1 round, 3 s runs")
    parser.add_argument("--images", type=int, default=None, help="default 2000")
    parser.add_argument("--rounds", type=int, default=None, help="default 3")
    parser.add_argument("--seconds", type=float, default=None, help="timed seconds per run")
    parser.add_argument("--warmup-batches", type=int, default=4)
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--no-stages", action="store_true", help="skip the per-stage timing")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        child(args.child, args.data, args.seconds, args.warmup_batches)
        return

    n = args.images or (500 if args.quick else 2000)
    rounds = args.rounds or (1 if args.quick else 3)
    seconds = args.seconds or (3.0 if args.quick else 12.0)
    ways = [w for w in args.ways.split(",") if w]
    unknown = sorted(set(ways) - set(WAYS + OTHER_WAYS))
    if unknown:
        parser.error(f"unknown ways {unknown}; known: {', '.join(WAYS + OTHER_WAYS)}")
    print(f"load average at start: {_load()}; {os.cpu_count()} CPUs")
    start = time.perf_counter()
    jpegs, labels = make_jpegs(n)
    size = sum(len(j) for j in jpegs)
    print(
        f"{n} JPEGs, {_mib(size)} MiB in all ({size / n / 1024:.0f} KiB each), "
        f"made in {time.perf_counter() - start:.1f} s"
    )

    results: list[list[dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        data_path = os.path.join(tmp, "jpegs.pickle")
        with open(data_path, "wb") as f:
            pickle.dump((jpegs, labels), f)
        for r in range(rounds):
            row = []
            for way in ways:
                load = _load()
                result = run_way(way, data_path, seconds, args.warmup_batches)
                result["load"] = load
                row.append(result)
                print(
                    f"round {r + 1} {way:<19} {result['images_per_s']:8,.0f} images/s  "
                    f"{result['cpu_ms_per_image']:.2f} CPU ms/image  "
                    f"first batch {result['first_batch_s']:.2f} s  "
                    f"peak tree RSS {_mib(result['peak_tree_rss'])} MiB, "
                    f"PSS {_mib(result['peak_tree_pss'])} MiB "
                    f"({result['processes']} processes)  load {load}",
                    flush=True,
                )
            results.append(row)

    print(
        "\n| round | way | images/s | / DataLoader | CPU ms / image | first batch (s) "
        "| RSS before (MiB) "
        "| peak tree RSS (MiB) | peak tree PSS (MiB) | processes | load (1, 5, 15 min) |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r, row in enumerate(results, 1):
        base = next((x for x in row if x["way"] == "dataloader"), None)
        for x in row:
            ratio = f"{x['images_per_s'] / base['images_per_s']:.2f}x" if base else "—"
            print(
                f"| {r} | {x['way']} | {x['images_per_s']:,.0f} | {ratio} "
                f"| {x['cpu_ms_per_image']:.2f} "
                f"| {x['first_batch_s']:.2f} | {_mib(x['rss_before'])} "
                f"| {_mib(x['peak_tree_rss'])} "
                f"| {_mib(x['peak_tree_pss'])} | {x['processes']} | {x['load']} |"
            )
    if "dataloader" in ways:
        print(f"\ngoal: feedline / DataLoader >= {GOAL}x at no more peak memory")

    profile = None
    if not args.no_stages:
        profile = stages(jpegs, labels, min(n, 256 if args.quick else 640))
        total = sum(profile.values())
        print("\nwhere the time goes, one thread, µs per image (best of 3):\n")
        print("| stage | µs / image | share |")
        print("|---|---:|---:|")
        for key, value in profile.items():
            print(f"| {key} | {value:,.0f} | {value / total:.0%} |")
        print(f"| total | {total:,.0f} | → {1e6 / total:,.0f} images/s per core |")
        consumer = consumer_cpu(jpegs, labels, min(n, 320))
        profile.update({f"consumer_thread_{k}": v for k, v in consumer.items()})
        print(
            "\nthe thread that takes the batches, CPU µs per image (map on 2 threads, best of 3): "
            f"fused with batch {consumer['fused']:,.0f}, unfused {consumer['unfused']:,.0f}"
        )

    _common.write_results(
        "image_pipeline",
        {"images": n, "jpeg_bytes": size, "rounds": results, "stages_us_per_image": profile},
    )


if __name__ == "__main__":
    main()
