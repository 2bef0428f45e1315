"""Tests of feedline/metrics/weights.py and the weights of feedline/metrics/base.py: metrics
written as Keras writes its own (``add_weight``, ``assign_add``, their own ``result``)."""

from __future__ import annotations

import doctest
import pickle
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import feedline.distribute as fdist
import feedline.train
from feedline.errors import InvalidArgumentError
from feedline.metrics import Metric
from feedline.metrics import weights as weights_module


class BinaryTruePositives(Metric):
    """Keras' guide's custom metric, as written there with torch in place of tf."""

    def __init__(self, name: str = "binary_true_positives", **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.true_positives = self.add_weight(name="tp", initializer="zeros")

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        y_true = torch.as_tensor(y_true).bool()
        y_pred = torch.as_tensor(y_pred).bool()
        values = (y_true & y_pred).to(self.dtype)
        if sample_weight is not None:
            values = values * torch.as_tensor(sample_weight, dtype=self.dtype)
        self.true_positives.assign_add(values.sum())

    def result(self) -> Any:
        return self.true_positives


class Precision(Metric):
    """Two weights, a vector among them, and a result computed from both."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name=name)
        self.tp = self.add_weight("tp")
        self.fp = self.add_weight(name="fp")
        self.seen = self.add_weight(shape=(2,), initializer="ones", name="seen")

    def update_state(self, y_true: Any, y_pred: Any) -> None:
        y_true, y_pred = torch.as_tensor(y_true), torch.as_tensor(y_pred)
        self.tp.assign_add(((y_pred == 1) & (y_true == 1)).sum())
        self.fp.assign_add(((y_pred == 1) & (y_true == 0)).sum())
        self.seen.assign_add(torch.stack([(y_true == 0).sum(), (y_true == 1).sum()]))

    def result(self) -> torch.Tensor:
        return self.tp / (self.tp + self.fp)


def test_doctests() -> None:
    assert doctest.testmod(weights_module).failed == 0


def test_kerass_custom_metric_runs_as_written() -> None:
    m = BinaryTruePositives()
    m.update_state([0, 1, 1, 1], [1, 0, 1, 1])
    assert isinstance(m.result(), torch.Tensor) and float(m.result()) == 2.0
    m.update_state([1, 1], [1, 1], sample_weight=[0.5, 0.25])
    assert float(m.result()) == 2.75 and float(m(y_true=[1], y_pred=[1])) == 3.75
    assert [w.name for w in m.variables] == ["tp"] and m.weights == m.variables
    m.reset_state()
    assert float(m.result()) == 0.0 and m.true_positives.numpy() == 0.0


def test_a_metric_of_several_weights_keeps_them_as_its_state() -> None:
    m = Precision()
    assert m.name == "precision"  # Keras' default name: the class's, in snake case
    m.update_state([1, 0, 1, 0], [1, 1, 1, 0])
    assert m.result().item() == pytest.approx(2 / 3)
    assert m.seen.value.tolist() == [3.0, 3.0]  # started at ones
    assert m.get_state().tolist() == [2.0, 1.0, 3.0, 3.0]
    other = Precision()
    other.update_state([0], [1])
    m.merge_state([other])
    assert m.get_state().tolist() == [2.0, 2.0, 5.0, 4.0] and m.result().item() == 0.5
    copy = Precision()
    copy.set_state(m.get_state())
    assert copy.get_state().tolist() == m.get_state().tolist()
    with pytest.raises(InvalidArgumentError, match=r"its weights' values of shape \(4,\)"):
        copy.set_state([1.0, 2.0])
    m.reset_state()
    assert m.get_state().tolist() == [0.0, 0.0, 0.0, 0.0]  # zeros, as Keras resets them


def test_weights_read_and_compute_as_their_tensors() -> None:
    m = Precision()
    m.update_state([1, 1], [1, 0])
    tp = m.tp
    assert tp.shape == () and tp.dtype == torch.float32
    assert float(tp + 1) == 2.0 and float(1 - tp) == 0.0 and float(tp * 3) == 3.0
    assert float(torch.add(tp, m.fp)) == 1.0 and (tp > 0.5) and np.asarray(tp) == 1.0
    assert m.seen[1].item() == 3.0 and len(m.seen) == 2
    before = tp.read_value()
    tp.assign(5)
    assert before.item() == 1.0 and tp.value.item() == 5.0  # assign never changes a read value
    tp.assign_sub(2)
    assert "MetricWeight 'tp' shape=() dtype=float32: 3.0" in repr(tp)


def test_bad_weights_say_what_is_wrong() -> None:
    m = Precision()
    with pytest.raises(InvalidArgumentError, match=r"'seen' has shape \(2,\); the value added"):
        m.seen.assign_add([1.0, 2.0, 3.0])
    with pytest.raises(InvalidArgumentError, match="has a weight 'tp' already"):
        m.add_weight("tp")
    with pytest.raises(InvalidArgumentError, match="aggregation 'sum'"):
        m.add_weight("mean_one", aggregation="mean")
    with pytest.raises(InvalidArgumentError, match="initializer"):
        m.add_weight("odd", initializer="glorot_uniform")
    assert m.add_weight("half", shape=3, initializer=0.5).value.tolist() == [0.5] * 3
    assert m.add_weight(initializer=lambda shape, dtype: torch.full(shape, 2.0)).name == "weight_4"


def test_replicas_update_one_metric_from_their_threads() -> None:
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
    m = BinaryTruePositives()

    def step() -> None:
        for _ in range(200):
            m.update_state([1, 1], [1, 1])

    strategy.run(step)
    threads = [threading.Thread(target=step) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert float(m.result()) == 2 * 200 * 6


def test_a_checkpoint_and_a_pickle_keep_the_weights(tmp_path: Path) -> None:
    m = Precision()
    m.update_state([1, 0, 1], [1, 1, 0])
    path = feedline.train.Checkpoint(metric=m).save(str(tmp_path / "ckpt"))
    m.update_state([0, 0], [1, 1])
    feedline.train.Checkpoint(metric=m).restore(path)
    assert m.get_state().tolist() == [1.0, 1.0, 2.0, 3.0]
    again = pickle.loads(pickle.dumps(m))
    again.update_state([1], [1])
    assert again.get_state().tolist() == [2.0, 1.0, 2.0, 4.0]
    assert m.get_state().tolist() == [1.0, 1.0, 2.0, 3.0]  # the copy's weights are its own
