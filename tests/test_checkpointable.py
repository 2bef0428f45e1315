"""Tests of feedline/_checkpointable.py: the protocol through which Checkpoint saves an object in
its own way, and the objects of other packages that implement it."""

from __future__ import annotations

import doctest

import numpy as np

import feedline.distribute as fdist
from feedline import _checkpointable
from feedline._checkpointable import Checkpointable
from feedline.data import Dataset
from feedline.metrics import Mean


def test_doctests() -> None:
    results = doctest.testmod(_checkpointable)
    assert results.attempted >= 1 and results.failed == 0


def test_distributed_iterators_and_metrics_are_checkpointable_and_dataset_iterators_are_not() -> (
    None
):
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
    iterator = iter(strategy.experimental_distribute_dataset(Dataset.range(8).batch(4)))
    assert isinstance(iterator, Checkpointable)
    assert isinstance(Mean(), Checkpointable)
    assert not isinstance(iter(Dataset.range(3)), Checkpointable)  # get_state/set_state only
    assert not isinstance(np.zeros(2), Checkpointable)


def test_a_distributed_iterator_restores_what_it_saved_for_a_checkpoint() -> None:
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
    dataset = strategy.experimental_distribute_dataset(Dataset.range(8).batch(4))
    iterator = iter(dataset)
    next(iterator)
    saved = iterator.checkpoint_state()
    assert iterator.check_restorable(saved) is None
    expected = [t.tolist() for t in next(iterator).values]
    restored = iter(dataset)
    restored.restore_checkpoint_state(saved)
    assert [t.tolist() for t in next(restored).values] == expected == [[4, 5], [6, 7]]
