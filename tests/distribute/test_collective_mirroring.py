"""Tests of feedline/distribute/collective_mirroring.py with replicas that hand over at
collectives: two workers of two local replicas each train as one replica on the global batch.
(The mirrored training of workers without collectives in the step is in test_multi_worker.py.)"""

from __future__ import annotations

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
