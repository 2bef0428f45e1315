"""``Dataset.take_while``: the elements up to the first one a predicate rejects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from feedline.data.dataset import UNKNOWN_CARDINALITY, Dataset, DatasetIterator, IteratorContext
from feedline.data.ops._functions import UserFunction, as_scalar_bool


class TakeWhileDataset(Dataset):
    """The input's elements while ``predicate`` returns True; the first False ends the dataset.

    A tuple element is unpacked into positional arguments, as in ``map``; the predicate must
    return a scalar bool, as in ``filter``. The cardinality is unknown (0 for an empty input).

    Example:
      >>> from feedline.data import Dataset
      >>> [int(x) for x in Dataset.range(10).take_while(lambda x: x < 5)]
      [0, 1, 2, 3, 4]
    """

    def __init__(self, input_dataset: Dataset, predicate: Callable[..., Any]) -> None:
        super().__init__((input_dataset,))
        self._predicate = UserFunction(predicate, "take_while")
        self._element_spec = input_dataset.element_spec

    def _cardinality(self) -> int:
        return 0 if self._inputs[0].cardinality() == 0 else UNKNOWN_CARDINALITY

    def _make_iterator(self, ctx: IteratorContext) -> _TakeWhileIterator:
        return _TakeWhileIterator(self, ctx)

    def keep(self, element: Any) -> bool:
        """Whether ``predicate`` accepts ``element``; InvalidArgumentError if it is not a bool."""
        return as_scalar_bool(self._predicate, self._predicate.call_raw(element))


class _TakeWhileIterator(DatasetIterator):
    """Single-threaded, as every iterator's API; ``done`` once the predicate said False."""

    def __init__(self, dataset: TakeWhileDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)
        self._keep = dataset.keep
        self._done = False

    def _next(self) -> Any:
        if self._done:
            raise StopIteration
        element = self._input._next()
        if not self._keep(element):
            self._done = True
            raise StopIteration
        return element

    def _get_state(self) -> dict[str, Any]:
        return {"done": self._done, "input": self._input.get_state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._done = bool(state["done"])
        self._input.set_state(state["input"])
