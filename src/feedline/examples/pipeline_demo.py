"""A tour of feedline.data: ``feedline pipeline-demo [--examples N] [--batch-size B]``.

It builds a Fashion-MNIST-shaped input pipeline (60,000 28x28 uint8 images), measures its rate,
saves the iterator's state mid-epoch and shows that a restored iterator continues with exactly the
same batches, then prints the seeds' distributed-input tables for plain datasets.
"""

from __future__ import annotations

import pickle
import sys
import time

import numpy as np

import feedline.data as fd


def _images(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28, 1), np.uint8), rng.integers(0, 10, n, np.uint8)


def _normalise(image: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return image.astype(np.float32) / 255.0, label.astype(np.int64)


def build_pipeline(images: np.ndarray, labels: np.ndarray, batch_size: int) -> fd.Dataset:
    return (
        fd.Dataset.from_tensor_slices((images, labels))
        .shuffle(len(images), seed=42)
        .batch(batch_size)
        .map(_normalise, num_parallel_calls=fd.AUTOTUNE)
        .prefetch(fd.AUTOTUNE)
    )


def run(*, examples: int = 60_000, batch_size: int = 64) -> int:
    """Runs the tour; the exit code: 0 when the restored iterator went on identically.

    Args:
      examples: images in the dataset.
      batch_size: images per batch.
    """
    images, labels = _images(examples)
    dataset = build_pipeline(images, labels, batch_size)
    print(f"pipeline: {dataset.element_spec}")
    print(f"batches per epoch: {len(dataset)}")

    start = time.perf_counter()
    seen = sum(len(batch[1]) for batch in dataset)
    seconds = time.perf_counter() - start
    print(f"one epoch: {seen} examples in {seconds:.2f} s ({seen / seconds:,.0f} examples/s)")

    iterator = iter(dataset)
    for _ in range(10):
        next(iterator)
    state = pickle.dumps(iterator.get_state())
    expected = [next(iterator)[1] for _ in range(3)]
    restored = iter(dataset)
    restored.set_state(pickle.loads(state))
    again = [next(restored)[1] for _ in range(3)]
    same = all(np.array_equal(a, b) for a, b in zip(expected, again, strict=True))
    print(f"checkpoint after 10 batches ({len(state):,} bytes): restored run identical: {same}")
    iterator.close()
    restored.close()

    print("Dataset.range(6).batch(4):", [b.tolist() for b in fd.Dataset.range(6).batch(4)])
    return 0 if same else 1


if __name__ == "__main__":  # python -m feedline.examples.pipeline_demo [OPTIONS]
    from feedline.cli import main

    raise SystemExit(main(["pipeline-demo", *sys.argv[1:]]))
