"""How many workers the jobs need, from what heartbeats report.

Workers report, per task, how long its producer was busy making elements (not waiting for room
in a full buffer) and how full its buffer is (``protocol.TaskLoad``); consumers report how long
their training steps waited for input (``protocol.InputWait``). Both are cumulative counters;
``Load`` keeps the last few reports of each and reads rates over that window.

The estimate. Over a window, the consumers of job ``j`` took ``s_c`` elements a second each
and waited a fraction ``f_c`` of their time for them: were their input never late they would
take ``s_c / (1 - f_c)`` (``f_c`` capped at ``protocol.MAX_WAIT_FRACTION``: one estimate at most
quadruples). A worker makes ``c`` elements per second of busy time (its producer's, not counting
its waits for room in a full buffer; the last measured while it idles). So the job needs::

    L_j = sum(s_c / (1 - f_c) for its consumers) / c      workers, at full speed each

Before its consumers report, ``L_j = sum(u_t) / (1 - f_j)``, ``u_t`` the fraction of the time
its task ``t`` was busy. Measuring what the consumers take, not what the workers make, keeps a
worker that fills its buffer from counting as demand. The dispatcher wants
``ceil(sum(L_j) * (1 + HEADROOM))`` workers, and at least the workers that run tasks of jobs
that cannot move (static sharding, round robin: they keep the workers they were made with), and
one while any job runs.

=============================================  =====  ====  ======  =======================
situation (workers of 20 elements/s)           takes  f     needs   desired (headroom 5%)
=============================================  =====  ====  ======  =======================
the trainer takes 50/s and never waits         50     0     2.5     3
4 workers, the steps wait half the time        80     0.5   8       9
the trainer pauses (takes nothing)             0      0     0       1
no job running                                 --     --    --      0
=============================================  =====  ====  ======  =======================
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from feedline.service.config import ShardingPolicy
from feedline.service.protocol import (
    MAX_WAIT_FRACTION,
    InputWait,
    JobLoad,
    LoadReply,
    TaskLoad,
    WorkerLoad,
)

__all__ = ["HEADROOM", "Load", "desired_workers", "load_reply"]

#: The spare capacity the estimate adds: a worker count that is just enough leaves the
#: consumers waiting now and then.
HEADROOM = 0.05
# Reports kept per task and consumer: rates are read from the oldest to the newest.
_KEPT = 6
# A report older than this (seconds) counts for nothing (its worker or consumer is gone).
_STALE_S = 10.0
# A task busy less than this over the window keeps the capacity measured before.
_MIN_BUSY_S = 0.05


class TaskWindow(NamedTuple):
    """What a task did over the window of its last reports.

    Attributes:
      busy: the fraction of the time its producer was busy.
      elements_per_s: the elements it made per second.
      fill: its buffer's fill now, 0..1.
      stages: seconds per stage of its pipeline.
      capacity: elements it makes per second of busy time (the last measured), or None.
    """

    busy: float
    elements_per_s: float
    fill: float
    stages: dict[str, float]
    capacity: float | None


class _Series:
    """The last ``_KEPT`` cumulative reports of one task or consumer: ``(time, values)``."""

    def __init__(self) -> None:
        self.samples: collections.deque[tuple[float, tuple[float, ...]]] = collections.deque(
            maxlen=_KEPT
        )
        self.extra: dict[str, float] = {}

    def add(self, now: float, values: tuple[float, ...]) -> None:
        last = self.samples[-1][1] if self.samples else values
        if any(v < old for v, old in zip(values, last, strict=True)):
            self.samples.clear()  # a counter went back: the reporter started again
        self.samples.append((now, values))

    def delta(self, now: float) -> tuple[float, ...] | None:
        """The values' growth over the window; None with fewer than two fresh reports."""
        if len(self.samples) < 2 or now - self.samples[-1][0] > _STALE_S:
            return None
        (_, first), (_, last) = self.samples[0], self.samples[-1]
        return tuple(b - a for a, b in zip(first, last, strict=True))


