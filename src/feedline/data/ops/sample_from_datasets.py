"""``Dataset.sample_from_datasets``: each element drawn from a dataset picked at random."""

from __future__ import annotations

import bisect
import secrets
from collections.abc import Sequence
from typing import Any

import numpy as np

from feedline import structure
from feedline.data.dataset import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    IteratorContext,
    mix_seed,
)
from feedline.data.ops._checks import check_seed
from feedline.data.ops.choose_from_datasets import DirectedIterator, check_datasets
from feedline.errors import InvalidArgumentError


def _probabilities(weights: Any, count: int) -> np.ndarray:
    """``weights`` as ``count`` finite float64 values >= 0, not all 0."""
    try:
        array = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"sample_from_datasets: weights must be numbers, got {weights!r}"
        ) from None
    if array.shape != (count,):
        raise InvalidArgumentError(
            f"sample_from_datasets: weights has shape {array.shape}, but there are {count} "
            "datasets; give one weight per dataset"
        )
    if not np.all(np.isfinite(array)) or np.any(array < 0) or not array.sum() > 0:
        raise InvalidArgumentError(
            f"sample_from_datasets: weights must be finite, >= 0 and not all 0, got "
            f"{array.tolist()}"
        )
    return array


class SampleFromDatasetsDataset(Dataset):
    """Draws each element from ``datasets[i]``, ``i`` picked with probability ``weights[i]``.

    ``weights`` defaults to uniform; it may also be a Dataset whose every element is a weight
    vector for one draw. A dataset that runs out is no longer picked and the other weights are
    renormalised, unless ``stop_on_empty_dataset``, which ends the iteration the first time an
    exhausted dataset is picked. With a ``seed`` the draws are reproducible; without one they
    are random but fixed for this dataset object. Every pass draws the same sequence unless
    ``rerandomize_each_iteration``.

    Example:
      >>> from feedline.data import Dataset
      >>> ds = Dataset.sample_from_datasets(
      ...     [Dataset.range(0, 3), Dataset.range(100, 103)], weights=[0.5, 0.5], seed=1
      ... )
      >>> sorted(int(x) for x in ds)
      [0, 1, 2, 100, 101, 102]
    """

    def __init__(
        self,
        datasets: Sequence[Dataset],
        weights: Sequence[float] | Dataset | None = None,
        seed: int | None = None,
        stop_on_empty_dataset: bool = False,
        rerandomize_each_iteration: bool | None = None,
    ) -> None:
        datasets, self._element_spec = check_datasets(datasets, "sample_from_datasets")
        count = len(datasets)
        self._weights: np.ndarray | None = None
        if isinstance(weights, Dataset):
            spec = weights.element_spec
            if not (
                isinstance(spec, structure.TensorSpec)
                and spec.shape is not None
                and spec.rank == 1
                and spec.shape[0] in (None, count)
                and spec.dtype.kind in "fiu"
            ):
                raise InvalidArgumentError(
                    f"sample_from_datasets: a weights dataset must yield vectors of {count} "
                    f"numbers, but its element_spec is {spec}"
                )
            super().__init__((*datasets, weights))
        else:
            self._weights = (
                np.full(count, 1.0) if weights is None else _probabilities(weights, count)
            )
            super().__init__(datasets)
        checked = check_seed(seed, "sample_from_datasets")
        self._seed = secrets.randbits(63) if checked is None else checked
        self._count = count
        self._stop_on_empty = bool(stop_on_empty_dataset)
        self._rerandomize = bool(rerandomize_each_iteration)

    def _cardinality(self) -> int:
        if self._weights is None:
            return UNKNOWN_CARDINALITY
        sizes = [
            d.cardinality() for d, w in zip(self._inputs, self._weights, strict=False) if w > 0
        ]
        if self._stop_on_empty:
            infinite = all(n == INFINITE_CARDINALITY for n in sizes)
            return INFINITE_CARDINALITY if infinite else UNKNOWN_CARDINALITY
        if INFINITE_CARDINALITY in sizes:
            return INFINITE_CARDINALITY
        return UNKNOWN_CARDINALITY if UNKNOWN_CARDINALITY in sizes else sum(sizes)

    def pass_seed(self, ctx: IteratorContext) -> int:
        return mix_seed(self._seed, ctx.seed) if self._rerandomize else mix_seed(self._seed)

    def _make_iterator(self, ctx: IteratorContext) -> _SampleIterator:
        return _SampleIterator(self, ctx)


class _SampleIterator(DirectedIterator):
    def __init__(self, dataset: SampleFromDatasetsDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx, dataset._count, dataset._stop_on_empty)
        self._rng = np.random.default_rng(dataset.pass_seed(ctx))
        self._fixed: np.ndarray | None = dataset._weights  # None with a weights dataset
        self._weights = (
            None
            if dataset._weights is not None
            else dataset._inputs[-1]._iterator(ctx.child(dataset._count))
        )
        self._cumulative: list[float] = []
        if self._fixed is not None:
            self._reweigh(self._fixed)

    def _reweigh(self, weights: np.ndarray) -> None:
        """Cumulative weights of the inputs still alive (the others weigh 0)."""
        self._cumulative = np.cumsum(weights * np.asarray(self._alive)).tolist()

    def _on_exhausted(self, index: int) -> None:
        if self._fixed is not None:
            self._reweigh(self._fixed)

    def _select(self) -> int:
        if self._weights is not None:
            self._reweigh(_probabilities(self._weights._next(), len(self._alive)))
        cumulative = self._cumulative
        total = cumulative[-1]
        if total <= 0:
            raise StopIteration  # the inputs left all have weight 0: none can be drawn
        index = bisect.bisect_right(cumulative, self._rng.random() * total)
        # A draw rounded up to ``total`` picks the last input that has a weight.
        return min(index, bisect.bisect_left(cumulative, total))

    def _selector_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"rng": self._rng.bit_generator.state}
        if self._weights is not None:
            state["weights"] = self._weights.get_state()
        return state

    def _restore_selector(self, state: dict[str, Any]) -> None:
        self._rng.bit_generator.state = state["rng"]
        if self._weights is not None:
            self._weights.set_state(state["weights"])
        if self._fixed is not None:
            self._reweigh(self._fixed)

    def _close(self) -> None:
        super()._close()
        if self._weights is not None:
            self._weights.close()
