"""Seed 000 (the Spanish "Entrada distribuida" guide, TensorFlow 2.3): every code block, ported.

The guide printed its outputs on one GPU, so ``MirroredStrategy()`` had one replica; here it takes
the one CPU replica of a machine without GPUs (the page runs with none visible), and the printed
outputs are compared with the guide's through ``normalise`` (rules in ``_support``).
Lines rewritten for PyTorch say so in a comment; ``docs/porting.md`` lists every kind of rewrite.

Blocks (13): 1-7 and 9-13 run; 8 only illustrates (a host training loop that is never called and
uses an undefined ``step_fn``). Printed outputs compared: 2, 3, 6, 7, 9, 10, 11, 12 (block 1
prints TensorFlow's version, ``2.3.0``, which feedline does not share).
"""

from __future__ import annotations

import pytest

from tests.seeds._support import check_snippet, run_page

SNIPPETS = [
    (
        "000_01",
        """
import feedline as tf

# Helper libraries
import numpy as np
import os
import torch  # added: PyTorch, for the rewritten tensor lines

print(tf.__version__)
""",
    ),
    (
        "000_02",
        """
global_batch_size = 16
# Create a tf.data.Dataset object.
dataset = tf.data.Dataset.from_tensors(([1.], [1.])).repeat(100).batch(global_batch_size)

# @tf.function: dropped (feedline runs eagerly)
def train_step(inputs):
  features, labels = inputs
  return labels - 0.3 * features

# Iterate over the dataset using the for..in construct.
for inputs in dataset:
  print(train_step(inputs))
""",
    ),
    (
        "000_03",
        """
global_batch_size = 16
mirrored_strategy = tf.distribute.MirroredStrategy()

dataset = tf.data.Dataset.from_tensors(([1.], [1.])).repeat(100).batch(global_batch_size)
# Distribute input using the `experimental_distribute_dataset`.
dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)
# 1 global batch of data fed to the model in 1 step.
print(next(iter(dist_dataset)))
""",
    ),
    (
        "000_04",
        """
dataset = tf.data.Dataset.from_tensors(([1.],[1.])).repeat(64).batch(16)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = dataset.with_options(options)
""",
    ),
    (
        "000_05",
        """
mirrored_strategy = tf.distribute.MirroredStrategy()

def dataset_fn(input_context):
  batch_size = input_context.get_per_replica_batch_size(global_batch_size)
  dataset = tf.data.Dataset.from_tensors(([1.],[1.])).repeat(64).batch(16)
  dataset = dataset.shard(
    input_context.num_input_pipelines, input_context.input_pipeline_id)
  dataset = dataset.batch(batch_size)
  dataset = dataset.prefetch(2) # This prefetches 2 batches per device.
  return dataset

dist_dataset = mirrored_strategy.experimental_distribute_datasets_from_function(dataset_fn)
""",
    ),
    (
        "000_06",
        """
global_batch_size = 16
mirrored_strategy = tf.distribute.MirroredStrategy()

dataset = tf.data.Dataset.from_tensors(([1.],[1.])).repeat(100).batch(global_batch_size)
dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)

# @tf.function: dropped (feedline runs eagerly)
def train_step(inputs):
  features, labels = inputs
  return labels - 0.3 * features

for x in dist_dataset:
  # train_step trains the model using the dataset elements
  loss = mirrored_strategy.run(train_step, args=(x,))
  print("Loss is ", loss)
""",
    ),
    (
        "000_07",
        """
num_epochs = 10
steps_per_epoch = 5
for epoch in range(num_epochs):
  dist_iterator = iter(dist_dataset)
  for step in range(steps_per_epoch):
    # train_step trains the model using the dataset elements
    loss = mirrored_strategy.run(train_step, args=(next(dist_iterator),))
    # which is the same as
    # loss = mirrored_strategy.run(train_step, args=(dist_iterator.get_next(),))
    print("Loss is ", loss)
""",
    ),
    # 000_08, the host training loop (`for _ in tf.range(steps_per_loop): strategy.run(step_fn,
    # ...)` in a tf.function that is never called), only illustrates.
    (
        "000_09",
        """
# You can break the loop with get_next_as_optional by checking if the Optional contains value
global_batch_size = 4
steps_per_loop = 5
strategy = tf.distribute.MirroredStrategy(devices=["CPU:0", "CPU:1"])  # seed: ["GPU:0", "CPU:0"]

dataset = tf.data.Dataset.range(9).batch(global_batch_size)
distributed_iterator = iter(strategy.experimental_distribute_dataset(dataset))

# @tf.function: dropped (feedline runs eagerly)
def train_fn(distributed_iterator):
  for _ in range(steps_per_loop):  # tf.range -> range
    optional_data = distributed_iterator.get_next_as_optional()
    if not optional_data.has_value():
      break
    per_replica_results = strategy.run(lambda x:x, args=(optional_data.get_value(),))
    print(strategy.experimental_local_results(per_replica_results))  # tf.print -> print
train_fn(distributed_iterator)
""",
    ),
    (
        "000_10",
        """
global_batch_size = 16
epochs = 5
steps_per_epoch = 5
mirrored_strategy = tf.distribute.MirroredStrategy()

dataset = tf.data.Dataset.from_tensors(([1.],[1.])).repeat(100).batch(global_batch_size)
dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)

input_signature = [dist_dataset.element_spec]  # @tf.function(input_signature=...): dropped
def train_step(per_replica_inputs):
  def step_fn(inputs):
    return 2 * inputs

  return mirrored_strategy.run(step_fn, args=(per_replica_inputs,))

for _ in range(epochs):
  iterator = iter(dist_dataset)
  for _ in range(steps_per_epoch):
    output = train_step(next(iterator))
    print(output)  # tf.print -> print
""",
    ),
    (
        "000_11",
        """
mirrored_strategy = tf.distribute.MirroredStrategy()
dataset_size = 24
batch_size = 6
dataset = tf.data.Dataset.range(dataset_size).enumerate().batch(batch_size)
dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)

def predict(index, inputs):
  outputs = 2 * inputs
  return index, outputs

result = {}
for index, inputs in dist_dataset:
  output_index, outputs = mirrored_strategy.run(predict, args=(index, inputs))
  indices = list(mirrored_strategy.experimental_local_results(output_index))
  rindices = []
  for a in indices:
    rindices.extend(a.numpy())
  outputs = list(mirrored_strategy.experimental_local_results(outputs))
  routputs = []
  for a in outputs:
    routputs.extend(a.numpy())
  for i, value in zip(rindices, routputs):
    result[i] = value

print(result)
""",
    ),
    (
        "000_12",
        """
mirrored_strategy = tf.distribute.MirroredStrategy()
worker_devices = mirrored_strategy.extended.worker_devices

def value_fn(ctx):
  return torch.tensor(1.0)  # tf.constant -> torch.tensor

distributed_values = mirrored_strategy.experimental_distribute_values_from_function(value_fn)
for _ in range(4):
  result = mirrored_strategy.run(lambda x:x, args=(distributed_values,))
  print(result)
""",
    ),
    (
        "000_13",
        """
mirrored_strategy = tf.distribute.MirroredStrategy()
def input_gen():
  while True:
    yield np.random.rand(4)

# use Dataset.from_generator
dataset = tf.data.Dataset.from_generator(
    input_gen, output_types=(tf.float32), output_shapes=tf.TensorShape([4]))
dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)
iterator = iter(dist_dataset)
for _ in range(4):
  mirrored_strategy.run(lambda x:x, args=(next(iterator),))
""",
    ),
]

TF_PRINT = {"000_09", "000_10"}  # snippets that print with tf.print in the seed


@pytest.fixture(scope="module")
def page() -> dict:
    return run_page(SNIPPETS)


@pytest.mark.parametrize("name", [name for name, _ in SNIPPETS])
def test_snippet(page: dict, name: str) -> None:
    check_snippet(page, name, tf_print=name in TF_PRINT)
