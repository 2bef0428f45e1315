"""``Dataset.rebatch``: the rows of batched elements regrouped into batches of other sizes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from feedline import structure
from feedline.data.dataset import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    DatasetIterator,
    IteratorContext,
)
from feedline.data.ops._checks import check_positive
from feedline.data.ops.batch import batched_cardinality
from feedline.data.ops.unbatch import RowReader, static_batch_dim, unbatched_spec
from feedline.errors import InvalidArgumentError


def _check_sizes(batch_size: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(batch_size, Sequence) and not isinstance(batch_size, str | bytes):
        sizes = tuple(batch_size)
        if not sizes:
            raise InvalidArgumentError("rebatch: batch_size is an empty list; give at least one")
        for size in sizes:
            if isinstance(size, bool) or not hasattr(size, "__index__") or int(size) < 0:
                raise InvalidArgumentError(
                    f"rebatch: every size in batch_size must be an int >= 0, got {size!r} in "
                    f"{list(sizes)}"
                )
        sizes = tuple(int(s) for s in sizes)
        if not any(sizes):
            raise InvalidArgumentError(
                f"rebatch: batch_size {list(sizes)} has no size >= 1; at least one must be"
            )
        return sizes
    return (check_positive("batch_size", batch_size, "rebatch"),)


class RebatchDataset(Dataset):
    """The same rows, in batches of ``batch_size`` whatever the input's batches were.

    ``batch_size`` is an int, or a list of sizes used in turn (``[1, 2]``: batches of 1, 2, 1,
    2, ... rows). A size of 0 gives an empty batch, as the per-replica batches of a global batch
    smaller than the number of replicas are. Rows are never lost: a batch takes rows from as many
    input batches as it needs, and the last one may be smaller unless ``drop_remainder``.

    Example:
      >>> from feedline.data import Dataset
      >>> [b.tolist() for b in Dataset.range(7).batch(4).rebatch(3)]
      [[0, 1, 2], [3, 4, 5], [6]]
      >>> [b.tolist() for b in Dataset.range(7).batch(2).rebatch([1, 2, 1, 3])]
      [[0], [1, 2], [3], [4, 5, 6]]
    """

    def __init__(
        self,
        input_dataset: Dataset,
        batch_size: int | Sequence[int],
        drop_remainder: bool = False,
    ) -> None:
        super().__init__((input_dataset,))
        self._sizes = _check_sizes(batch_size)
        self._drop_remainder = bool(drop_remainder)
        row_spec = unbatched_spec(input_dataset.element_spec, "rebatch")
        size = self._static_size(input_dataset.element_spec)
        self._element_spec = structure.map_spec(lambda s: s.batched(size), row_spec)

    def _static_size(self, input_spec: Any) -> int | None:
        if len(set(self._sizes)) != 1:
            return None
        size = self._sizes[0]
        if self._drop_remainder:
            return size
        # Input batches of a fixed size that ``size`` divides regroup into full batches only.
        rows = static_batch_dim(input_spec)
        return size if rows is not None and rows % size == 0 else None

    def _cardinality(self) -> int:
        n = self._inputs[0].cardinality()
        if n in (0, INFINITE_CARDINALITY):
            return n
        rows = static_batch_dim(self._inputs[0].element_spec)
        if n == UNKNOWN_CARDINALITY or rows is None or len(self._sizes) != 1:
            return UNKNOWN_CARDINALITY
        return batched_cardinality(n * rows, self._sizes[0], self._drop_remainder)

    def _make_iterator(self, ctx: IteratorContext) -> _RebatchIterator:
        return _RebatchIterator(self, ctx)


class _RebatchIterator(DatasetIterator):
    def __init__(self, dataset: RebatchDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)
        self._reader = RowReader(self._input)
        self._sizes = dataset._sizes
        self._drop_remainder = dataset._drop_remainder
        self._turn = 0  # index in ``sizes`` of the next batch
        self._ended = False

    def _next(self) -> Any:
        if self._ended:
            raise StopIteration
        size = self._sizes[self._turn]
        self._turn = (self._turn + 1) % len(self._sizes)
        if size == 0:
            # As tf.data: zero rows, unknown dimensions 0, whatever the input batches were.
            return structure.empty_like_spec(self._dataset.element_spec)
        try:
            rows, count = self._reader.rows(size)
        except StopIteration:
            self._ended = True
            raise
        if count < size:
            self._ended = True
            if self._drop_remainder:
                raise StopIteration
        return rows

    def _get_state(self) -> dict[str, Any]:
        return {"turn": self._turn, "ended": self._ended, "reader": self._reader.get_state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._turn = int(state["turn"])
        self._ended = bool(state["ended"])
        self._reader.set_state(state["reader"])
