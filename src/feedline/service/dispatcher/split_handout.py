"""The dispatcher's split hand-out: GetSplit for DYNAMIC jobs.

``SplitHandout`` hands out the next split of a DYNAMIC job's repetition from its ``SplitCursor``
(``splits``). A task that asks again with the same ``request`` number gets the same split (its
reply was lost), so that a dispatcher killed mid-reply skips nothing. Exactly-once jobs
(``ledger``) hand out the splits of lost workers again first, with the offsets already delivered
to skip, and end a repetition only once every split is done; a run of one of their splits tells
the dispatcher the version of each object it opens (PinSplitVersion; those its source listed
all at once, when it opens the first of them: PinSplitVersions), and a run again gets those
versions with the split, so that it reads the objects the first run read or raises
``DataLossError``, never the rest of another version. While its splits are all out and not yet
done, a GetSplit that asks to (``wait_ms``, up to ``MAX_SPLIT_WAIT_S``) waits here for a change
of the job, so that the task hears at once that one came back or that the repetition ended.

A GetSplit costs O(1) under the dispatcher's lock whatever the number of units: the cursor
only moves there (``SplitCursor.take``), and the split's units are computed after the lock is
released (``SplitCursor.units``, an index-to-position function of the plan's seed).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from feedline.errors import FailedPreconditionError, InvalidArgumentError
from feedline.service.dispatcher.core import DispatcherCore, Reply
from feedline.service.dispatcher.state import (
    CountSplit,
    DatasetRecord,
    EndTaskSplits,
    HandOutSplits,
    JobRecord,
    MoveSplitCursor,
    PinSplitVersion,
    ReplaySplit,
    TaskRecord,
)
from feedline.service.ledger import SplitLedger
from feedline.service.protocol import (
    GetSplitReply,
    GetSplitRequest,
    PinSplitVersionRequest,
    PinSplitVersionsRequest,
    SplitVersionsRequest,
    incarnation_of,
)
from feedline.service.splits import SplitCursor, SplitPlan

__all__ = ["MAX_SPLIT_WAIT_S", "SplitHandout"]

#: The longest a GetSplit of an exactly-once job waits (its ``wait_ms``, at most this) for a
#: split to come back or the job's splits to be done, before it answers ``wait``.
MAX_SPLIT_WAIT_S = 2.0
# The most GetSplit calls that wait at once (each holds a server thread); past that one is
# answered ``wait`` at once and the task waits on its side.
_MAX_WAITING_TASKS = 16


class SplitHandout:
    """The GetSplit handler of a dispatcher.

    Args:
      core: the dispatcher's core.
    """

    def __init__(self, core: DispatcherCore) -> None:
        self._core = core
        self._waiting_tasks = 0  # GetSplit calls waiting now (under the lock)

    def get_split(self, header: dict[str, Any], buffers: list[memoryview]) -> Reply:
        """GetSplit: a ``GetSplitReply`` with the next split (None at the end of the
        repetition); in exactly-once jobs with its ``key`` and ``skip``, or ``wait``."""
        request = GetSplitRequest.from_header(header)
        outcome = self._hand_out(request)
        if isinstance(outcome, GetSplitReply):
            return outcome.to_header(), ()
        # The split's units, computed outside the lock.
        cursor, (start, stop), fields = outcome
        units = tuple(int(i) for i in cursor.units(start, stop))
        return GetSplitReply(units, **fields).to_header(), ()

    def pin_split_version(self, header: dict[str, Any], buffers: list[memoryview]) -> Reply:
        """PinSplitVersion: ``{"version": ...}``, the version of the object that the split is
        held to: the one pinned first (this one if none was). A split that is done or not
        known holds none: the version given comes back."""
        request = PinSplitVersionRequest.from_header(header)
        held = self._pin(
            request.job_id, request.task_id, request.key, {request.url: request.version}
        )
        return {"version": held[request.url]}, ()

    def pin_split_versions(self, header: dict[str, Any], buffers: list[memoryview]) -> Reply:
        """PinSplitVersions: ``PinSplitVersion`` of several objects of a split at once,
        ``{"versions": {url: version}}``."""
        request = PinSplitVersionsRequest.from_header(header)
        held = self._pin(request.job_id, request.task_id, request.key, request.versions)
        return {"versions": held}, ()

    def _pin(
        self, job_id: int, task_id: int, key: int, versions: Mapping[str, str | int]
    ) -> dict[str, str | int]:
        """(Takes the lock.) Pins each of ``versions`` of split ``key`` where none is held;
        the version each object is held to (the one given, where the split holds none)."""
        core = self._core
        with core.lock:
            task = core.state.tasks.get(task_id)
            if task is None or task.job_id != job_id:
                raise InvalidArgumentError(f"task {task_id} is not a task of job {job_id}")
            ledger = core.state.ledgers.get(job_id)
            if ledger is None:
                raise FailedPreconditionError(
                    f"job {job_id} does not hand out its splits exactly once: its "
                    "splits are not run again, and pin no object versions"
                )
            out: dict[str, str | int] = {}
            for url, version in versions.items():
                held = ledger.pinned(key, url)
                if held is None:
                    core.apply(PinSplitVersion(job_id, key, url, version))
                    held = ledger.pinned(key, url)
                out[url] = version if held is None else held
        return out

    def split_versions(self, header: dict[str, Any], buffers: list[memoryview]) -> Reply:
        """SplitVersions: the object versions that the splits a consumer names are held to,
        ``{"versions": [[key, {url: version}], ...]}`` (the splits that hold any)."""
        request = SplitVersionsRequest.from_header(header)
        core = self._core
        with core.lock:
            job = core.consumer(request.client_id)
            ledger = core.state.ledgers.get(job.job_id)
            rows = []
            if ledger is not None:
                for key in request.keys:
                    split = ledger.open.get(key) or ledger.finished.get(key)
                    if split is not None and split.versions:
                        rows.append([key, dict(split.versions)])
        return {"versions": rows}, ()

    def _hand_out(
        self, request: GetSplitRequest
    ) -> GetSplitReply | tuple[SplitCursor, tuple[int, int], dict[str, Any]]:
        """(Takes the lock.) The reply, or the cursor and positions of the split to hand out
        with the reply's other fields."""
        deadline = time.monotonic() + min(request.wait_ms / 1000, MAX_SPLIT_WAIT_S)
        core = self._core
        with core.lock:
            while True:
                outcome = self._hand_out_locked(request)
                remaining = deadline - time.monotonic()
                if (
                    not isinstance(outcome, GetSplitReply)
                    or not outcome.wait
                    or remaining <= 0
                    or core.stopped.is_set()
                    or self._waiting_tasks >= _MAX_WAITING_TASKS
                ):
                    return outcome
                # An exactly-once job's splits are out and not done: wait here for a change of
                # its ledger (a consumer's receipts settle them, or one comes back), so that
                # the task hears of it at once rather than at its next ask.
                self._waiting_tasks += 1
                try:
                    core.wait(f"task {request.task_id}", remaining, ("splits", request.job_id))
                finally:
                    self._waiting_tasks -= 1

    def _hand_out_locked(
        self, request: GetSplitRequest
    ) -> GetSplitReply | tuple[SplitCursor, tuple[int, int], dict[str, Any]]:
        """``_hand_out``'s answer now (under the lock)."""
        job_id, repetition, task_id = request.job_id, request.repetition, request.task_id
        core = self._core
        state = core.state
        job = state.jobs.get(job_id)
        if job is None and incarnation_of(job_id) != core.incarnation:
            raise FailedPreconditionError(
                f"job {job_id} belongs to an earlier life of this dispatcher, which "
                "has restarted since without a journal: the job is gone"
            )
        if job is None or job.finished:  # None: it ended and was collected
            return GetSplitReply(None)
        record = state.datasets[job.dataset_id]
        if record.split_plan is None:
            raise FailedPreconditionError(f"job {job_id} reads a dataset without splits")
        task = state.tasks.get(task_id) if task_id is not None else None
        if task is not None and task.job_id != job_id:
            raise InvalidArgumentError(f"task {task_id} is not a task of job {job_id}")
        ledger = state.ledgers.get(job_id)
        if ledger is not None:
            return self._get_exactly_once(job, record, ledger, task, request)
        last = None if task is None else task.last_split
        if (
            request.request is not None
            and last is not None
            and last["request"] == request.request
            and last["repetition"] == repetition
        ):
            # The worker asks again: the reply to its request was lost (the dispatcher
            # restarted, or the call timed out). The same split, recomputed from the cursor
            # it came from: nothing is skipped.
            cursor = SplitCursor.from_json(last["cursor"])
            taken = cursor.take()
        else:
            saved = state.split_cursors.get((job_id, repetition))
            if saved is None:
                plan = SplitPlan.from_json(record.split_plan)
                cursor = SplitCursor.start(plan, repetition, max(1, len(job.task_ids)))
            else:
                cursor = SplitCursor.from_json(saved)
            previous = cursor.to_json()
            taken = cursor.take()
            mine = task is not None and request.request is not None
            core.apply(
                MoveSplitCursor(
                    job_id,
                    repetition,
                    cursor.to_json(),
                    task_id if mine else None,
                    request.request if mine else None,
                    previous if mine else None,
                )
            )
        return GetSplitReply(None) if taken is None else (cursor, taken, {})

    def _get_exactly_once(
        self,
        job: JobRecord,
        record: DatasetRecord,
        ledger: SplitLedger,
        task: TaskRecord | None,
        request: GetSplitRequest,
    ) -> GetSplitReply | tuple[SplitCursor, tuple[int, int], dict[str, Any]]:
        """GetSplit of an exactly-once job (under the lock): the split with its ``key`` and
        ``skip`` (as ``_hand_out`` returns it), or no split and ``wait`` while splits handed
        out are not done yet."""
        number = request.request
        if task is None or number is None:
            raise InvalidArgumentError(
                f"job {job.job_id} hands out its splits exactly once: GetSplit needs the "
                "task_id and request number of the asking task"
            )
        core = self._core
        if request.finished is not None:  # (key, count): the task produced all of that split
            key, count = request.finished
            if key in ledger.open and ledger.open[key].count is None:
                core.apply(CountSplit(job.job_id, key, count))
        news = [
            k
            for k in request.handed_out
            if k in ledger.open
            and ledger.open[k].holder == task.task_id
            and not ledger.open[k].handed_out
        ]
        if news:
            core.apply(HandOutSplits(job.job_id, task.task_id, news))
        if task.finished:  # lost meanwhile (its worker was dropped): nothing more for it
            return GetSplitReply(None)
        saved = core.state.split_cursors.get((job.job_id, 0))
        if saved is None:
            plan = SplitPlan.from_json(record.split_plan or {})
            cursor = SplitCursor.start(plan, 0, max(1, len(job.task_ids)))
        else:
            cursor = SplitCursor.from_json(saved)
        last = task.last_split
        if last is not None and last["request"] == number:  # the reply was lost: the same
            key = int(last["replay"]) if "replay" in last else int(last["cursor"]["position"])
        elif ledger.replay:
            key = ledger.replay[0]
            core.apply(ReplaySplit(job.job_id, key, task.task_id, number))
        elif self._next_open(cursor, ledger):
            key = cursor.position
            previous = cursor.to_json()
            cursor.take()  # the units are computed outside the lock, as in _hand_out_locked
            core.apply(
                MoveSplitCursor(job.job_id, 0, cursor.to_json(), task.task_id, number, previous)
            )
        elif ledger.settled:
            if not task.splits_ended:
                core.apply(EndTaskSplits(task.task_id))
            return GetSplitReply(None)
        else:
            return GetSplitReply(None, wait=True)
        # A split done meanwhile (only a retry can ask for one) is skipped whole.
        skip = ledger.skip_of(key) if key in ledger.open else [[0, 1 << 62]]
        fields = {
            "key": key,
            "skip": tuple((start, end) for start, end in skip),
            "versions": dict(ledger.open[key].versions) if key in ledger.open else {},
        }
        taken = dataclasses.replace(cursor, position=key).take()
        return cursor, taken or (key, key), fields

    @staticmethod
    def _next_open(cursor: SplitCursor, ledger: SplitLedger) -> bool:
        """Moves ``cursor`` past the splits a resumed position already has (done, or handed out
        from the replay queue); whether a split is left to hand out."""
        while not cursor.done and ledger.known(cursor.position):
            cursor.take()
        return not cursor.done
