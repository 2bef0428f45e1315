"""Exactly-once DYNAMIC epochs: the dispatcher's split ledger and the consumer's receipts.

With ``fault_tolerant_mode`` a DYNAMIC job keeps a ``SplitLedger``: every split handed out stays
*open* until its elements were delivered, and a split whose worker was lost is handed out again.

- A worker runs the job's pipeline once per split (``worker.replay``) and tags each element with
  ``(key, offset)``: ``key`` names the split (its first position in the repetition's order),
  ``offset`` is the element's place among the outputs of that split. When it has produced the
  whole split it tells the dispatcher how many elements the split has (``count``), with its next
  ``GetSplit``.
- Consumers keep ``Receipts``: the offsets received of each open split, dropping an offset they
  already have; their heartbeats report them (``receive``). A split is *done* once its count is
  known and the offsets the consumers received cover ``0 .. count - 1``.
- When a worker is lost its open splits wait until every consumer of the job has *closed* that
  worker's task (it takes nothing more from it, and reported all it received): only then is the
  set of delivered offsets final, and the split goes to the ``replay`` queue. ``GetSplit`` hands
  out replays first, with the delivered offsets to ``skip``; so an element that one consumer
  received is never given to another.
- The repetition ends (``GetSplit`` answers None) only when every split was handed out and is
  done; until then a worker whose input ran out is told to ``wait``, as a replay may come.
- A consumer that leaves (released, or gone silent past ``client_timeout_ms``) takes with it what
  it received and had not reported yet, so its offsets may never be covered. Once one has left,
  a split is also done when its worker has handed out every element of it (``handed_out``):
  what the leaver held is lost with it (at most once, for a consumer that dies), and the others
  reach the end of the epoch.

A job whose consumers acknowledge on commit (``commits``) counts an element delivered only when
the training step that used it *committed*: a consumer reports what it received as *held*
(``receive``) and, once the step commits, as committed (``commit``); a split is done once its
committed offsets cover it, and a replay skips what is committed or held by a consumer that
reads the job now (``skip_of``). When a consumer dies (``client_gone``) what it held, and what
reached it unreported, goes back: each open split it may have read from is *repaired* once its
worker has handed all of it out and every other consumer has *flushed* (reported all it
received, its replies in flight included: ``flush_wanted``, ``flushed``); the offsets then
neither committed nor held by anyone are replayed, whoever reads the job next gets them. A
consumer that was released and lives on (a paused process that runs again) takes elements until
it hears that it was released, and the dispatcher counts nothing it reports: so once one has
left, every split handed out after is repaired too, unless all of it is committed or held.

  >>> ledger = SplitLedger(commits=True)
  >>> ledger.joined(1, None); ledger.joined(2, None)
  >>> ledger.grant(0, task_id=7); ledger.count(0, 4)
  >>> ledger.receive(0, [[0, 2]], client_id=1); ledger.receive(0, [[2, 3]], client_id=2)
  >>> ledger.commit(0, [[0, 1]], client_id=1)  # consumer 1 committed offset 0, holds 1
  >>> ledger.client_gone(1); ledger.handed_out(0, task_id=7); ledger.flush_wanted(2)
  1
  >>> ledger.flushed(2, 1); ledger.replay, ledger.skip_of(0)  # 1 and 3 (never reported) go back
  ([0], [[0, 1], [2, 3]])

Offsets travel as *ranges*: sorted, disjoint ``[start, stop)`` pairs (``add_ranges``).

A cross-trainer job (``CrossTrainerCache``) keeps a ledger of its own kind (``per_trainer``):
every trainer reads every element, so what counts is what *each trainer* received, under its
``trainer_id`` (``joined``) whatever consumer id it reads with now. A split is done once its
count is known and every trainer that reads the job now (it has a consumer that did not leave)
received all of it; a trainer that left (killed, to come back from its checkpoint) is not
waited for, and is again once it rejoins. A split of a lost worker is handed out again at once
and whole (``skip`` nothing): each trainer drops the offsets it already has (its own receipts),
so one that had consumed part of it gets the rest, one that had none gets all of it, and a
trainer restored from a checkpoint taken before it read them gets them again too. A done split
is kept with its task and what each trainer received of it (``finished``): a trainer that
joins once it is done reads it from its worker's cache, and if that worker is lost before the
trainer received all of it, the split is open again and handed out again like the others. The
ledger keeps the lost tasks (``lost``), so that a trainer that joins after the worker was lost
gets those splits too: when it joins, each done split of a lost task that it lacks is open
again (so is one that became done while it waited to be handed out again, as the only trainer
lacking it had left: no worker made it since). A trainer restored from a checkpoint joins
with the offsets its position says it returned (``restored``), which replace what the ledger
had counted for it (it may have received more before it was killed): a done split of a lost
task that it lacks since is open again for it as well. The job's splits end (``settled``: its
tasks are told so) only once every trainer reading it has all of every done split, so that a
task still runs a split its worker turns out to have lost for a trainer that lacks it; where
the tasks ended their splits before one came back, the dispatcher gives a live worker a new
task (``dispatcher.workers``).

  >>> ledger = SplitLedger(per_trainer=True)
  >>> ledger.joined(1, "a"); ledger.joined(2, "b")
  >>> ledger.grant(0, task_id=7); ledger.count(0, 4)
  >>> ledger.receive(0, [[0, 4]], client_id=1); sorted(ledger.open)  # b has none of it yet
  [0]
  >>> ledger.holder_lost(7, consumers=[1, 2]); ledger.replay, ledger.open[0].delivered
  ([0], [])
  >>> ledger.regrant(0, task_id=8); ledger.receive(0, [[0, 4]], client_id=2); ledger.done
  {0: 4}
  >>> ledger.joined(3, "c")  # c joins late: split 0 is done, c reads it from task 8's cache
  >>> ledger.holder_lost(8, consumers=[1, 2, 3]); ledger.replay, ledger.done  # c lacks it
  ([0], {})
  >>> ledger.regrant(0, task_id=9); ledger.receive(0, [[0, 4]], client_id=3); ledger.done
  {0: 4}
  >>> ledger.holder_lost(9, consumers=[1, 2, 3])  # every trainer has split 0: it stays done
  >>> ledger.joined(4, "d"); ledger.replay, ledger.done  # d joins after task 9 was lost
  ([0], {})

Example:
  >>> ledger = SplitLedger()
  >>> ledger.grant(0, task_id=7); ledger.grant(4, task_id=8)
  >>> ledger.receive(0, [[0, 3]]); ledger.count(0, 4)
  >>> sorted(ledger.open)
  [0, 4]
  >>> ledger.holder_lost(7, consumers=[1])  # split 0 waits for consumer 1 to close task 7
  >>> ledger.closed(1, [7]); ledger.replay
  [0]
  >>> ledger.regrant(0, task_id=8); ledger.open[0].delivered  # the replay skips offsets 0-2
  [[0, 3]]
  >>> ledger.receive(0, [[3, 4]]); sorted(ledger.open), ledger.done
  ([4], {0: 4})
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from feedline.errors import InvalidArgumentError

__all__ = [
    "OpenSplit",
    "Receipts",
    "Returned",
    "SplitLedger",
    "add_ranges",
    "check_report",
    "contains",
    "covers",
    "ranges_of",
    "subtract_ranges",
    "tag_ranges",
    "tag_runs",
]

Ranges = list[list[int]]


def add_ranges(ranges: Sequence[Sequence[int]], more: Iterable[Sequence[int]]) -> Ranges:
    """The union of two range lists, sorted and merged (touching ranges join).

    Example:
      >>> add_ranges([[0, 2], [5, 6]], [[2, 4], [8, 9]])
      [[0, 4], [5, 6], [8, 9]]
    """
    pairs = sorted([int(a), int(b)] for a, b in (*ranges, *more) if int(b) > int(a))
    merged: Ranges = []
    for start, stop in pairs:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return merged


def ranges_of(offsets: Iterable[int]) -> Ranges:
    """The ranges that hold exactly ``offsets``.

    Example:
      >>> ranges_of([3, 0, 1, 4, 7])
      [[0, 2], [3, 5], [7, 8]]
    """
    ranges: Ranges = []
    for offset in sorted(offsets):  # (nearly always in order already: a linear sort)
        if not ranges or offset > ranges[-1][1]:
            ranges.append([offset, offset + 1])
        elif offset == ranges[-1][1]:
            ranges[-1][1] = offset + 1
    return ranges


def covers(ranges: Sequence[Sequence[int]], count: int) -> bool:
    """Whether ``ranges`` hold every offset ``0 .. count - 1``."""
    if count <= 0:
        return True
    return bool(ranges) and ranges[0][0] <= 0 and ranges[0][1] >= count


def _received_by(split: OpenSplit, trainers: Iterable[str]) -> bool:
    """(``per_trainer``) Whether each of ``trainers`` received all of ``split``."""
    return all(covers(split.trainers.get(t, []), split.count or 0) for t in trainers)


def _last_start(ranges: Sequence[Sequence[int]], offset: int) -> int:
    """The index of the last range starting at or before ``offset`` (-1 if none)."""
    return bisect.bisect_right(ranges, offset, key=lambda pair: pair[0]) - 1


def contains(ranges: Sequence[Sequence[int]], offset: int) -> bool:
    """Whether ``offset`` is in ``ranges``."""
    index = _last_start(ranges, offset)
    return index >= 0 and offset < ranges[index][1]


def _append_run(ranges: Ranges, start: int, stop: int) -> bool:
    """Adds ``start .. stop - 1`` to ``ranges`` in place where they all lie past its last
    range (the way offsets arrive, in order); False, and ``ranges`` unchanged, otherwise."""
    if not ranges:
        ranges.append([start, stop])
    elif ranges[-1][1] == start:
        ranges[-1][1] = stop
    elif ranges[-1][1] < start:
        ranges.append([start, stop])
    else:
        return False
    return True


def _insert(ranges: Ranges, offset: int) -> bool:
    """Adds ``offset`` to ``ranges`` in place; False if it was there."""
    if _append_run(ranges, offset, offset + 1):  # past the last range: most often
        return True
    index = _last_start(ranges, offset)
    if index >= 0 and offset < ranges[index][1]:
        return False
    joins_left = index >= 0 and ranges[index][1] == offset
    joins_right = index + 1 < len(ranges) and ranges[index + 1][0] == offset + 1
    if joins_left and joins_right:
        ranges[index][1] = ranges.pop(index + 1)[1]
    elif joins_left:
        ranges[index][1] = offset + 1
    elif joins_right:
        ranges[index + 1][0] = offset
    else:
        ranges.insert(index + 1, [offset, offset + 1])
    return True


def tag_runs(tags: Sequence[Sequence[int]]) -> Iterator[tuple[int, int, int]]:
    """``(key, start, stop)`` of each run of consecutive offsets of one split in ``tags``
    (``[key, offset]`` pairs), in order.

    Example:
      >>> list(tag_runs([[4, 0], [4, 1], [4, 2], [5, 9], [4, 3]]))
      [(4, 0, 3), (5, 9, 10), (4, 3, 4)]
    """
    if not tags:
        return
    key, start = tags[0]
    stop = start + 1
    for tag_key, offset in itertools.islice(tags, 1, None):
        if offset == stop and tag_key == key:
            stop += 1
        else:
            yield key, start, stop
            key, start, stop = tag_key, offset, offset + 1
    yield key, start, stop


def tag_ranges(tags: Sequence[Sequence[int]]) -> list[list[Any]]:
    """``[[key, ranges], ...]`` (by key) of the offsets of ``[key, offset]`` pairs: a run of
    consecutive offsets of one split costs one step, however long (``tag_runs``).

    Example:
      >>> tag_ranges([[5, 9], [4, 0], [4, 1], [5, 10], [4, 3], [4, 2]])
      [[4, [[0, 4]]], [5, [[9, 11]]]]
    """
    by_key: dict[int, Ranges] = {}
    _add_tags(by_key, tags)
    return [[key, ranges] for key, ranges in sorted(by_key.items())]


def _add_tags(by_key: dict[int, Ranges], tags: Sequence[Sequence[int]]) -> None:
    """Adds each ``[key, offset]`` of ``tags`` to ``by_key[key]`` in place: a run past what
    the key has in one step, an offset out of order where it goes."""
    for key, start, stop in tag_runs(tags):
        ranges = by_key.setdefault(key, [])
        if not _append_run(ranges, start, stop):
            for offset in range(start, stop):
                _insert(ranges, offset)


def subtract_ranges(ranges: Sequence[Sequence[int]], minus: Sequence[Sequence[int]]) -> Ranges:
    """The offsets of ``ranges`` that are not in ``minus``.

    Example:
      >>> subtract_ranges([[0, 10]], [[2, 4], [6, 7]])
      [[0, 2], [4, 6], [7, 10]]
    """
    out: Ranges = []
    cuts = add_ranges([], minus)
    for start, stop in add_ranges([], ranges):
        for cut_start, cut_stop in cuts:
            if cut_stop <= start or cut_start >= stop:
                continue
            if cut_start > start:
                out.append([start, cut_start])
            start = max(start, cut_stop)
        if start < stop:
            out.append([start, stop])
    return out


def _check_ranges(value: Any, what: str) -> Ranges:
    if not isinstance(value, list) or not all(
        isinstance(pair, list)
        and len(pair) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in pair)
        for pair in value
    ):
        raise InvalidArgumentError(f"malformed request: {what} must be [[start, stop], ...]")
    return add_ranges([], value)


@dataclasses.dataclass
class OpenSplit:
    """A split handed out and not yet done.

    Attributes:
      holder: the task producing it, None while it waits to be handed out again.
      count: how many elements it has, once a worker produced all of it.
      delivered: the offsets consumers reported, as ranges.
      lost_holder: the lost task it was taken from (while it waits for ``awaiting``).
      awaiting: the consumers that must close ``lost_holder`` before it is replayed.
      handed_out: its holder has handed every element of it to consumers.
      trainers: in a ``per_trainer`` ledger, the offsets each trainer reported, as ranges.
      held: in a ``commits`` ledger, the offsets each consumer (by its id as a string)
        received and has not committed yet; ``delivered`` holds the committed ones.
      repair: (``commits``) a consumer that may have read from it died: once handed out and
        flushed, what is neither committed nor held goes back (``flush_wanted``).
      flush_at: the flush round its repair waits for, 0 while none started.
      flushing: the consumers that must flush (round ``flush_at``) before its repair.
      versions: the version of each object (by URL) its first run opened: a run again reads
        those (``pin``).
    """

    holder: int | None
    count: int | None = None
    delivered: Ranges = dataclasses.field(default_factory=list)
    lost_holder: int | None = None
    awaiting: list[int] = dataclasses.field(default_factory=list)
    handed_out: bool = False
    trainers: dict[str, Ranges] = dataclasses.field(default_factory=dict)
    held: dict[str, Ranges] = dataclasses.field(default_factory=dict)
    repair: bool = False
    flush_at: int = 0
    flushing: list[int] = dataclasses.field(default_factory=list)
    versions: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class SplitLedger:
    """The splits of one exactly-once job: open, done, and waiting to be handed out again.

    Plain data changed only by its methods, which the dispatcher's state updates call
    (``dispatcher.state``);
    ``to_json`` / ``from_json`` write and read it for the journal's snapshot.
    """

    open: dict[int, OpenSplit] = dataclasses.field(default_factory=dict)
    #: The splits done, and how many elements each had.
    done: dict[int, int] = dataclasses.field(default_factory=dict)
    replay: list[int] = dataclasses.field(default_factory=list)
    #: A consumer left the job: a split handed out whole is done, covered or not (``commits``:
    #: it is repaired, ``handed_out``).
    consumer_left: bool = False
    #: A cross-trainer job's ledger: a split is done once every trainer received all of it.
    per_trainer: bool = False
    #: (``per_trainer``) The trainer id of each consumer that joined, and those that left.
    trainer_of: dict[int, str] = dataclasses.field(default_factory=dict)
    left: list[int] = dataclasses.field(default_factory=list)
    #: (``per_trainer``) The done splits, with their task and what each trainer received: a
    #: trainer that joined once one was done has not received it yet, and where its task is
    #: lost before it did, the split is open again (``holder_lost``, ``joined``).
    finished: dict[int, OpenSplit] = dataclasses.field(default_factory=dict)
    #: The consumers acknowledge elements when their training step commits (module doc).
    commits: bool = False
    #: (``commits``) The consumers reading the job now, and the last flush round asked for.
    consumers: list[int] = dataclasses.field(default_factory=list)
    flush_round: int = 0

    #: (``per_trainer``) The tasks lost, whose done splits a trainer joining later lacks.
    lost: list[int] = dataclasses.field(default_factory=list)
    #: (``per_trainer``; derived, not saved) The done splits each trainer lacks part of:
    #: counted when it joins and kept as its receipts come, so that ``settled`` and
    #: ``complete_for`` need not look at every done split.
    _lacks: dict[str, set[int]] = dataclasses.field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        for trainer in set(self.trainer_of.values()):
            self._count_lacks(trainer)

    def _count_lacks(self, trainer: str) -> None:
        self._lacks[trainer] = {
            key for key, split in self.finished.items() if not _received_by(split, (trainer,))
        }

    def joined(
        self,
        client_id: int,
        trainer_id: str | None,
        restored: Mapping[int, Sequence[Sequence[int]]] | None = None,
    ) -> None:
        """Consumer ``client_id`` joined the job as trainer ``trainer_id`` (``per_trainer``);
        ``restored``: the offsets of each split that the trainer's restored position says it
        returned (None: not restored), which replace what it was counted as having received.
        A done split of a lost task that the trainer lacks is open again."""
        if self.commits and client_id not in self.consumers:
            self.consumers.append(client_id)
        if not self.per_trainer or trainer_id is None:
            return
        self.trainer_of[client_id] = trainer_id
        if restored is not None:
            for split in (*self.open.values(), *self.finished.values()):
                split.trainers.pop(trainer_id, None)
            for key, ranges in restored.items():
                had = self._reported(int(key))
                if had is not None:
                    had.trainers[trainer_id] = add_ranges([], ranges)
        self._count_lacks(trainer_id)
        self._reopen_lacking()

    def _reopen_lacking(self) -> None:
        """(``per_trainer``) Opens again each done split that no live task holds (its task is
        lost, or it became done while it waited to be handed out again) and that a trainer
        reading the job has not received all of: it is handed out again, whole."""
        reading = self.reading()
        for key, split in list(self.finished.items()):
            if (split.holder is None or split.holder in self.lost) and not _received_by(
                split, reading
            ):
                del self.finished[key], self.done[key]
                for lacking in self._lacks.values():
                    lacking.discard(key)
                self.open[key] = split
                if split.holder is not None:
                    split.lost_holder = split.holder
                split.holder, split.awaiting = None, []
                split.handed_out = False
                self._release(key)

    def reading(self) -> set[str]:
        """The trainers with a consumer that did not leave (``per_trainer``)."""
        left = set(self.left)
        return {trainer for client, trainer in self.trainer_of.items() if client not in left}

    def grant(self, key: int, task_id: int) -> None:
        """Split ``key`` was handed out for the first time, to ``task_id``."""
        if key not in self.done:
            self.open.setdefault(key, OpenSplit(task_id)).holder = task_id

    def regrant(self, key: int, task_id: int) -> None:
        """Split ``key`` (from the replay queue) was handed out again, to ``task_id``."""
        if key in self.replay:
            self.replay.remove(key)
        split = self.open.get(key)
        if split is not None:
            split.holder, split.handed_out = task_id, False

    def count(self, key: int, count: int) -> None:
        """A worker produced all of split ``key``: it has ``count`` elements."""
        split = self.open.get(key)
        if split is not None:
            split.count = count
            self._settle(key)
            self._repair(key)

    def pinned(self, key: int, url: str) -> Any:
        """The version of object ``url`` that split ``key`` is held to, None if none is (or
        the split is not open)."""
        split = self._reported(key)
        return None if split is None else split.versions.get(url)

    def pin(self, key: int, url: str, version: Any) -> None:
        """A run of split ``key`` opened object ``url`` as ``version``: a run again reads that
        one (the first pinned stays)."""
        split = self._reported(key)
        if split is not None:
            split.versions.setdefault(url, version)

    def receive(
        self, key: int, ranges: Sequence[Sequence[int]], client_id: int | None = None
    ) -> None:
        """Consumer ``client_id`` reported that it received the offsets ``ranges`` of split
        ``key`` (counted for its trainer in a ``per_trainer`` ledger)."""
        split = self._reported(key)
        if split is None:
            return
        if self.per_trainer:
            trainer = self._reporting_trainer(client_id)
            if trainer is None:
                return
            split.trainers[trainer] = add_ranges(split.trainers.get(trainer, []), ranges)
            lacking = self._lacks.get(trainer)
            if lacking and key in lacking and _received_by(split, (trainer,)):
                lacking.discard(key)
        elif self.commits:
            if client_id is None or client_id not in self.consumers:
                return  # a consumer that left: what it held goes back (client_gone)
            held = add_ranges(split.held.get(str(client_id), []), ranges)
            split.held[str(client_id)] = subtract_ranges(held, split.delivered)
            return
        else:
            split.delivered = add_ranges(split.delivered, ranges)
        if key in self.open:
            self._settle(key)

    def commit(self, key: int, ranges: Sequence[Sequence[int]], client_id: int) -> None:
        """(``commits``) Consumer ``client_id``'s training step that used the offsets ``ranges``
        of split ``key`` committed: they are delivered, and held no more."""
        split = self.open.get(key)
        if split is None:
            return
        split.delivered = add_ranges(split.delivered, ranges)
        for holder, held in list(split.held.items()):
            rest = subtract_ranges(held, split.delivered)
            if rest:
                split.held[holder] = rest
            else:
                del split.held[holder]
        self._settle(key)

    def skip_of(self, key: int) -> Ranges:
        """The offsets of open split ``key`` that a worker handing it out again skips: those
        delivered, and (``commits``) those a consumer reading the job holds."""
        split = self.open[key]
        if not self.commits:
            return split.delivered
        return add_ranges(split.delivered, (pair for held in split.held.values() for pair in held))

    def flush_wanted(self, client_id: int) -> int:
        """(``commits``) The flush round consumer ``client_id`` is asked to report (0: none)."""
        return max((s.flush_at for s in self.open.values() if client_id in s.flushing), default=0)

    def awaits_commits(self) -> bool:
        """(``commits``) Whether every split handed out so far is out whole, with each element
        committed or held by a consumer reading the job: until a consumer dies, nothing more
        reaches any of them (call it once the cursor has handed out every split)."""
        return not self.replay and all(
            split.holder is not None
            and split.handed_out
            and split.count is not None
            and covers(self.skip_of(key), split.count)
            for key, split in self.open.items()
        )

    def flushed(self, client_id: int, flush_round: int) -> None:
        """(``commits``) Consumer ``client_id`` reported everything it received up to the flush
        ``flush_round`` asked for, its replies in flight then included."""
        for key, split in list(self.open.items()):
            if client_id in split.flushing and split.flush_at <= flush_round:
                split.flushing.remove(client_id)
                self._repair(key)

    def _repair(self, key: int) -> None:
        """(``commits``) Moves the repair of split ``key`` on: it starts a flush once the split
        is handed out, and once every consumer flushed sends the offsets neither committed nor
        held back to be handed out again."""
        split = self.open.get(key)
        if split is None or not split.repair or split.holder is None:
            return
        if not split.handed_out or split.count is None:
            return
        if not split.flush_at and covers(self.skip_of(key), split.count):
            split.repair = False  # committed or held, all of it: nothing can go back
            return
        if not split.flush_at:
            self.flush_round += 1
            split.flush_at, split.flushing = self.flush_round, list(self.consumers)
        if split.flushing:
            return
        split.repair, split.flush_at = False, 0
        if not covers(self.skip_of(key), split.count):
            split.holder, split.handed_out = None, False
            self._release(key)

    def _reporting_trainer(self, client_id: int | None) -> str | None:
        """(``per_trainer``) The trainer a report of consumer ``client_id`` counts for; None
        for a consumer that left: its trainer may have been restored from a checkpoint since,
        and what the gone consumer had received no longer says what the trainer has."""
        if client_id is None or client_id in self.left:
            return None
        return self.trainer_of.get(client_id)

    def _reported(self, key: int) -> OpenSplit | None:
        """The split whose receipts a report of ``key`` adds to: an open one, or (``per_trainer``)
        a done one whose task may still be lost before a trainer has all of it."""
        split = self.open.get(key)
        return self.finished.get(key) if split is None else split

    def holder_lost(self, task_id: int, consumers: Sequence[int]) -> None:
        """The worker of ``task_id`` is gone: its open splits are replayed once each of
        ``consumers`` (the job's, now) has closed the task."""
        if self.per_trainer:
            # A done split the lost task made that a trainer reading the job has not received
            # all of (it joined once the split was done) is open again.
            if task_id not in self.lost:
                self.lost.append(task_id)
            self._reopen_lacking()
        for key, split in list(self.open.items()):
            if split.holder == task_id:
                split.holder, split.lost_holder = None, task_id
                split.repair, split.flush_at, split.flushing = False, 0, []
                # A trainer drops what it has of a replayed split itself: nothing to wait for.
                split.awaiting = [] if self.per_trainer else sorted(set(consumers))
                self._release(key)

    def closed(self, client_id: int, task_ids: Iterable[int]) -> None:
        """Consumer ``client_id`` takes nothing more from ``task_ids`` (lost tasks) and has
        reported everything it received from them."""
        closed = set(task_ids)
        for key, split in list(self.open.items()):
            if split.lost_holder in closed and client_id in split.awaiting:
                split.awaiting.remove(client_id)
                self._release(key)

    def client_gone(self, client_id: int) -> None:
        """Consumer ``client_id`` left the job: nothing waits for it any more, and what it
        did not report is not waited for either (the module's last rule). A trainer that left
        is not waited for until it rejoins (``per_trainer``)."""
        if self.per_trainer:
            if client_id in self.trainer_of and client_id not in self.left:
                self.left.append(client_id)
            for key in list(self.open):
                self._settle(key)
            return
        if self.commits:
            self._commit_client_gone(client_id)
            return
        self.consumer_left = True
        for key, split in list(self.open.items()):
            if client_id in split.awaiting:
                split.awaiting.remove(client_id)
                self._release(key)
            if key in self.open:
                self._settle(key)

    def _commit_client_gone(self, client_id: int) -> None:
        """(``commits``) What consumer ``client_id`` held, or received unreported, goes back:
        every split being handed out is repaired (``_repair``), as it may have read from any."""
        if client_id in self.consumers:
            self.consumers.remove(client_id)
        self.consumer_left = True
        for key, split in list(self.open.items()):
            split.held.pop(str(client_id), None)
            if client_id in split.awaiting:
                split.awaiting.remove(client_id)
                self._release(key)
            if client_id in split.flushing:
                split.flushing.remove(client_id)
            if split.holder is not None:
                split.repair = True
            self._repair(key)

    def handed_out(self, key: int, task_id: int) -> None:
        """``task_id`` handed every element of split ``key`` to consumers. (``commits``) Once a
        consumer has left the job, the split is repaired as well: a released consumer that
        lives on (its process was paused or cut off) takes elements until it hears that it
        was released, and what it takes counts for nothing."""
        split = self.open.get(key)
        if split is not None and split.holder == task_id:
            split.handed_out = True
            self._settle(key)
            if self.commits and self.consumer_left and key in self.open:
                split.repair = True
            self._repair(key)

    def adds(self, key: int, ranges: Sequence[Sequence[int]], client_id: int | None = None) -> bool:
        """Whether consumer ``client_id``'s report of ``ranges`` of split ``key`` is news to the
        ledger."""
        split = self._reported(key)
        if split is None:
            return False
        if self.per_trainer:
            trainer = self._reporting_trainer(client_id)
            if trainer is None:
                return False
            have = split.trainers.get(trainer, [])
            return add_ranges(have, ranges) != have
        if self.commits and client_id is not None:
            have = add_ranges(split.delivered, split.held.get(str(client_id), []))
            return add_ranges(have, ranges) != have
        return add_ranges(split.delivered, ranges) != split.delivered

    def done_for(self, client_id: int, keys: Iterable[int]) -> list[tuple[int, int]]:
        """``(key, count)`` of the splits among ``keys`` that are done for consumer
        ``client_id``: done, and (``per_trainer``) received in full by its trainer, which may
        lack a done split (it was restored from a checkpoint; it joined once the split was
        done) that its worker's cache, or a run again, still gives it."""
        found = []
        trainer = self.trainer_of.get(client_id)
        for key in sorted(set(keys)):
            count = self.done.get(key)
            if count is None:
                continue
            split = self.finished.get(key) if self.per_trainer else None
            if split is not None and not covers(split.trainers.get(trainer or "", []), count):
                continue
            found.append((key, count))
        return found

    def complete_for(self, client_id: int) -> bool:
        """(``per_trainer``) Whether the trainer of consumer ``client_id`` has every element
        of every split known: each split's count is known and the trainer received all of it,
        open (another trainer lacks some) or done. Once every split is out, nothing more comes
        to it."""
        trainer = self.trainer_of.get(client_id)
        if not self.per_trainer or trainer is None:
            return False
        return not self._lacks.get(trainer) and all(
            split.count is not None and covers(split.trainers.get(trainer, []), split.count)
            for split in self.open.values()
        )

    def lacking(
        self, trainer_id: str, restored: Mapping[int, Sequence[Sequence[int]]] | None = None
    ) -> tuple[int, int]:
        """(``per_trainer``) How many done splits trainer ``trainer_id`` lacks part of, and how
        many of their elements: it has what ``restored`` says (a restored position's offsets per
        split) or, without it, what the ledger counted for it.

        Example:
          >>> ledger = SplitLedger(per_trainer=True)
          >>> ledger.joined(1, "a"); ledger.grant(0, task_id=7); ledger.count(0, 4)
          >>> ledger.receive(0, [[0, 4]], client_id=1)
          >>> ledger.lacking("a"), ledger.lacking("b"), ledger.lacking("a", {0: [[0, 1]]})
          ((0, 0), (1, 4), (1, 3))
        """
        splits = elements = 0
        for key, split in self.finished.items():
            count = split.count or 0
            have = (restored or {}).get(key, []) if restored is not None else None
            if have is None:
                have = split.trainers.get(trainer_id, [])
            held = sum(min(int(b), count) - int(a) for a, b in have if int(a) < count)
            if held < count:
                splits, elements = splits + 1, elements + count - held
        return splits, elements

    def awaits(self, client_id: int, task_id: int) -> bool:
        """Whether a split waits for consumer ``client_id`` to close the lost ``task_id``."""
        return any(
            split.lost_holder == task_id and client_id in split.awaiting
            for split in self.open.values()
        )

    def resume(
        self,
        done: Mapping[int, int],
        partial: Mapping[int, Ranges],
        versions: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> None:
        """Seeds a new job with a consumer's saved position: ``done`` splits (key -> count)
        are not handed out, ``partial`` ones (key -> offsets returned) are handed out first,
        skipping those offsets, and reading the objects as ``versions`` (key -> URL ->
        version) where the position holds them (``pin``)."""
        self.done.update(done)
        versions = versions or {}
        for key, ranges in partial.items():
            if key not in self.done:
                self.open[key] = OpenSplit(
                    None, delivered=add_ranges([], ranges), versions=dict(versions.get(key, {}))
                )
                self._release(key)

    def known(self, key: int) -> bool:
        """Whether split ``key`` was handed out (or a resumed position has it)."""
        return key in self.done or key in self.open

    def holds(self, task_id: int) -> list[int]:
        """The open splits that ``task_id`` is producing."""
        return sorted(key for key, split in self.open.items() if split.holder == task_id)

    @property
    def settled(self) -> bool:
        """Whether every split handed out is done (none open, none waiting for a replay) and
        (``per_trainer``) each trainer reading the job received all of every done split: one
        restored from a checkpoint may lack some, whose worker may yet turn out to be lost
        (``holder_lost``), and the job's tasks wait for them until it has them or they run
        again."""
        if self.open or self.replay:
            return False
        return not self.per_trainer or not any(self._lacks.get(t) for t in self.reading())

    def _release(self, key: int) -> None:
        split = self.open[key]
        if split.holder is None and not split.awaiting and key not in self.replay:
            self.replay.append(key)

    def _settle(self, key: int) -> None:
        split = self.open[key]
        if split.count is None:
            return
        if self.per_trainer:
            done = _received_by(split, self.reading())
        else:
            done = covers(split.delivered, split.count) or (
                self.consumer_left and split.handed_out and not self.commits
            )
        if done:
            del self.open[key]
            self.done[key] = split.count
            if self.per_trainer:
                self.finished[key] = split
            if key in self.replay:
                self.replay.remove(key)

    def to_json(self) -> dict[str, Any]:
        """The ledger as JSON values; ``from_json`` reads it back."""
        return {
            "open": [[key, dataclasses.asdict(split)] for key, split in self.open.items()],
            "done": sorted([key, count] for key, count in self.done.items()),
            "replay": list(self.replay),
            "consumer_left": self.consumer_left,
            **(
                {
                    "per_trainer": True,
                    "trainer_of": sorted([c, t] for c, t in self.trainer_of.items()),
                    "left": list(self.left),
                    "finished": [
                        [key, dataclasses.asdict(split)] for key, split in self.finished.items()
                    ],
                    "lost": list(self.lost),
                }
                if self.per_trainer
                else {}
            ),
            **(
                {
                    "commits": True,
                    "consumers": list(self.consumers),
                    "flush_round": self.flush_round,
                }
                if self.commits
                else {}
            ),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SplitLedger:
        """The ledger ``to_json`` wrote."""
        return cls(
            {int(key): OpenSplit(**fields) for key, fields in data["open"]},
            {int(key): int(count) for key, count in data["done"]},
            [int(key) for key in data["replay"]],
            bool(data.get("consumer_left", False)),
            bool(data.get("per_trainer", False)),
            {int(c): str(t) for c, t in data.get("trainer_of", ())},
            [int(c) for c in data.get("left", ())],
            {int(key): OpenSplit(**fields) for key, fields in data.get("finished", ())},
            bool(data.get("commits", False)),
            [int(c) for c in data.get("consumers", ())],
            int(data.get("flush_round", 0)),
            [int(task) for task in data.get("lost", ())],
        )


def check_report(received: Any, closed: Any) -> tuple[list[tuple[int, Ranges]], list[int]]:
    """A consumer's report (``ClientHeartbeat``'s ``received`` and ``closed``), checked.

    Raises:
      InvalidArgumentError: not ``[[key, ranges], ...]`` and a list of task ids.
    """
    if not isinstance(received, list) or not all(
        isinstance(item, list) and len(item) == 2 and isinstance(item[0], int) for item in received
    ):
        raise InvalidArgumentError("malformed request: received must be [[key, ranges], ...]")
    if not isinstance(closed, list) or not all(isinstance(t, int) for t in closed):
        raise InvalidArgumentError("malformed request: closed must be a list of task ids")
    return [(key, _check_ranges(ranges, "received")) for key, ranges in received], closed


class Receipts:
    """A consumer's record of what it received of an exactly-once job: per open split, the
    offsets it has, so that a replayed element it already has is dropped; and which splits
    changed since the last report. Not thread-safe: the reader holds its lock."""

    def __init__(self, received: Mapping[int, Ranges] | None = None) -> None:
        # ``received``: what a consumer restored from a checkpoint had (a trainer's).
        self._received: dict[int, Ranges] = {
            int(key): add_ranges([], ranges) for key, ranges in (received or {}).items()
        }
        self._done: set[int] = set()
        self._changed: set[int] = set(self._received)  # reported first

    def take(self, key: int, offset: int) -> bool:
        """Records ``(key, offset)``; False if it was received before (drop it)."""
        if key in self._done:
            return False
        if not _insert(self._received.setdefault(key, []), offset):
            return False
        self._changed.add(key)
        return True

    def take_tags(self, tags: Sequence[Sequence[int]]) -> list[bool]:
        """Records each ``[key, offset]`` of ``tags``; per tag, whether it is new (``take``).
        A run of offsets past what a split has is recorded in one step."""
        kept: list[bool] = []
        for key, start, stop in tag_runs(tags):
            if key not in self._done and _append_run(
                self._received.setdefault(key, []), start, stop
            ):
                self._changed.add(key)
                kept.extend(itertools.repeat(True, stop - start))
            else:
                kept.extend([self.take(key, offset) for offset in range(start, stop)])
        return kept

    def report(self, everything: bool = False) -> list[list[Any]]:
        """``[[key, ranges], ...]`` of the splits received since the last report (or of every
        open split), to send; ``changed`` is cleared."""
        keys = set(self._received) if everything else self._changed & set(self._received)
        self._changed.clear()
        return [[key, [list(pair) for pair in self._received[key]]] for key in sorted(keys)]

    def unreported(self) -> bool:
        return bool(self._changed)

    def holding(self) -> list[int]:
        """The splits received from and not yet known to be done: the dispatcher says which
        of them are done (``forget``)."""
        return sorted(self._received)

    def forget(self, keys: Iterable[int]) -> None:
        """The dispatcher says ``keys`` are done: their offsets need not be kept (any element of
        them that still arrives is a duplicate)."""
        for key in keys:
            self._received.pop(key, None)
            self._done.add(key)


class Returned:
    """What a consumer of an exactly-once job returned from ``next``, as its position: per
    split the offsets returned, and the element counts of the splits the dispatcher said are
    done. Not thread-safe: the reader holds its lock."""

    def __init__(
        self, done: Mapping[int, int] | None = None, partial: Mapping[int, Ranges] | None = None
    ) -> None:
        done, partial = done or {}, partial or {}
        self._ranges: dict[int, Ranges] = {key: [[0, count]] for key, count in done.items()}
        self._ranges.update((key, add_ranges([], r)) for key, r in partial.items())
        self._counts: dict[int, int] = dict(done)

    def take(self, key: int, offset: int) -> None:
        _insert(self._ranges.setdefault(key, []), offset)

    def take_tags(self, tags: Sequence[Sequence[int]]) -> None:
        """``take`` of each ``[key, offset]`` of ``tags``; a run past what a split has in one
        step."""
        _add_tags(self._ranges, tags)

    def counted(self, counts: Iterable[Sequence[int]]) -> None:
        """``[[key, count], ...]`` of splits done at the dispatcher."""
        self._counts.update((int(key), int(count)) for key, count in counts)

    def position(self) -> tuple[dict[int, int], dict[int, Ranges]]:
        """(done: key -> count, partial: key -> ranges): a split is done here once its count
        is known and this consumer returned all of it."""
        done, partial = {}, {}
        for key, ranges in self._ranges.items():
            count = self._counts.get(key)
            if count is not None and covers(ranges, count):
                done[key] = count
            else:
                partial[key] = [list(pair) for pair in ranges]
        return done, partial
