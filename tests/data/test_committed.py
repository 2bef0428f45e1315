"""Tests of feedline/data/committed.py: ``CommittedIterator``, whose position advances when a
training step commits. Without the data service: DATA-sharded pipelines whose workers abort
steps and restart from a checkpoint taken mid-step; every element is committed exactly once."""

from __future__ import annotations

import doctest
import pickle
import random

import pytest

from feedline.data import Dataset, Options
from feedline.data import committed as committed_module
from feedline.data.committed import CommittedIterator, abort_step, commit_step
from feedline.data.experimental import AutoShardPolicy


def test_doctests() -> None:
    assert doctest.testmod(committed_module).failed == 0


def pipeline(worker: int, workers: int) -> Dataset:
    """Worker ``worker``'s DATA-sharded share of a shuffled, batched, prefetched pipeline."""
    options = Options()
    options.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA
    dataset = Dataset.range(240).shuffle(50, seed=3).with_options(options)
    return dataset.shard(workers, worker).batch(4).prefetch(2)


@pytest.mark.parametrize("seed", range(4))
def test_aborted_steps_and_restarts_mid_step_commit_every_element_once(seed: int) -> None:
    rng = random.Random(seed)
    workers = 3
    committed: list[int] = []
    for worker in range(workers):
        iterator = CommittedIterator(iter(pipeline(worker, workers)))
        checkpoint = pickle.dumps(iterator.get_state())
        while True:
            first = next(iterator, None)
            if first is None:
                break
            second = next(iterator, None) if rng.random() < 0.3 else None  # a step of two
            batch = [int(x) for x in first] + ([] if second is None else [int(x) for x in second])
            fate = rng.random()
            if fate < 0.2:  # a peer failed mid-step: the step's batches are read again
                iterator.abort()
                continue
            if fate < 0.35:  # this worker dies mid-step, restarts from its last checkpoint
                iterator.close()
                iterator = CommittedIterator(iter(pipeline(worker, workers)))
                iterator.set_state(pickle.loads(checkpoint))
                continue
            iterator.commit()
            committed.extend(batch)
            if rng.random() < 0.5:
                checkpoint = pickle.dumps(iterator.get_state())
            else:  # a checkpoint taken after next(), before the commit, is the commit's too
                next_batch = next(iterator, None)
                checkpoint = pickle.dumps(iterator.get_state())
                if next_batch is not None:
                    iterator.abort()
        iterator.close()
    assert sorted(committed) == list(range(240))


def test_plain_next_advances_on_commit_only() -> None:
    iterator = CommittedIterator(iter(Dataset.range(10)))
    assert [int(next(iterator)) for _ in range(3)] == [0, 1, 2]
    state = iterator.get_state()
    fresh = CommittedIterator(iter(Dataset.range(10)))
    fresh.set_state(state)
    assert int(next(fresh)) == 0  # nothing was committed
    iterator.commit()
    fresh.set_state(iterator.get_state())
    assert int(next(fresh)) == 3


def test_step_hooks_reach_only_iterators_that_count_steps() -> None:
    counted = CommittedIterator(iter(Dataset.range(4)))
    plain = iter(Dataset.range(4))
    next(counted), next(plain)
    abort_step([counted, plain])
    assert int(next(counted)) == 0 and int(next(plain)) == 1
    commit_step([counted, plain])
    assert counted.get_state() == iter_state_after(1)


def iter_state_after(count: int) -> dict:
    iterator = iter(Dataset.range(4))
    for _ in range(count):
        next(iterator)
    return iterator.get_state()
