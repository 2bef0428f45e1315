"""Tests of feedline/distribute/collective_mirroring.py: replicas that hand over at collectives
(two workers of two local replicas each train as one replica on the global batch), gradients as
views into the buckets, and a run's scalar results summed with its gradients. (The mirrored
training of workers without collectives in the step is in test_multi_worker.py.)"""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

import feedline.distribute as fdist
from tests.distribute.test_mirroring import GLOBAL_BATCH, train_on
from tests.launcher import run, torchrun_envs

_TRAIN = """
import sys
import feedline.distribute as fdist
from tests.distribute.test_mirroring import train_on
from tests.launcher import report

strategy = fdist.MultiWorkerMirroredStrategy(devices=["cpu:0", "cpu:1"])
mode = sys.argv[2]
params = train_on(strategy, rows=int(sys.argv[1]), own_all_reduce=mode == "own",
                  reduce_loss=mode == "loss", sgd=True)
report([p.flatten().tolist() for p in params])
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["own", "loss"])
def test_two_workers_with_collectives_in_the_step_train_as_one_replica(mode: str) -> None:
    # 6 steps, the last with 3 rows: replicas 1 to 3 of the last step have 1, 1, 0 rows.
    rows = GLOBAL_BATCH * 5 + 3
    results = run(_TRAIN, torchrun_envs(2), argv=[str(rows), mode])
    one = train_on(fdist.MirroredStrategy(["cpu:0"]), rows=rows, sgd=True)
    expected = [p.flatten() for p in one]
    for result in results.values():
        for got, want in zip(result.result, expected, strict=True):
            torch.testing.assert_close(torch.tensor(got), want, rtol=1e-5, atol=1e-6)
    assert results["rank:0"].result == results["rank:1"].result


def _bucket_view_steps(strategy: fdist.Strategy | None, rank: int, world: int) -> dict:
    """8 SGD-with-momentum steps on a small model, zero_grad alternating between
    ``set_to_none=True`` and ``False``, a checkpoint saved and loaded back after step 4; each
    worker takes its ``rank``-th share of every global batch of 8 rows. ``strategy=None``: one
    plain process on the whole batch. Returns the final parameters, each step's gradients, and
    (under a strategy) whether every gradient was a view into a bucket after each step."""
    torch.manual_seed(0)
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1, bias=False)
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    features = torch.randn(8 * 8, 4)
    targets = torch.randn(8 * 8, 1)
    share = 8 // world
    out: dict = {"grads": [], "views": [], "ptrs": []}

    def step(x: torch.Tensor, y: torch.Tensor, set_to_none: bool) -> None:
        optimizer.zero_grad(set_to_none=set_to_none)
        ((model(x) - y) ** 2).sum().div(8).backward()
        optimizer.step()

    for i in range(8):
        rows = slice(i * 8 + rank * share, i * 8 + (rank + 1) * share)
        x, y = features[rows], targets[rows]
        if strategy is None:
            step(x, y, i % 2 == 1)
        else:
            strategy.run(step, args=(x, y, i % 2 == 1))
            mirroring = strategy._mirroring
            views = {p.grad.data_ptr() for b in mirroring._buckets for p in b.params}
            flats = [(b.flat.data_ptr(), b.flat.numel() * 4) for b in mirroring._buckets]
            out["views"].append(all(any(s <= ptr < s + n for s, n in flats) for ptr in views))
            out["ptrs"].append(sorted(views))
        out["grads"].append([p.grad.flatten().tolist() for p in model.parameters()])
        if i == 3:
            saved = io.BytesIO()
            torch.save({"m": model.state_dict(), "o": optimizer.state_dict()}, saved)
            saved.seek(0)
            state = torch.load(saved)
            model.load_state_dict(state["m"])
            optimizer.load_state_dict(state["o"])
    out["params"] = [p.detach().flatten().tolist() for p in model.parameters()]
    return out


_BUCKET_VIEWS = """
import os
import feedline.distribute as fdist
from feedline.distribute.experimental import CommunicationOptions
from tests.distribute.test_collective_mirroring import _bucket_view_steps
from tests.launcher import report

