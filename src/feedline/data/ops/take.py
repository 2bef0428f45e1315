"""``Dataset.take``: the first ``count`` elements."""

from __future__ import annotations

from typing import Any

from feedline.data.dataset import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    DatasetIterator,
    IteratorContext,
)
from feedline.data.ops._checks import check_count


class TakeDataset(Dataset):
    """At most ``count`` elements; ``count=-1`` takes all of them."""

    def __init__(self, input_dataset: Dataset, count: int) -> None:
        super().__init__((input_dataset,))
        self._count = check_count(count, "take")
        self._element_spec = input_dataset.element_spec

    def _cardinality(self) -> int:
        n = self._inputs[0].cardinality()
        if self._count == -1:
            return n
        if n == INFINITE_CARDINALITY:
            return self._count
        if n == UNKNOWN_CARDINALITY:
            return UNKNOWN_CARDINALITY
        return min(n, self._count)

    def _make_iterator(self, ctx: IteratorContext) -> _TakeIterator:
        return _TakeIterator(self, ctx)


class _TakeIterator(DatasetIterator):
    def __init__(self, dataset: TakeDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)
        self._count = dataset._count
        self._taken = 0

    def _next(self) -> Any:
        if self._count != -1 and self._taken >= self._count:
            raise StopIteration
        element = self._input._next()
        self._taken += 1
        return element

    def _get_state(self) -> dict[str, Any]:
        return {"taken": self._taken, "input": self._input.get_state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._taken = int(state["taken"])
        self._input.set_state(state["input"])
