"""``Dataset.enumerate``: ``(index, element)`` pairs."""

from __future__ import annotations

from typing import Any

import numpy as np

from feedline.data.dataset import Dataset, DatasetIterator, IteratorContext
from feedline.data.ops._checks import check_int
from feedline.structure import TensorSpec


class EnumerateDataset(Dataset):
    """Pairs each element with its int64 index, counting from ``start``.

    Example:
      >>> from feedline.data import Dataset
      >>> [(int(i), int(x)) for i, x in Dataset.range(10, 13).enumerate(start=5)]
      [(5, 10), (6, 11), (7, 12)]
    """

    def __init__(self, input_dataset: Dataset, start: int = 0) -> None:
        super().__init__((input_dataset,))
        self._start = check_int("start", start, "enumerate")
        self._element_spec = (TensorSpec((), np.dtype(np.int64)), input_dataset.element_spec)

    def _cardinality(self) -> int:
        return self._inputs[0].cardinality()

    def _make_iterator(self, ctx: IteratorContext) -> _EnumerateIterator:
        return _EnumerateIterator(self, ctx)


class _EnumerateIterator(DatasetIterator):
    def __init__(self, dataset: EnumerateDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)
        self._index = dataset._start

    def _next(self) -> Any:
        element = self._input._next()
        index = self._index
        self._index = index + 1
        return np.int64(index), element

    def _get_state(self) -> dict[str, Any]:
        return {"index": self._index, "input": self._input.get_state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._index = int(state["index"])
        self._input.set_state(state["input"])
