"""A parameter server killed with SIGKILL: the coordinator raises ``UnavailableError`` naming
it, and the cluster, restarted, resumes from the chief's last ``feedline.train.Checkpoint``."""

from __future__ import annotations

import signal

from tests import launcher
from tests.distribute.parameter_server._cluster import only, servers

SETUP = """
import os, time, torch
from pathlib import Path
import feedline as tf
from tests.launcher import report

folder = Path(os.environ["FEEDLINE_TEST_RESULT_DIR"])
checkpoints = os.environ["CHECKPOINTS"]
strategy = tf.distribute.ParameterServerStrategy(connect_timeout=60)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
torch.manual_seed(int(os.environ["SEED"]))
with strategy.scope():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)

def train_step():
    optimizer.zero_grad()
    loss = (model(torch.ones(2)) - 1.0).square().sum()
    loss.backward()
    optimizer.step()
    return float(loss)

def state():
    return {"model": {k: v.tolist() for k, v in model.state_dict().items()},
            "step": optimizer.state_dict()["state"][0]["step"].item()}
"""

FIRST = (
    SETUP
    + """
for _ in range(5):
    coordinator.schedule(train_step)
coordinator.join()
checkpoint.save(os.path.join(checkpoints, "ckpt"))
saved = state()
(folder / "saved").touch()
while not (folder / "killed").exists():
    time.sleep(0.02)
errors, value = {}, None
try:
    value = coordinator.schedule(train_step)
    coordinator.join(timeout=60)
except tf.errors.UnavailableError as error:
    errors["join"] = str(error)
try:
    coordinator.schedule(train_step)
except tf.errors.UnavailableError as error:
    errors["schedule"] = str(error)
if value is not None:
    try:
        value.fetch(timeout=60)
    except tf.errors.UnavailableError as error:
        errors["fetch"] = str(error)
report({"saved": saved, "errors": errors})
"""
)

SECOND = (
    SETUP
    + """
checkpoint.restore(tf.train.latest_checkpoint(checkpoints)).assert_consumed()
restored = state()
for _ in range(3):
    coordinator.schedule(train_step)
coordinator.join()
report({"restored": restored, "after": state()})
"""
)


def test_a_killed_ps_is_named_and_a_restarted_cluster_resumes(tmp_path) -> None:
    cluster = launcher.tf_config_envs({"chief": 1, "worker": 2, "ps": 1})
    address = cluster[-1][1]["TF_CONFIG"].split('"ps": ["')[1].split('"')[0]
    env = {"CHECKPOINTS": str(tmp_path), "SEED": "0"}
    with servers(only(cluster, "worker:0", "worker:1"), wait=False):
        with (
            servers(only(cluster, "ps:0"), wait=False) as ps,
            launcher.Processes(FIRST, only(cluster, "chief:0"), timeout=120, env=env) as chief,
        ):
            chief.wait_for(chief.dir / "saved", timeout=90)
            ps.send("ps:0", signal.SIGKILL)
            assert ps.wait_exit("ps:0", timeout=20) == -signal.SIGKILL
            (chief.dir / "killed").touch()
            first = chief.wait()["chief:0"]
        assert first.ok, first.describe()
        # The same cluster again (a new ps, a new chief that restores the checkpoint).
        with servers(only(cluster, "ps:0"), wait=False):
            second = launcher.run(
                SECOND, only(cluster, "chief:0"), timeout=120, env={**env, "SEED": "1"}
            )["chief:0"]
    saved, errors = first.result["saved"], first.result["errors"]
    assert set(errors) == {"join", "schedule", "fetch"}
    for message in errors.values():
        assert f"parameter server /job:ps/task:0 at {address} is unavailable" in message
        assert "restore the last checkpoint" in message
    assert saved["step"] == 5
    restored = second.result["restored"]
    assert restored["step"] == 5
    assert restored["model"] == saved["model"]
    assert second.result["after"]["step"] == 8
