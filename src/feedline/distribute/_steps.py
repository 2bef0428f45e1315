"""The steps of distributed input as feedline.data datasets, so that they checkpoint like any.

A *step* is a tuple with one element per local replica. ``SplitBatchesDataset`` makes steps from
global batches: each batch of ``b`` rows is cut into ``num_slices`` slices of ``ceil(b /
num_slices)`` rows in order (the last ones shorter or empty), and this worker keeps either its own
``replicas`` slices of every batch (one step per batch) or all of them, ``replicas`` per step.
``GroupElementsDataset`` takes ``replicas`` consecutive elements per step; replicas past the end
get None, which the distributed iterator turns into empty batches.

    range(8).batch(4) over 3 replicas: step 1 = [0 1] [2 3] [], step 2 = [4 5] [6 7] []

Where several workers each read batches of their own (FILE, OFF or HINT sharding), a batch of
``b`` rows is cut by TensorFlow's ``batch_sizes_for_worker(b, W, R, i)`` instead: sizes that
differ by at most one and rotate with the worker index, so that each global step (R slices on
every worker) takes one global batch. Global batch 7, 2 workers x 2 replicas:

    worker 0 (sizes [2, 2, 2, 1]): step 1 = [A0 A1] [A2 A3], step 2 = [A4 A5] [A6]
    worker 1 (sizes [2, 1, 2, 2]): step 1 = [B0 B1] [B2],    step 2 = [B3 B4] [B5 B6]

A replica's spec keeps a static batch dimension only where every slice has it: the global batch
dimension is static and ``num_slices`` divides it (as TensorFlow's rebatch does); otherwise it is
None. ``num_slices`` counts the replicas of all workers, so with several workers the split is
over ``num_workers * replicas_per_worker``:

    ==========================================  ==========  ===============
    global batches                              num_slices  replica spec
    ==========================================  ==========  ===============
    range(8).batch(4, drop_remainder=True)      1           TensorSpec([4])
    range(8).batch(4, drop_remainder=True)      2           TensorSpec([2])
    range(8).batch(4, drop_remainder=True)      3           TensorSpec([None])
    range(8).batch(4)                           2           TensorSpec([None])
    ==========================================  ==========  ===============
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from feedline import structure
from feedline.data.dataset import UNKNOWN_CARDINALITY, Dataset, DatasetIterator, IteratorContext
from feedline.errors import InvalidArgumentError


def batch_sizes_for_worker(
    global_batch_size: int, num_workers: int, num_replicas_per_worker: int, worker_index: int
) -> list[int]:
    """The sizes that worker ``worker_index`` rebatches its rows into, so that every global
    step (``num_replicas_per_worker`` batches on each worker) takes ``global_batch_size`` rows
    (TensorFlow's ``tf.data.experimental.batch_sizes_for_worker``).

    Of the ``W * R`` sizes, the first ``G mod (W * R)`` of worker 0 are ``ceil(G / (W * R))``
    and the rest ``floor(G / (W * R))``; worker ``i`` starts ``R * i`` sizes further on:

    ======  =================  ============
    G, WxR  worker 0           worker 1
    ======  =================  ============
    7, 2x2  [2, 2, 2, 1]       [2, 1, 2, 2]
    5, 2x2  [2, 1, 1, 1]       [1, 1, 2, 1]
    ======  =================  ============

    Example:
      >>> batch_sizes_for_worker(7, 2, 2, 1)
      [2, 1, 2, 2]
    """
    slices = num_workers * num_replicas_per_worker
    floor, num_ceil = divmod(global_batch_size, slices)
    worker_0 = [floor + 1] * num_ceil + [floor] * (slices - num_ceil)
    offset = worker_index * num_replicas_per_worker
    return worker_0[offset:] + worker_0[:offset]


def ceil_sizes(rows: int, num_slices: int) -> list[int]:
    """``rows`` cut into ``num_slices`` slices of ``ceil(rows / num_slices)`` rows, in order
    (the last ones shorter or empty): the seeds' split of a global batch over replicas."""
    size = -(-rows // num_slices)
    return [max(0, min(size, rows - i * size)) for i in range(num_slices)]


SlicePlan = Callable[[int], list[int]]


def slice_batch(batch: Any, num_slices: int, plan: SlicePlan | None = None) -> list[Any]:
    """``batch`` cut into ``num_slices`` slices in order, of the sizes ``plan(rows)`` gives
    (by default ``ceil_sizes``)."""
    fast = type(batch) is tuple and all(isinstance(leaf, np.ndarray) for leaf in batch)
    rows = batch[0].shape[0] if fast and batch and batch[0].ndim else -1
    # A flat tuple of arrays (the common (features, labels) case) without the general path.
    fast = fast and rows >= 0 and all(leaf.ndim and leaf.shape[0] == rows for leaf in batch)
    if not fast:
        rows = structure.leading_dim(batch)
    sizes = plan(rows) if plan is not None else ceil_sizes(rows, num_slices)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    cuts = [slice(bounds[i], bounds[i + 1]) for i in range(num_slices)]
    if fast:
        return [tuple(leaf[cut] for leaf in batch) for cut in cuts]
    return [structure.slice_element(batch, cut) for cut in cuts]


def _worker_sizes(num_workers: int, replicas: int, worker_index: int, rows: int) -> list[int]:
    return batch_sizes_for_worker(rows, num_workers, replicas, worker_index)


def is_empty(part: Any) -> bool:
    return part is None or structure.leading_dim(part) == 0


def replica_spec(batch_spec: Any, num_slices: int) -> Any:
    """One slice's spec of global batches of ``batch_spec`` cut into ``num_slices`` slices.

    The batch dimension (shared by every leaf) stays static where it is static and ``num_slices``
    divides it, and becomes None otherwise; unbatched leaves (rank 0) are kept as they are.

    Example:
      >>> spec = structure.TensorSpec((4, 3), np.float32)
      >>> replica_spec(spec, 2).shape, replica_spec(spec, 3).shape
      ((2, 3), (None, 3))
    """
    known = {leaf.shape[0] for leaf in structure.spec_leaves(batch_spec) if leaf.shape}
    known.discard(None)
    rows = known.pop() if len(known) == 1 else None
    dim = rows // num_slices if rows is not None and rows % num_slices == 0 else None
    return structure.map_spec(
        lambda s: structure.TensorSpec((dim, *s.shape[1:]), s.dtype) if s.shape else s,
        batch_spec,
    )


class SplitBatchesDataset(Dataset):
    """Steps cut from global batches (see the module docstring).

    Args:
      keep: the slice indices this worker keeps from every batch (one step per batch), or None
        to keep all slices, ``replicas`` per step, skipping steps in which every slice is empty.
      worker: ``(num_workers, worker_index)`` where each of several workers reads batches of its
        own (``keep`` is None): a batch of ``b`` rows is cut by TensorFlow's
        ``batch_sizes_for_worker(b, ...)``, whose sizes rotate with the worker index so that
        each global step takes one global batch. Otherwise slices are ``ceil_sizes``.
    """

    def __init__(
        self,
        batches: Dataset,
        num_slices: int,
        replicas: int,
        keep: range | None,
        worker: tuple[int, int] | None = None,
    ) -> None:
        super().__init__((batches,))
        leaves = structure.spec_leaves(batches.element_spec)
        if num_slices > 1 and any(leaf.shape == () for leaf in leaves):  # unknown rank: may be
            raise InvalidArgumentError(
                f"the dataset's elements are not batched ({batches.element_spec}), so they cannot "
                f"be split over {num_slices} replicas; call dataset.batch(global_batch_size) "
                "before distributing it, or batch per replica in distribute_datasets_from_function"
            )
        self._num_slices = num_slices
        self._replicas = replicas
        self._keep = keep
        self._plan: SlicePlan | None = None
        if worker is not None and keep is None:
            num_workers, worker_index = worker
            self._plan = functools.partial(
                _worker_sizes, num_workers, num_slices // num_workers, worker_index
            )
        self._element_spec = (replica_spec(batches.element_spec, num_slices),) * replicas

    def _cardinality(self) -> int:
        n = self._inputs[0].cardinality()
        if n < 0 or self._keep is not None:
            return n
        return UNKNOWN_CARDINALITY

    def _make_iterator(self, ctx: IteratorContext) -> _SplitIterator:
        return _SplitIterator(self, ctx)


class _SplitIterator(DatasetIterator):
    """Its state: the input's, the steps cut but not yet returned (``pending``), and global
    batches to cut before reading the input again (``batches``: a position restored on another
    number of workers, see ``_iterator_state``)."""

    _dataset: SplitBatchesDataset

    def __init__(self, dataset: SplitBatchesDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)
        self._pending: collections.deque[tuple[Any, ...]] = collections.deque()
        self._batches: collections.deque[Any] = collections.deque()

    def _global_batch(self) -> Any:
        return self._batches.popleft() if self._batches else self._input._next()

    def _next(self) -> tuple[Any, ...]:
        dataset = self._dataset
        if dataset._num_slices == 1:
            return (self._global_batch(),)
        while not self._pending:
            parts = slice_batch(self._global_batch(), dataset._num_slices, dataset._plan)
            if dataset._keep is not None:
                return tuple(parts[i] for i in dataset._keep)
            r = dataset._replicas
            for start in range(0, len(parts), r):
                step = tuple(parts[start : start + r])
                if not all(is_empty(p) for p in step):
                    self._pending.append(step)
        return self._pending.popleft()

    def _get_state(self) -> dict[str, Any]:
        return {
            "input": self._input.get_state(),
            "pending": list(self._pending),
            "batches": list(self._batches),
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        self._input.set_state(state["input"])
        self._pending = collections.deque(state["pending"])
        self._batches = collections.deque(state.get("batches", ()))


class GroupElementsDataset(Dataset):
    """Steps of ``replicas`` consecutive elements; missing ones at the end are None."""

    def __init__(self, elements: Dataset, replicas: int) -> None:
        super().__init__((elements,))
        self._replicas = replicas
        self._element_spec = (elements.element_spec,) * replicas

    def _make_iterator(self, ctx: IteratorContext) -> _GroupIterator:
        return _GroupIterator(self, ctx)


class _GroupIterator(DatasetIterator):
    _dataset: GroupElementsDataset

    def __init__(self, dataset: GroupElementsDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)

    def _next(self) -> tuple[Any, ...]:
        step: list[Any] = []
        try:
            while len(step) < self._dataset._replicas:
                step.append(self._input._next())
        except StopIteration:
            if not step:
                raise
        return tuple(step) + (None,) * (self._dataset._replicas - len(step))

    def _get_state(self) -> dict[str, Any]:
        return {"input": self._input.get_state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._input.set_state(state["input"])


class ZipReplicasDataset(Dataset):
    """Steps from one pipeline per replica (PER_REPLICA mode): replica i reads ``pipelines[i]``;
    a step exists while any pipeline has an element, the others get None."""

    def __init__(self, pipelines: tuple[Dataset, ...]) -> None:
        super().__init__(pipelines)
        self._element_spec = tuple(p.element_spec for p in pipelines)

    def _make_iterator(self, ctx: IteratorContext) -> _ZipReplicasIterator:
        return _ZipReplicasIterator(self, ctx)


class _ZipReplicasIterator(DatasetIterator):
    def __init__(self, dataset: ZipReplicasDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._inputs = [p._iterator(ctx) for p in dataset._inputs]
        self._done = [False] * len(self._inputs)

    def _next(self) -> tuple[Any, ...]:
        step: list[Any] = []
        for i, it in enumerate(self._inputs):
            if self._done[i]:
                step.append(None)
                continue
            try:
                step.append(it._next())
            except StopIteration:
                self._done[i] = True
                step.append(None)
        if all(part is None for part in step):
            raise StopIteration
        return tuple(step)

    def _get_state(self) -> dict[str, Any]:
        return {"inputs": [it.get_state() for it in self._inputs], "done": list(self._done)}

    def _set_state(self, state: dict[str, Any]) -> None:
        for it, s in zip(self._inputs, state["inputs"], strict=True):
            it.set_state(s)
        self._done = [bool(d) for d in state["done"]]

    def _close(self) -> None:
        for it in self._inputs:
            it.close()
