"""``Dataset.unique``: each distinct element once, in order of first appearance."""

from __future__ import annotations

from typing import Any

import numpy as np

from feedline import structure
from feedline.data.dataset import UNKNOWN_CARDINALITY, Dataset, DatasetIterator, IteratorContext
from feedline.errors import InvalidArgumentError
from feedline.structure import TensorSpec

_SUPPORTED = (np.dtype(np.int32), np.dtype(np.int64))


def _supported(spec: Any) -> bool:
    return isinstance(spec, TensorSpec) and (
        spec.dtype in _SUPPORTED or spec.dtype == structure.BYTES or spec.dtype.kind == "U"
    )


class UniqueDataset(Dataset):
    """The input's elements without repeats; the first appearance of each is kept.

    As in TensorFlow, the elements must be single scalars of int32, int64 or string type (a
    TypeError names any other element spec at construction; a non-scalar element is an
    InvalidArgumentError when it arrives). The elements seen so far are part of the iterator's
    checkpoint. The cardinality is unknown (0 for an empty input).

    Example:
      >>> from feedline.data import Dataset
      >>> [int(x) for x in Dataset.from_tensor_slices([1, 37, 2, 37, 2, 1]).unique()]
      [1, 37, 2]
    """

    def __init__(self, input_dataset: Dataset) -> None:
        super().__init__((input_dataset,))
        spec = input_dataset.element_spec
        if not _supported(spec):
            raise TypeError(
                f"unique does not support elements of spec {spec}: only single int32, int64 "
                "and string scalars are supported (map the elements to one of those first)"
            )
        self._element_spec = spec

    def _cardinality(self) -> int:
        return 0 if self._inputs[0].cardinality() == 0 else UNKNOWN_CARDINALITY

    def _make_iterator(self, ctx: IteratorContext) -> _UniqueIterator:
        return _UniqueIterator(self, ctx)


def _key(element: Any) -> Any:
    array = np.asarray(element)
    if array.shape != ():
        raise InvalidArgumentError(
            f"unique supports only scalar elements, got an element of shape {array.shape}"
        )
    return array.item()


class _UniqueIterator(DatasetIterator):
    """Single-threaded, as every iterator's API; holds the set of elements seen."""

    def __init__(self, dataset: UniqueDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)
        self._seen: set[Any] = set()

    def _next(self) -> Any:
        seen = self._seen
        while True:
            element = self._input._next()
            key = _key(element)
            if key not in seen:
                seen.add(key)
                return element

    def _get_state(self) -> dict[str, Any]:
        return {"seen": sorted(self._seen), "input": self._input.get_state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._seen = set(state["seen"])
        self._input.set_state(state["input"])
