"""Seed 002 (the ``ParameterServerStrategy`` API page): every code block, ported.

Blocks (3):

1. ``ParameterServerStrategy()`` handed to an Estimator.
   Its Estimator lines are not Python as printed (``experimental_distribute.train_distribute=``
   as a keyword) and feed ``tf.estimator``, which feedline does not re-create; the strategy it
   builds from ``TF_CONFIG`` is what is tested.
2. ``TF_CONFIG`` and ``MultiWorkerMirroredStrategy``: runs in the two worker processes of the
   page's cluster (started by ``tests/launcher.py``, on free ports instead of the page's fixed
   ones); each checks that its ``task_type`` branch is the one that runs.
3. ``experimental_distribute_dataset`` over two replicas: runs, and its printed ``PerReplica``
   list is compared with the page's through ``normalise`` (rules in ``_support``).
"""

from __future__ import annotations

import pytest

from tests import launcher
from tests.seeds._support import PAGE_ENV, check_snippet, run_page

SNIPPETS = [
    ("002_00", "import feedline as tf  # the page's blocks assume it\n"),
    (
        "002_03",
        """
global_batch_size = 2
# Passing the devices is optional.
strategy = tf.distribute.MirroredStrategy(devices=["CPU:0", "CPU:1"])  # seed: ["GPU:0", "GPU:1"]
# Create a dataset
dataset = tf.data.Dataset.range(4).batch(global_batch_size)
# Distribute that dataset
dist_dataset = strategy.experimental_distribute_dataset(dataset)
# @tf.function: dropped (feedline runs eagerly)
def replica_fn(input):
  return input*2
result = []
# Iterate over the `tf.distribute.DistributedDataset`
for x in dist_dataset:
  # process dataset elements
  result.append(strategy.run(replica_fn, args=(x,)))
print(result)
""",
    ),
]

# Block 2, in each worker process of the page's cluster. The page's cluster, with the launcher's
# free ports for its fixed ones, and this process's index for the page's 0.
MULTI_WORKER = """
import json
import os
import feedline as tf
from tests.launcher import report

GIVEN = json.loads(os.environ["TF_CONFIG"])
WORKERS, PS, INDEX = GIVEN["cluster"]["worker"], GIVEN["cluster"]["ps"], GIVEN["task"]["index"]

os.environ['TF_CONFIG'] = json.dumps({
    'cluster': {
        'worker': WORKERS,  # seed: ["localhost:12345", "localhost:23456"]
        'ps': PS  # seed: ["localhost:34567"]
    },
    'task': {'type': 'worker', 'index': INDEX}  # seed: 0 (this is one of its two workers)
})

# This implicitly uses TF_CONFIG for the cluster and current task info.
strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()

...

if strategy.cluster_resolver.task_type == 'worker':
  # Perform something that's only applicable on workers. Since we set this
  # as a worker above, this block will run on this particular instance.
  branch = 'worker'  # added: the page's branches hold comments only
elif strategy.cluster_resolver.task_type == 'ps':
  # Perform something that's only applicable on parameter servers. Since we
  # set this as a worker above, this block will not run on this particular
  # instance.
  branch = 'ps'  # added

report({
    "branch": branch,
    "task": [strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id],
    "num_replicas_in_sync": strategy.num_replicas_in_sync,
})
"""

# Block 1's strategy, built from TF_CONFIG as the page says it is by default.
PARAMETER_SERVER = """
import feedline as tf
from tests.launcher import report

strategy = tf.distribute.experimental.ParameterServerStrategy()
report([strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id])
"""


@pytest.fixture(scope="module")
def page() -> dict:
    return run_page(SNIPPETS)


@pytest.mark.parametrize("name", [name for name, _ in SNIPPETS])
def test_snippet(page: dict, name: str) -> None:
    check_snippet(page, name)


def test_multi_worker_cluster_resolver() -> None:  # block 2
    cluster = launcher.tf_config_envs({"worker": 2, "ps": 1})
    workers = [(name, env) for name, env in cluster if name.startswith("worker:")]
    results = launcher.run(MULTI_WORKER, workers, timeout=90, env=PAGE_ENV)
    assert {name: result.result for name, result in results.items()} == {
        f"worker:{i}": {"branch": "worker", "task": ["worker", i], "num_replicas_in_sync": 2}
        for i in range(2)
    }


def test_parameter_server_strategy_from_tf_config() -> None:  # block 1
    cluster = launcher.tf_config_envs({"worker": 2, "ps": 1})
    results = launcher.run(PARAMETER_SERVER, cluster[:1], timeout=60, env=PAGE_ENV)
    assert results["worker:0"].result == ["worker", 0]
