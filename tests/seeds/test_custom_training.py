"""Seed 004 (the Spanish "Entrenamiento personalizado con tf.distribute.Strategy"): every block.

The tutorial trains a Keras CNN on Fashion-MNIST under ``MirroredStrategy()`` (one GPU: "Number of
devices: 1"). The port trains the same CNN in PyTorch, on scikit-learn's 8x8 digits (offline, a
few seconds; ``'same'`` padding so that two 3x3 convolutions and poolings fit in 8x8) for
``EPOCHS = 3`` instead of 10, on the one CPU replica. Lines rewritten for PyTorch say so in a
comment; ``docs/porting.md`` lists every kind of rewrite.

Blocks (16): all run. Printed outputs compared: block 4 ("Number of devices: 1") through
``normalise``; the four tables (blocks 13-16) line by line against the page's own lines, with
each number free (the data, the epochs and the random start differ) but what the page's code
fixes kept: the epoch numbers, the line format, accuracies that count whole examples, and the
restored model's accuracy, which is the test accuracy of the epoch whose checkpoint was restored
(the page: 91.0199966430664 after restoring epoch 9's checkpoint, its epoch 9 test accuracy).
Blocks 1, 3, 6 and 10 print only TensorFlow's version or its logs.
"""

from __future__ import annotations

import re

import pytest

from tests.seeds._support import check_snippet, expected, run_page

EPOCHS = 3
TABLES = {"004_13", "004_14", "004_15", "004_16"}  # compared by the table tests below

