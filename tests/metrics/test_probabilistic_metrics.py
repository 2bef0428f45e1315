"""Tests of feedline/metrics/probabilistic_metrics.py: SparseCategoricalCrossentropy."""

from __future__ import annotations

import doctest
import math

import pytest
import torch

from feedline.errors import InvalidArgumentError
from feedline.metrics import SparseCategoricalCrossentropy, probabilistic_metrics
from feedline.metrics import sparse_categorical_crossentropy as xent


def test_docstring_examples() -> None:
    results = doctest.testmod(probabilistic_metrics)
    assert results.attempted > 0 and results.failed == 0


def test_keras_example() -> None:
    m = SparseCategoricalCrossentropy()
    m.update_state([1, 2], [[0.05, 0.95, 0], [0.1, 0.8, 0.1]])
    expected = (-math.log(0.95) - math.log(0.1)) / 2
    assert m.result().item() == pytest.approx(expected, rel=1e-6)
    assert m.result().item() == pytest.approx(1.177, abs=1e-3)
    m.reset_state()
    m.update_state([1, 2], [[0.05, 0.95, 0], [0.1, 0.8, 0.1]], sample_weight=[0.3, 0.7])
    assert m.result().item() == pytest.approx(1.6271976, rel=1e-5)


def test_from_logits_matches_torch_cross_entropy() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 5)
    labels = torch.randint(0, 5, (6,))
    expected = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    torch.testing.assert_close(xent(labels, logits, from_logits=True), expected)
    m = SparseCategoricalCrossentropy(from_logits=True)
    m.update_state(labels[:, None], logits)
    assert m.result().item() == pytest.approx(expected.mean().item(), rel=1e-6)


def test_probabilities_are_normalized_and_clipped() -> None:
    # Unnormalized scores are divided by their sum; a zero probability costs -log(1e-7).
    torch.testing.assert_close(xent([0], [[2.0, 2.0]]), torch.tensor([math.log(2.0)]))
    torch.testing.assert_close(xent([1], [[1.0, 0.0]]), torch.tensor([-math.log(1e-7)]))


def test_functional_form_is_differentiable() -> None:
    logits = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 3, 1])
    assert torch.autograd.gradcheck(lambda z: xent(labels, z, from_logits=True), (logits,))


def test_labels_outside_the_classes_are_named() -> None:
    with pytest.raises(InvalidArgumentError, match=r"label 3 is outside \[0, 3\)"):
        xent([0, 3], torch.rand(2, 3))
    with pytest.raises(InvalidArgumentError, match=r"label -1 is outside"):
        SparseCategoricalCrossentropy().update_state([-1], torch.rand(1, 3))


def test_empty_batches_change_nothing() -> None:
    m = SparseCategoricalCrossentropy(from_logits=True)
    m.update_state(torch.zeros(0, dtype=torch.int64), torch.zeros(0, 10))
    assert m.get_state().tolist() == [0.0, 0.0] and m.result().item() == 0.0


def test_keras_argument_order_and_ignore_class_and_axis() -> None:
    # Keras: (name, dtype, from_logits, ignore_class, axis). A positional dtype once landed in
    # from_logits and gave 0.987 without a word.
    metric = SparseCategoricalCrossentropy("scce", "float64")
    metric.update_state([1, 2], [[0.05, 0.95, 0], [0.1, 0.8, 0.1]])
    assert metric.result().dtype == torch.float64
    assert metric.result().item() == pytest.approx(1.1769392, rel=1e-6)
    # Keras' documented ignore_class values: the void examples cost 0 and leave the mean.
    y_true = [[0, 2], [-1, -1]]
    y_pred = [[[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], [[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]]]
    losses = xent(y_true, y_pred, ignore_class=-1)
    assert losses.flatten().tolist() == pytest.approx([2.3841855e-07, 2.3841855e-07, 0.0, 0.0])
    ignoring = SparseCategoricalCrossentropy(ignore_class=-1)
    ignoring.update_state(y_true, y_pred, sample_weight=[1.0, 5.0])
    assert ignoring.result().item() == pytest.approx(2.3841855e-07, rel=1e-5)
    # The class axis first (channels-first predictions) gives the same cross-entropies.
    channels_first = torch.tensor(y_pred).movedim(-1, 1)
    first = xent([[0, 2], [0, 1]], channels_first, axis=1).flatten().tolist()
    assert first == pytest.approx(xent([[0, 2], [0, 1]], y_pred).flatten().tolist())


def test_probabilities_are_clipped_before_they_are_normalised_as_keras_does() -> None:
    # Keras clips to [1e-7, 1 - 1e-7], takes the log and normalises it as logits.
    assert xent([0], [[3.0, 1.0]]).item() == pytest.approx(math.log(2), rel=1e-6)
    one_hot = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]  # Keras' documented 2.38e-07 a certain example
    assert xent([0, 1], one_hot).tolist() == pytest.approx([2.3841855e-07] * 2, rel=1e-5)
