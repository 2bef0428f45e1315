"""``Dataset.repeat``: the input ``count`` times, or forever."""

from __future__ import annotations

import contextlib
from typing import Any

from feedline import structure
from feedline.data.dataset import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    DatasetIterator,
    IteratorContext,
)
from feedline.data.ops._checks import check_count
from feedline.data.ops.batch import pull_up_to


class RepeatDataset(Dataset):
    """Repeats the input; ``count=None`` or ``-1`` repeats forever.

    Every epoch is a new pass over the input, so seeded shuffles upstream reshuffle each epoch
    (``reshuffle_each_iteration``) in a reproducible sequence. A forever-repeat of an input that
    yields nothing in an epoch ends instead of spinning.
    """

    def __init__(self, input_dataset: Dataset, count: int | None = None) -> None:
        super().__init__((input_dataset,))
        self._count = -1 if count is None else check_count(count, "repeat")
        self._element_spec = input_dataset.element_spec

    def _cardinality(self) -> int:
        n = self._inputs[0].cardinality()
        if self._count == 0 or n == 0:
            return 0
        if self._count == -1:
            return UNKNOWN_CARDINALITY if n == UNKNOWN_CARDINALITY else INFINITE_CARDINALITY
        if n in (INFINITE_CARDINALITY, UNKNOWN_CARDINALITY):
            return n
        return n * self._count

    def _make_iterator(self, ctx: IteratorContext) -> _RepeatIterator:
        return _RepeatIterator(self, ctx)


class _RepeatIterator(DatasetIterator):
    def __init__(self, dataset: RepeatDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._count = dataset._count
        self._epoch = 0
        self._yielded_in_epoch = 0
        self._input = dataset._inputs[0]._iterator(ctx.child(0))
        if self._input._next_batch is not None:
            self._next_batch = self._rows

    def _rows(self, n: int) -> Any:
        """Up to ``n`` rows (fewer only at the end of the last epoch), from the blocks of the
        input's epochs; the same rows, and the same state after them, as ``n`` calls of
        ``_next``."""
        parts = []
        wanted = n
        while wanted and (self._count == -1 or self._epoch < self._count):
            block = self._input._next_batch
            if block is None:  # the input reads row by row now: so does the rest of this batch
                with contextlib.suppress(StopIteration):
                    parts.append(structure.batch_elements(pull_up_to(self, wanted, False)))
                break
            try:
                part = block(wanted)
                rows = structure.leading_dim(part)
            except StopIteration:
                rows = 0
            if rows == 0:  # the epoch ended
                if self._yielded_in_epoch == 0:
                    break
                self._start_epoch(self._epoch + 1)
                continue
            self._yielded_in_epoch += rows
            wanted -= rows
            parts.append(part)
        if not parts:
            raise StopIteration
        return structure.concatenate_rows(parts)

    def _next(self) -> Any:
        while self._count == -1 or self._epoch < self._count:
            try:
                element = self._input._next()
            except StopIteration:
                if self._yielded_in_epoch == 0:
                    raise
                self._start_epoch(self._epoch + 1)
                continue
            self._yielded_in_epoch += 1
            return element
        raise StopIteration

    def _start_epoch(self, epoch: int) -> None:
        self._input.close()
        self._epoch = epoch
        self._yielded_in_epoch = 0
        self._input = self._dataset._inputs[0]._iterator(self._ctx.child(epoch))

    def _get_state(self) -> dict[str, Any]:
        return {
            "seed": self._ctx.seed,
            "epoch": self._epoch,
            "yielded_in_epoch": self._yielded_in_epoch,
            "input": self._input.get_state(),
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        self._restore_seed(state["seed"])
        self._start_epoch(int(state["epoch"]))
        self._yielded_in_epoch = int(state["yielded_in_epoch"])
        self._input.set_state(state["input"])
