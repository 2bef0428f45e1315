"""The custom training tutorial with ``MirroredStrategy``, in feedline: ``feedline demo``.

It follows TensorFlow's "Custom training with tf.distribute.Strategy" tutorial on Fashion-MNIST:
the seed's CNN trained with Adam under ``MirroredStrategy`` (two logical CPU replicas by default,
every GPU where there are GPUs), distributed train and test datasets, the loss divided by the
global batch size, metrics, a checkpoint every 2 epochs, then the last checkpoint restored into a
new model without a strategy and evaluated, and the variant that iterates with an explicit
iterator for a fixed number of steps.

Fashion-MNIST is read from ``--data-dir``, ``$FEEDLINE_DATA_DIR`` or the cache (downloaded there
where the network allows). Without it, the demo trains on scikit-learn's bundled 8x8 digits and
says so in one line.

    feedline demo --epochs 10 --replicas 2

On a cluster the same program trains under ``MultiWorkerMirroredStrategy``: ``--workers N``
starts N worker processes on this machine through torchrun's launcher; started by ``torchrun``
or with ``TF_CONFIG`` on each machine, each process is one worker. The chief (worker 0) prints,
writes the checkpoints and evaluates the restored model; every worker trains.

    feedline demo --workers 2
    torchrun --nnodes 2 --node-rank R --nproc-per-node 1 --master-addr HOST --master-port 29500 \
        -m feedline.cli demo --checkpoint-dir /shared/ckpt

The command line (``feedline.cli``) parses the options and calls ``run`` or, for ``--workers``,
``launch_workers``. On a terminal a progress bar shows each epoch's steps; in a log, each
epoch is one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

import feedline.data as fd
import feedline.distribute as fdist
import feedline.metrics
import feedline.nn
import feedline.train
from feedline._net.ports import free_port
from feedline.datasets import digits, fashion_mnist
from feedline.errors import NotFoundError
from feedline.examples._progress import progress_bar

TEMPLATE = "Epoch {}, Loss: {}, Accuracy: {}, Test Loss: {}, Test Accuracy: {}"


def create_model(image_size: int = 28) -> torch.nn.Module:
    """The seed's CNN: two 3x3 convolutions with max pooling, then two dense layers.

    Images smaller than 28x28 (the 8x8 digits) use 'same' padding so that the two poolings fit.
    """
    padding = 0 if image_size >= 28 else 1
    size = image_size
    for _ in range(2):
        size = (size - 2 + 2 * padding) // 2
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=padding),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=padding),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(64 * size * size, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def load(
    data_dir: str | None, say: Callable[[str], None] = print
) -> tuple[str, tuple[np.ndarray, ...]]:
    """Fashion-MNIST where its files are available, else the bundled digits."""
    try:
        (x_train, y_train), (x_test, y_test) = fashion_mnist.load_data(data_dir)
        name = "Fashion-MNIST"
    except NotFoundError:
        say("Fashion-MNIST is not available offline; training on scikit-learn's 8x8 digits.")
        (x_train, y_train), (x_test, y_test) = digits.load_data()
        name = "digits"
    # As the seed: add the channel axis and scale to [0, 1]; PyTorch wants channels first.
    x_train = (x_train[:, None] / np.float32(255)).astype(np.float32)
    x_test = (x_test[:, None] / np.float32(255)).astype(np.float32)
    return name, (x_train, y_train.astype(np.int64), x_test, y_test.astype(np.int64))


def in_cluster() -> bool:
    """Whether this process is one worker of a cluster (torchrun's environment or TF_CONFIG)."""
    from feedline.distribute.cluster_resolver import multi_worker_environment

    return multi_worker_environment() > 1


def make_strategy(replicas: int | None) -> fdist.Strategy:
    """MultiWorkerMirroredStrategy in a cluster (``replicas`` logical CPU replicas per worker,
    default 1), else MirroredStrategy (every GPU, or ``replicas`` logical CPU replicas,
    default 2)."""
    if in_cluster():
        cpus = None if torch.cuda.is_available() else [f"cpu:{i}" for i in range(replicas or 1)]
        return fdist.MultiWorkerMirroredStrategy(devices=cpus)
    if torch.cuda.is_available():
        return fdist.MirroredStrategy()
    return fdist.MirroredStrategy([f"cpu:{i}" for i in range(replicas or 2)])


def launch_workers(workers: int, argv: Sequence[str], timeout: float | None = None) -> int:
    """Runs ``feedline demo ARGV`` as ``workers`` processes on this machine through torchrun's
    launcher (``torch.distributed.run``); the exit code is the launcher's."""
    port = free_port()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
        "--nproc-per-node", str(workers), "--master-addr", "127.0.0.1",
        "--master-port", str(port), "-m", "feedline.cli", "demo", *argv,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    process = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        return process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()


class _Progress:
    """The epoch a run has reached: saved with the checkpoints so that --resume goes on."""

    def __init__(self) -> None:
        self.epoch = 0

    def get_state(self) -> dict[str, int]:
        return {"epoch": self.epoch}

    def set_state(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])