SNIPPETS = [
    (
        "004_01",
        """
# Import TensorFlow
import feedline as tf

# Helper libraries
import numpy as np
import os
import torch  # added: PyTorch takes Keras' place

print(tf.__version__)
""",
    ),
    (
        "004_02",
        """
from feedline.datasets import digits as fashion_mnist  # tf.keras.datasets.fashion_mnist

(train_images, train_labels), (test_images, test_labels) = fashion_mnist.load_data()

# Adding a dimension to the array -> new shape == (28, 28, 1)
# We are doing this because the first layer in our model is a convolutional
# layer and it requires a 4D input (batch_size, height, width, channels).
# batch_size dimension will be added later on.
train_images = train_images[:, None]  # [..., None]: PyTorch puts channels first
test_images = test_images[:, None]  # [..., None]

# Getting the images in [0, 1] range.
train_images = train_images / np.float32(255)
test_images = test_images / np.float32(255)
""",
    ),
    (
        "004_03",
        """
# If the list of devices is not specified in the
# `tf.distribute.MirroredStrategy` constructor, it will be auto-detected.
strategy = tf.distribute.MirroredStrategy()
""",
    ),
    (
        "004_04",
        """
print ('Number of devices: {}'.format(strategy.num_replicas_in_sync))
""",
    ),
    (
        "004_05",
        f"""
BUFFER_SIZE = len(train_images)

BATCH_SIZE_PER_REPLICA = 64
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync

EPOCHS = {EPOCHS}  # the page trains 10 epochs
""",
    ),
    (
        "004_06",
        """
train_dataset = tf.data.Dataset.from_tensor_slices((train_images, train_labels)).shuffle(BUFFER_SIZE).batch(GLOBAL_BATCH_SIZE)
test_dataset = tf.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(GLOBAL_BATCH_SIZE)

train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)
""",  # noqa: E501
    ),
    (
        "004_07",
        """
def create_model():
  model = torch.nn.Sequential(  # tf.keras.Sequential([
      torch.nn.Conv2d(1, 32, 3, padding='same'), torch.nn.ReLU(),  # Conv2D(32, 3, activation='relu')
      torch.nn.MaxPool2d(2),  # MaxPooling2D()
      torch.nn.Conv2d(32, 64, 3, padding='same'), torch.nn.ReLU(),  # Conv2D(64, 3, activation='relu')
      torch.nn.MaxPool2d(2),  # MaxPooling2D()
      torch.nn.Flatten(),  # Flatten()
      torch.nn.LazyLinear(64), torch.nn.ReLU(),  # Dense(64, activation='relu')
      torch.nn.Linear(64, 10)  # Dense(10)
    )

  return model
""",  # noqa: E501
    ),
    (
        "004_08",
        """
# Create a checkpoint directory to store the checkpoints.
checkpoint_dir = './training_checkpoints'
checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt")
""",
    ),
    (
        "004_09",
        """
with strategy.scope():
  # Set reduction to `none` so we can do the reduction afterwards and divide by
  # global batch size.
  def loss_object(labels, predictions):  # tf.keras.losses.SparseCategoricalCrossentropy(
    return torch.nn.functional.cross_entropy(  # from_logits=True,
        predictions, labels.long(), reduction='none')  # reduction=tf.keras.losses.Reduction.NONE)
  def compute_loss(labels, predictions):
    per_example_loss = loss_object(labels, predictions)
    return tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH_SIZE)
""",
    ),
    (
        "004_10",
        """
with strategy.scope():
  test_loss = tf.metrics.Mean(name='test_loss')  # tf.keras.metrics -> tf.metrics

  train_accuracy = tf.metrics.SparseCategoricalAccuracy(
      name='train_accuracy')
  test_accuracy = tf.metrics.SparseCategoricalAccuracy(
      name='test_accuracy')
""",
    ),
    (
        "004_11",
        """
# model, optimizer, and checkpoint must be created under `strategy.scope`.
with strategy.scope():
  model = create_model()

  optimizer = torch.optim.Adam(model.parameters())  # tf.keras.optimizers.Adam()

  checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)
""",
    ),
    (
        "004_12",
        """
def train_step(inputs):
  images, labels = inputs

  optimizer.zero_grad()  # with tf.GradientTape() as tape:
  predictions = model(images)  # training=True (no dropout or batch norm here)
  loss = compute_loss(labels, predictions)

  loss.backward()  # gradients = tape.gradient(loss, model.trainable_variables)
  optimizer.step()  # optimizer.apply_gradients(zip(gradients, model.trainable_variables))

  train_accuracy.update_state(labels, predictions)
  return loss

def test_step(inputs):
  images, labels = inputs

  predictions = model(images)  # training=False
  t_loss = loss_object(labels, predictions)

  test_loss.update_state(t_loss)
  test_accuracy.update_state(labels, predictions)
""",
    ),
    (
        "004_13",
        """
# `run` replicates the provided computation and runs it
# with the distributed input.
# @tf.function: dropped (feedline runs eagerly)
def distributed_train_step(dataset_inputs):
  per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
  return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses,
                         axis=None)

# @tf.function: dropped
def distributed_test_step(dataset_inputs):
  return strategy.run(test_step, args=(dataset_inputs,))

for epoch in range(EPOCHS):
  # TRAIN LOOP
  total_loss = 0.0
  num_batches = 0
  for x in train_dist_dataset:
    total_loss += distributed_train_step(x)
    num_batches += 1
  train_loss = total_loss / num_batches

  # TEST LOOP
  for x in test_dist_dataset:
    distributed_test_step(x)

  if epoch % 2 == 0:
    checkpoint.save(checkpoint_prefix)

  template = ("Epoch {}, Loss: {}, Accuracy: {}, Test Loss: {}, "
              "Test Accuracy: {}")
  print (template.format(epoch+1, train_loss,
                         train_accuracy.result()*100, test_loss.result(),
                         test_accuracy.result()*100))

  test_loss.reset_states()
  train_accuracy.reset_states()
  test_accuracy.reset_states()
""",
    ),
    (
        "004_14",
        """
eval_accuracy = tf.metrics.SparseCategoricalAccuracy(  # tf.keras.metrics -> tf.metrics
      name='eval_accuracy')

new_model = create_model()
new_optimizer = torch.optim.Adam(new_model.parameters())  # tf.keras.optimizers.Adam()

test_dataset = tf.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(GLOBAL_BATCH_SIZE)
# @tf.function: dropped (feedline runs eagerly)
def eval_step(images, labels):
  predictions = new_model(torch.from_numpy(images))  # training=False; NumPy batch -> torch
  eval_accuracy(labels, predictions)
checkpoint = tf.train.Checkpoint(optimizer=new_optimizer, model=new_model)
checkpoint.restore(tf.train.latest_checkpoint(checkpoint_dir))

for images, labels in test_dataset:
  eval_step(images, labels)

print ('Accuracy after restoring the saved model without strategy: {}'.format(
    eval_accuracy.result()*100))
""",  # noqa: E501
    ),
    (
        "004_15",
        """
for _ in range(EPOCHS):
  total_loss = 0.0
  num_batches = 0
  train_iter = iter(train_dist_dataset)

  for _ in range(10):
    total_loss += distributed_train_step(next(train_iter))
    num_batches += 1
  average_train_loss = total_loss / num_batches

  template = ("Epoch {}, Loss: {}, Accuracy: {}")
  print (template.format(epoch+1, average_train_loss, train_accuracy.result()*100))
  train_accuracy.reset_states()
""",
    ),
    (
        "004_16",
        """
# @tf.function: dropped (feedline runs eagerly)
def distributed_train_epoch(dataset):
  total_loss = 0.0
  num_batches = 0
  for x in dataset:
    per_replica_losses = strategy.run(train_step, args=(x,))
    total_loss += strategy.reduce(
      tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)
    num_batches += 1
  return total_loss / torch.tensor(num_batches, dtype=torch.float32)  # tf.cast(..., tf.float32)

for epoch in range(EPOCHS):
  train_loss = distributed_train_epoch(train_dist_dataset)

  template = ("Epoch {}, Loss: {}, Accuracy: {}")
  print (template.format(epoch+1, train_loss, train_accuracy.result()*100))

  train_accuracy.reset_states()
""",
    ),
]

