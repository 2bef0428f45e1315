"""The dispatcher's split handout: GetSplit for DYNAMIC jobs.

Part of ``DispatchServer`` (``dispatcher``): ``SplitHandout`` hands out the next split of a DYNAMIC
job's repetition from its ``SplitCursor`` (``_split``). A task that asks again with the same
``request`` number gets the same split (its reply was lost), so that a dispatcher killed mid-reply
skips nothing.
"""

from __future__ import annotations

from typing import Any

from feedline._net.rpc import field
from feedline.errors import FailedPreconditionError, InvalidArgumentError
from feedline.service._split import SplitCursor, SplitPlan
from feedline.service._state import MoveSplitCursor, incarnation_of


class SplitHandout:
    """The GetSplit handler of ``DispatchServer``.

    A base of ``DispatchServer`` only: its methods use the server's state and lock.
    """

    def _get_split(self, header: dict[str, Any], buffers: list[memoryview]) -> Any:
        job_id = field(header, "job_id", int)
        repetition = field(header, "repetition", int)
        with self._lock:
            job = self._state.jobs.get(job_id)
            if job is None and incarnation_of(job_id) != self._incarnation:
                raise FailedPreconditionError(
                    f"job {job_id} belongs to an earlier life of this dispatcher, which "
                    "has restarted since without a journal: the job is gone"
                )
            if job is None or job.finished:  # None: it ended and was collected
                return {"split": None}, ()
            record = self._state.datasets[job.dataset_id]
            if record.split_plan is None:
                raise FailedPreconditionError(f"job {job_id} reads a dataset without splits")
            task_id = field(header, "task_id", (int, type(None)), None)
            request = field(header, "request", (int, type(None)), None)
            task = self._state.tasks.get(task_id) if task_id is not None else None
            if task is not None and task.job_id != job_id:
                raise InvalidArgumentError(f"task {task_id} is not a task of job {job_id}")
            last = None if task is None else task.last_split
            if (
                request is not None
                and last is not None
                and last["request"] == request
                and last["repetition"] == repetition
            ):
                # The worker asks again: the reply to its request was lost (the dispatcher
                # restarted, or the call timed out). The same split, recomputed from the cursor
                # it came from: nothing is skipped.
                split = SplitCursor.from_json(last["cursor"]).next()
            else:
                saved = self._state.split_cursors.get((job_id, repetition))
                if saved is None:
                    plan = SplitPlan.from_json(record.split_plan)
                    cursor = SplitCursor.start(plan, repetition, max(1, len(job.task_ids)))
                else:
                    cursor = SplitCursor.from_json(saved)
                previous = cursor.to_json()
                split = cursor.next()
                mine = task is not None and request is not None
                self._apply(
                    MoveSplitCursor(
                        job_id,
                        repetition,
                        cursor.to_json(),
                        task_id if mine else None,
                        request if mine else None,
                        previous if mine else None,
                    )
                )
            return {"split": None if split is None else [int(i) for i in split]}, ()
