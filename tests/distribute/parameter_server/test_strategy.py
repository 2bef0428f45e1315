"""``ParameterServerStrategy``: the between-graph form with real worker and ps processes, and
the clusters and tasks it refuses."""

from __future__ import annotations

import json

import pytest

from feedline.distribute import ParameterServerStrategy
from feedline.distribute.cluster_resolver import ClusterSpec, SimpleClusterResolver
from feedline.errors import InvalidArgumentError
from tests import launcher
from tests.distribute.parameter_server._cluster import only, ps_here

# Every worker runs this. Each starts from other random values: the first worker to create a
# variable on the ps wins, and every worker reads that one. Then each runs 10 steps of its
# own (async), pushing a gradient of 1 for `w` and for its own row of the table.
BETWEEN_GRAPH = """
import os, time, torch
from pathlib import Path
import feedline as tf
from tests.launcher import report

strategy = tf.compat.v1.distribute.experimental.ParameterServerStrategy()
task = strategy.cluster_resolver.task_id
torch.manual_seed(task)

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))
        self.table = torch.nn.Embedding(4, 2, sparse=True)
    def forward(self, ids):
        return self.w.sum() + self.table(ids).sum()

with strategy.scope():
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

folder = Path(os.environ["FEEDLINE_TEST_RESULT_DIR"])
def barrier(name):
    (folder / f"{name}-{task}").touch()
    deadline = time.monotonic() + 60
    while not (folder / f"{name}-{1 - task}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)

initial = {k: v.tolist() for k, v in model.state_dict().items()}
barrier("ready")
def step(ids):
    optimizer.zero_grad()
    loss = model(ids)
    loss.backward()
    optimizer.step()
    return loss
for _ in range(10):
    strategy.run(step, args=(torch.tensor([task]),))
barrier("done")
report({
    "task": [strategy.cluster_resolver.task_type, task],
    "cluster": strategy.cluster_resolver.cluster_spec().as_dict(),
    "replicas": strategy.num_replicas_in_sync,
    "placement": {n: [list(s) for s in p.spec.shard_list] for n, p in model.named_parameters()},
    "initial": initial,
    "final": {k: v.tolist() for k, v in model.state_dict().items()},
})
"""


def test_between_graph_workers_push_asynchronously() -> None:
    cluster = launcher.tf_config_envs({"worker": 2, "ps": 2})
    with ps_here(cluster):
        results = launcher.run(BETWEEN_GRAPH, only(cluster, "worker:0", "worker:1"), timeout=90)
    first, second = results["worker:0"].result, results["worker:1"].result
    assert first["task"] == ["worker", 0] and second["task"] == ["worker", 1]
    assert first["cluster"] == json.loads(cluster[0][1]["TF_CONFIG"])["cluster"]
    assert first["replicas"] == 1
    # Round-robin in creation order: w on ps 0, the table on ps 1.
    assert first["placement"] == {"w": [[0, 0, 3]], "table.weight": [[1, 0, 4]]}
    assert first["initial"] == second["initial"]
    assert first["final"] == second["final"]
    start, end = first["initial"], first["final"]
    # 20 pushes of gradient 1 with lr 0.5 reached w; each worker's 10 reached its own row.
    assert end["w"] == pytest.approx([v - 10.0 for v in start["w"]])
    for row in range(4):
        moved = 5.0 if row < 2 else 0.0
        assert end["table.weight"][row] == pytest.approx(
            [v - moved for v in start["table.weight"][row]]
        )


def _resolver(jobs: dict, task_type: str | None, task_id: int | None) -> SimpleClusterResolver:
    return SimpleClusterResolver(ClusterSpec(jobs), task_type=task_type, task_id=task_id)


@pytest.mark.parametrize(
    ("jobs", "task", "match"),
    [
        (
            {"worker": ["a:1"]},
            ("worker", 0),
            r"needs 'ps' tasks in the cluster, which has jobs \['worker'\]",
        ),
        (
            {"worker": ["a:1"], "ps": ["b:1"]},
            ("ps", 0),
            "a ps task runs feedline.distribute.Server",
        ),
        ({"evaluator": ["a:1"], "ps": ["b:1"]}, ("evaluator", 0), "SidecarEvaluator"),
    ],
)
def test_clusters_and_tasks_the_strategy_cannot_play(jobs: dict, task: tuple, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        ParameterServerStrategy(_resolver(jobs, *task))


def test_tf_config_without_ps_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    config = {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    with pytest.raises(InvalidArgumentError, match="needs 'ps' tasks"):
        ParameterServerStrategy()


def test_an_unreachable_ps_is_named() -> None:
    port = launcher.free_port()
    strategy = ParameterServerStrategy(
        _resolver({"ps": [f"127.0.0.1:{port}"]}, None, None), connect_timeout=0.5
    )
    import torch

    from feedline.errors import UnavailableError

    with strategy.scope():
        model = torch.nn.Linear(2, 1)
    with pytest.raises(
        UnavailableError, match=rf"/job:ps/task:0 at 127.0.0.1:{port} is unavailable within 0.5 s"
    ):
        model(torch.ones(2))