_NUMBER = r"(-?\d+(?:\.\d+)?(?:e-?\d+)?)"


def rows(text: str, like: str) -> list[list[float]]:
    """The numbers of each line of ``text``, every line required to read like ``like`` (a line
    of the page's table) with its numbers free."""
    pattern = re.compile(_NUMBER.join(re.escape(part) for part in re.split(_NUMBER, like)[::2]))
    lines = text.strip().splitlines()
    assert lines, "nothing printed"
    parsed = []
    for line in lines:
        match = pattern.fullmatch(line)
        assert match, f"{line!r} does not read like the page's {like!r}"
        parsed.append([float(x) for x in match.groups()])
    return parsed


def whole_examples(percent: float, examples: int) -> bool:
    """Whether ``percent`` % of ``examples`` is a whole number of examples (to float32)."""
    count = percent * examples / 100
    return abs(count - round(count)) < 1e-3 * max(1.0, count)


@pytest.fixture(scope="module")
def page() -> dict:
    return run_page(SNIPPETS)


@pytest.mark.parametrize("name", [name for name, _ in SNIPPETS])
def test_snippet(page: dict, name: str) -> None:
    check_snippet(page, name, compare=name not in TABLES)


def _table(text: str, name: str) -> list[list[float]]:
    page_lines = expected(name).splitlines()
    return rows(text, page_lines[0])


@pytest.mark.parametrize("source", ["page", "port"])
def test_training_table(page: dict, source: str) -> None:  # block 13
    text = expected("004_13") if source == "page" else page["004_13"]["stdout"]
    table = _table(text, "004_13")
    epochs = 10 if source == "page" else EPOCHS
    assert [int(row[0]) for row in table] == list(range(1, epochs + 1))
    for _, loss, accuracy, test_loss, test_accuracy in table:
        assert loss > 0 and test_loss > 0
        assert 0 <= accuracy <= 100 and 0 <= test_accuracy <= 100
    assert table[-1][1] < table[0][1], "the training loss does not fall"


@pytest.mark.parametrize("source", ["page", "port"])
def test_restored_accuracy_is_the_checkpointed_epochs(page: dict, source: str) -> None:
    """Block 14: the restored model scores exactly what its epoch scored when it was saved
    (checkpoints are saved after epochs 1, 3, ...; the last one is restored)."""
    table_text = expected("004_13") if source == "page" else page["004_13"]["stdout"]
    text = expected("004_14") if source == "page" else page["004_14"]["stdout"]
    table = _table(table_text, "004_13")
    [[restored]] = rows(text, expected("004_14").strip())
    last_saved = max(epoch for epoch in range(len(table)) if epoch % 2 == 0)
    assert restored == pytest.approx(table[last_saved][4], abs=1e-4)


@pytest.mark.parametrize("source", ["page", "port"])
def test_iterator_table(page: dict, source: str) -> None:  # block 15
    """Ten steps of a full global batch each; the epoch printed is the last one of block 13's
    loop (``epoch`` is not this loop's variable), as on the page."""
    text = expected("004_15") if source == "page" else page["004_15"]["stdout"]
    table = _table(text, "004_15")
    epochs, global_batch = (10, 64) if source == "page" else (EPOCHS, 64)
    assert [int(row[0]) for row in table] == [epochs] * epochs
    for _, loss, accuracy in table:
        assert loss > 0 and whole_examples(accuracy, 10 * global_batch)


@pytest.mark.parametrize("source", ["page", "port"])
def test_epoch_function_table(page: dict, source: str) -> None:  # block 16
    text = expected("004_16") if source == "page" else page["004_16"]["stdout"]
    table = _table(text, "004_16")
    epochs = 10 if source == "page" else EPOCHS
    assert [int(row[0]) for row in table] == list(range(1, epochs + 1))
    for _, loss, accuracy in table:
        assert loss > 0 and 0 <= accuracy <= 100
