"""``Dataset.sparse_batch``: batches of dense elements as one ``SparseArray`` each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from feedline import structure
from feedline._composite import SparseArray
from feedline.data.dataset import Dataset, DatasetIterator, IteratorContext
from feedline.data.ops._checks import check_positive
from feedline.data.ops.batch import batched_cardinality, pull_up_to
from feedline.errors import InvalidArgumentError
from feedline.structure import SparseTensorSpec, TensorSpec


def _row_shape(row_shape: Any, spec: TensorSpec) -> tuple[int | None, ...]:
    if isinstance(row_shape, np.ndarray):
        row_shape = row_shape.tolist()
    if hasattr(row_shape, "__index__") and not isinstance(row_shape, bool):
        row_shape = [row_shape]
    if not isinstance(row_shape, Sequence) or isinstance(row_shape, str | bytes):
        raise InvalidArgumentError(
            f"sparse_batch: row_shape must be a list of ints (None or -1 for the batch's "
            f"largest), got {row_shape!r}"
        )
    dims: list[int | None] = []
    for d in row_shape:
        if d is None or (hasattr(d, "__index__") and int(d) == -1):
            dims.append(None)
        elif hasattr(d, "__index__") and not isinstance(d, bool) and int(d) >= 0:
            dims.append(int(d))
        else:
            raise InvalidArgumentError(
                f"sparse_batch: row_shape must be a list of ints >= 0 (None or -1 for the "
                f"batch's largest), got {row_shape!r}"
            )
    if spec.shape is not None and (
        len(dims) != spec.rank
        or any(
            r is not None and s is not None and s > r for r, s in zip(dims, spec.shape, strict=True)
        )
    ):
        raise InvalidArgumentError(
            f"sparse_batch: row_shape {list(row_shape)} does not fit the elements' shape "
            f"{spec.shape}: it needs rank {spec.rank} and no dimension smaller than theirs"
        )
    return tuple(dims)


class SparseBatchDataset(Dataset):
    """Batches ``batch_size`` consecutive dense elements into one ``SparseArray`` each.

    Every value of every element is stored (zeros too), at index ``[k, *position]`` for the
    ``k``-th element of the batch; ``dense_shape`` is ``[batch, *row_shape]``, where a ``None``
    (or -1) in ``row_shape`` takes the batch's largest size. Elements must be one array of the
    rank of ``row_shape``, no larger than it in any dimension.

    Example:
      >>> from feedline.data import Dataset, TensorSpec
      >>> rows = [[b"a", b"b", b"c"], [b"a", b"b"], [b"a", b"b", b"c", b"d"]]
      >>> ds = Dataset.from_generator(
      ...     lambda: iter(rows), output_signature=TensorSpec([None], bytes)
      ... ).sparse_batch(2, row_shape=[6])
      >>> first = next(iter(ds))
      >>> first.indices.tolist(), first.values.tolist(), first.dense_shape.tolist()
      ([[0, 0], [0, 1], [0, 2], [1, 0], [1, 1]], [b'a', b'b', b'c', b'a', b'b'], [2, 6])
    """

    def __init__(self, input_dataset: Dataset, batch_size: int, row_shape: Any) -> None:
        super().__init__((input_dataset,))
        self._batch_size = check_positive("batch_size", batch_size, "sparse_batch")
        spec = input_dataset.element_spec
        if not isinstance(spec, TensorSpec):
            raise InvalidArgumentError(
                f"sparse_batch takes elements of one dense array, but element_spec is {spec}; "
                "map each element to one array first, or use padded_batch"
            )
        self._row_shape = _row_shape(row_shape, spec)
        self._element_spec = SparseTensorSpec((None, *self._row_shape), spec.dtype)

    def _cardinality(self) -> int:
        return batched_cardinality(self._inputs[0].cardinality(), self._batch_size, False)

    def _make_iterator(self, ctx: IteratorContext) -> _SparseBatchIterator:
        return _SparseBatchIterator(self, ctx)

    def make_batch(self, elements: list[Any]) -> SparseArray:
        arrays = [np.asarray(structure.to_array(e)) for e in elements]
        row_shape = self._row_shape
        for k, array in enumerate(arrays):
            if array.ndim != len(row_shape) or any(
                r is not None and d > r for d, r in zip(array.shape, row_shape, strict=True)
            ):
                raise InvalidArgumentError(
                    f"sparse_batch: element {k} of the batch has shape {array.shape}, larger "
                    f"than (or of another rank than) row_shape {list(row_shape)}; raise "
                    "row_shape, or give None for a dimension to take the batch's largest"
                )
        largest = np.max([a.shape for a in arrays], axis=0) if row_shape else []
        dense_shape = [len(arrays)] + [
            int(m) if r is None else r for r, m in zip(row_shape, largest, strict=True)
        ]
        indices = [
            np.concatenate(
                [np.full((a.size, 1), k, np.int64), np.indices(a.shape).reshape(a.ndim, -1).T],
                axis=1,
            )
            for k, a in enumerate(arrays)
        ]
        values = np.concatenate([a.reshape(-1) for a in arrays])
        return SparseArray(np.concatenate(indices), values, dense_shape, validate=False)


class _SparseBatchIterator(DatasetIterator):
    _dataset: SparseBatchDataset

    def __init__(self, dataset: SparseBatchDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)

    def _next(self) -> SparseArray:
        dataset = self._dataset
        return dataset.make_batch(pull_up_to(self._input, dataset._batch_size, False))

    def _get_state(self) -> dict[str, Any]:
        return {"input": self._input.get_state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._input.set_state(state["input"])
