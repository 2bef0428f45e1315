"""``Dataset.unbatch``: every element split into rows along its first dimension."""

from __future__ import annotations

from typing import Any

from feedline import structure
from feedline.data.dataset import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    DatasetIterator,
    IteratorContext,
)
from feedline.errors import InvalidArgumentError
from feedline.structure import TensorSpec


def unbatched_spec(spec: Any, operation: str) -> Any:
    """``spec`` without its first dimension; an error naming the operation for scalars."""
    try:
        return structure.map_spec(lambda s: s.unbatched(), spec)
    except InvalidArgumentError as error:
        raise InvalidArgumentError(
            f"{operation} needs elements whose every component has a first (batch) dimension; "
            f"{error} in element_spec {spec}"
        ) from None


def static_batch_dim(spec: Any) -> int | None:
    """The first dimension shared by every component of ``spec``, where it is known."""
    dims = {s.shape[0] if s.shape else None for s in structure.spec_leaves(spec)}
    return dims.pop() if len(dims) == 1 else None


class RowReader:
    """Reads rows out of an iterator of batched elements, one at a time or several stacked.

    Its state is the input's position and the rows of the current batch not yet read.
    """

    def __init__(self, batches: DatasetIterator) -> None:
        self._input = batches
        self._batch: Any = None
        self._rows = 0
        self._position = 0

    def _load(self) -> None:
        """Reads batches until one has rows; StopIteration at the end of the input."""
        pull = self._input._next
        while True:
            batch = pull()
            rows = structure.leading_dim(batch)
            if rows:
                self._batch, self._rows, self._position = batch, rows, 0
                return

    def row(self) -> Any:
        """The next row."""
        if self._position >= self._rows:
            self._load()
        position = self._position
        self._position = position + 1
        return structure.slice_element(self._batch, position)

    def rows(self, n: int) -> tuple[Any, int]:
        """Up to ``n`` (>= 1) rows stacked and their number; StopIteration if none is left."""
        parts: list[Any] = []
        count = 0
        while count < n:
            if self._position >= self._rows:
                try:
                    self._load()
                except StopIteration:
                    if not parts:
                        raise
                    break
            take = min(n - count, self._rows - self._position)
            start = self._position
            parts.append(structure.slice_element(self._batch, slice(start, start + take)))
            self._position = start + take
            count += take
        return structure.concatenate_rows(parts), count

    def get_state(self) -> dict[str, Any]:
        rest = []
        if self._position < self._rows:
            rest = [structure.slice_element(self._batch, slice(self._position, None))]
        return {"input": self._input.get_state(), "rest": rest}

    def set_state(self, state: dict[str, Any]) -> None:
        self._input.set_state(state["input"])
        rest = state["rest"]
        self._batch = rest[0] if rest else None
        self._rows = structure.leading_dim(rest[0]) if rest else 0
        self._position = 0


class UnbatchDataset(Dataset):
    """Splits each element into its rows; every component must have the same first dimension.

    Batches of zero rows produce nothing. ``unbatch().batch(n)`` regroups rows in bulk rather
    than one at a time.

    Example:
      >>> from feedline.data import Dataset
      >>> ds = Dataset.from_tensors(([1, 2, 3], ["a", "b", "c"])).unbatch()
      >>> [(int(x), s.item()) for x, s in ds]
      [(1, b'a'), (2, b'b'), (3, b'c')]
    """

    def __init__(self, input_dataset: Dataset) -> None:
        super().__init__((input_dataset,))
        self._element_spec = unbatched_spec(input_dataset.element_spec, "unbatch")

    def _cardinality(self) -> int:
        n = self._inputs[0].cardinality()
        if n in (0, INFINITE_CARDINALITY):
            return n
        rows = static_batch_dim(self._inputs[0].element_spec)
        if n == UNKNOWN_CARDINALITY or rows is None:
            return UNKNOWN_CARDINALITY
        return n * rows

    def _make_iterator(self, ctx: IteratorContext) -> _UnbatchIterator:
        return _UnbatchIterator(self, ctx)


class _UnbatchIterator(DatasetIterator):
    def __init__(self, dataset: UnbatchDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)
        self._reader = RowReader(self._input)
        batch_spec = dataset._inputs[0].element_spec
        if all(isinstance(s, TensorSpec) for s in structure.spec_leaves(batch_spec)):
            # Rows of a ragged or sparse batch are batched one by one, as their spec says: a
            # slice of the batch would keep them ragged where the spec says dense.
            self._next_batch = self._rows

    def _next(self) -> Any:
        return self._reader.row()

    def _rows(self, n: int) -> Any:
        return self._reader.rows(n)[0]

    def _get_state(self) -> dict[str, Any]:
        return self._reader.get_state()

    def _set_state(self, state: dict[str, Any]) -> None:
        self._reader.set_state(state)
