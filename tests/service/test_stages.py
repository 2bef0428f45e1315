"""``stages``: a pipeline timed per stage gives the same elements, and the slow stage is the
one that takes the time."""

from __future__ import annotations

import time

import numpy as np

from feedline.data import Dataset
from feedline.service.stages import StageClock, profile, source_stage, stage_kind, timed


def slow(x):
    time.sleep(0.005)
    return x


def test_a_timed_pipeline_gives_the_same_elements_and_state() -> None:
    dataset = Dataset.range(20).map(lambda x: x * 2).shuffle(8, seed=1).batch(3)
    clock = StageClock()
    expected = [b.tolist() for b in dataset]
    assert [b.tolist() for b in timed(dataset, clock)] == expected
    assert sorted(stage_kind(name) for name in clock.seconds()) == [
        "batch", "map", "range", "shuffle",
    ]  # fmt: skip
    # A timed iterator saves and restores its position like the pipeline it wraps.
    iterator = iter(timed(dataset, StageClock()))
    next(iterator)
    state = iterator.get_state()
    rest = [b.tolist() for b in iterator]
    again = iter(timed(dataset, StageClock()))
    again.set_state(state)
    assert [b.tolist() for b in again] == rest == expected[1:]


def test_the_slow_stage_takes_the_time() -> None:
    seconds = profile(Dataset.range(1000).map(slow).map(lambda x: x + 1), 40)
    slowest = max(seconds, key=seconds.__getitem__)
    assert slowest == "map#1", seconds
    assert seconds["map#1"] >= 39 * 0.005
    (source,) = [name for name in seconds if source_stage(name)]
    assert stage_kind(source) == "range"


def test_a_generator_is_a_source() -> None:
    def generate():
        for i in range(10):
            time.sleep(0.005)
            yield np.int64(i)

    from feedline.data import TensorSpec

    dataset = Dataset.from_generator(generate, output_signature=TensorSpec((), np.int64))
    seconds = profile(dataset.map(lambda x: x), 10)
    slowest = max(seconds, key=seconds.__getitem__)
    assert source_stage(slowest) and stage_kind(slowest) == "generator", seconds


def test_a_closed_iterators_time_stays_counted_and_its_account_goes() -> None:
    # A task of an exactly-once job makes an iterator per split: their accounts must not pile up.
    clock = StageClock()
    dataset = timed(Dataset.range(4).map(slow), clock)
    for _ in range(30):
        iterator = iter(dataset)
        assert [int(x) for x in iterator] == [0, 1, 2, 3]
        iterator.close()
    seconds = clock.seconds()
    assert seconds["map#0"] >= 30 * 4 * 0.005 * 0.9, seconds
    assert not any(clock._open.values())  # every account folded into its stage's total
    open_one = iter(dataset)
    next(open_one)
    assert clock.seconds()["map#0"] > seconds["map#0"]  # an open account counts too
    open_one.close()


def test_closing_one_account_leaves_another_of_the_same_seconds_open() -> None:
    clock = StageClock()
    first, second = clock.account("map#0"), clock.account("map#0")  # both [0.0]
    clock.close("map#0", second)
    first[0] += 2.0
    assert clock.seconds() == {"map#0": 2.0}
