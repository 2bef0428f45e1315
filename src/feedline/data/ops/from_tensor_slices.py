"""``Dataset.from_tensor_slices``: the rows of arrays along their first dimension."""

from __future__ import annotations

from typing import Any

import numpy as np

from feedline import structure
from feedline.data.dataset import Dataset, DatasetIterator, IteratorContext, RowCursor
from feedline.errors import InvalidArgumentError


class TensorSliceDataset(Dataset):
    """Row ``i`` of the element is row ``i`` of every leaf; random-access.

    The arrays are not copied: elements are read-only views of them (as tensors are immutable in
    tf.data), so no map function can change the source by writing into an element. Batches are
    new, writable arrays.

    Example:
      >>> ds = TensorSliceDataset(({"a": [1, 2]}, [3, 4]))
      >>> [(e[0]["a"].item(), e[1].item()) for e in ds]
      [(1, 3), (2, 4)]
    """

    def __init__(self, tensors: Any) -> None:
        super().__init__()
        tensors = structure.normalize(tensors)
        leaves, self._treespec = structure.flatten(tensors)
        if not leaves:
            raise InvalidArgumentError("from_tensor_slices needs at least one array")
        shapes = [np.shape(leaf) for leaf in leaves]
        if any(len(s) == 0 for s in shapes):
            raise ValueError(
                f"from_tensor_slices slices along the first dimension, but a component is a "
                f"scalar; component shapes: {shapes}"
            )
        if len({s[0] for s in shapes}) != 1:
            raise ValueError(
                f"from_tensor_slices: components have different first dimensions; "
                f"component shapes: {shapes}"
            )
        self._leaves = [structure.read_only(np.asarray(leaf)) for leaf in leaves]
        self._length = shapes[0][0]
        self._element_spec = structure.map_spec(lambda s: s.unbatched(), structure.spec_of(tensors))

    def _cardinality(self) -> int:
        return self._length

    def _random_access(self) -> _SliceAccess:
        return _SliceAccess(self)

    def _make_iterator(self, ctx: IteratorContext) -> _SliceIterator:
        return _SliceIterator(self, ctx)


class _SliceAccess:
    def __init__(self, dataset: TensorSliceDataset) -> None:
        self._leaves = dataset._leaves
        self._treespec = dataset._treespec
        self._length = dataset._length
        self._single = len(self._leaves) == 1 and self._treespec.num_nodes == 1
        self._flat_tuple = self._treespec == structure.flatten(tuple(self._leaves))[1]
        if any(leaf.dtype == structure.BYTES for leaf in self._leaves):
            # A row of a 1-d object array must stay a 0-d array, not become a bare ``bytes``.
            self.get = self._get_rows  # type: ignore[method-assign]

    def __len__(self) -> int:
        return self._length

    def get(self, index: int) -> Any:
        if self._single:
            return self._leaves[0][index]
        if self._flat_tuple:
            return tuple([leaf[index] for leaf in self._leaves])
        return structure.unflatten(self._treespec, [leaf[index] for leaf in self._leaves])

    def _get_rows(self, index: int) -> Any:
        leaves = [structure.row(leaf, index) for leaf in self._leaves]
        if self._single:
            return leaves[0]
        if self._flat_tuple:
            return tuple(leaves)
        return structure.unflatten(self._treespec, leaves)

    def gather(self, indices: np.ndarray | slice) -> Any:
        if self._single:
            return _take(self._leaves[0], indices)
        return structure.unflatten(self._treespec, [_take(leaf, indices) for leaf in self._leaves])


def _take(leaf: np.ndarray, indices: np.ndarray | slice) -> np.ndarray:
    if isinstance(indices, slice):
        return leaf[indices].copy()
    return np.take(leaf, indices, axis=0)


class _SliceIterator(DatasetIterator):
    def __init__(self, dataset: TensorSliceDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._cursor = RowCursor(_SliceAccess(dataset))
        self._next = self._cursor.next  # type: ignore[method-assign]
        self._next_batch = self._cursor.next_batch

    def _get_state(self) -> dict[str, Any]:
        return self._cursor.state()

    def _set_state(self, state: dict[str, Any]) -> None:
        self._cursor.restore(state)