class Load:
    """The load reports of a dispatcher's workers and consumers (volatile); thread-safe.

    Args:
      clock: the time reports are stamped with (``time.monotonic``).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._tasks: dict[int, _Series] = {}
        self._stages: dict[int, collections.deque[dict[str, float]]] = {}
        self._consumers: dict[int, _Series] = {}

    def worker_report(self, loads: Iterable[TaskLoad], issued: Callable[[int], bool]) -> None:
        """A worker's ``task_load``; tasks for which ``issued`` is false are ignored."""
        now = self._clock()
        with self._lock:
            for load in loads:
                if not issued(load.task_id):
                    continue
                series = self._tasks.setdefault(load.task_id, _Series())
                series.add(now, (load.produced, load.busy_s, load.wall_s))
                series.extra["fill"] = load.fill
                stages = self._stages.setdefault(load.task_id, collections.deque(maxlen=_KEPT))
                stages.append(dict(load.stages))

    def consumer_report(self, client_id: int, wait: InputWait | None) -> None:
        """A consumer's ``input_wait`` (None: it sent none)."""
        if wait is None:
            return
        now = self._clock()
        with self._lock:
            series = self._consumers.setdefault(client_id, _Series())
            series.add(now, (wait.steps, wait.waited_s, wait.wall_s))

    def keep_only(self, task_ids: Iterable[int], client_ids: Iterable[int]) -> None:
        """Forgets the tasks and consumers not listed (collected ones)."""
        tasks, clients = set(task_ids), set(client_ids)
        with self._lock:
            for task_id in [t for t in self._tasks if t not in tasks]:
                del self._tasks[task_id]
                self._stages.pop(task_id, None)
            for client_id in [c for c in self._consumers if c not in clients]:
                del self._consumers[client_id]

    def task(self, task_id: int) -> TaskWindow | None:
        """What a task did over the window, None without two fresh reports."""
        now = self._clock()
        with self._lock:
            series = self._tasks.get(task_id)
            delta = None if series is None else series.delta(now)
            if series is None or delta is None:
                return None
            produced, busy, wall = delta
            stages = self._stages.get(task_id) or collections.deque()
            first, last = (stages[0], stages[-1]) if stages else ({}, {})
            spent = {name: max(0.0, last[name] - first.get(name, 0.0)) for name in last}
            if wall <= 0:
                return None
            if busy >= _MIN_BUSY_S and produced > 0:  # else the last one measured
                series.extra["capacity"] = produced / busy
            return TaskWindow(
                min(1.0, busy / wall),
                produced / wall,
                series.extra.get("fill", 0.0),
                spent,
                series.extra.get("capacity"),
            )

    def consumer(self, client_id: int) -> tuple[float, float] | None:
        """``(fraction of time waited for input, steps/s)`` of a consumer over the window."""
        now = self._clock()
        with self._lock:
            series = self._consumers.get(client_id)
            delta = None if series is None else series.delta(now)
        if delta is None:
            return None
        steps, waited, wall = delta
        if wall <= 0:
            return None
        return min(1.0, waited / wall), steps / wall

    def jobs(self, state: Any, live: Iterable[str]) -> list[JobLoad]:
        """The load of every running job of ``state`` (a ``DispatcherState``; under the
        dispatcher's lock), counting the tasks on the ``live`` workers."""
        live = set(live)
        loads = []
        for job in state.jobs.values():
            if job.finished:
                continue
            busy = rate = made = busy_s = 0.0
            fills: list[float] = []
            stages: collections.Counter[str] = collections.Counter()
            workers = set()
            measured_any = False
            for task in state.job_tasks(job.job_id):
                if task.finished or task.worker_address not in live:
                    continue
                workers.add(task.worker_address)
                measured = self.task(task.task_id)
                if measured is None:
                    continue
                measured_any = True
                busy += measured.busy
                rate += measured.elements_per_s
                fills.append(measured.fill)
                stages.update(measured.stages)  # adds the seconds
                if measured.capacity is not None:  # weighted by busy time: a mean capacity
                    made += measured.capacity * max(measured.busy, 1e-3)
                    busy_s += max(measured.busy, 1e-3)
            measured_consumers = [
                waited
                for client_id in state.active_clients(job.job_id)
                if (waited := self.consumer(client_id)) is not None
            ]
            waits = [waited for waited, _ in measured_consumers]
            # What the consumers would take were their input never late.
            demand = sum(
                steps / (1.0 - min(waited, MAX_WAIT_FRACTION))
                for waited, steps in measured_consumers
            )
            movable = job.num_consumers is None and not ShardingPolicy(job.mode).is_static
            loads.append(
                JobLoad(
                    job_id=job.job_id,
                    busy=busy,
                    wait=sum(waits) / len(waits) if waits else None,
                    fill=sum(fills) / len(fills) if fills else None,
                    elements_per_s=rate,
                    workers=tuple(sorted(workers)),
                    movable=movable,
                    stages=dict(stages),
                    measured=measured_any,
                    steps_per_s=sum(steps for _, steps in measured_consumers),
                    demand=demand if measured_consumers else None,
                    capacity=made / busy_s if busy_s else None,
                )
            )
        return loads


def desired_workers(jobs: Iterable[JobLoad], headroom: float = HEADROOM) -> int:
    """The workers that ``jobs`` need (the module's docstring gives the rule).

    Example:
      >>> job = JobLoad(1, busy=4.0, wait=0.5, fill=0.0, elements_per_s=80.0,
      ...               workers=("a", "b", "c", "d"), movable=True, demand=160.0, capacity=20.0)
      >>> desired_workers([job])
      9
      >>> desired_workers([])
      0
    """
    jobs = list(jobs)
    if not jobs:
        return 0
    needed = sum(job.needed for job in jobs if job.movable)
    fixed = {worker for job in jobs if not job.movable for worker in job.workers}
    # A job whose tasks have not reported yet keeps the workers it has.
    unmeasured = {worker for job in jobs if not job.measured for worker in job.workers}
    estimate = math.ceil(needed * (1.0 + headroom) - 1e-9)
    return max(1, estimate, len(fixed), len(unmeasured))


def load_reply(state: Any, load: Load, draining: set[str]) -> LoadReply:
    """What ``GetLoad`` answers (under the dispatcher's lock): the workers needed, each
    registered worker with whether it may drain, and each running job's load."""
    live = sorted(set(state.workers) - draining)
    jobs = load.jobs(state, live)
    busy: dict[str, float] = {}
    for job in jobs:
        for task in state.job_tasks(job.job_id):
            measured = None if task.finished else load.task(task.task_id)
            if measured is not None:
                busy[task.worker_address] = busy.get(task.worker_address, 0.0) + measured.busy
    pinned = {w for job in jobs if not job.movable for w in job.workers}
    pinned |= {job.workers[0] for job in jobs if len(job.workers) == 1}
    workers = tuple(
        WorkerLoad(
            address=address,
            draining=address in draining,
            tasks=sum(1 for t in state.worker_tasks(address) if not t.finished),
            busy=busy.get(address, 0.0),
            pinned=address in pinned,
        )
        for address in sorted(state.workers)
    )
    consumers = sum(len(state.active_clients(job.job_id)) for job in jobs)
    return LoadReply(desired_workers(jobs), workers, tuple(jobs), consumers)
