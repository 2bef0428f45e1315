"""``CommittedIterator``: an iterator whose position advances when a training step commits.

A training step takes its input with ``next``, computes, and *commits* (its all-reduce
succeeded on every worker) or is *aborted* (a peer failed mid-step). Wrapped in a
``CommittedIterator``, an iterator counts an element as consumed only once the step that took it
committed:

=======================  ===========================================================
``next(it)``             the next element: one an aborted step gave back first, then
                         the pipeline's; it belongs to the current step
``it.commit()``          the current step committed: its elements are consumed
``it.abort()``           the current step is aborted: the pipeline goes back to where
                         the step started and reads its elements again, none skipped
``it.get_state()``       the position after the last committed step (what a checkpoint
                         saves): restored, the uncommitted step's elements come again
=======================  ===========================================================

Over a data service iterator that acknowledges on commit (``distribute(...,
acknowledge="on_commit")``) ``commit`` and ``abort`` are the service iterator's own: the
dispatcher records the step's elements, and a consumer that dies before its commit gives them
back to the job. Over any other pipeline (a DATA-sharded one, say) the wrapper keeps the
position the step started from (one ``get_state`` per step) and restores it on ``abort``.

Example:
  >>> from feedline.data import Dataset
  >>> it = CommittedIterator(iter(Dataset.range(6).batch(2)))
  >>> state = it.get_state()
  >>> [int(x) for x in next(it)]
  [0, 1]
  >>> it.abort()  # the step failed: its batch is read again
  >>> [int(x) for x in next(it)]
  [0, 1]
  >>> it.commit()
  >>> [int(x) for x in next(it)]  # taken, not committed: the state is still after [0, 1]
  [2, 3]
  >>> again = CommittedIterator(iter(Dataset.range(6).batch(2)))
  >>> again.set_state(it.get_state()); [int(x) for x in next(again)]
  [2, 3]
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from feedline.errors import ConsumerReleasedError

__all__ = ["CommittedIterator", "abort_step", "commit_step", "counts_steps"]

logger = logging.getLogger(__name__)


class CommittedIterator:
    """Wraps ``iterator`` so that its position advances on ``commit``, not on ``next``.

    Single-threaded, as the iterator it wraps.

    Args:
      iterator: a ``feedline.data`` iterator (``iter(dataset)``), or a data service iterator
        that acknowledges on commit.
    """

    def __init__(self, iterator: Any) -> None:
        self._inner = iterator
        # A service iterator that acknowledges on commit keeps the step itself.
        self._delegate = bool(getattr(iterator, "acknowledges_on_commit", False))
        # The inner iterator's state before the current step took its first element.
        self._start: dict[str, Any] | None = None

    @property
    def element_spec(self) -> Any:
        return self._inner.element_spec

    def __iter__(self) -> CommittedIterator:
        return self

    def __next__(self) -> Any:
        if not self._delegate and self._start is None:
            self._start = self._inner.get_state()
        return next(self._inner)

    def commit(self, wait: bool = True) -> None:
        """The current step committed: the elements ``next`` returned since the last commit
        are consumed. ``wait=False`` lets a service iterator's heartbeat carry the
        acknowledgement (``commit`` of a data service iterator)."""
        if self._delegate:
            self._inner.commit(wait)
        self._start = None

    def abort(self) -> None:
        """The current step is aborted: ``next`` returns its elements again, in order."""
        if self._delegate:
            self._inner.abort()
        elif self._start is not None:
            self._inner.set_state(self._start)

    def get_state(self) -> dict[str, Any]:
        """The position after the last committed step."""
        if self._delegate or self._start is None:
            return self._inner.get_state()
        return self._start

    def set_state(self, state: dict[str, Any]) -> None:
        """Moves to a position ``get_state`` gave; an uncommitted step is dropped."""
        self._inner.set_state(state)
        self._start = None

    def close(self) -> None:
        """Closes the wrapped iterator."""
        self._inner.close()


def counts_steps(iterator: Any) -> bool:
    """Whether ``iterator`` consumes its elements when their step commits: a
    ``CommittedIterator``, or a service iterator that acknowledges on commit."""
    return isinstance(iterator, CommittedIterator) or (
        getattr(iterator, "acknowledges_on_commit", False) is True
    )


def commit_step(iterators: Iterable[Any]) -> None:
    """A training step committed (its ``strategy.run`` and ``strategy.reduce`` returned on
    every worker): each of ``iterators`` that counts steps (``counts_steps``) consumes the
    step's elements; others are left alone. A service iterator whose consumer the dispatcher
    released during the step (``ConsumerReleasedError``: the step's elements went back to its
    job, and the iterator joined the job again) does not: its step is trained, and its
    elements come again, as after a kill before the commit."""
    for iterator in iterators:
        if counts_steps(iterator):
            try:
                iterator.commit()
            except ConsumerReleasedError as error:
                logger.warning("the step's input is not committed, the training goes on: %s", error)


def abort_step(iterators: Iterable[Any]) -> None:
    """A training step was aborted (a peer failed mid-step): each of ``iterators`` that counts
    steps returns the step's elements again."""
    for iterator in iterators:
        if counts_steps(iterator):
            iterator.abort()
