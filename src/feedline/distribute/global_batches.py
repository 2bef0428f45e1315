"""``GlobalBatches``: the same global batches whatever the number of workers and whatever failed.

A training job with a fixed global batch size trains step ``s`` on *global batch* ``s``: the
elements ``[s * G, (s + 1) * G)`` of one deterministic sequence. Each worker of the group takes
its part of that batch (``numpy.array_split``'s: rank ``r`` of ``n`` the ``r``-th of ``n``
nearly equal consecutive parts), as the group is *now*. So the sequence of global batches
that commit is a function of the data alone: a step redone after a membership change (under
the elastic strategy), on 1, 2 or 3 workers, with or without a worker lost, trains on the same
elements; only who computes which part differs. Nothing is exchanged between workers: the
position is the step count, which the group agrees on.

The sequence is read one of three ways:

* **By index** (a dataset with random access: ``range``, ``from_tensor_slices``, an
  in-memory ``cache()`` once filled, a ``cache(filename)`` on a local disk once complete, in
  any process, ...): a worker reads only its own rows, with ``epochs``
  passes and a seeded permutation per epoch (``shuffle_seed``): pass ``e`` is
  ``numpy.random.default_rng([shuffle_seed, e]).permutation(N)``, and a pass's last
  ``N mod G`` elements are dropped, so that no global batch spans two passes.
* **By place in a snapshot** (``Dataset.load(path)``, and ``Dataset.load(path, wait=True)`` of
  one that ``distributed_save`` is still writing on the data service's workers): a pass is
  the snapshot's streams one after another (each a split of the source), in a seeded order per
  pass with ``shuffle_seed`` (``numpy.random.default_rng([shuffle_seed, e]).permutation`` of
  the streams), each stream's elements in their saved order. A stream's elements have fixed
  places whichever service worker wrote them and whatever failed (``snapshot_positions``), so
  the global batches are the same on any number of trainers and service workers. A worker
  reads only the chunks that hold its rows; a global batch not yet written is waited for (for
  at most ``timeout_s`` without the save moving). The elements of the snapshot's streams
  before a place must all be written before it can be read: with ``shuffle_seed`` the first
  pass waits for more of the save.
* **As a stream** (any other pipeline): every worker reads every element of each global batch
  and keeps its part: the cost of determinism, a read of ``G`` elements per step on each
  worker instead of ``G / n``. ``map_func`` runs on a worker's own elements only, so put the
  costly per-element work (decoding, augmentation) there, not in the dataset.

The iterator counts steps as the commit protocol says (``feedline.data.committed``):
``commit()`` moves to the next global batch, ``abort()`` stays (``next`` returns the step's
part again, as the group is then), ``get_state()`` is the committed step count, which
``BackupAndRestore`` saves. Under an elastic strategy the step count follows the group's after
each change (a worker that joins a running group starts at the group's count).

Example:
  >>> from feedline.data import Dataset
  >>> batches = GlobalBatches(Dataset.range(10), 4)
  >>> [int(x) for x in batches.local_batch(0, rank=1, world_size=2)]
  [2, 3]
  >>> [int(x) for x in batches.local_batch(1, rank=0, world_size=3)]
  [4, 5]
  >>> [int(x) for x in next(batches)], batches.commit(), [int(x) for x in next(batches)]
  ([0, 1, 2, 3], None, [4, 5, 6, 7])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from feedline import structure
from feedline.data.dataset import Dataset, RandomAccess
from feedline.data.ops.load import LoadDataset
from feedline.data.ops.snapshot_positions import DEFAULT_TIMEOUT_S, SnapshotPositions
from feedline.distribute import collective as collectives
from feedline.errors import InvalidArgumentError, OutOfRangeError

__all__ = ["GlobalBatches"]

# Stream reads: the iterator's state at the start of the last few global batches, for a step
# that is redone (or a position restored) behind the one read last.
_KEPT_STARTS = 4


def part(step: int, rank: int, world_size: int, global_batch_size: int) -> tuple[int, int]:
    """Where rank ``rank`` of ``world_size``'s part of a global batch starts and ends in it
    (``numpy.array_split``'s split of ``range(global_batch_size)``)."""
    if not 0 <= rank < world_size:
        raise InvalidArgumentError(f"rank {rank} is not one of {world_size} workers")
    if world_size > global_batch_size:
        raise InvalidArgumentError(
            f"{world_size} workers cannot share a global batch of {global_batch_size}: each "
            "needs at least one element"
        )
    size, extra = divmod(global_batch_size, world_size)
    start = rank * size + min(rank, extra)
    return start, start + size + (1 if rank < extra else 0)


class GlobalBatches:
    """The global batches of ``dataset``, read by step; each worker reads its part.

    Args:
      dataset: the unbatched elements, in a deterministic order (a shuffle in it needs a seed).
      global_batch_size: ``G``, the elements of one step over all workers.
      shuffle_seed: a new permutation of the dataset per pass (needs random access).
      epochs: the passes (needs random access); None: as many as are read. Without
        ``shuffle_seed`` and ``epochs`` the dataset is read once, as it is (put ``repeat``
        and a seeded ``shuffle`` in it).
      map_func: applied to each of this worker's elements after they are read.
      timeout_s: how long a read of a snapshot still being written waits for a stream that
        does not move.

    Raises:
      InvalidArgumentError: ``global_batch_size`` or ``epochs`` below 1; ``shuffle_seed`` or
        ``epochs`` for a dataset without random access (or a snapshot); a dataset with random
        access but fewer than ``global_batch_size`` elements.
    """

    #: ``feedline.data.committed``: ``commit`` and ``abort`` are this iterator's own.
    acknowledges_on_commit = True

    def __init__(
        self,
        dataset: Dataset,
        global_batch_size: int,
        *,
        shuffle_seed: int | None = None,
        epochs: int | None = None,
        map_func: Callable[[Any], Any] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if global_batch_size < 1:
            raise InvalidArgumentError(f"global_batch_size must be ≥ 1, got {global_batch_size}")
        if epochs is not None and epochs < 1:
            raise InvalidArgumentError(f"epochs must be ≥ 1 or None, got {epochs}")
        self.global_batch_size = int(global_batch_size)
        self._map = map_func
        access = dataset._random_access()
        by_index = shuffle_seed is not None or epochs is not None
        saved = dataset.positions(timeout_s) if isinstance(dataset, LoadDataset) else None
        self._reader: _Rows | _Saved | _Stream
        if saved is not None:
            self._reader = _Saved(saved, self.global_batch_size, shuffle_seed, epochs, by_index)
        elif by_index and access is None:
            raise InvalidArgumentError(
                f"shuffle_seed and epochs need a dataset with random access (a source such as "
                f"range or from_tensor_slices, a filled in-memory cache or a complete file cache "
                f"on a local disk); "
                f"{type(dataset).__name__} has none: put a seeded shuffle and repeat in the "
                "dataset instead"
            )
        elif access is not None:
            self._reader = _Rows(access, self.global_batch_size, shuffle_seed, epochs, by_index)
        else:
            self._reader = _Stream(dataset, self.global_batch_size)
        self._step = 0
        self._generation: int | None = None

    # -- reads by step ------------------------------------------------------------------------
    def local_batch(self, step: int, rank: int, world_size: int) -> Any:
        """Rank ``rank`` of ``world_size``'s part of global batch ``step``, batched.

        Raises:
          OutOfRangeError: the data has no whole global batch ``step``.
        """
        start, end = part(step, rank, world_size, self.global_batch_size)
        if self._map is None:
            return self._reader.read(step, start, end, stacked=True)
        rows = self._reader.read(step, start, end, stacked=False)
        return structure.batch_elements([self._map(row) for row in rows])

    @property
    def step(self) -> int:
        """The global batch the next ``next`` reads a part of: the committed steps."""
        return self._step

    # -- the commit protocol ------------------------------------------------------------------
    def __iter__(self) -> GlobalBatches:
        return self

    def __next__(self) -> Any:
        rank, world_size = self._follow_group()
        try:
            return self.local_batch(self._step, rank, world_size)
        except OutOfRangeError:
            raise StopIteration from None

    def commit(self, wait: bool = True) -> None:
        """The current step committed: ``next`` reads the next global batch."""
        del wait  # nothing to send: the position is the step count
        self._step += 1

    def abort(self) -> None:
        """The current step was aborted: ``next`` reads its global batch again."""

    def get_state(self) -> dict[str, Any]:
        """The committed steps (what a checkpoint saves)."""
        return {"step": self._step, "global_batch_size": self.global_batch_size}

    def set_state(self, state: dict[str, Any]) -> None:
        """Moves to the step ``get_state`` gave.

        Raises:
          InvalidArgumentError: the state is of another global batch size.
        """
        if int(state["global_batch_size"]) != self.global_batch_size:
            raise InvalidArgumentError(
                f"the state is of global batches of {state['global_batch_size']} elements, "
                f"not {self.global_batch_size}: the steps would read other elements"
            )
        self._step = int(state["step"])

    def close(self) -> None:
        """Lets go of the stream's iterator."""
        self._reader.close()

    def _follow_group(self) -> tuple[int, int]:
        """This worker's rank and the group's size now; under an elastic strategy, the step
        count the group agreed on after a change (or that of a running group this worker
        joined)."""
        collective = collectives.active()
        if collective is None:
            return 0, 1
        generation = getattr(collective, "generation", None)
        if generation is not None and generation.number != self._generation:
            if self._generation is not None or generation.running:
                self._step = int(collective.step)  # type: ignore[attr-defined]
            self._generation = generation.number
        return collective.rank, collective.world_size


class _Rows:
    """Global batches of a dataset with random access: each worker reads its own rows."""

    def __init__(
        self,
        access: RandomAccess,
        global_batch_size: int,
        shuffle_seed: int | None,
        epochs: int | None,
        passes: bool,
    ) -> None:
        self._access = access
        self._length = len(access)
        self._seed = shuffle_seed
        self._epochs = epochs if passes else 1
        self._per_pass = self._length // global_batch_size
        if passes and self._per_pass == 0:
            raise InvalidArgumentError(
                f"the dataset has {self._length} elements, fewer than one global batch of "
                f"{global_batch_size}"
            )
        self._global = global_batch_size
        self._permutation: tuple[int, np.ndarray] | None = None

    def read(self, step: int, start: int, end: int, stacked: bool) -> Any:
        if self._per_pass == 0:
            raise OutOfRangeError(f"the data has no global batch {step}")
        epoch, index = divmod(step, self._per_pass)
        if self._epochs is not None and epoch >= self._epochs:
            raise OutOfRangeError(f"the data has no global batch {step}")
        rows = np.arange(index * self._global + start, index * self._global + end)
        if self._seed is not None:
            rows = self._order(epoch)[rows]
        if stacked:
            return self._access.gather(rows)
        return [self._access.get(int(row)) for row in rows]

    def _order(self, epoch: int) -> np.ndarray:
        if self._permutation is None or self._permutation[0] != epoch:
            rng = np.random.default_rng([int(self._seed or 0), epoch])
            self._permutation = (epoch, rng.permutation(self._length))
        return self._permutation[1]

    def close(self) -> None:
        pass


class _Saved:
    """Global batches of a snapshot by place: pass ``e`` is its streams in ``_order(e)``, one
    after another; a pass's last ``N mod G`` elements are dropped."""

    def __init__(
        self,
        positions: SnapshotPositions,
        global_batch_size: int,
        shuffle_seed: int | None,
        epochs: int | None,
        passes: bool,
    ) -> None:
        self._positions = positions
        self._global = global_batch_size
        self._seed = shuffle_seed
        self._epochs = epochs if passes else 1
        self._order_of: tuple[int, list[int]] | None = None

    def read(self, step: int, start: int, end: int, stacked: bool) -> Any:
        while True:
            epoch, index = self._locate(step)
            first = index * self._global
            rows = self._places(self._order(epoch), first + start, first + end)
            if rows is not None:  # else the pass ended before them: the total is known now
                return structure.batch_elements(rows) if stacked else rows

    def _locate(self, step: int) -> tuple[int, int]:
        """The pass and global batch in it of ``step``: in the first pass while the
        snapshot's size is not known."""
        total = self._positions.total()
        if total is None:
            return 0, step
        per_pass = total // self._global
        if per_pass == 0:
            raise OutOfRangeError(
                f"the snapshot has {total} elements, fewer than one global batch of {self._global}"
            )
        epoch, index = divmod(step, per_pass)
        if self._epochs is not None and epoch >= self._epochs:
            raise OutOfRangeError(f"the data has no global batch {step}")
        return epoch, index

    def _places(self, order: list[int], low: int, high: int) -> list[Any] | None:
        """The elements at places ``low`` to ``high`` of a pass whose streams are in ``order``,
        waiting for the streams before them to be written; None where the pass has fewer."""
        positions = self._positions
        rows: list[Any] = []
        base = 0
        for stream in order:
            if base >= high:
                break
            length = positions.length(stream)
            while length is None:  # being written: enough of it, or its end, is needed
                committed = positions.committed(stream)
                if high <= base + committed:
                    length = committed
                    break
                positions.wait(stream, _moved(positions, stream, committed))
                length = positions.length(stream)
            start, end = max(low, base) - base, min(high, base + length) - base
            if start < end:
                rows += positions.rows(stream, start, end)
            base += length
        return rows if base >= high else None

    def _order(self, epoch: int) -> list[int]:
        if self._order_of is None or self._order_of[0] != epoch:
            streams = self._positions.num_streams
            if self._seed is None:
                order = list(range(streams))
            else:
                order = np.random.default_rng([self._seed, epoch]).permutation(streams).tolist()
            self._order_of = (epoch, order)
        return self._order_of[1]

    def close(self) -> None:
        pass


def _moved(positions: SnapshotPositions, stream: int, committed: int) -> Callable[[], bool]:
    """Whether ``stream`` is complete or has more than ``committed`` elements committed."""
    return lambda: positions.length(stream) is not None or positions.committed(stream) > committed


class _Stream:
    """Global batches of any pipeline: global batch ``s`` is elements ``[s*G, (s+1)*G)`` of
    one pass, read whole on every worker."""

    def __init__(self, dataset: Dataset, global_batch_size: int) -> None:
        self._dataset = dataset
        self._global = global_batch_size
        self._iterator: Any = None
        self._origin: dict[str, Any] = {}  # the iterator's state at its start
        self._position = 0  # in global batches
        self._starts: dict[int, dict[str, Any]] = {}  # global batch -> the iterator's state
        self._last: tuple[int, list[Any]] | None = None

    def read(self, step: int, start: int, end: int, stacked: bool) -> Any:
        if self._last is None or self._last[0] != step:
            self._last = (step, self._global_batch(step))
        rows = self._last[1][start:end]
        return structure.batch_elements(rows) if stacked else rows

    def _global_batch(self, step: int) -> list[Any]:
        self._seek(step)
        self._starts[step] = self._iterator.get_state()
        for old in sorted(self._starts)[:-_KEPT_STARTS]:
            del self._starts[old]
        rows = []
        for _ in range(self._global):
            try:
                rows.append(next(self._iterator))
            except StopIteration:
                self._position = -1  # the next read starts over
                raise OutOfRangeError(f"the data has no whole global batch {step}") from None
        self._position = step + 1
        return rows

    def _seek(self, step: int) -> None:
        """Puts the iterator at the start of global batch ``step``: from where it is, from a
        kept start at or before ``step``, or from the beginning of the same pass (a new pass
        of a dataset may shuffle otherwise)."""
        if self._iterator is None:
            self._iterator = iter(self._dataset)
            self._origin = self._iterator.get_state()
            self._position = 0
        if not 0 <= self._position <= step:
            known = [s for s in self._starts if s <= step]
            self._position = max(known, default=0)
            self._iterator.set_state(self._starts[self._position] if known else self._origin)
        while self._position < step:
            for _ in range(self._global):
                try:
                    next(self._iterator)
                except StopIteration:
                    self._position = -1
                    raise OutOfRangeError(f"the data has no global batch {step}") from None
            self._position += 1

    def close(self) -> None:
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None
            self._starts.clear()
