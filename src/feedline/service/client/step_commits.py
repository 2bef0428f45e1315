"""``StepCommits``: what a consumer that acknowledges on commit keeps (``feedline.service.ledger``).

With ``acknowledge="on_commit"`` a consumer of an exactly-once job acknowledges an element only
when the training step that used it commits:

- ``next`` takes an element given back by an aborted step first (``again``), then the queue's;
  each element returned belongs to the current step (``returned``);
- ``commit`` sends the step's ``[split, offset]`` tags to the dispatcher (``step_ranges``) and
  starts a new step (``committed``); ``abort`` gives the step's elements back, to be returned
  again in the same order;
- the heartbeat thread answers the dispatcher's *flush* requests (a consumer died and the
  dispatcher must know everything the others received before it sends the rest back): asked
  for a round (``asked``), it reports the round (``flush_report``) once every request that was
  in flight then has its reply delivered, and so its receipts reported.

Example:
  >>> from feedline.service.client.queue import Item
  >>> steps = StepCommits()
  >>> for offset in (0, 1): steps.returned(Item(offset, 8, 7, [4, offset]))
  >>> steps.step_ranges()
  [[4, [[0, 2]]]]
  >>> steps.abort(); [steps.again().element for _ in range(2)]  # the step's two, again
  2
  [0, 1]
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from typing import Any

from feedline.service.client.queue import Item
from feedline.service.ledger import tag_ranges

__all__ = ["StepCommits"]


class StepCommits:
    """The current step's elements and the flush state of one consumer. The step methods
    (``again``, ``returned``, ``step_ranges``, ``committed``, ``abort``) are called by the
    consumer's thread, the flush methods by its heartbeat thread."""

    def __init__(self) -> None:
        self._step: list[Item] = []
        self._again: collections.deque[Item] = collections.deque()
        self._lock = threading.Lock()
        self._flush_asked = 0  # the last flush round the dispatcher asked for
        self._flush_mark: int | None = None  # the requests to wait for, while one is asked
        self._flushed = 0  # the last round reported
        #: The dispatcher said the job waits only for its consumers' steps to commit.
        self.awaits_commits = False
        # Committed steps whose acknowledgement the heartbeat carries (``commit(wait=False)``).
        self._unsent: list[list[Any]] = []
        self._unsent_tags: list[Sequence[int]] = []

    # -- the consumer's thread ----------------------------------------------------------------
    def again(self) -> Item | None:
        """The next element an aborted step gave back, if any."""
        return self._again.popleft() if self._again else None

    def returned(self, item: Item) -> None:
        """``next`` returned ``item``: it belongs to the current step."""
        self._step.append(item)

    @property
    def step_size(self) -> int:
        """How many elements the current step has returned."""
        return len(self._step)

    def step_tags(self) -> list[Sequence[int]]:
        """The ``[split, offset]`` of the current step's elements."""
        return [item.tag for item in self._step if item.tag is not None]

    def step_ranges(self, tags: list[Sequence[int]] | None = None) -> list[list[Any]]:
        """The current step's elements (or those tagged ``tags``) as a report's ``[[key,
        ranges], ...]``."""
        return tag_ranges(self.step_tags() if tags is None else tags)

    def committed(self) -> None:
        """The current step committed: a new one starts."""
        self._step.clear()

    def abort(self) -> int:
        """The current step is aborted: its elements come again first, in order; how many."""
        count = len(self._step)
        self._again.extendleft(reversed(self._step))
        self._step.clear()
        return count

    def send_later(self) -> None:
        """The current step committed; the heartbeat carries its acknowledgement (a new step
        starts)."""
        tags = self.step_tags()
        with self._lock:
            self._unsent.extend(self.step_ranges(tags))
            self._unsent_tags.extend(tags)
        self._step.clear()

    # -- the heartbeat thread (or ``release``) ------------------------------------------------
    def take_unsent(self) -> tuple[list[list[Any]], list[Sequence[int]]]:
        """The acknowledgements to send now, ``([[key, ranges], ...], tags)``; ``unsent``
        puts them back if they did not arrive."""
        with self._lock:
            ranges, tags = self._unsent, self._unsent_tags
            self._unsent, self._unsent_tags = [], []
        return ranges, tags

    def unsent(self, ranges: list[list[Any]], tags: list[Sequence[int]]) -> None:
        """Acknowledgements that did not arrive: the next report carries them."""
        with self._lock:
            self._unsent[:0] = ranges
            self._unsent_tags[:0] = tags

    def has_unsent(self) -> bool:
        with self._lock:
            return bool(self._unsent)

    def asked(self, flush_round: int, mark: int) -> None:
        """The dispatcher asks for flush ``flush_round``; ``mark`` counts the requests made."""
        with self._lock:
            if flush_round > self._flush_asked:
                self._flush_asked, self._flush_mark = flush_round, mark

    def flush_pending(self) -> bool:
        """Whether a flush is asked for and not reported yet."""
        with self._lock:
            return self._flush_mark is not None

    def flush_report(self, answered_through: Callable[[int], bool]) -> int:
        """The flush round to report with the receipts collected next (0: none yet); call it
        before collecting them, so that they include every reply delivered by then."""
        with self._lock:
            if self._flush_mark is not None and answered_through(self._flush_mark):
                self._flushed, self._flush_mark = self._flush_asked, None
            return self._flushed
