"""``Dataset.shard``: every ``num_shards``-th element, starting at ``index``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from feedline.data.dataset import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    DatasetIterator,
    IteratorContext,
    RandomAccess,
    RowCursor,
)
from feedline.data.ops._checks import check_int
from feedline.errors import InvalidArgumentError

#: Placeholder for the number of shards and the shard index, filled in by HINT auto-sharding.
SHARD_HINT = -1


class ShardDataset(Dataset):
    """Keeps elements ``index``, ``index + num_shards``, ``index + 2 * num_shards``, ...

    ``shard(SHARD_HINT, SHARD_HINT)`` marks where HINT auto-sharding puts the worker count and
    index; a dataset iterated without that rewrite (no distribution, or another policy) is not
    sharded at all. Over a random-access input the shard is random-access too and reads only its
    own rows; otherwise it reads the input and drops the other shards' elements.

    Example:
      >>> from feedline.data import Dataset
      >>> [int(x) for x in Dataset.range(10).shard(num_shards=3, index=1)]
      [1, 4, 7]
      >>> from feedline.data.experimental import SHARD_HINT
      >>> len(list(Dataset.range(4).shard(SHARD_HINT, SHARD_HINT)))
      4
    """

    def __init__(self, input_dataset: Dataset, num_shards: int, index: int) -> None:
        super().__init__((input_dataset,))
        num_shards = check_int("num_shards", num_shards, "shard")
        index = check_int("index", index, "shard")
        if (num_shards == SHARD_HINT) != (index == SHARD_HINT):
            raise InvalidArgumentError(
                f"shard: num_shards={num_shards} and index={index}: either both are SHARD_HINT "
                f"({SHARD_HINT}), for HINT auto-sharding to fill in, or neither is"
            )
        if num_shards != SHARD_HINT:
            if num_shards < 1:
                raise InvalidArgumentError(f"shard: num_shards must be >= 1, got {num_shards}")
            if not 0 <= index < num_shards:
                raise InvalidArgumentError(
                    f"shard: index {index} is out of range [0, {num_shards}) for "
                    f"num_shards={num_shards}"
                )
        self._num_shards = num_shards
        self._index = index
        self._element_spec = input_dataset.element_spec

    @property
    def num_shards(self) -> int:
        """The number of shards (``SHARD_HINT`` until auto-sharding fills it in)."""
        return self._num_shards

    @property
    def index(self) -> int:
        """The index of the shard kept (``SHARD_HINT`` until auto-sharding fills it in)."""
        return self._index

    @property
    def is_hint(self) -> bool:
        """Whether this is a ``shard(SHARD_HINT, SHARD_HINT)`` placeholder."""
        return self._num_shards == SHARD_HINT

    def _stride(self) -> tuple[int, int]:
        return (1, 0) if self.is_hint else (self._num_shards, self._index)

    def _cardinality(self) -> int:
        n = self._inputs[0].cardinality()
        if n in (INFINITE_CARDINALITY, UNKNOWN_CARDINALITY):
            return n
        step, start = self._stride()
        return _strided_length(n, start, step)

    def _random_access(self) -> RandomAccess | None:
        access = self._inputs[0]._random_access()
        if access is None:
            return None
        step, start = self._stride()
        return access if step == 1 else _StridedAccess(access, start, step)

    def _make_iterator(self, ctx: IteratorContext) -> _ShardIterator:
        return _ShardIterator(self, ctx)


def _strided_length(n: int, start: int, step: int) -> int:
    return max(0, -(-(n - start) // step))


class _StridedAccess:
    """Rows ``start``, ``start + step``, ... of another random-access source."""

    def __init__(self, access: RandomAccess, start: int, step: int) -> None:
        self._access = access
        self._start = start
        self._step = step
        self._length = _strided_length(len(access), start, step)

    def __len__(self) -> int:
        return self._length

    def get(self, index: int) -> Any:
        return self._access.get(self._start + index * self._step)

    def gather(self, indices: np.ndarray) -> Any:
        return self._access.gather(self._start + np.asarray(indices, np.int64) * self._step)


class _ShardIterator(DatasetIterator):
    """Reads the shard's rows from the random-access input where it has one, else reads the
    input and drops the other shards' elements.

    Both ways share one state: the elements yielded, the input elements read, and the input's
    state (a list leaf, empty when reading rows). An input that is random-access only once
    filled (a cache) may differ between the run and the restore: a streaming state restores by
    streaming, and a row state where the input has no rows (a new process) replays the input.
    """

    def __init__(self, dataset: ShardDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._step, self._start = dataset._stride()
        self._input: Any = None  # the input's iterator while streaming
        self._cursor: RowCursor | None = None
        self._yielded = 0
        self._consumed = 0  # elements read from the input
        access = dataset._random_access()
        if access is not None:
            self._read_rows(access, 0)
        else:
            self._stream()

    def _read_rows(self, access: RandomAccess, position: int) -> None:
        self._cursor = RowCursor(access, position)
        self._next_batch = self._cursor.next_batch

    def _stream(self) -> DatasetIterator:
        self._cursor = None
        self._next_batch = None
        self._input = self._dataset._inputs[0]._iterator(self._ctx)
        return self._input

    def _next(self) -> Any:
        if self._cursor is not None:
            element = self._cursor.next()
        else:
            element = self._next_streamed(self._input._next)
        self._yielded += 1
        return element

    def _next_streamed(self, pull: Callable[[], Any]) -> Any:
        # Read up to and including the next element of this shard.
        wanted = self._consumed + (self._start - self._consumed) % self._step
        while self._consumed < wanted:
            pull()
            self._consumed += 1
        element = pull()
        self._consumed += 1
        return element

    def _get_state(self) -> dict[str, Any]:
        if self._cursor is not None:
            self._yielded = self._cursor.position  # batch may have read several rows at once
        rest = [] if self._input is None else [self._input.get_state()]
        return {"yielded": self._yielded, "consumed": self._consumed, "input": rest}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._close()
        self._yielded = yielded = int(state["yielded"])
        self._consumed = int(state["consumed"])
        if state["input"]:
            self._stream().set_state(state["input"][0])
            return
        access = self._dataset._random_access()
        if access is not None:
            self._read_rows(access, yielded)
            return
        self._consumed = 0
        pull = self._stream()._next
        for _ in range(yielded):
            self._next_streamed(pull)

    def _close(self) -> None:
        if self._input is not None:
            self._input.close()
            self._input = None
