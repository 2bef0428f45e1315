"""Tests of feedline/nn/losses.py."""

from __future__ import annotations

import doctest
import warnings

import numpy as np
import pytest
import torch

from feedline.distribute import MirroredStrategy, PerReplica, ReduceOp
from feedline.errors import FailedPreconditionError, InvalidArgumentError
from feedline.nn import compute_average_loss, scale_regularization_loss
from feedline.nn import losses as losses_module


def test_docstring_examples() -> None:
    results = doctest.testmod(losses_module)
    assert results.attempted > 0 and results.failed == 0


# -- the seed's numbers ------------------------------------------------------------------------


def test_seed_two_replicas_global_batch_4() -> None:
    # Two replicas, per-example losses [2, 3] and [4, 5], global batch size 4.
    share_0 = compute_average_loss(torch.tensor([2.0, 3.0]), global_batch_size=4)
    share_1 = compute_average_loss(torch.tensor([4.0, 5.0]), global_batch_size=4)
    assert (share_0.item(), share_1.item()) == (1.25, 2.25)
    assert (share_0 + share_1).item() == 3.5  # strategy.reduce(SUM, ...)
    assert (share_0 + share_1).item() == torch.tensor([2.0, 3.0, 4.0, 5.0]).mean().item()


def test_seed_replica_context_infers_global_batch() -> None:
    strategy = MirroredStrategy(["cpu:0", "cpu:1"])
    losses = PerReplica([torch.tensor([2.0, 3.0]), torch.tensor([4.0, 5.0])])
    shares = strategy.run(compute_average_loss, args=(losses,))
    assert [t.item() for t in shares.values] == [1.25, 2.25]


def test_seed_004_batch_16_per_replica_global_64() -> None:
    # 4 replicas of BATCH_SIZE_PER_REPLICA = 16: each divides by GLOBAL_BATCH_SIZE = 64.
    loss = compute_average_loss(torch.ones(16), global_batch_size=64)
    assert loss.item() == 0.25


def test_outside_any_strategy_the_local_batch_is_the_global_batch() -> None:
    assert compute_average_loss(torch.tensor([1.0, 2.0, 6.0])).item() == 3.0
    assert scale_regularization_loss(torch.tensor([0.5, 1.5])).item() == 2.0


def test_cross_replica_context_needs_global_batch_size() -> None:
    with MirroredStrategy(["cpu:0", "cpu:1"]).scope():
        with pytest.raises(FailedPreconditionError, match=r"cross-replica.*pass global_batch_size"):
            compute_average_loss(torch.tensor([2.0, 3.0]))
        with pytest.raises(RuntimeError, match="scale_regularization_loss"):
            scale_regularization_loss(torch.tensor(1.0))
        assert compute_average_loss(torch.tensor([2.0, 3.0]), global_batch_size=4).item() == 1.25


def test_with_a_real_mirrored_strategy() -> None:
    import feedline.data as fd

    strategy = MirroredStrategy(["cpu:0", "cpu:1"])
    # The seed: global batch [2, 3, 4, 5] of per-example losses over two replicas.
    (step,) = strategy.experimental_distribute_dataset(
        fd.Dataset.from_tensor_slices(np.array([2.0, 3.0, 4.0, 5.0])).batch(4)
    )
    per_replica = strategy.run(compute_average_loss, args=(step,))
    assert [s.item() for s in strategy.experimental_local_results(per_replica)] == [1.25, 2.25]
    assert strategy.reduce(ReduceOp.SUM, per_replica, axis=None).item() == 3.5
    shares = strategy.experimental_local_results(
        strategy.run(lambda: compute_average_loss(torch.tensor([2.0, 3.0])))
    )
    assert [s.item() for s in shares] == [1.25, 1.25]
    regularization = strategy.experimental_local_results(
        strategy.run(lambda: scale_regularization_loss(torch.tensor(3.0)))
    )
    assert [r.item() for r in regularization] == [1.5, 1.5]
    with strategy.scope(), pytest.raises(FailedPreconditionError):
        compute_average_loss(torch.tensor([2.0, 3.0]))


# -- gradients ---------------------------------------------------------------------------------


def test_gradient_is_scaled_by_the_global_batch() -> None:
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    compute_average_loss(x**2, global_batch_size=8).backward()
    torch.testing.assert_close(x.grad, 2 * x.detach() / 8)


def test_gradcheck_with_sample_weights() -> None:
    loss = torch.rand(5, 3, dtype=torch.float64, requires_grad=True)
    weights = torch.rand(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda loss, w: compute_average_loss(loss, sample_weight=w, global_batch_size=7),
        (loss, weights),
    )


def test_replica_shares_sum_to_the_gradient_of_the_global_mean() -> None:
    # The equivalence the design asks for: 2 replicas on halves of a global batch of 4 give the
    # gradient of one replica on the whole batch.
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    y = torch.tensor([2.0, 3.0, 7.0, 9.0], dtype=torch.float64)
    w = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    (whole,) = torch.autograd.grad(((w * x - y) ** 2).mean(), w)
    grads = [
        torch.autograd.grad(compute_average_loss((w * x[s] - y[s]) ** 2, global_batch_size=4), w)[0]
        for s in (slice(0, 2), slice(2, 4))
    ]
    torch.testing.assert_close(grads[0] + grads[1], whole)


# -- sample weights ----------------------------------------------------------------------------


