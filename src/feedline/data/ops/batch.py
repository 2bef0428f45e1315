"""``Dataset.batch``: consecutive elements stacked along a new first dimension."""

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
from feedline.data.ops._checks import check_positive
from feedline.data.ops.map_batch import fusion_plan
from feedline.data.ops.map_batch_parallel import ParallelMapBatchIterator, parallel_fusable


def pull_up_to(iterator: DatasetIterator, n: int, drop_remainder: bool) -> list[Any]:
    """Up to ``n`` elements of ``iterator``: fewer only at its end, and then only without
    ``drop_remainder``; StopIteration where there is no batch to make."""
    pull = iterator._next
    elements = []
    try:
        for _ in range(n):
            elements.append(pull())
    except StopIteration:
        if not elements or drop_remainder:
            raise
    return elements


def batched_cardinality(n: int, batch_size: int, drop_remainder: bool) -> int:
    if n in (INFINITE_CARDINALITY, UNKNOWN_CARDINALITY):
        return n
    return n // batch_size if drop_remainder else -(-n // batch_size)


class BatchDataset(Dataset):
    """Groups ``batch_size`` consecutive elements; the last batch may be smaller.

    The batch dimension of ``element_spec`` is ``batch_size`` with ``drop_remainder=True`` and
    ``None`` otherwise. Elements of different shapes are an InvalidArgumentError that names the
    component; ``padded_batch`` batches them.

    ``num_parallel_calls`` is accepted for compatibility: stacking runs in NumPy, and batches of
    random-access sources are gathered in one call rather than element by element. A ``map``
    over a random-access source followed by ``batch`` runs as one fused stage
    (``map_batch``), and so does a parallel ``map`` on threads over any source, its threads
    writing each result into its row of the batch (``map_batch_parallel``), unless
    ``Options.experimental_optimization.map_and_batch_fusion`` is False.
    """

    def __init__(
        self,
        input_dataset: Dataset,
        batch_size: int,
        drop_remainder: bool = False,
        num_parallel_calls: int | None = None,
        deterministic: bool | None = None,
    ) -> None:
        super().__init__((input_dataset,))
        self._batch_size = check_positive("batch_size", batch_size, "batch")
        self._drop_remainder = bool(drop_remainder)
        size = self._batch_size if self._drop_remainder else None
        self._element_spec = structure.map_spec(
            lambda s: s.batched(size), input_dataset.element_spec
        )

    def _cardinality(self) -> int:
        return batched_cardinality(
            self._inputs[0].cardinality(), self._batch_size, self._drop_remainder
        )

    def _make_iterator(self, ctx: IteratorContext) -> DatasetIterator:
        plan = fusion_plan(self, ctx)
        if plan is not None:
            return plan.iterator(self, ctx, lambda: _BatchIterator(self, ctx))
        if parallel_fusable(self, ctx):
            return ParallelMapBatchIterator(self, ctx, lambda: _BatchIterator(self, ctx))
        return _BatchIterator(self, ctx)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_fusion_cache", None)  # found again where the dataset is unpickled
        return state


class _BatchIterator(DatasetIterator):
    def __init__(self, dataset: BatchDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)
        self._batch_size = dataset._batch_size
        self._drop_remainder = dataset._drop_remainder

    def _next(self) -> Any:
        n = self._batch_size
        fast = self._input._next_batch
        if fast is not None:
            batch = fast(n)
            if self._drop_remainder and structure.leading_dim(batch) < n:
                raise StopIteration
            return batch
        return structure.batch_elements(pull_up_to(self._input, n, self._drop_remainder))

    def _get_state(self) -> dict[str, Any]:
        return {"input": self._input.get_state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._input.set_state(state["input"])
