"""``Dataset.ignore_errors``: drops the elements whose production raised an error."""

from __future__ import annotations

import logging
from typing import Any

from feedline.data.dataset import UNKNOWN_CARDINALITY, Dataset, DatasetIterator, IteratorContext

logger = logging.getLogger(__name__)

#: Errors of the program, not of an element: TensorFlow meets them when it traces a function,
#: before any element exists, so they never reach its ``ignore_errors``; neither do they here.
CODE_ERRORS = (NameError, AttributeError, ImportError, SyntaxError)


class IgnoreErrorsDataset(Dataset):
    """The input's elements, skipping every one whose production raised an exception.

    ``StopIteration`` still ends the dataset; any other ``Exception`` raised while producing an
    element (by a ``map`` function, a reader, a ``filter`` predicate...) drops that element, and
    with ``log_warning=True`` it is logged as a warning on the ``feedline.data.ops.ignore_errors``
    logger. The input must move past the failing element, as ``map``, ``prefetch`` and the readers
    do. Errors of the code rather than of an element (``NameError``, ``AttributeError``,
    ``ImportError``, ``SyntaxError``: a misspelt name, a TensorFlow function feedline does not
    have) are raised, not dropped, as TensorFlow raises them when it traces the function.
    ``KeyboardInterrupt`` and other ``BaseException``s are never swallowed.

    Example:
      >>> from feedline.data import Dataset
      >>> ds = Dataset.from_tensor_slices([1.0, 2.0, 0.0, 4.0])
      >>> ds = ds.map(lambda x: 1 / x if x else 1 / 0).ignore_errors()
      >>> [float(x) for x in ds]
      [1.0, 0.5, 0.25]
    """

    def __init__(self, input_dataset: Dataset, log_warning: bool = False) -> None:
        super().__init__((input_dataset,))
        self._log_warning = bool(log_warning)

    @property
    def element_spec(self) -> Any:
        # Lazy: a map's spec may come from its first element, which may be one that fails.
        return self._inputs[0].element_spec

    def _cardinality(self) -> int:
        return 0 if self._inputs[0].cardinality() == 0 else UNKNOWN_CARDINALITY

    def _make_iterator(self, ctx: IteratorContext) -> _IgnoreErrorsIterator:
        return _IgnoreErrorsIterator(self, ctx)


class _IgnoreErrorsIterator(DatasetIterator):
    def __init__(self, dataset: IgnoreErrorsDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)
        self._log_warning = dataset._log_warning
        self._dropped = 0

    def _next(self) -> Any:
        pull = self._input._next
        while True:
            try:
                return pull()
            except (StopIteration, *CODE_ERRORS):
                raise
            except Exception as error:
                self._dropped += 1
                if self._log_warning:
                    logger.warning(
                        "ignore_errors: dropped an element (%d so far) whose production raised "
                        "%s: %s",
                        self._dropped,
                        type(error).__name__,
                        error,
                    )

    def _get_state(self) -> dict[str, Any]:
        return {"dropped": self._dropped, "input": self._input.get_state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._dropped = int(state["dropped"])
        self._input.set_state(state["input"])
