"""``Dataset.range``: an arithmetic sequence of int64 scalars."""

from __future__ import annotations

from typing import Any

import numpy as np

from feedline.data.dataset import Dataset, DatasetIterator, IteratorContext
from feedline.errors import InvalidArgumentError
from feedline.structure import TensorSpec


class RangeDataset(Dataset):
    """``range(start, stop, step)`` as 0-d int64 elements; random-access."""

    def __init__(self, *args: int, dtype: Any = np.int64) -> None:
        super().__init__()
        if not 1 <= len(args) <= 3:
            raise InvalidArgumentError(f"range takes 1 to 3 arguments, got {len(args)}")
        for a in args:
            if isinstance(a, bool) or not isinstance(a, int | np.integer):
                raise InvalidArgumentError(f"range arguments must be ints, got {a!r}")
        self._range = range(*(int(a) for a in args))
        self._dtype = np.dtype(dtype)
        self._element_spec = TensorSpec((), self._dtype)

    def _cardinality(self) -> int:
        return len(self._range)

    def _random_access(self) -> _RangeAccess:
        return _RangeAccess(self._range, self._dtype)

    def _make_iterator(self, ctx: IteratorContext) -> _RangeIterator:
        return _RangeIterator(self, ctx)


class _RangeAccess:
    def __init__(self, r: range, dtype: np.dtype) -> None:
        self._r = r
        self._dtype = dtype

    def __len__(self) -> int:
        return len(self._r)

    def get(self, index: int) -> np.generic:
        return self._dtype.type(self._r[index])

    def gather(self, indices: np.ndarray) -> np.ndarray:
        return (self._r.start + np.asarray(indices, np.int64) * self._r.step).astype(self._dtype)


class _RangeIterator(DatasetIterator):
    def __init__(self, dataset: RangeDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._range = dataset._range
        self._scalar = dataset._dtype.type
        self._position = 0

    def _next(self) -> np.generic:
        position = self._position
        if position >= len(self._range):
            raise StopIteration
        self._position = position + 1
        return self._scalar(self._range[position])

    def _next_batch(self, n: int) -> np.ndarray:
        position = self._position
        rows = self._range[position : position + n]
        if not rows:
            raise StopIteration
        self._position = position + len(rows)
        return np.arange(rows.start, rows.stop, rows.step, dtype=np.int64).astype(
            self._scalar, copy=False
        )

    def _get_state(self) -> dict[str, Any]:
        return {"position": self._position}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._position = int(state["position"])
