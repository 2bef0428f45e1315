"""``SplitReceipts``: what a consumer of an exactly-once job keeps (``feedline.service.ledger``).

The fetch threads ask it which elements of a reply to take (``keep``: none from a task this
consumer closed, none it received before); the heartbeat reports what it received and the lost
tasks it closed (``report``), and hears which splits are done (``heard``); ``next`` counts what
it returned (``returned``), which is the consumer's position (``position``).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from feedline.service.ledger import Ranges, Receipts, Returned
from feedline.service.position import SplitPosition

__all__ = ["SplitReceipts"]


class SplitReceipts:
    """The receipts of one consumer of an exactly-once job. Thread-safe.

    Args:
      resume: the position the consumer resumes from, if any.
      received: per split, the offsets it has already (a trainer's, restored).
    """

    def __init__(
        self, resume: SplitPosition | None = None, received: dict[int, Ranges] | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._receipts = Receipts(received)
        self._returned = Returned(
            resume.done if resume else None, resume.partial if resume else None
        )
        # The tags ``returned`` and not yet counted in ``_returned`` (``_fold``): a deque, whose
        # append and popleft need no lock.
        self._unfolded: collections.deque[Sequence[int]] = collections.deque()
        self._closed: set[int] = set()  # lost tasks this consumer takes nothing more from
        self._report_all = False  # the last report may not have arrived: send everything

    def keep(
        self, task_id: int, tags: Sequence[Sequence[int]] | None, count: int
    ) -> list[bool] | None:
        """Which of the ``count`` elements of a reply of ``task_id``, tagged ``tags``, this
        consumer takes: none from a task it closed, none it received before (a replayed
        split). None if ``tags`` do not tag each element."""
        with self._lock:
            if task_id in self._closed:
                return [False] * count
            if tags is None or len(tags) != count:
                return None
            return self._receipts.take_tags(tags)

    def close_tasks(self, task_ids: Iterable[int]) -> None:
        """Nothing more is taken from ``task_ids`` (their workers were lost)."""
        with self._lock:
            self._closed.update(task_ids)

    def report(self) -> dict[str, Any]:
        """The fields of a heartbeat: the offsets received since the last report (all of them
        after a failed one), the splits held, and the tasks closed."""
        with self._lock:
            self._fold()  # (not reported: it keeps the queue short)
            everything, self._report_all = self._report_all, False
            return {
                "received": self._receipts.report(everything),
                "holding": self._receipts.holding(),
                "closed": sorted(self._closed),
            }

    def unreported(self) -> bool:
        """Whether offsets received wait to be reported."""
        with self._lock:
            return self._receipts.unreported()

    def report_failed(self) -> None:
        """The last report may not have arrived: the next one sends everything."""
        with self._lock:
            self._report_all = True

    def heard(self, splits_done: Iterable[Sequence[int]]) -> None:
        """The dispatcher said these ``[key, count]`` splits are done."""
        done = [list(pair) for pair in splits_done]
        with self._lock:
            self._receipts.forget(key for key, _ in done)
            self._returned.counted(done)

    def returned(self, tag: Sequence[int]) -> None:
        """``next`` returned the element tagged ``tag`` (``[split, offset]``). Only queued
        here (``next`` calls it for every element); counted by the next ``report`` or
        ``position``."""
        self._unfolded.append(tag)

    def returned_all(self, tags: Iterable[Sequence[int]]) -> None:
        """``returned`` of each of ``tags`` (a step's, once it committed)."""
        self._unfolded.extend(tags)

    def position(self) -> tuple[dict[int, int], dict[int, Ranges]]:
        """The splits returned in full (``key: count``) and the offsets returned of others."""
        with self._lock:
            self._fold()
            return self._returned.position()

    def _fold(self) -> None:
        """(Under the lock.) Counts the elements ``returned`` queued."""
        unfolded = self._unfolded
        self._returned.take_tags([unfolded.popleft() for _ in range(len(unfolded))])
