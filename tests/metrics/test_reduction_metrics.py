"""Tests of feedline/metrics/reduction_metrics.py: Mean, Sum, MeanMetricWrapper."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
import torch

from feedline.errors import InvalidArgumentError
from feedline.metrics import Mean, MeanMetricWrapper, Sum, reduction_metrics
from feedline.nn import compute_average_loss


def test_docstring_examples() -> None:
    results = doctest.testmod(reduction_metrics)
    assert results.attempted > 0 and results.failed == 0


def test_seed_pitfall_mean_of_scaled_replica_losses_is_1_75_not_3_5() -> None:
    # Two replicas, losses [2, 3] and [4, 5], global batch size 4.
    shares = [
        compute_average_loss(torch.tensor([2.0, 3.0]), global_batch_size=4),
        compute_average_loss(torch.tensor([4.0, 5.0]), global_batch_size=4),
    ]
    assert [s.item() for s in shares] == [1.25, 2.25]
    assert sum(s.item() for s in shares) == 3.5  # strategy.reduce(SUM, ...)
    train_loss = Mean(name="train_loss")
    for share in shares:
        train_loss.update_state(share)
    assert train_loss.get_state().tolist() == [3.5, 2.0]  # total 3.50, count 2
    assert train_loss.result().item() == 1.75


def test_keras_mean_and_sum_examples() -> None:
    mean, total = Mean(), Sum()
    for metric in (mean, total):
        metric.update_state([1, 3, 5, 7])
    assert (mean.result().item(), total.result().item()) == (4.0, 16.0)
    for metric in (mean, total):
        metric.reset_state()
        metric.update_state([1, 3, 5, 7], sample_weight=[1, 1, 0, 0])
    assert (mean.result().item(), total.result().item()) == (2.0, 4.0)


def test_weights_broadcast_to_values() -> None:
    m = Mean()
    m.update_state(torch.tensor([[1.0, 3.0], [5.0, 7.0]]), sample_weight=torch.tensor([1.0, 0.0]))
    assert m.get_state().tolist() == [4.0, 2.0]  # [batch] weights: one per row, each element
    m.reset_state()
    m.update_state([[1.0], [3.0]], sample_weight=[[2.0], [0.0]])
    assert m.result().item() == 1.0
    m.reset_state()
    m.update_state([1.0, 3.0], sample_weight=0.5)
    assert m.get_state().tolist() == [2.0, 1.0]


def test_weights_of_the_leading_dims_weigh_reduced_values() -> None:
    # [batch] weights that do not broadcast to [batch, 2, 3] values weigh each example's mean
    # (Mean) or sum (Sum), as Keras does. Example means 2.5 and 8.5, sums 15 and 51.
    values = torch.arange(12.0).reshape(2, 2, 3)
    mean, total = Mean(), Sum()
    mean.update_state(values, sample_weight=[1.0, 3.0])
    total.update_state(values, sample_weight=[1.0, 3.0])
    assert mean.get_state().tolist() == [2.5 + 3 * 8.5, 4.0]
    assert total.result().item() == 15.0 + 3 * 51.0
    # Weights that do broadcast (here along the last dimension) weigh elements.
    mean.reset_state()
    mean.update_state(torch.ones(2, 2), sample_weight=[1.0, 0.0])
    assert mean.get_state().tolist() == [2.0, 2.0]


def test_bad_weights_name_both_shapes() -> None:
    with pytest.raises(InvalidArgumentError, match=r"shape \(3,\).*values of shape \(2,\)"):
        Mean().update_state([1.0, 2.0], sample_weight=[1.0, 1.0, 1.0])


def test_empty_updates_change_nothing() -> None:
    m = Mean()
    m.update_state(torch.zeros(0))
    assert m.get_state().tolist() == [0.0, 0.0] and m.result().item() == 0.0
    m.update_state([2.0])
    m.update_state(np.zeros((0, 3)), sample_weight=np.zeros(0))
    assert m.get_state().tolist() == [2.0, 1.0]
    wrapped = MeanMetricWrapper(lambda t, p: (t - p).abs(), name="mae")
    wrapped.update_state(torch.zeros(0), torch.zeros(0))
    assert wrapped.get_state().tolist() == [0.0, 0.0]


def test_zero_total_weight_gives_zero_not_nan() -> None:
    m = Mean()
    m.update_state([1.0, 2.0], sample_weight=[0.0, 0.0])
    assert m.result().item() == 0.0


def test_mean_metric_wrapper_passes_its_kwargs() -> None:
    def scaled_error(y_true, y_pred, scale):
        return (y_true - y_pred).abs() * scale

    m = MeanMetricWrapper(scaled_error, scale=10.0)
    assert m.name == "scaled_error"
    assert m([1.0, 2.0], [1.5, 2.0], sample_weight=[1.0, 0.0]).item() == 5.0
    assert isinstance(m, Mean)


def test_dtype_argument_and_labels_lined_up_with_predictions_as_keras_does() -> None:
    import feedline.metrics as metrics

    assert metrics.Mean(name="m", dtype="float64")([1.0, 2.0]).dtype == torch.float64
    assert metrics.Sum("s", torch.float64)([1.0]).dtype == torch.float64
    assert metrics.Accuracy("acc", "float32").dtype == torch.float32
    with pytest.raises(InvalidArgumentError, match="floating point"):
        metrics.Mean(dtype="int32")

    def matches(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
        return torch.eq(y_true, y_pred).float()

    # [[1], [2]] against [1, 3]: Keras drops the label's trailing 1 (0.5), where broadcasting
    # the two gave a 2 x 2 comparison (0.25).
    wrapper = metrics.MeanMetricWrapper(matches, name="a", dtype="float32")
    wrapper.update_state([[1], [2]], [1, 3])
    assert wrapper.result().item() == 0.5
    wrapper.update_state([1, 2], [[1], [2]])
    assert wrapper.result().item() == 0.75
