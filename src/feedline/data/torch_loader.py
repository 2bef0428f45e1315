"""``Dataset.as_torch()``: a feedline pipeline as a ``torch.utils.data.IterableDataset``.

The one module of ``feedline.data`` that imports torch; ``Dataset.as_torch`` (and
``DistributedDataset.as_torch``) import it when called, so ``import feedline.data`` stays free
of torch.

What it yields, element by element, is what the pipeline yields with every NumPy array made a
torch tensor: ``torch.from_numpy`` where the array is writable (no copy: a batch made by the
pipeline), a copy where it is read-only (a slice that views the source arrays, which a tensor
written in place must not change). Byte and unicode strings stay NumPy arrays; tensors (those
of a distributed dataset, on each replica's device) and ``PerReplica`` values pass unchanged.

============================================  =================================================
loop                                          use
============================================  =================================================
a plain loop                                  ``for x, y in dataset.as_torch(): ...``
anything that takes a ``DataLoader``          ``DataLoader(dataset.as_torch(), batch_size=None)``
(Lightning's ``Trainer.fit``, Accelerate's    — the pipeline batches; ``DataLoader``'s default
``prepare``)                                  ``batch_size=1`` would add a dimension of 1
torchdata's ``StatefulDataLoader``            the same; its ``state_dict`` saves the pipeline's
                                              position through this object's ``state_dict``
============================================  =================================================

**On a GPU.** ``as_torch(device="cuda:0")`` yields every element already on the device: each
batch is copied through a ring of reusable pinned host buffers on a copy stream of the device's
own, one batch ahead of the loop, and the loop's stream waits only for its own batch: the pass
reads ``dataset.apply(prefetch_to_device(device))`` (``feedline.data.ops.prefetch_to_device``).
Give the loop the tensors as they come, without ``.to(device)``; ``DataLoader(...,
pin_memory=True)`` has nothing left to do.

**DataLoader workers.** ``num_workers`` must be 0: under ``num_workers=N`` every worker process
would run the whole pipeline (N times the work for the same data, and unseeded shuffles that
differ between the copies), so iterating in a worker raises ``InvalidArgumentError``. The
pipeline has its own parallelism: ``map(..., num_parallel_calls=AUTOTUNE)`` on threads,
``use_processes=True`` for Python that holds the GIL, ``prefetch``, or a data service.

**Checkpoints** follow the convention of torchdata's ``StatefulDataLoader``: ``state_dict()``
returns where the latest pass stands (a picklable dict), and after ``load_state_dict(state)`` the
next ``iter()`` goes on from there, yielding exactly what the saved pass would have yielded next.
Passes are counted as ``iter`` counts them on a ``Dataset``, and the count is saved too, so the
passes after a restore reshuffle as the uninterrupted run's would have.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch
import torch.utils.data

from feedline.data.dataset import Dataset, IteratorContext, mix_seed
from feedline.errors import InvalidArgumentError
from feedline.structure import RaggedArray, SparseArray

__all__ = ["FeedlineIterableDataset", "to_torch"]

#: NumPy kinds that have no torch dtype: byte strings (object), unicode, void, dates and times.
_NUMPY_ONLY = "OSUVMm"


def to_torch(element: Any) -> Any:
    """``element`` with every NumPy array made a torch tensor (see the module).

    Example:
      >>> import numpy as np
      >>> x, y = to_torch((np.zeros(2, np.float32), np.array([b"a"], dtype=object)))
      >>> x, y
      (tensor([0., 0.]), array([b'a'], dtype=object))
    """
    if type(element) is tuple:
        return tuple([_to_tensor(a) for a in element])
    if isinstance(element, np.ndarray | np.generic):
        return _to_tensor(element)
    return _tree_map(element)


def _tree_map(element: Any) -> Any:
    # Nested tuples, dicts, namedtuples and lists, as feedline's elements (and torch's) nest.
    if isinstance(element, np.ndarray | np.generic | RaggedArray | SparseArray):
        return _to_tensor(element)
    if isinstance(element, tuple):
        values = [_tree_map(v) for v in element]
        return type(element)(*values) if hasattr(element, "_fields") else tuple(values)
    if isinstance(element, list):
        return [_tree_map(v) for v in element]
    if isinstance(element, dict):
        return {key: _tree_map(value) for key, value in element.items()}
    return element


def _to_tensor(value: Any) -> Any:
    if not isinstance(value, np.ndarray | np.generic):
        if isinstance(value, RaggedArray):
            return _ragged_to_torch(value)
        if isinstance(value, SparseArray):
            return _sparse_to_torch(value)
        return value
    if value.dtype.kind in _NUMPY_ONLY:
        return value
    if isinstance(value, np.ndarray) and value.flags.writeable:
        try:
            return torch.from_numpy(value)
        except (TypeError, ValueError):
            pass  # a layout torch cannot view (byte order, negative strides): copied below
    try:
        return torch.from_numpy(np.array(value, dtype=value.dtype.newbyteorder("="), order="C"))
    except (TypeError, ValueError) as error:
        raise InvalidArgumentError(
            f"as_torch: a NumPy array of dtype {value.dtype} has no torch equivalent ({error}); "
            "cast it in the pipeline, e.g. with map"
        ) from error


def _ragged_to_torch(value: RaggedArray) -> Any:
    """A ``RaggedArray`` of ragged_rank 1 as a jagged-layout nested tensor (values and offsets
    shared, not copied); of strings, unchanged."""
    if value.dtype.kind in _NUMPY_ONLY:
        return value
    if value.ragged_rank != 1:
        raise InvalidArgumentError(
            f"as_torch: a RaggedArray of ragged_rank {value.ragged_rank} (shape {value.shape}) has "
            "no torch nested tensor, which has one ragged dimension; pad it in the pipeline "
            "with map(lambda r: r.to_tensor()), or batch elements of one unknown dimension"
        )
    offsets = torch.from_numpy(np.asarray(value.row_splits, dtype=np.int64))
    return torch.nested.nested_tensor_from_jagged(_to_tensor(value.values), offsets)


def _sparse_to_torch(value: SparseArray) -> Any:
    """A ``SparseArray`` as a ``torch.sparse_coo_tensor`` (indices transposed to ``[rank, N]``);
    of strings, unchanged."""
    if value.dtype.kind in _NUMPY_ONLY:
        return value
    return torch.sparse_coo_tensor(
        torch.from_numpy(np.ascontiguousarray(value.indices.T)),
        _to_tensor(value.values),
        value.shape,
        check_invariants=False,  # a SparseArray checks its indices when it is made
    )


class StatefulIterator(Protocol):
    """What ``as_torch`` reads: an iterator whose position can be saved and restored."""

    def __next__(self) -> Any: ...

    def get_state(self) -> dict[str, Any]: ...

    def set_state(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class StatefulIterable(Protocol):
    """An iterable of ``StatefulIterator`` passes (a ``DistributedDataset``)."""

    def __iter__(self) -> StatefulIterator: ...


def _check_not_in_worker() -> None:
    info = torch.utils.data.get_worker_info()
    if info is not None:
        raise InvalidArgumentError(
            f"a feedline pipeline (as_torch) was iterated in DataLoader worker {info.id} of "
            f"{info.num_workers}: every worker would run the whole pipeline. Use "
            "DataLoader(..., num_workers=0, batch_size=None) and parallelise inside the "
            "pipeline (map(..., num_parallel_calls=AUTOTUNE), use_processes=True, prefetch)"
        )


class FeedlineIterableDataset(torch.utils.data.IterableDataset):
    """A feedline pipeline as a ``torch.utils.data.IterableDataset`` of torch tensors.

    Made by ``Dataset.as_torch()`` or ``DistributedDataset.as_torch()``; see the module for
    what it yields, ``DataLoader`` workers and checkpoints. ``len()`` is the dataset's
    cardinality where it is known and finite, and a ``TypeError`` otherwise (as torch expects
    of an iterable without a length).

    Args:
      source: a feedline ``Dataset``, or an iterable whose iterators have ``get_state`` and
        ``set_state`` (a ``DistributedDataset``; there the passes after a restore are those
        of a fresh iteration of it).

    Example:
      >>> from feedline.data import Dataset
      >>> loader = Dataset.range(5).batch(2).as_torch()
      >>> [batch.tolist() for batch in loader]
      [[0, 1], [2, 3], [4]]
      >>> it = iter(loader)
      >>> next(it).tolist()
      [0, 1]
      >>> state = loader.state_dict()
      >>> again = Dataset.range(5).batch(2).as_torch()
      >>> again.load_state_dict(state)
      >>> [batch.tolist() for batch in again]
      [[2, 3], [4]]
    """

    def __init__(self, source: Dataset | StatefulIterable) -> None:
        super().__init__()
        if not isinstance(source, Dataset) and not callable(getattr(source, "__iter__", None)):
            raise TypeError(
                f"as_torch needs a feedline Dataset or DistributedDataset, got "
                f"{type(source).__name__}"
            )
        self._source = source
        self._pass = 0  # the index of the pass that the next iter() makes
        self._resume: dict[str, Any] | None = None  # where the next iter() starts, if loaded
        self._current: _TorchIterator | None = None

    @property
    def source(self) -> Dataset | StatefulIterable:
        """The feedline dataset (or distributed dataset) this iterates."""
        return self._source

    def __iter__(self) -> _TorchIterator:
        _check_not_in_worker()
        index, resume = self._pass, self._resume
        self._pass, self._resume = index + 1, None
        iterator: StatefulIterator
        if isinstance(self._source, Dataset):
            source = self._source
            iterator = source._iterator(IteratorContext(source.options(), mix_seed(index)))
        else:
            iterator = iter(self._source)
        if resume is not None:
            iterator.set_state(resume)
        self._current = _TorchIterator(iterator, index)
        return self._current

    def __len__(self) -> int:
        return len(self._source)  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, Any]:
        """Where the latest pass stands: ``{"pass": index, "iterator": state or None}``.

        ``iterator`` is the feedline iterator's state while the pass has elements left; once it
        ends (and before any pass), None, with ``pass`` the index of the pass to come.

        Raises:
          FeedlineError: what the iterator's ``get_state`` raises where the pipeline cannot be
            checkpointed mid-pass (e.g. ``FailedPreconditionError`` for a split source).
        """
        current = self._current
        if current is None or current.done:
            return {"pass": self._pass, "iterator": self._resume}
        return {"pass": current.index, "iterator": current.get_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Makes the next ``iter()`` go on from ``state_dict`` (one that ``state_dict`` gave).

        Raises:
          InvalidArgumentError: ``state_dict`` is not such a dict.
        """
        if not isinstance(state_dict, dict) or set(state_dict) != {"pass", "iterator"}:
            raise InvalidArgumentError(
                "as_torch: load_state_dict expects the dict that state_dict() returned, with the "
                f"keys 'pass' and 'iterator'; got {state_dict!r:.200}"
            )
        iterator = state_dict["iterator"]
        if iterator is not None and not isinstance(iterator, dict):
            raise InvalidArgumentError(
                f"as_torch: the saved iterator state is a dict or None, got "
                f"{type(iterator).__name__}"
            )
        self._pass = int(state_dict["pass"])
        self._resume = iterator
        self._current = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_current"] = None  # a running pass (threads, open files) does not travel
        return state

    def __repr__(self) -> str:
        return f"<FeedlineIterableDataset of {self._source!r}>"


class _TorchIterator:
    """One pass of a ``FeedlineIterableDataset``: the feedline iterator's elements as tensors.
    Single-threaded, as the iterator it wraps."""

    def __init__(self, iterator: StatefulIterator, index: int) -> None:
        self.index = index
        self.done = False
        self._iterator = iterator
        self._pull = iterator.__next__

    def __iter__(self) -> _TorchIterator:
        return self

    def __next__(self) -> Any:
        try:
            element = self._pull()
        except StopIteration:
            self.done = True
            raise
        return to_torch(element)

    def get_state(self) -> dict[str, Any]:
        """The wrapped iterator's state."""
        return self._iterator.get_state()

    def close(self) -> None:
        """Closes the wrapped iterator (its threads, processes and files); idempotent."""
        self._iterator.close()
