"""``Dataset.window``: windows of consecutive elements, each window itself a dataset.

Window ``k`` starts at input element ``k * shift`` and holds the elements ``stride`` apart from
there, ``size`` of them (fewer at the end of the input, unless ``drop_remainder``). A window is
an ``ElementsDataset`` over those elements; an element that is a structure gives the same
structure of windows, one per component, as in TensorFlow.

The time-series idiom ``ds.window(n, shift=1).flat_map(lambda w: w.batch(n))`` runs without
making window datasets: ``flat_map`` asks ``batched_window_plan`` whether its function only
batches the window (or a ``Dataset.zip`` of its components), and if so iterates with
``WindowBatchIterator``, which keeps the input's rows stacked and cuts each window's batch from
them by NumPy indexing, many windows at once when a ``batch`` follows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import optree

from feedline import structure
from feedline.data.dataset import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    DatasetIterator,
    IteratorContext,
)
from feedline.data.ops._checks import check_int
from feedline.data.ops.batch import BatchDataset, pull_up_to
from feedline.data.ops.elements import ElementsDataset
from feedline.data.ops.zip import ZipDataset
from feedline.errors import InvalidArgumentError
from feedline.structure import DatasetSpec, TensorSpec

#: Rows read at once from an input that gives rows in blocks (``_next_batch``).
_READ_AHEAD = 1024


def _check_window_arg(name: str, value: Any) -> int:
    value = check_int(name, value, "window")
    if value <= 0:
        raise InvalidArgumentError(f"window: Window {name} must be greater than zero, got {value}")
    return value


def window_cardinality(n: int, size: int, shift: int, stride: int, drop_remainder: bool) -> int:
    """The number of windows over ``n`` elements, as TensorFlow counts them."""
    if n in (INFINITE_CARDINALITY, UNKNOWN_CARDINALITY):
        return n
    if drop_remainder:
        rest = n - ((size - 1) * stride + 1)
        return 0 if rest < 0 else rest // shift + 1
    return -(-n // shift)


class WindowDataset(Dataset):
    """Windows of ``size`` elements, started every ``shift`` elements, ``stride`` apart.

    The element spec is the input's with every ``TensorSpec`` replaced by a ``DatasetSpec`` of
    it. The state of an iterator holds the elements of the window being filled.

    Example:
      >>> from feedline.data import Dataset
      >>> [[x.tolist() for x in w] for w in Dataset.range(7).window(3)]
      [[0, 1, 2], [3, 4, 5], [6]]
      >>> ds = Dataset.range(7).window(3, shift=1, stride=2, drop_remainder=True)
      >>> [b.tolist() for b in ds.flat_map(lambda w: w.batch(3))]
      [[0, 2, 4], [1, 3, 5], [2, 4, 6]]
    """

    def __init__(
        self,
        input_dataset: Dataset,
        size: int,
        shift: int | None = None,
        stride: int = 1,
        drop_remainder: bool = False,
    ) -> None:
        super().__init__((input_dataset,))
        self._size = _check_window_arg("size", size)
        self._shift = self._size if shift is None else _check_window_arg("shift", shift)
        self._stride = _check_window_arg("stride", stride)
        self._drop_remainder = bool(drop_remainder)
        self._span = (self._size - 1) * self._stride + 1
        self._element_spec = structure.map_spec(DatasetSpec, input_dataset.element_spec)

    def _cardinality(self) -> int:
        return window_cardinality(
            self._inputs[0].cardinality(),
            self._size,
            self._shift,
            self._stride,
            self._drop_remainder,
        )

    def windows(self, rows: list[Any]) -> Any:
        """The window (a structure of windows) over ``rows``, input elements."""
        spec = self._inputs[0].element_spec
        if isinstance(spec, TensorSpec):
            return ElementsDataset(rows, spec)
        leaf_specs, treespec = structure.flatten(spec)
        columns = zip(*(structure.flatten(row)[0] for row in rows), strict=True)
        return structure.unflatten(
            treespec,
            [
                ElementsDataset(list(column), leaf_spec)
                for column, leaf_spec in zip(columns, leaf_specs, strict=True)
            ],
        )

    def _make_iterator(self, ctx: IteratorContext) -> _WindowIterator:
        return _WindowIterator(self, ctx)


class _WindowIterator(DatasetIterator):
    """Single-threaded; holds the elements from the current window's first one on."""

    _dataset: WindowDataset

    def __init__(self, dataset: WindowDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)
        self._buffer: list[Any] = []
        self._skip = 0  # input elements to drop before the next window starts
        self._end = False

    def _next(self) -> Any:
        dataset = self._dataset
        buffer, span = self._buffer, dataset._span
        pull = self._input._next
        while len(buffer) < span and not self._end:
            try:
                element = pull()
            except StopIteration:
                self._end = True
                break
            if self._skip:
                self._skip -= 1
            else:
                buffer.append(element)
        if not buffer or (len(buffer) < span and dataset._drop_remainder):
            raise StopIteration
        rows = buffer[0 : span : dataset._stride]
        shift = dataset._shift
        if shift <= len(buffer):
            del buffer[:shift]
        else:
            self._skip = shift - len(buffer)
            buffer.clear()
        return dataset.windows(rows)

    def _get_state(self) -> dict[str, Any]:
        return {
            "input": self._input.get_state(),
            "buffer": list(self._buffer),
            "skip": self._skip,
            "end": self._end,
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        self._input.set_state(state["input"])
        self._buffer = list(state["buffer"])
        self._skip = int(state["skip"])
        self._end = bool(state["end"])


# -- window + flat_map(batch): the fused path ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WindowBatchPlan:
    """What a flat_map function does with a window: ``batch(batch_size, drop_remainder)``."""

    batch_size: int
    drop_remainder: bool

    def iterator(
        self, dataset: Dataset, window: WindowDataset, ctx: IteratorContext
    ) -> WindowBatchIterator:
        return WindowBatchIterator(dataset, window, self, ctx)


def _is_dataset(value: Any) -> bool:
    return isinstance(value, Dataset)


def batched_window_plan(
    window: WindowDataset, fn: Callable[[Any], Dataset]
) -> WindowBatchPlan | None:
    """The plan of ``window.flat_map(fn)`` where ``fn`` only batches its window, else None.

    ``fn`` is called once on stand-in windows (as TensorFlow traces a flat_map function once):
    the answer is a plan when it returns ``window.batch(n)``, or for a structure of windows
    ``Dataset.zip(windows).batch(n)``, and when every component has a fully known shape (the
    rows are kept stacked). A function that fails on the stand-ins gets no plan.
    """
    spec = window.inputs[0].element_spec
    leaf_specs = structure.spec_leaves(spec)
    if any(not isinstance(s, TensorSpec) or s.shape is None or None in s.shape for s in leaf_specs):
        return None
    probes = structure.map_spec(lambda s: ElementsDataset([], s), spec)
    try:
        result = fn(probes)
    except Exception:
        return None
    if type(result) is not BatchDataset:
        return None
    source = result.inputs[0]
    if source is not probes:
        probe_leaves, treespec = optree.tree_flatten(probes, is_leaf=_is_dataset)
        if (
            type(source) is not ZipDataset
            or len(source.inputs) != len(probe_leaves)
            or any(a is not b for a, b in zip(source.inputs, probe_leaves, strict=True))
            or source._treespec != treespec
        ):
            return None
    return WindowBatchPlan(result._batch_size, result._drop_remainder)


class _Rows:
    """The input's rows from the current window's first one on, stacked: one array per
    component, ``count`` rows each."""

    def __init__(self, input_iterator: DatasetIterator, leaf_specs: list[TensorSpec]) -> None:
        self._input = input_iterator
        self._empty = [
            structure.zeros((0, *(int(d or 0) for d in s.shape or ())), s.dtype) for s in leaf_specs
        ]
        self.leaves = list(self._empty)
        self.count = 0
        self.skip = 0  # input rows to drop before the next window starts
        self.end = False

    def fill(self, need: int) -> None:
        """Reads until ``need`` rows are held or the input ends (then ``end`` is set)."""
        if self.count >= need or self.end:
            return
        parts: list[list[np.ndarray]] = []
        rows: list[list[np.ndarray]] = []
        have = self.count
        try:
            fast = self._input._next_batch
            while have < need:
                if fast is not None:
                    block = structure.flatten(fast(max(need - have, _READ_AHEAD) + self.skip))[0]
                    n = len(block[0])
                    if self.skip:
                        dropped = min(self.skip, n)
                        block = [b[dropped:] for b in block]
                        n -= dropped
                        self.skip -= dropped
                    if n:
                        parts.append(block)
                        have += n
                else:
                    element = self._input._next()
                    if self.skip:
                        self.skip -= 1
                        continue
                    rows.append(structure.flatten(element)[0])
                    have += 1
        except StopIteration:
            self.end = True
        finally:
            # Rows read before an error stay held: nothing read is lost.
            if rows:
                parts.append([_stack(column) for column in zip(*rows, strict=True)])
            if parts:
                self.leaves = [
                    np.concatenate([held, *(part[i] for part in parts)])
                    for i, held in enumerate(self.leaves)
                ]
                self.count = have

    def advance(self, shift: int) -> None:
        if shift <= self.count:
            self.leaves = [leaf[shift:] for leaf in self.leaves]
            self.count -= shift
        else:
            self.skip += shift - self.count
            self.leaves = list(self._empty)
            self.count = 0

    def state(self) -> dict[str, Any]:
        return {"rows": list(self.leaves), "skip": self.skip, "end": self.end}

    def restore(self, state: dict[str, Any]) -> None:
        self.leaves = [np.asarray(leaf) for leaf in state["rows"]]
        self.count = len(self.leaves[0])
        self.skip = int(state["skip"])
        self.end = bool(state["end"])


def _stack(column: tuple[np.ndarray, ...]) -> np.ndarray:
    try:
        return np.stack(column)
    except ValueError:
        shapes = sorted({np.shape(a) for a in column})
        raise InvalidArgumentError(
            f"window: the elements have shapes {shapes}, not the one their element_spec gives"
        ) from None


class WindowBatchIterator(DatasetIterator):
    """``window(...).flat_map(lambda w: w.batch(n))`` without window datasets.

    Single-threaded. Its state holds the input's state, the rows of the current window on (as
    arrays) and how many of the current window's batches were given. ``_next_batch`` gives many
    windows' batches in one NumPy gather, which a following ``batch`` uses.
    """

    def __init__(
        self, dataset: Dataset, window: WindowDataset, plan: WindowBatchPlan, ctx: IteratorContext
    ) -> None:
        super().__init__(dataset, ctx)
        spec = window.inputs[0].element_spec
        leaf_specs, self._treespec = structure.flatten(spec)
        self._single = isinstance(spec, TensorSpec)
        self._input = window.inputs[0]._iterator(ctx)
        self._rows = _Rows(self._input, leaf_specs)
        self._size, self._shift = window._size, window._shift
        self._span, self._drop_window = window._span, window._drop_remainder
        self._stride = window._stride
        self._offsets = np.arange(0, self._span, window._stride)
        self._batch_size, self._drop_batch = plan.batch_size, plan.drop_remainder
        self._given = 0  # batches of the current window given so far
        if plan.batch_size == self._size or (
            plan.batch_size > self._size and not plan.drop_remainder
        ):
            self._next_batch = self._next_windows  # one batch per window

    def _window_rows(self) -> int:
        """The number of rows in the current window (0: no window is left)."""
        rows = self._rows
        rows.fill(self._span)
        if rows.count >= self._span:
            return self._size
        if rows.count == 0 or self._drop_window:
            return 0
        return (rows.count - 1) // self._stride + 1

    def _take(self, index: np.ndarray) -> Any:
        leaves = [leaf[index] for leaf in self._rows.leaves]
        return leaves[0] if self._single else structure.unflatten(self._treespec, leaves)

    def _next(self) -> Any:
        bs = self._batch_size
        while True:
            m = self._window_rows()
            if m == 0:
                raise StopIteration
            start = self._given * bs
            if start < m and not (self._drop_batch and m - start < bs):
                self._given += 1
                return self._take(self._offsets[start : min(start + bs, m)])
            self._given = 0
            self._rows.advance(self._shift)

    def _next_windows(self, n: int) -> Any:
        """Up to ``n`` outputs stacked: one gather where ``n`` full windows are there."""
        if self._given == 0:
            need = (n - 1) * self._shift + self._span
            self._rows.fill(need)
            if self._rows.count >= need:
                index = (np.arange(n) * self._shift)[:, None] + self._offsets[None, :]
                out = self._take(index)
                self._rows.advance(n * self._shift)
                return out
        return structure.batch_elements(pull_up_to(self, n, False))

    def _get_state(self) -> dict[str, Any]:
        return {"input": self._input.get_state(), "given": self._given, **self._rows.state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._input.set_state(state["input"])
        self._rows.restore(state)
        self._given = int(state["given"])
