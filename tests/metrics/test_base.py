"""Tests of feedline/metrics/base.py: the (total, count) state, locking, merging, pickling."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest
import torch

from feedline.errors import InvalidArgumentError
from feedline.metrics import Mean, Metric, SparseCategoricalAccuracy, Sum


def test_result_is_a_0d_float32_tensor_and_zero_before_updates() -> None:
    m = Mean()
    assert m.result().shape == () and m.result().dtype == torch.float32
    assert m.result().item() == 0.0
    assert m.get_state().dtype == torch.float64


def test_call_is_update_then_result() -> None:
    m = Mean(name="test_loss")
    assert m([1.0, 3.0]).item() == 2.0
    assert m(np.array([8.0])).item() == 4.0
    assert (m.name, repr(m)) == ("test_loss", "Mean(name='test_loss')")


def test_reset_state_and_its_older_alias() -> None:
    m = Sum()
    m.update_state([1.0, 2.0])
    m.reset_state()
    assert m.get_state().tolist() == [0.0, 0.0]
    m.update_state([5.0])
    m.reset_states()
    assert m.result().item() == 0.0


def test_state_is_total_and_count_in_float64() -> None:
    m = Mean()
    m.update_state(torch.tensor([1e8, 1.0, -1e8], dtype=torch.float32))
    # float64 totals keep the 1.0 that float32 accumulation of 1e8 + 1 would lose.
    assert m.get_state().tolist() == [1.0, 3.0]


def test_states_add_up_as_an_all_reduce_would() -> None:
    replicas = [Mean(), Mean()]
    replicas[0].update_state([2.0, 3.0])
    replicas[1].update_state([4.0, 5.0])
    summed = replicas[0].get_state() + replicas[1].get_state()  # what all_reduce(SUM) gives
    target = Mean()
    target.set_state(summed)
    assert target.result().item() == 3.5
    merged = Mean()
    merged.merge_state(replicas)
    assert merged.get_state().tolist() == [14.0, 4.0]


def test_merge_state_needs_the_same_type() -> None:
    with pytest.raises(InvalidArgumentError, match="cannot merge a Sum into a Mean"):
        Mean().merge_state([Sum()])


def test_set_state_needs_total_and_count() -> None:
    with pytest.raises(InvalidArgumentError, match=r"\[total, count\].*got shape \(3,\)"):
        Mean().set_state([1.0, 2.0, 3.0])


def test_updates_from_many_threads_are_all_counted() -> None:
    m = Mean()
    barrier = threading.Barrier(8)

    def replica() -> None:
        barrier.wait()
        for _ in range(500):
            m.update_state(torch.tensor([1.0, 2.0]))

    threads = [threading.Thread(target=replica) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert m.get_state().tolist() == [8 * 500 * 3.0, 8 * 500 * 2.0]


def test_updates_do_not_keep_the_autograd_graph() -> None:
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    m = Mean()
    m.update_state(x * 2)
    assert not m.get_state().requires_grad and not m.result().requires_grad


def test_metrics_pickle_with_their_state() -> None:
    m = SparseCategoricalAccuracy(name="eval_accuracy")
    m.update_state([1, 0], [[0.2, 0.8], [0.3, 0.7]])
    copy = pickle.loads(pickle.dumps(m))
    assert (copy.name, copy.result().item()) == ("eval_accuracy", 0.5)
    copy.update_state([0], [[0.9, 0.1]])  # the copy has a lock of its own
    assert copy.get_state().tolist() == [2.0, 3.0] and m.get_state().tolist() == [1.0, 2.0]


def test_base_class_names_the_missing_hooks() -> None:
    with pytest.raises(NotImplementedError, match="Metric must implement update_state"):
        Metric("m").update_state(1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_state_lives_on_the_device_of_the_first_update() -> None:
    m = Mean()
    m.update_state(torch.tensor([1.0, 3.0], device="cuda"))
    assert m.get_state().device.type == "cuda" and m.result().device.type == "cuda"
    m.update_state(np.array([5.0]))  # CPU updates join the CUDA state
    assert m.result().item() == 3.0
    m.reset_state()
    m.update_state([1.0])
    assert m.get_state().device.type == "cpu"


def test_get_config_and_from_config_make_the_metric_again() -> None:
    import feedline.metrics as metrics

    for metric in (
        metrics.Mean(name="loss", dtype="float64"),
        metrics.Sum(),
        metrics.SparseCategoricalAccuracy(name="acc"),
        metrics.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1),
        metrics.MeanMetricWrapper(metrics.accuracy, name="same"),
    ):
        config = metric.get_config()
        again = type(metric).from_config(config)
        assert again.get_config() == config and again is not metric
        assert again.name == metric.name and again.dtype == metric.dtype
    assert metrics.Mean(name="loss", dtype="float64").get_config() == {
        "name": "loss",
        "dtype": "float64",
    }
    assert metrics.SparseCategoricalCrossentropy().get_config()["from_logits"] is False
