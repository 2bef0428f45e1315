"""Tests of feedline/metrics/accuracy_metrics.py: Accuracy and SparseCategoricalAccuracy."""

from __future__ import annotations

import doctest
from collections.abc import Callable

import numpy as np
import pytest
import torch

from feedline.errors import InvalidArgumentError
from feedline.metrics import (
    Accuracy,
    SparseCategoricalAccuracy,
    accuracy,
    accuracy_metrics,
    sparse_categorical_accuracy,
)


def test_docstring_examples() -> None:
    results = doctest.testmod(accuracy_metrics)
    assert results.attempted > 0 and results.failed == 0


def test_keras_sparse_categorical_accuracy_example() -> None:
    m = SparseCategoricalAccuracy()
    m.update_state([[2], [1]], [[0.1, 0.6, 0.3], [0.05, 0.95, 0]])
    assert m.result().item() == 0.5
    m.reset_state()
    m.update_state([[2], [1]], [[0.1, 0.6, 0.3], [0.05, 0.95, 0]], sample_weight=[0.7, 0.3])
    assert m.result().item() == pytest.approx(0.3)
    assert m.name == "sparse_categorical_accuracy"


def test_keras_accuracy_example() -> None:
    m = Accuracy()
    m.update_state([[1], [2], [3], [4]], [[0], [2], [3], [4]])
    assert m.result().item() == 0.75
    m.reset_state()
    m.update_state([[1], [2], [3], [4]], [[0], [2], [3], [4]], sample_weight=[1, 1, 0, 0])
    assert m.result().item() == 0.5


def test_seed_004_evaluation_loop() -> None:
    # eval_accuracy(labels, predictions) per batch, then eval_accuracy.result() * 100.
    eval_accuracy = SparseCategoricalAccuracy(name="eval_accuracy")
    torch.manual_seed(0)
    logits = torch.randn(10, 10)
    labels = logits.argmax(dim=1)
    labels[7:] = (labels[7:] + 1) % 10  # the last three predictions are wrong
    for start in range(0, 10, 4):  # batches of 4, 4, 2
        eval_accuracy(labels[start : start + 4], logits[start : start + 4])
    assert (eval_accuracy.result() * 100).item() == pytest.approx(70.0)
    eval_accuracy.reset_states()
    assert eval_accuracy.result().item() == 0.0


def test_logits_and_probabilities_agree() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 3.0, 1.0], [1.0, 1.0, 4.0]])
    labels = torch.tensor([0, 2, 2])
    by_logits = sparse_categorical_accuracy(labels, logits)
    by_probs = sparse_categorical_accuracy(labels, torch.softmax(logits, dim=1))
    assert by_logits.tolist() == by_probs.tolist() == [1.0, 0.0, 1.0]
    assert by_logits.dtype == torch.float32


def test_ties_go_to_the_first_class_and_float_labels_work() -> None:
    assert sparse_categorical_accuracy([0.0, 1.0], [[0.5, 0.5], [0.5, 0.5]]).tolist() == [1, 0]
    assert sparse_categorical_accuracy(np.array([[1]]), np.array([[0.2, 0.8]])).tolist() == [1.0]


def test_sequence_labels_with_per_example_weights() -> None:
    # [batch, time] labels and [batch, time, classes] scores; weights per example.
    y_pred = torch.zeros(2, 3, 4)
    y_pred[..., 1] = 1.0  # always predicts class 1
    y_true = torch.tensor([[1, 1, 0], [0, 0, 0]])
    m = SparseCategoricalAccuracy()
    m.update_state(y_true, y_pred, sample_weight=[1.0, 0.0])
    assert m.get_state().tolist() == [2.0, 3.0]


def test_accuracy_squeezes_a_trailing_one() -> None:
    assert accuracy([1, 2, 3], [[1], [0], [3]]).tolist() == [1.0, 0.0, 1.0]
    assert accuracy([[1], [2]], np.array([1, 2])).tolist() == [1.0, 1.0]


