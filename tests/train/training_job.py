"""A small training job that fault-tolerance tests run in worker processes, interrupt and resume.

``Job(strategy)`` builds, under the strategy's scope, a two-layer model with Adam and a
distributed iterator over a shuffled, repeated dataset (AUTO sharding, which is DATA here: 16
global batches of 16 rows an epoch); ``job.step(next(job.iterator))`` is one training step;
``job.checkpoint`` holds the model, the optimizer and the iterator. Every run of the same job is
deterministic on CPU, so an interrupted and resumed run must end with the parameters of an
uninterrupted one, bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import feedline.data as fd
import feedline.distribute as fdist
import feedline.nn
from feedline.train import Checkpoint

GLOBAL_BATCH = 16
ROWS = 256


class Job:
    def __init__(self, strategy: fdist.Strategy) -> None:
        self.strategy = strategy
        torch.manual_seed(0)
        with strategy.scope():
            self.model = torch.nn.Sequential(
                torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
            )
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)
        rng = np.random.default_rng(0)
        x = rng.normal(size=(ROWS, 4)).astype(np.float32)
        y = rng.normal(size=(ROWS, 1)).astype(np.float32)
        dataset = fd.Dataset.from_tensor_slices((x, y)).shuffle(ROWS, seed=1).batch(GLOBAL_BATCH)
        self.iterator = iter(strategy.experimental_distribute_dataset(dataset.repeat()))
        self.checkpoint = Checkpoint(
            model=self.model, optimizer=self.optimizer, iterator=self.iterator
        )

    def _replica_step(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        features, labels = inputs
        self.optimizer.zero_grad()
        per_example = ((self.model(features) - labels) ** 2).squeeze(1)
        loss = feedline.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def step(self, inputs: Any) -> torch.Tensor:
        """One step on a global batch (a ``distributed_train_step``)."""
        losses = self.strategy.run(self._replica_step, args=(inputs,))
        return self.strategy.reduce("SUM", losses, axis=None)

    def weights(self) -> list[float]:
        return [v for p in self.model.parameters() for v in p.detach().flatten().tolist()]