def run(
    *,
    epochs: int | None = None,
    replicas: int | None = None,
    data_dir: str | None = None,
    checkpoint_dir: str | None = None,
    resume: bool = False,
    seed: int = 0,
) -> int:
    """Trains, checkpoints, restores and evaluates as the tutorial does; the exit code (0).

    In a cluster (torchrun's environment or ``TF_CONFIG``) this process is one worker.

    Args:
      epochs: epochs to train; default 10 on Fashion-MNIST, 40 on the digits.
      replicas: logical CPU replicas where there is no GPU: default 2, or 1 per worker.
      data_dir: folder with Fashion-MNIST's ``.gz`` files (default: ``$FEEDLINE_DATA_DIR`` or
        the cache).
      checkpoint_dir: where checkpoints go; default a new temporary folder.
      resume: go on from the latest checkpoint in ``checkpoint_dir``.
      seed: the shuffle's and the model's seed.
    """
    torch.manual_seed(seed)
    started = time.perf_counter()

    strategy = make_strategy(replicas)
    chief = strategy.extended.should_checkpoint
    show = print if chief else _quiet  # the chief speaks for the cluster
    name, (train_images, train_labels, test_images, test_labels) = load(data_dir, show)
    if epochs is None:
        # The digits have 1,438 training images: 12 steps an epoch, so they need more epochs.
        epochs = 10 if name == "Fashion-MNIST" else 40
    if strategy.extended.num_workers > 1:
        show(f"Number of workers: {strategy.extended.num_workers}")
    show(f"Number of devices: {strategy.num_replicas_in_sync}")

    buffer_size = len(train_images)
    batch_size_per_replica = 64
    global_batch_size = batch_size_per_replica * strategy.num_replicas_in_sync
    train_dataset = (
        fd.Dataset.from_tensor_slices((train_images, train_labels))
        .shuffle(buffer_size, seed=seed)
        .batch(global_batch_size)
    )
    test_dataset = fd.Dataset.from_tensor_slices((test_images, test_labels)).batch(
        global_batch_size
    )
    train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
    test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)

    checkpoint_dir = checkpoint_dir or tempfile.mkdtemp(prefix="feedline-demo-")
    checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt")
    progress = _Progress()
    # The model, optimizer and checkpoint are created under the strategy's scope.
    with strategy.scope():
        model = create_model(train_images.shape[-1])
        optimizer = torch.optim.Adam(model.parameters())
        checkpoint = feedline.train.Checkpoint(optimizer=optimizer, model=model, progress=progress)
    if resume:
        latest = feedline.train.latest_checkpoint(checkpoint_dir)
        checkpoint.restore(latest)
        show(f"Resumed from {latest} after epoch {progress.epoch}")

    loss_object = torch.nn.CrossEntropyLoss(reduction="none")

    def compute_loss(labels: torch.Tensor, predictions: torch.Tensor) -> torch.Tensor:
        per_example_loss = loss_object(predictions, labels)
        return feedline.nn.compute_average_loss(
            per_example_loss, global_batch_size=global_batch_size
        )

    with strategy.scope():  # metrics made in the scope read every worker's updates
        test_loss = feedline.metrics.Mean(name="test_loss")
        train_accuracy = feedline.metrics.SparseCategoricalAccuracy(name="train_accuracy")
        test_accuracy = feedline.metrics.SparseCategoricalAccuracy(name="test_accuracy")

    def train_step(inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        images, labels = inputs
        model.train()
        optimizer.zero_grad()
        predictions = model(images)
        loss = compute_loss(labels, predictions)
        loss.backward()
        optimizer.step()
        train_accuracy.update_state(labels, predictions.detach())
        return loss.detach()

    def test_step(inputs: tuple[torch.Tensor, torch.Tensor]) -> None:
        images, labels = inputs
        model.eval()
        with torch.no_grad():
            predictions = model(images)
            t_loss = loss_object(predictions, labels)
        test_loss.update_state(t_loss)
        test_accuracy.update_state(labels, predictions)

    def distributed_train_step(dataset_inputs: object) -> torch.Tensor:
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce(fdist.ReduceOp.SUM, per_replica_losses, axis=None)

    def distributed_test_step(dataset_inputs: object) -> None:
        strategy.run(test_step, args=(dataset_inputs,))

    steps_per_epoch = -(-len(train_images) // global_batch_size)
    final_test_accuracy = float("nan")
    for epoch in range(progress.epoch, epochs):
        total_loss, num_batches = 0.0, 0
        # On a terminal, a bar over the epoch's steps; in a log, the epoch's line below only.
        bar = progress_bar(
            train_dist_dataset, total=steps_per_epoch, desc=f"epoch {epoch + 1}", enabled=chief
        )
        for x in bar:
            total_loss += float(distributed_train_step(x))
            num_batches += 1
            bar.set_postfix(loss=f"{total_loss / num_batches:.4f}")
        train_loss = total_loss / num_batches
        for x in test_dist_dataset:
            distributed_test_step(x)
        progress.epoch = epoch + 1
        if epoch % 2 == 0:  # every worker saves; the chief alone writes the file
            checkpoint.save(checkpoint_prefix)
        # Under several workers, result() is over all of them: every worker asks, together.
        final_test_accuracy = float(test_accuracy.result())
        show(
            TEMPLATE.format(
                epoch + 1,
                train_loss,
                float(train_accuracy.result()) * 100,
                float(test_loss.result()),
                final_test_accuracy * 100,
            )
        )
        test_loss.reset_state()
        train_accuracy.reset_state()
        test_accuracy.reset_state()

    # Restore the latest checkpoint into a new model, without a strategy, and evaluate it.
    restored_accuracy = float("nan")
    if chief:
        restored_accuracy = evaluate_restored(checkpoint_dir, train_images.shape[-1], test_dataset)
        print(
            f"Accuracy after restoring the saved model without strategy: {restored_accuracy * 100}"
        )

    # Iterating with an explicit iterator, a fixed number of steps per "epoch".
    for _ in range(2):
        total_loss, num_batches = 0.0, 0
        train_iter = iter(train_dist_dataset)
        for _ in range(10):
            total_loss += float(distributed_train_step(next(train_iter)))
            num_batches += 1
        accuracy = float(train_accuracy.result()) * 100
        show(f"Epoch {epochs}, Loss: {total_loss / num_batches}, Accuracy: {accuracy}")
        train_accuracy.reset_state()

    seconds = time.perf_counter() - started
    workers = strategy.extended.num_workers
    show(
        f"Summary: {name}, {strategy.num_replicas_in_sync} replicas"
        + (f" on {workers} workers" if workers > 1 else "")
        + f", {epochs} epochs, test accuracy {final_test_accuracy * 100:.2f}% "
        f"(restored without strategy: {restored_accuracy * 100:.2f}%), {seconds:.0f} s; "
        f"checkpoints in {checkpoint_dir}"
    )
    return 0


def evaluate_restored(checkpoint_dir: str, image_size: int, test_dataset: fd.Dataset) -> float:
    """The test accuracy of the latest checkpoint restored into a new model, no strategy."""
    new_model = create_model(image_size)
    new_optimizer = torch.optim.Adam(new_model.parameters())
    restored = feedline.train.Checkpoint(optimizer=new_optimizer, model=new_model)
    latest = feedline.train.latest_checkpoint(checkpoint_dir)
    restored.restore(latest).expect_partial()
    eval_accuracy = feedline.metrics.SparseCategoricalAccuracy(name="eval_accuracy")
    new_model.eval()
    with torch.no_grad():
        for images, labels in test_dataset.as_torch():  # torch tensors, not NumPy arrays
            eval_accuracy.update_state(labels, new_model(images))
    return float(eval_accuracy.result())


def _quiet(*args: object, **kwargs: object) -> None:
    """``print`` for workers other than the chief: nothing."""


if __name__ == "__main__":  # python -m feedline.examples.custom_training [OPTIONS]
    from feedline.cli import main

    raise SystemExit(main(["demo", *sys.argv[1:]]))
