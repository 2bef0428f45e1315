"""``Dataset.interleave``: the datasets a function returns, read a few at a time in turn.

The order is tf.data's: ``cycle_length`` datasets are open at once; each in turn gives
``block_length`` elements (fewer where it ends), and a dataset that ends is replaced by the one
made from the next input element, in its place in the cycle.

With ``num_parallel_calls`` every slot of the cycle is filled at once and each open dataset is
read ahead on a thread of its own (``num_parallel_calls`` of them reading at a time), in chunks
of about half a millisecond of work so that cheap elements do not pay a thread handoff each.
The datasets of the next ``cycle_length`` input elements are made ahead too (tf.data's future
cycle elements), their iterators created but not read: what an iterator starts when it is made
(a file reader opens its first remote object and starts its read-ahead) overlaps the cycle
before them, instead of waiting for a slot to end.
The consumer takes elements in the same order as without it; with ``deterministic=False`` it
takes them from whichever open dataset has one ready when the current one has none. The state
holds, per open dataset, the elements read ahead, as prefetch's does.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from feedline.data.autotune import ConcurrencyLimit, ParallelismTuner, cpu_budget
from feedline.data.dataset import AUTOTUNE, Dataset, DatasetIterator, IteratorContext
from feedline.data.ops._background import ELEMENT, END, ERROR, Producer
from feedline.data.ops._checks import check_parallel_calls, check_positive
from feedline.data.ops.flat_map import DatasetFunction
from feedline.errors import InvalidArgumentError

# Parallel mode: each open dataset is read ahead by up to this many chunks, each chunk about
# _CHUNK_SECONDS of work (as map's chunks), at most _MAX_CHUNK elements.
_AHEAD_CHUNKS = 2
_CHUNK_SECONDS = 0.0005
_MAX_CHUNK = 64
# Non-deterministic mode waits for any open dataset to have an element; this bounds one wait.
_WAIT_SECONDS = 0.05


class InterleaveDataset(Dataset):
    """Maps each element to a dataset and interleaves ``cycle_length`` of them.

    ``cycle_length`` None or AUTOTUNE means the number of cores (``Options.autotune.cpu_budget``
    of the input where set); it is fixed when the dataset is made, so the order travels with
    the description. ``block_length`` defaults to 1. ``map_func`` receives the element (a tuple
    unpacked into arguments; a ``list_files`` name as a 0-d object array of bytes) and returns a
    Dataset.
    ``num_parallel_calls`` (AUTOTUNE: ``cycle_length``) reads the open datasets on threads;
    ``deterministic`` (default: ``Options.deterministic``, True) keeps the order.
    Where ``map_func`` builds file readers (``interleave(TFRecordDataset)``), FILE auto-sharding
    gives each worker a share of the file names this interleave reads (see ``auto_shard``).

    Example:
      >>> from feedline.data import Dataset
      >>> ds = Dataset.range(1, 6).interleave(
      ...     lambda x: Dataset.from_tensors(x).repeat(6), cycle_length=2, block_length=4
      ... )
      >>> [int(x) for x in ds]
      [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3, 4, 4, 5, 5, 5, 5, 5, 5]
    """

    def __init__(
        self,
        input_dataset: Dataset,
        map_func: Callable[..., Dataset],
        cycle_length: int | None = None,
        block_length: int | None = None,
        num_parallel_calls: int | None = None,
        deterministic: bool | None = None,
    ) -> None:
        super().__init__((input_dataset,))
        self._fn = DatasetFunction(map_func, "interleave")
        if cycle_length is None or cycle_length == AUTOTUNE:
            cycle_length = cpu_budget(input_dataset.options())
        self._cycle_length = check_positive("cycle_length", cycle_length, "interleave")
        self._block_length = (
            1
            if block_length is None
            else check_positive("block_length", block_length, "interleave")
        )
        self._num_parallel_calls = check_parallel_calls(num_parallel_calls, "interleave")
        self._deterministic = deterministic

    def _compute_element_spec(self) -> Any:
        return self._fn.output_spec(self._inputs[0])

    def _make_iterator(self, ctx: IteratorContext) -> _InterleaveIterator:
        return _InterleaveIterator(self, ctx)


class _ChunkReader:
    """Reads a chunk of ``(ok, element or error)`` outcomes on a slot's thread: about
    ``_CHUNK_SECONDS`` of work, so that cheap elements do not pay a thread handoff each."""

    def __init__(self, pull: Callable[[], Any], workers: ConcurrencyLimit) -> None:
        self._pull = pull
        self._workers = workers
        self._size = 1

    def __call__(self) -> list[tuple[bool, Any]]:
        chunk: list[tuple[bool, Any]] = []
        start = time.perf_counter()
        with self._workers:
            while len(chunk) < self._size:
                try:
                    chunk.append((True, self._pull()))
                except StopIteration:
                    if not chunk:
                        raise
                    break
                except Exception as error:
                    chunk.append((False, error))
                    break
        seconds = (time.perf_counter() - start) / len(chunk)
        self._size = max(1, min(_MAX_CHUNK, int(_CHUNK_SECONDS / max(seconds, 1e-9))))
        return chunk


@dataclasses.dataclass
class _Slot:
    """One open dataset of the cycle, the input element and pass index that made it and, in
    parallel mode, its producer and the rest of the chunk being handed out."""

    element: Any
    index: int
    iterator: DatasetIterator
    producer: Producer | None = None
    chunk: collections.deque[tuple[bool, Any]] = dataclasses.field(
        default_factory=collections.deque
    )

    def next(self) -> Any:
        if self.producer is None:
            return self.iterator._next()
        if not self.chunk:
            (kind, value), _ = self.producer.get()
            if kind == END:
                raise StopIteration
            if kind == ERROR:
                raise value.with_traceback(value.__traceback__)
            self.chunk.extend(value)
        ok, value = self.chunk.popleft()
        if ok:
            return value
        raise value.with_traceback(value.__traceback__)

    def ready(self) -> bool:
        return bool(self.chunk) or (self.producer is not None and self.producer.ready())

    def get_state(self) -> tuple[Any, int, Any, list[Any]]:
        if self.producer is None:
            return self.element, self.index, self.iterator.get_state(), []
        state, items = self.producer.capture(self.iterator.get_state)
        rest = [(ELEMENT, list(self.chunk))] if self.chunk else []
        return self.element, self.index, state, rest + items

    def restore(self, state: Any, items: list[Any]) -> None:
        self.iterator.set_state(state)
        if self.producer is not None:
            self.producer.reset(list(items))
        self.chunk.clear()

    def close(self) -> None:
        if self.producer is not None:
            self.producer.stop()
        self.iterator.close()


class _InterleaveIterator(DatasetIterator):
    def __init__(self, dataset: InterleaveDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)
        self._fn = dataset._fn
        self._cycle_length = dataset._cycle_length
        self._block_length = dataset._block_length
        parallel = dataset._num_parallel_calls
        self._parallel = parallel is not None
        workers = self._cycle_length if parallel in (None, AUTOTUNE) else parallel
        maximum = min(workers, self._cycle_length)
        self._tuner: ParallelismTuner | None = None
        if parallel == AUTOTUNE and ctx.options.autotune.enabled is not False:
            # How many open datasets are read at once is tuned from the rate delivered.
            autotune = ctx.options.autotune
            start = max(1, autotune.initial_parallelism or 1, autotune.min_parallelism or 0)
            self._tuner = ParallelismTuner(maximum, start=start)
        self._workers = ConcurrencyLimit(self._tuner.level if self._tuner else maximum)
        self._ready = threading.Condition()  # shared by the slots' producers
        deterministic = dataset._deterministic
        self._deterministic = ctx.deterministic if deterministic is None else bool(deterministic)
        # An open dataset, or in parallel mode the error that making it raised (the input's or
        # map_func's), raised in the slot's turn as the sequential order raises it.
        self._slots: list[_Slot | BaseException | None] = [None] * self._cycle_length
        # Parallel mode: the slots of the next input elements, made ahead, in input order (or
        # the error of making one).
        self._future: collections.deque[_Slot | BaseException] = collections.deque()
        self._ahead = self._cycle_length if self._parallel else 0
        self._input_done = False
        self._num_open = 0
        self._cycle_index = 0
        self._block_index = 0
        self._opened = 0  # input elements mapped so far
        self._end_of_input = False

    def _make_slot(self, element: Any, index: int) -> _Slot:
        iterator = self._fn(element)._iterator(self._ctx.child(index))
        slot = _Slot(element, index, iterator)
        if self._parallel:
            reader = _ChunkReader(iterator._next, self._workers)
            slot.producer = Producer(
                reader, lambda: _AHEAD_CHUNKS, "feedline-interleave", self._ready
            )
        return slot

    def _open(self, position: int) -> bool:
        """Puts the dataset of the next input element in the cycle at ``position`` (the one
        made ahead, where there is one; in parallel mode, the error of making it); False at the
        end of the input."""
        slot: _Slot | BaseException | None
        if self._future:
            slot = self._future.popleft()
        else:
            slot = self._made_slot() if self._parallel else self._next_slot()
        if slot is None:
            self._end_of_input = True
            return False
        if isinstance(slot, _Slot) and slot.producer is not None:
            slot.producer.start()
        self._slots[position] = slot
        self._num_open += 1
        return True

    def _next_slot(self) -> _Slot | None:
        """The slot of the next input element, its producer not started; None at the end."""
        if self._input_done:
            return None
        try:
            element = self._input._next()
        except StopIteration:
            self._input_done = True
            return None
        self._opened += 1
        return self._make_slot(element, self._opened - 1)

    def _made_slot(self) -> _Slot | BaseException | None:
        """Parallel mode: ``_next_slot``, or the error making it raised (the input's or
        map_func's), kept to be raised in the slot's turn as the sequential order raises it."""
        try:
            return self._next_slot()
        except Exception as error:
            return error

    def _fill(self) -> None:
        """Parallel mode: opens a dataset in every empty slot, in the order the cycle visits
        them, which gives them the input elements that the sequential order would; then makes
        the datasets of the next input elements ahead."""
        for step in range(self._cycle_length):
            position = (self._cycle_index + step) % self._cycle_length
            if self._slots[position] is None and not self._open(position):
                return
        while len(self._future) < self._ahead:
            slot = self._made_slot()
            if slot is None:
                return
            self._future.append(slot)

    def _advance_cycle(self) -> None:
        self._block_index = 0
        self._cycle_index = (self._cycle_index + 1) % self._cycle_length

    def _any_ready(self) -> _Slot | BaseException:
        """Non-deterministic mode: the first open slot, from the current one on, that has an
        element (or its end) ready, waiting for one if none has."""
        while True:
            for step in range(self._cycle_length):
                position = (self._cycle_index + step) % self._cycle_length
                slot = self._slots[position]
                if slot is not None and (isinstance(slot, BaseException) or slot.ready()):
                    if step:
                        self._cycle_index, self._block_index = position, 0
                    return slot
            with self._ready:
                self._ready.wait(_WAIT_SECONDS)

    def _next(self) -> Any:
        element = self._next_element()
        tuner = self._tuner
        if tuner is not None and not tuner.settled:
            tuner.observe()
            self._workers.set_limit(tuner.level)
        return element

    def _next_element(self) -> Any:
        slots = self._slots
        while not self._end_of_input or self._num_open:
            if self._parallel and not self._end_of_input and self._num_open < self._cycle_length:
                self._fill()
                continue
            slot = slots[self._cycle_index]
            if slot is None:
                if self._end_of_input:
                    self._advance_cycle()
                else:
                    self._open(self._cycle_index)
                continue
            if self._parallel and not self._deterministic:
                slot = self._any_ready()
            if isinstance(slot, BaseException):  # its dataset could not be made
                slots[self._cycle_index] = None
                self._num_open -= 1
                raise slot.with_traceback(slot.__traceback__)
            try:
                element = slot.next()
            except StopIteration:
                slot.close()
                slots[self._cycle_index] = None
                self._num_open -= 1
                self._advance_cycle()
                continue
            self._block_index += 1
            if self._block_index == self._block_length:
                self._advance_cycle()
            return element
        raise StopIteration

    def _get_state(self) -> dict[str, Any]:
        return {
            "seed": self._ctx.seed,
            "opened": self._opened,
            "end_of_input": self._end_of_input,
            "cycle_index": self._cycle_index,
            "block_index": self._block_index,
            "input": self._input.get_state(),
            "input_done": self._input_done,
            # Each open dataset: (input element, pass index, its state, elements read ahead).
            "slots": [_saved(slot) for slot in self._slots],
            # The datasets made ahead (not read yet): (input element, pass index, its state),
            # or the error that making one raised.
            "future": [_saved(slot) for slot in self._future],
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        saved = list(state["slots"])
        if len(saved) != self._cycle_length:
            raise InvalidArgumentError(
                f"interleave: the state has {len(saved)} cycle slots, but this interleave has "
                f"cycle_length={self._cycle_length}; restore it with the cycle_length it was "
                "saved with"
            )
        self._close_slots()
        self._restore_seed(state["seed"])
        self._input.set_state(state["input"])
        self._opened = int(state["opened"])
        self._end_of_input = bool(state["end_of_input"])
        self._input_done = bool(state.get("input_done", self._end_of_input))
        self._cycle_index = int(state["cycle_index"])
        self._block_index = int(state["block_index"])
        self._slots = [self._restored(entry) for entry in saved]
        self._num_open = sum(slot is not None for slot in self._slots)
        self._future.extend(self._restored(entry) for entry in state.get("future", ()))

    def _restored(self, entry: Any) -> Any:
        """The slot that ``_saved`` gave ``entry`` for (None and errors as they are)."""
        if entry is None or isinstance(entry, BaseException):
            return entry
        element, index, iterator_state, items = entry
        slot = self._make_slot(element, int(index))
        slot.restore(iterator_state, items)
        return slot

    def _close_slots(self) -> None:
        for k, slot in enumerate(self._slots):
            if isinstance(slot, _Slot):
                slot.close()
            self._slots[k] = None
        self._num_open = 0
        while self._future:
            ahead = self._future.popleft()
            if isinstance(ahead, _Slot):
                ahead.close()

    def _close(self) -> None:
        self._close_slots()
        self._input.close()


def _saved(slot: _Slot | BaseException | None) -> Any:
    """A slot in the iterator's state: its input element, pass index, state and the elements
    it read ahead (the error itself for one whose dataset could not be made)."""
    return slot.get_state() if isinstance(slot, _Slot) else slot
