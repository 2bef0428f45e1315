"""``Dataset.skip``: all but the first ``count`` elements."""

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


class SkipDataset(Dataset):
    """Drops the first ``count`` elements; ``count=-1`` drops all of them."""

    def __init__(self, input_dataset: Dataset, count: int) -> None:
        super().__init__((input_dataset,))
        self._count = check_count(count, "skip")
        self._element_spec = input_dataset.element_spec

    def _cardinality(self) -> int:
        n = self._inputs[0].cardinality()
        if n in (INFINITE_CARDINALITY, UNKNOWN_CARDINALITY):
            return n
        return 0 if self._count == -1 else max(0, n - self._count)

    def _make_iterator(self, ctx: IteratorContext) -> _SkipIterator:
        return _SkipIterator(self, ctx)


class _SkipIterator(DatasetIterator):
    def __init__(self, dataset: SkipDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)
        self._count = dataset._count
        self._skipped = 0

    def _next(self) -> Any:
        while self._count == -1 or self._skipped < self._count:
            self._input._next()
            self._skipped += 1
        return self._input._next()

    def _get_state(self) -> dict[str, Any]:
        return {"skipped": self._skipped, "input": self._input.get_state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._skipped = int(state["skipped"])
        self._input.set_state(state["input"])
