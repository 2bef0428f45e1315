"""Distributed datasets fed to real CUDA devices (every GPU of the machine); they skip where
``torch.cuda.is_available()`` is False (``test_distributed_dataset.py`` covers the same path on
the CPU with a stand-in backend)."""

from __future__ import annotations

import pickle

import pytest
import torch

import feedline.data as fd
from feedline.distribute import MirroredStrategy, OneDeviceStrategy

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"
)


def _table(strategy: MirroredStrategy | OneDeviceStrategy, dataset: fd.Dataset) -> list:
    return [
        [t.cpu().tolist() for t in strategy.experimental_local_results(step)]
        for step in strategy.experimental_distribute_dataset(dataset)
    ]


def test_every_gpu_gets_what_cpu_replicas_get() -> None:
    n = torch.cuda.device_count()
    dataset = fd.Dataset.range(10 * n + 3).batch(2 * n)
    gpus = MirroredStrategy([f"cuda:{i}" for i in range(n)])
    cpus = MirroredStrategy([f"cpu:{i}" for i in range(n)])
    assert _table(gpus, dataset) == _table(cpus, dataset)
    for step in gpus.experimental_distribute_dataset(dataset):
        devices = [t.device for t in gpus.experimental_local_results(step)]
        assert devices == [torch.device("cuda", i) for i in range(n)]


def test_one_gpu_checkpoint_restores_exactly() -> None:
    strategy = OneDeviceStrategy("/gpu:0")
    dataset = fd.Dataset.range(40).shuffle(40, seed=2).batch(4)
    expected = _table(strategy, dataset)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    next(iterator), next(iterator)
    state = pickle.loads(pickle.dumps(iterator.get_state()))
    restored = iter(strategy.experimental_distribute_dataset(dataset))
    restored.set_state(state)
    assert [[t.cpu().tolist()] for t in restored] == expected[2:]