def test_sample_weights() -> None:
    loss = torch.tensor([2.0, 3.0])
    assert compute_average_loss(loss, sample_weight=[1.0, 0.0], global_batch_size=4).item() == 0.5
    assert compute_average_loss(loss, sample_weight=2.0, global_batch_size=4).item() == 2.5
    column = np.array([[1.0], [0.0]])  # [batch, 1] weights for [batch] losses
    assert compute_average_loss(loss, sample_weight=column, global_batch_size=4).item() == 0.5
    per_element = torch.tensor([[1.0, 1.0], [2.0, 2.0]])  # [batch] weights for [batch, 2] losses
    assert compute_average_loss(per_element, sample_weight=[1.0, 0.5]).item() == 2.0


@pytest.mark.parametrize(
    ("loss_shape", "weight_shape"), [((2,), (3,)), ((4,), (2, 2)), ((4, 1), (1, 4))]
)
def test_mismatched_sample_weight_names_both_shapes(loss_shape, weight_shape) -> None:
    pattern = rf"sample_weight of shape \({weight_shape[0]},.*per_example_loss of shape"
    with pytest.raises(InvalidArgumentError, match=pattern) as info:
        compute_average_loss(torch.ones(loss_shape), sample_weight=torch.ones(weight_shape))
    assert str(tuple(loss_shape)) in str(info.value) and str(weight_shape) in str(info.value)


# -- empty batches -----------------------------------------------------------------------------


def test_empty_batch_gives_zero_not_nan() -> None:
    x = torch.zeros(0, requires_grad=True)
    loss = compute_average_loss(x * 2)
    assert loss.item() == 0.0
    loss.backward()
    assert x.grad is not None and x.grad.shape == (0,)
    assert compute_average_loss(torch.zeros(0, 3), global_batch_size=4).item() == 0.0
    two = MirroredStrategy(["cpu:0", "cpu:1"])
    empties = PerReplica([torch.zeros(0), torch.zeros(0)])
    assert [t.item() for t in two.run(compute_average_loss, args=(empties,)).values] == [0.0, 0.0]


def test_zero_global_batch_size_gives_zero_as_tensorflow() -> None:
    # TF 2.21: tf.nn.compute_average_loss([2., 3.], global_batch_size=0) -> 0.0 (div_no_nan).
    x = torch.tensor([2.0, 3.0], requires_grad=True)
    loss = compute_average_loss(x, global_batch_size=0)
    assert loss.item() == 0.0 and loss.dtype == torch.float32
    loss.backward()
    assert x.grad is not None and x.grad.tolist() == [0.0, 0.0]
    assert compute_average_loss([float("inf")], global_batch_size=0).item() == 0.0
    weighted = compute_average_loss([2.0, 3.0], sample_weight=[1.0, 2.0], global_batch_size=0)
    assert weighted.item() == 0.0
    assert compute_average_loss(np.float64(5.0), global_batch_size=0).dtype == torch.float64


# -- inputs and bad inputs ---------------------------------------------------------------------


@pytest.mark.parametrize("size", [4, np.int64(4), np.array(4), torch.tensor(4)])
def test_integer_global_batch_sizes(size) -> None:
    assert compute_average_loss([2.0, 3.0], global_batch_size=size).item() == 1.25


@pytest.mark.parametrize(
    ("size", "pattern"),
    [
        (-4, "global_batch_size must not be negative, got -4"),
        (4.0, r"global_batch_size must be an integer, got 4.0 \(float\)"),
        (torch.tensor(4.0), "global_batch_size must be an integer, got 4.0"),
        (True, "global_batch_size must be an integer, got True"),
        ("4", "global_batch_size must be an integer, got '4'"),
        (np.array([4]), r"global_batch_size must be a scalar, got shape \(1,\)"),
    ],
)
def test_bad_global_batch_size_is_named(size, pattern: str) -> None:
    with pytest.raises(InvalidArgumentError, match=pattern):
        compute_average_loss(torch.tensor([2.0, 3.0]), global_batch_size=size)


def test_scalar_loss_needs_a_global_batch_size() -> None:
    assert compute_average_loss(torch.tensor(5.0), global_batch_size=4).item() == 1.25
    with pytest.raises(InvalidArgumentError, match=r"rank 0.*pass global_batch_size"):
        compute_average_loss(torch.tensor(5.0))


def test_numpy_and_python_inputs_become_tensors() -> None:
    from_numpy = compute_average_loss(np.array([2.0, 3.0]), global_batch_size=4)
    assert isinstance(from_numpy, torch.Tensor) and from_numpy.dtype == torch.float64
    from_list = compute_average_loss([2, 3], global_batch_size=4)
    assert from_list.dtype == torch.float32 and from_list.item() == 1.25
    read_only = np.array([2.0, 3.0], dtype=np.float32)
    read_only.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compute_average_loss(read_only, global_batch_size=4).item() == 1.25


@pytest.mark.parametrize("bad", [["a", "b"], np.array(["a"]), {"loss": 1.0}])
def test_non_numeric_loss_is_an_invalid_argument(bad) -> None:
    with pytest.raises(InvalidArgumentError, match="per_example_loss must be"):
        compute_average_loss(bad, global_batch_size=2)


def test_scale_regularization_loss() -> None:
    weights = torch.tensor([1.0, 2.0], requires_grad=True)
    penalties = [weights.pow(2).sum(), weights.abs().sum()]  # as model.losses
    two = MirroredStrategy(["cpu:0", "cpu:1"])
    scaled = two.run(lambda: scale_regularization_loss(penalties)).values[0]
    assert scaled.item() == (5.0 + 3.0) / 2
    scaled.backward()
    torch.testing.assert_close(weights.grad, (2 * weights.detach() + 1) / 2)
