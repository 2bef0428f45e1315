"""The TensorFlow side of ``multi_worker.py``; one worker process, under ``.venv-tf/bin/python``.

``tf.distribute.MultiWorkerMirroredStrategy`` over the cluster in ``TF_CONFIG`` (the workers on
127.0.0.1; without ``TF_CONFIG``, one worker alone) with RING (gloo-like) collectives, trains the
tutorial's CNN (tf-keras, the same layers as ``_tf_training_peer.py``) with Adam on ``_common``'s
random Fashion-MNIST-shaped data, the custom loop of the "Custom training with
tf.distribute.Strategy" tutorial::

    @tf.function
    def distributed_train_step(dataset_inputs):
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

over ``experimental_distribute_dataset`` of ``from_tensor_slices((x, y)).shuffle(60000, seed)
.batch(global_batch).repeat()``, sharded by DATA (what AUTO falls back to for in-memory data, and
what feedline does: every worker makes the global batch and keeps its part).

The process is driven by ``multi_worker.py``: after building everything and running the warm-up
steps it prints one JSON line (``{"ready": ...}``), then answers every ``run STEPS`` line on stdin
with one JSON line: one untimed step first (it lines the workers up: every step all-reduces),
then ``STEPS`` steps timed, ``float`` of the summed loss at the end. ``quit`` or the end of input
ends it; ``--child-timeout`` ends it in any case (``signal.alarm``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

import _common
from _tf_training_peer import EpochBatches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--warmup-steps", type=int, default=15)
    parser.add_argument("--intra-op", type=int, default=1, help="0: TensorFlow's default")
    parser.add_argument("--inter-op", type=int, default=1, help="0: TensorFlow's default")
    parser.add_argument("--child-timeout", type=int, default=900)
    args = parser.parse_args()
    signal.alarm(args.child_timeout)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import tf_keras as keras

    # Thread pools must be set, and the strategy made, before TensorFlow's runtime starts.
    if args.intra_op:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op)
    if args.inter_op:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
    )
    tf.random.set_seed(_common.SEED)

    x, y = _common.make_images()
    images = (x / 255.0).astype("float32")  # NHWC, as the tutorial's images[..., None] / 255
    labels = y.astype("int64")
    global_batch = args.global_batch
    dataset = (
        tf.data.Dataset.from_tensor_slices((images, labels))
        .shuffle(_common.NUM_IMAGES, seed=_common.SEED)
        .batch(global_batch)
        .repeat()
    )
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train_dist_dataset = strategy.experimental_distribute_dataset(dataset.with_options(options))

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.layers.Input(shape=_common.IMAGE_SHAPE),
                keras.layers.Conv2D(32, 3, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Conv2D(64, 3, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Flatten(),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        optimizer = keras.optimizers.Adam()
        train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
        loss_object = keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=keras.losses.Reduction.NONE
        )

    def compute_loss(labels: Any, predictions: Any) -> Any:
        per_example_loss = loss_object(labels, predictions)
        return tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch)

    def train_step(inputs: Any) -> Any:
        images, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = compute_loss(labels, predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        train_accuracy.update_state(labels, predictions)
        return loss

    @tf.function
    def distributed_train_step(dataset_inputs: Any) -> Any:
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    iterator = iter(train_dist_dataset)
    batch_sizes = EpochBatches(_common.NUM_IMAGES, global_batch)

    def run_steps(steps: int) -> tuple[float, int]:
        """The mean loss of ``steps`` steps, and their examples (all workers)."""
        total_loss = 0.0
        for _ in range(steps):
            total_loss += distributed_train_step(next(iterator))
        return float(total_loss) / steps, batch_sizes.take(steps)

    run_steps(max(1, args.warmup_steps))
    resolver = strategy.cluster_resolver
    info = {
        "ready": True,
        "framework": f"tensorflow {tf.__version__}, tf-keras {keras.__version__}",
        "workers": len(resolver.cluster_spec().as_dict().get("worker", [])) or 1,
        "task": f"{resolver.task_type}:{resolver.task_id}",
        "replicas_in_sync": strategy.num_replicas_in_sync,
        "intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
        "pid": os.getpid(),
    }
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        if len(words) == 2 and words[0] == "run":
            steps = int(words[1])
            run_steps(1)  # lines the workers up; not timed
            cpu = time.process_time()
            start = time.perf_counter()
            loss, examples = run_steps(steps)
            seconds = time.perf_counter() - start
            answer = {
                "steps": steps,
                "seconds": seconds,
                "cpu_seconds": time.process_time() - cpu,
                "examples": examples,
                "loss": loss,
                "accuracy": float(train_accuracy.result()),
            }
        else:
            answer = {"error": f"unknown command {line.strip()!r}"}
        print(json.dumps(answer), flush=True)
    sys.stdout.flush()
    os._exit(0)  # TensorFlow's teardown can hang on the input pipeline's threads


if __name__ == "__main__":
    main()
