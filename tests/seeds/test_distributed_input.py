"""Seed 003 (the English "Distributed Input" guide): every code block, ported.

The guide simulates two CPUs with logical devices (block 2), so ``MirroredStrategy()`` has two
replicas in every later block. It shows no printed output, so the blocks run and are not compared
(the Spanish translation, ``test_distributed_input_es.py``, has the outputs).
Lines rewritten for PyTorch say so in a comment; ``docs/porting.md`` lists every kind of rewrite.

Blocks (21): 1-9, 11, 12, 15, 18-21 run (18 with the names it leaves to the reader given values
first); 16 runs on a chief, 2 workers and a ps (``test_parameter_server_coordinator``); 10, 13,
14 and 17 only illustrate (a host training loop that is never called; ``Model.fit`` with
``model = ...``; ``DatasetCreator`` with ``...``; TensorFlow Transform with ``...``).
"""

from __future__ import annotations

import pytest

from tests import launcher
from tests.seeds._support import PAGE_ENV, check_snippet, run_page

SNIPPETS = [
    (
        "003_01",
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
        "003_02",
        """
# Simulate multiple CPUs with virtual devices
N_VIRTUAL_DEVICES = 2
physical_devices = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    physical_devices[0], [tf.config.LogicalDeviceConfiguration() for _ in range(N_VIRTUAL_DEVICES)])
""",
    ),
    (
        "003_03",
        """
print("Available devices:")
for i, device in enumerate(tf.config.list_logical_devices()):
  print("%d) %s" % (i, device))
""",
    ),
    (
        "003_04",
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
        "003_05",
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
        "003_06",
        """
dataset = tf.data.Dataset.from_tensors(([1.], [1.])).repeat(64).batch(16)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = dataset.with_options(options)
""",
    ),
    (
        "003_07",
        """
mirrored_strategy = tf.distribute.MirroredStrategy()

def dataset_fn(input_context):
  batch_size = input_context.get_per_replica_batch_size(global_batch_size)
  dataset = tf.data.Dataset.from_tensors(([1.], [1.])).repeat(64).batch(16)
  dataset = dataset.shard(
      input_context.num_input_pipelines, input_context.input_pipeline_id)
  dataset = dataset.batch(batch_size)
  dataset = dataset.prefetch(2)  # This prefetches 2 batches per device.
  return dataset

dist_dataset = mirrored_strategy.distribute_datasets_from_function(dataset_fn)
""",
    ),
    (
        "003_08",
        """
global_batch_size = 16
mirrored_strategy = tf.distribute.MirroredStrategy()

dataset = tf.data.Dataset.from_tensors(([1.], [1.])).repeat(100).batch(global_batch_size)
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
        "003_09",
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
    # 003_10, the host training loop (`for _ in tf.range(steps_per_loop): strategy.run(step_fn,
    # ...)` in a tf.function that is never called), only illustrates.
    (
        "003_11",
        """
# You can break the loop with `get_next_as_optional` by checking if the `Optional` contains a value
global_batch_size = 4
steps_per_loop = 5
strategy = tf.distribute.MirroredStrategy()

dataset = tf.data.Dataset.range(9).batch(global_batch_size)
distributed_iterator = iter(strategy.experimental_distribute_dataset(dataset))

# @tf.function: dropped (feedline runs eagerly)
def train_fn(distributed_iterator):
  for _ in range(steps_per_loop):  # tf.range -> range
    optional_data = distributed_iterator.get_next_as_optional()
    if not optional_data.has_value():
      break
    per_replica_results = strategy.run(lambda x: x, args=(optional_data.get_value(),))
    print(strategy.experimental_local_results(per_replica_results))  # tf.print -> print
train_fn(distributed_iterator)
""",
    ),
    (
        "003_12",
        """
global_batch_size = 16
epochs = 5
steps_per_epoch = 5
mirrored_strategy = tf.distribute.MirroredStrategy()

dataset = tf.data.Dataset.from_tensors(([1.], [1.])).repeat(100).batch(global_batch_size)
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
    # 003_13 (Model.fit with an IntegerLookup layer, `model = ...`) and 003_14
    # (ParameterServerStrategy with Keras' DatasetCreator, `...`) only illustrate.
    (
        "003_15",
        """
strategy = tf.distribute.MirroredStrategy()
vocab = ["a", "b", "c", "d", "f"]  # the page lost the commas: ["a""b""c""d""f"]

class StringLookup:  # added: Keras' StringLookup (vocabulary index + 1, 0 out of vocabulary)
  def __init__(self, vocabulary):
    self.table = {key: i + 1 for i, word in enumerate(vocabulary) for key in (word, word.encode())}
  def __call__(self, inputs):
    return np.array([self.table.get(word, 0) for word in inputs.tolist()], dtype=np.int64)

with strategy.scope():
  # Create the layer(s) under scope.
  layer = StringLookup(vocabulary=vocab)  # tf.keras.layers.StringLookup

def dataset_fn(input_context):
  # a tf.data.Dataset
  dataset = tf.data.Dataset.from_tensor_slices(["a", "c", "e"]).repeat()  # commas lost too

  # Custom your batching, sharding, prefetching, etc.
  global_batch_size = 4
  batch_size = input_context.get_per_replica_batch_size(global_batch_size)
  dataset = dataset.batch(batch_size)
  dataset = dataset.shard(
      input_context.num_input_pipelines,
      input_context.input_pipeline_id)

  # Apply the preprocessing layer(s) to the tf.data.Dataset
  def preprocess_with_kpl(input):
    return layer(input)

  processed_ds = dataset.map(preprocess_with_kpl)
  return processed_ds

distributed_dataset = strategy.distribute_datasets_from_function(dataset_fn)

# Print out a few example batches.
distributed_dataset_iterator = iter(distributed_dataset)
for _ in range(3):
  print(next(distributed_dataset_iterator))
""",
    ),
    # 003_16 (ClusterCoordinator.create_per_worker_dataset): test_parameter_server_coordinator.
    # 003_17 (TensorFlow Transform, `...`) only illustrates.
    (
        "003_18",
        """
# given: the names this block leaves to the reader (worker 0 of 2, four files of three records)
import tempfile
folder = tempfile.mkdtemp()
for i in range(4):
  with tf.io.TFRecordWriter(os.path.join(folder, f"part-{i}.tfrecord")) as writer:
    for j in range(3):
      writer.write(str(10 * i + j).encode())
pattern = os.path.join(folder, "part-*.tfrecord")
num_workers, worker_index = 2, 0
num_epochs, shuffle_buffer_size, num_readers, num_map_threads = 1, 4, 2, 2
def parser_fn(record):
  return int(record.item())

d = tf.data.Dataset.list_files(pattern, shuffle=False)
d = d.shard(num_workers, worker_index)
d = d.repeat(num_epochs)
d = d.shuffle(shuffle_buffer_size)
d = d.interleave(tf.data.TFRecordDataset,
             cycle_length=num_readers, block_length=1)
d = d.map(parser_fn, num_parallel_calls=num_map_threads)

print(sorted(d.as_numpy_iterator()))  # added: what worker 0 reads
""",
    ),
    (
        "003_19",
        """
mirrored_strategy = tf.distribute.MirroredStrategy()
dataset_size = 24
batch_size = 6
dataset = tf.data.Dataset.range(dataset_size).enumerate().batch(batch_size)
dist_dataset = mirrored_strategy.experimental_distribute_dataset(dataset)

def predict(index, inputs):  # the page lost the comma: (indexinputs)
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
        "003_20",
        """
mirrored_strategy = tf.distribute.MirroredStrategy()

def value_fn(ctx):
  return torch.tensor(ctx.replica_id_in_sync_group)  # tf.constant -> torch.tensor

distributed_values = mirrored_strategy.experimental_distribute_values_from_function(value_fn)
for _ in range(4):
  result = mirrored_strategy.run(lambda x: x, args=(distributed_values,))
  print(result)
""",
    ),
    (
        "003_21",
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
  result = mirrored_strategy.run(lambda x: x, args=(next(iterator),))
  print(result)
""",
    ),
]


@pytest.fixture(scope="module")
def page() -> dict:
    return run_page(SNIPPETS)


@pytest.mark.parametrize("name", [name for name, _ in SNIPPETS])
def test_snippet(page: dict, name: str) -> None:
    check_snippet(page, name)


# Block 16 with what it needs around it, as the ParameterServerStrategy tutorial sets it up: a
# chief that creates the strategy and its coordinator, and worker and ps tasks that serve.
COORDINATOR = """
import numpy as np
import feedline as tf
from tests.launcher import report

cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if cluster_resolver.task_type in ("worker", "ps"):
  server = tf.distribute.Server(
      cluster_resolver.cluster_spec(), job_name=cluster_resolver.task_type,
      task_index=cluster_resolver.task_id, protocol="grpc", start=True)
  server.join()

strategy = tf.distribute.experimental.ParameterServerStrategy(cluster_resolver)
coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

def dataset_fn(input_context):  # block 15's, without its Keras layer
  dataset = tf.data.Dataset.from_tensor_slices(["a", "c", "e"]).repeat()
  batch_size = input_context.get_per_replica_batch_size(4)
  return dataset.batch(batch_size)

# @tf.function: dropped (feedline runs eagerly)
def per_worker_dataset_fn():
  return strategy.distribute_datasets_from_function(dataset_fn)

per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
per_worker_iterator = iter(per_worker_dataset)

report("created")
"""


def test_parameter_server_coordinator() -> None:  # block 16
    processes = launcher.tf_config_envs({"chief": 1, "worker": 2, "ps": 1})
    with launcher.Processes(COORDINATOR, processes, timeout=60, env=PAGE_ENV) as running:
        running.wait_for(running.dir / "chief:0.json")