strategy = fdist.MultiWorkerMirroredStrategy(
    communication_options=CommunicationOptions(bytes_per_pack=64))
report(_bucket_view_steps(strategy, int(os.environ["RANK"]), 2))
"""


@pytest.mark.timeout(240)
def test_gradients_are_bucket_views_and_train_as_one_process() -> None:
    results = run(_BUCKET_VIEWS, torchrun_envs(2))
    want = _bucket_view_steps(None, 0, 1)
    for result in results.values():
        got = result.result
        assert got["views"] == [True] * 8  # every gradient lives in its bucket after a step
        for step_got, step_want in zip(got["grads"], want["grads"], strict=True):
            for g, w in zip(step_got, step_want, strict=True):
                torch.testing.assert_close(torch.tensor(g), torch.tensor(w), rtol=1e-5, atol=1e-6)
        for g, w in zip(got["params"], want["params"], strict=True):
            torch.testing.assert_close(torch.tensor(g), torch.tensor(w), rtol=1e-5, atol=1e-6)
        # the bucket is made once: the gradients stay at the same addresses step after step
        assert all(ptrs == got["ptrs"][0] for ptrs in got["ptrs"])
    assert results["rank:0"].result["params"] == results["rank:1"].result["params"]


_LOSS_RIDES_ALONG = """
import os
import torch
import feedline.distribute as fdist
from tests.launcher import report

rank = int(os.environ["RANK"])
strategy = fdist.MultiWorkerMirroredStrategy(devices=["cpu:0", "cpu:1"])
torch.manual_seed(0)
with strategy.scope():
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

def step(x):
    optimizer.zero_grad()
    loss = model(x).pow(2).sum() / 8
    loss.backward()
    optimizer.step()
    return loss.detach()

out = {"rode": [], "sum": [], "eager_sum": [], "mean": [], "eager_mean": [], "later": []}
previous = None
for i in range(4):
    x = torch.arange(24.0).reshape(8, 3)[i % 2 * 4 + rank * 2 :][:2] / 10
    per_replica = strategy.run(step, args=(fdist.PerReplica([x[:1], x[1:]]),))
    if previous is not None:
        out["later"].append(previous.item())  # a result read after the next step
    mean = strategy.reduce("MEAN", per_replica, axis=None)
    total = strategy.reduce("SUM", per_replica, axis=None)
    out["rode"].append(strategy._mirroring._summed_taken)
    copies = fdist.PerReplica([v.clone() for v in per_replica.values])
    out["sum"].append(total.item())
    out["eager_sum"].append(strategy.reduce("SUM", copies, axis=None).item())
    out["mean"].append(mean.item())
    out["eager_mean"].append(strategy.reduce("MEAN", copies, axis=None).item())
    previous = total
# a result changed in place after the run is all-reduced as it is now
per_replica = strategy.run(step, args=(fdist.PerReplica([x[:1], x[1:]]),))
per_replica.values[0].add_(1.0)
changed = strategy.reduce("SUM", per_replica, axis=None)
out["changed"] = [changed.item(), strategy._mirroring._summed_taken]
out["changed_eager"] = strategy.reduce(
    "SUM", fdist.PerReplica([v.clone() for v in per_replica.values]), axis=None).item()
out["types"] = [type(total).__name__, total.shape == torch.Size([]), total.requires_grad]
report(out)
"""


@pytest.mark.timeout(240)
def test_a_run_s_scalar_results_are_reduced_with_the_gradients() -> None:
    results = run(_LOSS_RIDES_ALONG, torchrun_envs(2))
    for result in results.values():
        got = result.result
        # the first step does not hold its last bucket back; from then on the loss rides along
        assert got["rode"] == [False, True, True, True]
        assert got["sum"] == got["eager_sum"] and got["mean"] == got["eager_mean"]
        assert got["mean"] == [pytest.approx(s / 4) for s in got["sum"]]
        assert got["later"] == got["sum"][:3]
        assert got["changed"][1] is False and got["changed"][0] == got["changed_eager"]
        assert got["types"] == ["Tensor", True, False]
    assert results["rank:0"].result == results["rank:1"].result
