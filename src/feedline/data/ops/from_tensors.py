"""``Dataset.from_tensors``: one element."""

from __future__ import annotations

from typing import Any

from feedline import structure
from feedline.data.dataset import Dataset, DatasetIterator, IteratorContext


class TensorDataset(Dataset):
    """A dataset of exactly one element, the given structure."""

    def __init__(self, tensors: Any) -> None:
        super().__init__()
        # Read-only, as every pass hands out these same arrays.
        self._tensors = structure.map_structure(structure.read_only, structure.normalize(tensors))
        self._element_spec = structure.spec_of(self._tensors)

    def _cardinality(self) -> int:
        return 1

    def _make_iterator(self, ctx: IteratorContext) -> _TensorIterator:
        return _TensorIterator(self, ctx)


class _TensorIterator(DatasetIterator):
    _dataset: TensorDataset

    def __init__(self, dataset: TensorDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._done = False

    def _next(self) -> Any:
        if self._done:
            raise StopIteration
        self._done = True
        return self._dataset._tensors

    def _get_state(self) -> dict[str, Any]:
        return {"done": self._done}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._done = bool(state["done"])