def test_mismatched_shapes_are_named() -> None:
    with pytest.raises(
        InvalidArgumentError, match=r"y_true of shape \(3,\).*y_pred of shape \(2,\)"
    ):
        accuracy([1, 2, 3], [1, 2])
    with pytest.raises(InvalidArgumentError, match=r"y_true of shape \(3,\).*\(2, 4\)"):
        SparseCategoricalAccuracy().update_state([1, 2, 3], torch.zeros(2, 4))
    with pytest.raises(InvalidArgumentError, match="last dimension of classes"):
        sparse_categorical_accuracy(1, 0.5)


def test_empty_batches_change_nothing() -> None:
    m = SparseCategoricalAccuracy()
    m.update_state([1], [[0.1, 0.9]])
    m.update_state(torch.zeros(0, dtype=torch.int64), torch.zeros(0, 2))
    m.update_state(np.zeros((0, 1)), np.zeros((0, 2)), sample_weight=np.zeros(0))
    assert m.get_state().tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    ("metric_type", "make_pred"),
    [
        (SparseCategoricalAccuracy, lambda g, n: torch.randn(n, 5, generator=g)),
        (Accuracy, lambda g, n: torch.randint(0, 5, (n,), generator=g)),
    ],
)
def test_counted_updates_give_the_state_of_the_general_path(
    metric_type: type, make_pred: Callable[[torch.Generator, int], torch.Tensor]
) -> None:
    # Plain tensors take the counting path (their counts join the state when it is read, or
    # every _FOLD_EVERY updates); lists, weights and [batch, 1] labels the general one. Every
    # read sees exactly the state the general path gives the same batches.
    g = torch.Generator().manual_seed(0)
    counted, general = metric_type(), metric_type()
    for step in range(160):
        n = int(torch.randint(1, 9, (1,), generator=g))
        y_true = torch.randint(0, 5, (n,), generator=g)
        y_pred = make_pred(g, n)
        if step % 37 == 5:
            weights = torch.rand(n, generator=g)
            counted.update_state(y_true, y_pred, sample_weight=weights)
            general.update_state(y_true.tolist(), y_pred.tolist(), sample_weight=weights.tolist())
        elif step % 41 == 7:  # labels [batch, 1]: the general path, then counting again
            counted.update_state(y_true[:, None], y_pred)
            general.update_state(y_true[:, None].tolist(), y_pred.tolist())
        else:
            counted.update_state(y_true, y_pred)
            general.update_state(y_true.tolist(), y_pred.tolist())
        if step % 50 == 49:
            assert torch.equal(counted.get_state(), general.get_state())
    assert counted._counts  # counts wait for the next read...
    assert torch.equal(counted.result(), general.result())
    assert not counted._counts  # ...which takes them in
    assert torch.equal(counted.get_state(), general.get_state())


def test_counted_updates_survive_pickling_and_reset() -> None:
    import pickle

    m = SparseCategoricalAccuracy()
    m.update_state(torch.tensor([0, 1, 2]), torch.eye(3))
    copy = pickle.loads(pickle.dumps(m))
    assert copy.get_state().tolist() == [3.0, 3.0]
    m.update_state(torch.tensor([1]), torch.tensor([[1.0, 0.0]]))
    assert m.get_state().tolist() == [3.0, 4.0]
    m.update_state(torch.tensor([1]), torch.tensor([[0.0, 1.0]]))
    m.reset_state()  # counts not yet read are dropped with the rest
    assert m.get_state().tolist() == [0.0, 0.0]
    m.update_state(torch.tensor([1]), torch.tensor([[0.0, 1.0]]))
    m.set_state([5.0, 10.0])
    assert m.get_state().tolist() == [5.0, 10.0]


def test_counted_updates_keep_the_errors_of_the_general_path() -> None:
    with pytest.raises(InvalidArgumentError, match="does not match y_pred"):
        SparseCategoricalAccuracy().update_state(torch.tensor([0, 1, 2]), torch.eye(2))
    with pytest.raises(InvalidArgumentError, match="must have the same shape"):
        Accuracy().update_state(torch.tensor([0, 1, 2]), torch.tensor([0, 1]))
