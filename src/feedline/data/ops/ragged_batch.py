"""``Dataset.ragged_batch``: batches whose components of varying shape become ``RaggedArray``."""

from __future__ import annotations

from typing import Any

import numpy as np

from feedline import structure
from feedline._composite import RaggedArray, stack
from feedline.data.dataset import Dataset, DatasetIterator, IteratorContext
from feedline.data.ops._checks import check_positive
from feedline.data.ops.batch import batched_cardinality, pull_up_to
from feedline.errors import InvalidArgumentError
from feedline.structure import RaggedTensorSpec, TensorSpec


def _ragged_rank(spec: Any) -> int:
    """How many ragged dimensions a batch of ``spec`` gets: 0 for a component batched as
    ``batch`` does (a fully known shape, or already ragged or sparse), else up to the last
    unknown dimension, as tf.data does."""
    if not isinstance(spec, TensorSpec):
        return 0
    if spec.shape is None:
        raise InvalidArgumentError(
            f"ragged_batch: a component has unknown rank ({spec}); give the source its shapes "
            "(from_generator's output_shapes or output_signature), or use padded_batch with "
            "padded_shapes"
        )
    if None not in spec.shape:
        return 0
    return max(i for i, d in enumerate(spec.shape) if d is None) + 1


class RaggedBatchDataset(Dataset):
    """Groups ``batch_size`` consecutive elements; components may differ in shape.

    A component whose ``element_spec`` shape is fully known is stacked as ``batch`` stacks it;
    one with unknown dimensions becomes a ``RaggedArray``, ragged up to its last unknown
    dimension (``ragged_rank`` = that dimension's index + 1, counting the batch dimension); a
    ``RaggedArray`` or ``SparseArray`` component is batched as ``batch`` does (one ragged or
    sparse dimension more). ``row_splits_dtype`` (int64 or int32) is that of the new splits.

    Example:
      >>> from feedline.data import Dataset
      >>> ds = Dataset.range(6).map(lambda x: np.arange(x)).ragged_batch(2)
      >>> [b.to_list() for b in ds]
      [[[], [0]], [[0, 1], [0, 1, 2]], [[0, 1, 2, 3], [0, 1, 2, 3, 4]]]
    """

    def __init__(
        self,
        input_dataset: Dataset,
        batch_size: int,
        drop_remainder: bool = False,
        row_splits_dtype: Any = np.int64,
    ) -> None:
        super().__init__((input_dataset,))
        self._batch_size = check_positive("batch_size", batch_size, "ragged_batch")
        self._drop_remainder = bool(drop_remainder)
        self._splits_dtype = np.dtype(row_splits_dtype)
        if self._splits_dtype not in (np.dtype(np.int64), np.dtype(np.int32)):
            raise InvalidArgumentError(
                f"ragged_batch: row_splits_dtype must be int64 or int32, got {self._splits_dtype}"
            )
        leaves, self._treespec = structure.flatten(input_dataset.element_spec)
        self._ranks = [_ragged_rank(s) for s in leaves]
        self._names = [
            "component " + "/".join(map(str, p)) if p else "the element"
            for p in self._treespec.paths()
        ]
        self._ranks_in = [s.rank for s in leaves]
        size = self._batch_size if self._drop_remainder else None
        self._element_spec = structure.unflatten(
            self._treespec,
            [
                RaggedTensorSpec((size, *s.shape), s.dtype, r, self._splits_dtype)
                if r
                else s.batched(size)
                for s, r in zip(leaves, self._ranks, strict=True)
            ],
        )

    def _cardinality(self) -> int:
        return batched_cardinality(
            self._inputs[0].cardinality(), self._batch_size, self._drop_remainder
        )

    def _make_iterator(self, ctx: IteratorContext) -> _RaggedBatchIterator:
        return _RaggedBatchIterator(self, ctx)

    def make_batch(self, elements: list[Any]) -> Any:
        """The elements batched, ragged where the spec has unknown dimensions."""
        if not any(self._ranks):
            return structure.batch_elements(elements, "ragged_batch")
        columns = zip(*(structure.flatten(e)[0] for e in elements), strict=True)
        out = []
        for column, rank, rank_in, name in zip(
            columns, self._ranks, self._ranks_in, self._names, strict=True
        ):
            if not rank:
                out.append(structure.batch_elements(list(column), "ragged_batch"))
                continue
            out.append(self._ragged(list(column), rank, rank_in, name))
        return structure.unflatten(self._treespec, out)

    def _ragged(self, column: list[Any], rank: int, rank_in: int, name: str) -> RaggedArray:
        dtype = self._splits_dtype
        rows = []
        for i, array in enumerate(column):
            array = np.asarray(array)
            if array.ndim != rank_in:
                raise InvalidArgumentError(
                    f"ragged_batch: {name} of element {i} in the batch has shape {array.shape}, "
                    f"but its element_spec has rank {rank_in}"
                )
            rows.append(array if rank == 1 else RaggedArray.from_tensor(array, rank - 1, dtype))
        try:
            return stack(rows, dtype)
        except InvalidArgumentError as error:
            raise InvalidArgumentError(f"ragged_batch: cannot batch {name}: {error}") from None


class _RaggedBatchIterator(DatasetIterator):
    _dataset: RaggedBatchDataset

    def __init__(self, dataset: RaggedBatchDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)

    def _next(self) -> Any:
        dataset = self._dataset
        elements = pull_up_to(self._input, dataset._batch_size, dataset._drop_remainder)
        return dataset.make_batch(elements)

    def _get_state(self) -> dict[str, Any]:
        return {"input": self._input.get_state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._input.set_state(state["input"])
