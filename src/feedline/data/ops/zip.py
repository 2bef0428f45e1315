"""``Dataset.zip``: elements of several datasets side by side."""

from __future__ import annotations

from typing import Any

import numpy as np
import optree

from feedline import structure
from feedline.data.dataset import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    DatasetIterator,
    IteratorContext,
    RandomAccess,
)


def _is_dataset(value: Any) -> bool:
    return isinstance(value, Dataset)


class ZipDataset(Dataset):
    """Zips a (nested) tuple, dict or namedtuple of datasets; ends with the shortest.

    Each element has the structure of ``datasets`` with every dataset replaced by one of its
    elements. When every input is random-access (``range``, ``from_tensor_slices``, a full
    cache) the zip is too, so ``shuffle`` and ``batch`` keep their fast paths.

    Example:
      >>> from feedline.data import Dataset
      >>> a, b = Dataset.range(1, 4), Dataset.range(4, 7)
      >>> [(int(x), int(y)) for x, y in Dataset.zip((a, b))]
      [(1, 4), (2, 5), (3, 6)]
      >>> [{k: int(v) for k, v in e.items()} for e in Dataset.zip({"a": a, "c": Dataset.range(2)})]
      [{'a': 1, 'c': 0}, {'a': 2, 'c': 1}]
    """

    def __init__(self, datasets: Any) -> None:
        leaves, self._treespec = optree.tree_flatten(datasets, is_leaf=_is_dataset)
        bad = [leaf for leaf in leaves if not isinstance(leaf, Dataset)]
        if bad or not leaves:
            found = type(bad[0]).__name__ if bad else "no datasets"
            raise TypeError(
                "zip expects a (nested) tuple, dict or namedtuple of Datasets, "
                f"got {found} in {datasets!r}"
            )
        super().__init__(tuple(leaves))
        self._flat_tuple = type(datasets) is tuple and len(leaves) == len(datasets)
        self._element_spec = structure.unflatten(self._treespec, [d.element_spec for d in leaves])

    def _cardinality(self) -> int:
        result = INFINITE_CARDINALITY
        for dataset in self._inputs:
            n = dataset.cardinality()
            if n == UNKNOWN_CARDINALITY:
                return n
            if n != INFINITE_CARDINALITY and (result == INFINITE_CARDINALITY or n < result):
                result = n
        return result

    def _random_access(self) -> RandomAccess | None:
        accesses = [d._random_access() for d in self._inputs]
        present = [a for a in accesses if a is not None]
        if len(present) < len(accesses):
            return None
        return _ZipAccess(present, self._treespec)

    def _make_iterator(self, ctx: IteratorContext) -> _ZipIterator:
        return _ZipIterator(self, ctx)


class _ZipAccess:
    def __init__(self, accesses: list[RandomAccess], treespec: optree.PyTreeSpec) -> None:
        self._accesses = accesses
        self._treespec = treespec
        self._length = min(len(a) for a in accesses)

    def __len__(self) -> int:
        return self._length

    def get(self, index: int) -> Any:
        return structure.unflatten(self._treespec, [a.get(index) for a in self._accesses])

    def gather(self, indices: np.ndarray) -> Any:
        return structure.unflatten(self._treespec, [a.gather(indices) for a in self._accesses])


class _ZipIterator(DatasetIterator):
    def __init__(self, dataset: ZipDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        # Every input runs in this pass's context: two shuffles with the same seed zipped together
        # (features and labels) stay aligned, as in tf.data.
        self._iterators = [d._iterator(ctx) for d in dataset._inputs]
        self._treespec = dataset._treespec
        self._flat_tuple = dataset._flat_tuple

    def _next(self) -> Any:
        if self._flat_tuple:
            return tuple([it._next() for it in self._iterators])
        return structure.unflatten(self._treespec, [it._next() for it in self._iterators])

    def _get_state(self) -> dict[str, Any]:
        return {str(k): it.get_state() for k, it in enumerate(self._iterators)}

    def _set_state(self, state: dict[str, Any]) -> None:
        for k, it in enumerate(self._iterators):
            it.set_state(state[str(k)])

    def _close(self) -> None:
        for it in self._iterators:
            it.close()
