"""What a ``ClusterCoordinator`` hands back: ``RemoteValue``, ``PerWorkerValues`` and per-worker
datasets and iterators.

A per-worker dataset or iterator, or a ``PerWorkerValues``, passed to a scheduled function (as
an argument or through a global), reaches each worker as that worker's own: its own dataset and
iterator (made on it by the coordinator before the function runs, again after the worker
restarts), or its element of the ``PerWorkerValues``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from feedline.errors import UnavailableError

if TYPE_CHECKING:
    from feedline.distribute.parameter_server.resources import ResourceRegistry

__all__ = ["PerWorkerDataset", "PerWorkerDatasetIterator", "PerWorkerValues", "RemoteValue"]

_ids = itertools.count(1)


class RemoteValue:
    """The result of a scheduled function, once a worker has run it.

    ``fetch()`` and ``get()`` wait for it and return it, or raise the function's error (with the
    worker's traceback as a note), or the ``UnavailableError`` of a failed parameter server.

    Args:
      name: the function's name, for messages.
      raise_if_aborted: raises the error of a failed parameter server, if one failed; called
        while ``fetch`` waits.
    """

    def __init__(self, name: str, raise_if_aborted: Callable[[], None]) -> None:
        self._raise_if_aborted = raise_if_aborted
        self._name = name
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def _set(self, value: Any) -> None:
        self._value = value
        self._done.set()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def fetch(self, timeout: float | None = None) -> Any:
        """Waits for the value (at most ``timeout`` s when given) and returns it.

        Raises:
          the function's error; ``UnavailableError`` when a ps failed, or when ``timeout``
          passes first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done.wait(0.1):
            self._raise_if_aborted()
            if deadline is not None and time.monotonic() > deadline:
                raise UnavailableError(
                    f"the result of {self._name} did not arrive within {timeout:g} s; it is "
                    "still scheduled (fetch again, or join())"
                )
        if self._error is not None:
            raise self._error
        return self._value

    def get(self, timeout: float | None = None) -> Any:
        """The value, as ``fetch`` returns it."""
        return self.fetch(timeout)

    def __repr__(self) -> str:
        state = "error" if self._error is not None else "done" if self.done else "pending"
        return f"<RemoteValue of {self._name}: {state}>"


class PerWorkerValues:
    """One value per worker, in worker order; a scheduled function gets its worker's."""

    def __init__(self, values: Sequence[Any]) -> None:
        self._values = tuple(values)
        self._id = next(_ids)

    @property
    def values(self) -> tuple[Any, ...]:
        return self._values

    def _feedline_reference(self) -> tuple[str, int]:
        return ("value", self._id)

    def __repr__(self) -> str:
        return f"PerWorkerValues({list(self._values)!r})"


class PerWorkerDataset:
    """A dataset made on every worker (``ClusterCoordinator.create_per_worker_dataset``).

    ``iter()`` gives a ``PerWorkerDatasetIterator``: each worker's own iterator over its own
    dataset, to pass to scheduled functions.

    Args:
      resources: the coordinator's registry, where ``iter()`` adds the iterator.
      ident: this dataset's id in ``resources``.
    """

    def __init__(self, resources: ResourceRegistry, ident: int) -> None:
        self._resources = resources
        self._id = ident

    def _feedline_reference(self) -> tuple[str, int]:
        return ("resource", self._id)

    def __iter__(self) -> PerWorkerDatasetIterator:
        return PerWorkerDatasetIterator(self._resources.add_iterator(self._id))

    def __repr__(self) -> str:
        return f"<PerWorkerDataset {self._id}>"


class PerWorkerDatasetIterator:
    """Each worker's iterator over its per-worker dataset; ``next()`` of it inside a scheduled
    function reads that worker's next element. A restarted worker's iterator starts over."""

    def __init__(self, ident: int) -> None:
        self._id = ident

    def _feedline_reference(self) -> tuple[str, int]:
        return ("resource", self._id)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        raise TypeError(
            "a per-worker iterator is read inside a scheduled function (next(iterator) in the "
            "function given to coordinator.schedule), where it is that worker's iterator"
        )

    def __repr__(self) -> str:
        return f"<PerWorkerDatasetIterator {self._id}>"
