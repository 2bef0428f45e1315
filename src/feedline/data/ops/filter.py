"""``Dataset.filter``: the elements for which a predicate returns True."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from feedline.data.dataset import UNKNOWN_CARDINALITY, Dataset, DatasetIterator, IteratorContext
from feedline.data.ops._functions import UserFunction, as_scalar_bool


class FilterDataset(Dataset):
    """Keeps the elements for which ``predicate`` returns a scalar True.

    A tuple element is unpacked into positional arguments, as in ``map``. The predicate must
    return a scalar bool (a Python ``bool``, ``np.bool_`` or a 0-d bool array); anything else is an
    InvalidArgumentError that names what it returned. The cardinality is unknown.

    Example:
      >>> from feedline.data import Dataset
      >>> [int(x) for x in Dataset.range(10).filter(lambda x: x % 3 == 0)]
      [0, 3, 6, 9]
    """

    def __init__(self, input_dataset: Dataset, predicate: Callable[..., Any]) -> None:
        super().__init__((input_dataset,))
        self._predicate = UserFunction(predicate, "filter")
        self._element_spec = input_dataset.element_spec

    def _cardinality(self) -> int:
        return 0 if self._inputs[0].cardinality() == 0 else UNKNOWN_CARDINALITY

    def _make_iterator(self, ctx: IteratorContext) -> _FilterIterator:
        return _FilterIterator(self, ctx)

    def keep(self, element: Any) -> bool:
        """Whether ``predicate`` keeps ``element``; InvalidArgumentError if it is not a bool."""
        return as_scalar_bool(self._predicate, self._predicate.call_raw(element))


class _FilterIterator(DatasetIterator):
    def __init__(self, dataset: FilterDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)
        self._keep = dataset.keep

    def _next(self) -> Any:
        pull = self._input._next
        keep = self._keep
        while True:
            element = pull()
            if keep(element):
                return element

    def _get_state(self) -> dict[str, Any]:
        return {"input": self._input.get_state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._input.set_state(state["input"])
