"""``CrossTrainerCache``: several trainers read every element of one job, which the workers
compute once (``tf.data.experimental.service.CrossTrainerCache``).

Each trainer names the job (``job_name``) and itself (``trainer_id``). It reads every task of
the job from its own position in the task's stream; the workers keep what the fastest trainer
made for the others (``worker.trainer_cache``). A trainer's position is, per task, the elements
``next`` returned: ``TrainerPosition``, what ``get_state`` saves. Restored into a new iterator
(in this process or a new one), it rejoins the same job and reads each task from there, so a
trainer restarted from its checkpoint gets the rest of the epoch exactly once while the other
trainers go on.

Under a fault-tolerant dispatcher (``ledger``, ``per_trainer``) each element also carries its
``[split, offset]``: the trainer reports what it received under its id, keeps the offsets it
has of each split (``SplitReceipts``) and drops those it gets again when the split of a lost
worker runs again elsewhere. Its position then also saves, per split, the offsets ``next``
returned, so that a trainer restored from its checkpoint drops what it returned before it and
takes the rest, in whichever task's stream the split comes again. Its epoch ends once the
dispatcher says that it has every element, not when the tasks it knows of end: a split of a
lost worker may run again for it in a task that a live worker gets later.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

from feedline.errors import FailedPreconditionError, InvalidArgumentError
from feedline.service.client.exactly_once import SplitReceipts
from feedline.service.ledger import Ranges, add_ranges

__all__ = ["CrossTrainerCache", "TrainerPosition", "TrainerPositions"]


class CrossTrainerCache:
    """Options of the data service's cross-trainer cache: trainers that share a job by its
    ``job_name`` each read every element of it, computed once by the workers.

    Example:
      >>> from feedline.data import Dataset
      >>> from feedline import service
      >>> dispatcher = service.DispatchServer()
      >>> worker = service.WorkerServer(
      ...     service.WorkerConfig(dispatcher_address=dispatcher.target.split("://")[1]))
      >>> def trainer(name):
      ...     return Dataset.range(6).apply(service.distribute(
      ...         "distributed_epoch", dispatcher.target, job_name="shared",
      ...         cross_trainer_cache=service.CrossTrainerCache(trainer_id=name)))
      >>> a, b = iter(trainer("a")), iter(trainer("b"))
      >>> [int(x) for x in a], [int(x) for x in b]
      ([0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5])
      >>> worker.stop(); dispatcher.stop()

    Args:
      trainer_id: the trainer's id, unique among the trainers of a job. Trainers of other ids
        reuse what one has read; requests of the same id never do (a restarted trainer takes up
        its id, and resumes where its checkpoint says).

    Raises:
      InvalidArgumentError: ``trainer_id`` is not a non-empty string.
    """

    def __init__(self, trainer_id: str) -> None:
        if not isinstance(trainer_id, str) or not trainer_id:
            raise InvalidArgumentError(
                f"CrossTrainerCache needs a non-empty trainer_id string, got {trainer_id!r}"
            )
        self.trainer_id = trainer_id

    def __repr__(self) -> str:
        return f"CrossTrainerCache(trainer_id={self.trainer_id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CrossTrainerCache) and other.trainer_id == self.trainer_id

    def __hash__(self) -> int:
        return hash(("CrossTrainerCache", self.trainer_id))


def trainer_id_of(cross_trainer_cache: Any, job_name: str | None) -> str | None:
    """The trainer id that ``distribute``'s ``cross_trainer_cache`` argument names (None: no
    cache).

    Raises:
      InvalidArgumentError: not a ``CrossTrainerCache``, or without a ``job_name``.
    """
    if cross_trainer_cache is None:
        return None
    if not isinstance(cross_trainer_cache, CrossTrainerCache):
        raise InvalidArgumentError(
            "cross_trainer_cache must be a feedline.service.CrossTrainerCache or None, got "
            f"{type(cross_trainer_cache).__name__}"
        )
    if job_name is None:
        raise InvalidArgumentError(
            "job_name must be set when setting cross_trainer_cache: the trainers share the "
            "job by its name"
        )
    return cross_trainer_cache.trainer_id


def trainer_tags(first: int, count: int, splits: Sequence[Sequence[int]] | None) -> list[list[int]]:
    """The tags of ``count`` elements of a trainer's reply from position ``first`` on:
    ``[position]``, or ``[position, split, offset]`` where the reply tags each element with its
    ``[split, offset]`` (a fault-tolerant dispatcher's job).

    Example:
      >>> trainer_tags(5, 2, None), trainer_tags(5, 2, [[0, 3], [0, 4]])
      ([[5], [6]], [[5, 0, 3], [6, 0, 4]])
    """
    if splits is None or len(splits) != count:
        return [[first + i] for i in range(count)]
    return [[first + i, *map(int, tag)] for i, tag in enumerate(splits)]


@dataclasses.dataclass(frozen=True)
class TrainerPosition:
    """A trainer's position in a cross-trainer job: per task, the elements of its stream
    before the next one the trainer returns; under a fault-tolerant dispatcher also, per split,
    the offsets it returned (``splits``).

    Example:
      >>> position = TrainerPosition("a", 7, {12: 3, 13: 0}, {0: [[0, 3]]})
      >>> TrainerPosition.from_state(position.to_state()) == position
      True
    """

    trainer_id: str
    job_id: int
    tasks: dict[int, int]
    splits: dict[int, Ranges] = dataclasses.field(default_factory=dict)

    def to_state(self) -> dict[str, Any]:
        """The position as an iterator's state (a nested dict of plain values)."""
        splits = [[key, ranges] for key, ranges in sorted(self.splits.items())]
        return {
            "cross_trainer": {
                "trainer_id": self.trainer_id,
                "job_id": self.job_id,
                "tasks": [[task, count] for task, count in sorted(self.tasks.items())],
                **({"splits": splits} if splits else {}),
            }
        }

    @classmethod
    def from_state(cls, state: Any) -> TrainerPosition:
        """The position in ``state``.

        Raises:
          InvalidArgumentError: ``state`` is not a trainer's position.
        """
        saved = state.get("cross_trainer") if isinstance(state, dict) else None
        try:
            if not isinstance(saved, dict):
                raise TypeError("no 'cross_trainer' entry")
            tasks = {int(task): int(count) for task, count in saved["tasks"]}
            splits = {int(key): add_ranges([], ranges) for key, ranges in saved.get("splits", ())}
            return cls(str(saved["trainer_id"]), int(saved["job_id"]), tasks, splits)
        except (KeyError, TypeError, ValueError) as error:
            raise InvalidArgumentError(
                "the state is not the position of a trainer of a cross-trainer job (saved by "
                f"an iterator of distribute(..., cross_trainer_cache=...)): {error}"
            ) from None


class TrainerPositions:
    """The positions of one trainer in its job's tasks, kept by its reader; thread-safe.

    ``fetch_from`` is where a fetch thread starts a task (the restored position, else 0);
    ``returned`` moves a task's position past an element ``next`` returned, ``admit`` past
    the elements of a replayed split the trainer had (once those before them are returned).
    """

    def __init__(self, trainer_id: str, resume: TrainerPosition | None) -> None:
        self.trainer_id = trainer_id
        self._resume = resume
        self._lock = threading.Lock()
        self._tasks: dict[int, int] = dict(resume.tasks) if resume is not None else {}
        # Per split, the offsets returned (a fault-tolerant dispatcher's jobs: ``ledger``).
        self._splits: dict[int, Ranges] = (
            {key: add_ranges([], ranges) for key, ranges in resume.splits.items()}
            if resume is not None
            else {}
        )
        # Per task, the positions of elements dropped as had before, not yet passed.
        self._dropped: dict[int, set[int]] = {}

    def restored_splits(self) -> dict[int, Ranges]:
        """The offsets of each split returned before the restored position was saved."""
        return {} if self._resume is None else dict(self._resume.splits)

    def restored_report(self) -> list[list[Any]] | None:
        """``[[key, ranges], ...]`` of ``restored_splits``, what a restored trainer joins with
        (a fault-tolerant dispatcher counts that as what it has); None where not restored."""
        if self._resume is None:
            return None
        return [[key, [list(p) for p in r]] for key, r in sorted(self._resume.splits.items())]

    def admit(
        self,
        receipts: SplitReceipts,
        task_id: int,
        tags: Sequence[Sequence[int]] | None,
        count: int,
    ) -> list[bool] | None:
        """Which of the ``count`` elements of a reply of ``task_id``, tagged ``[position,
        split, offset]``, the trainer takes: those it does not have (``receipts``); the
        positions of the others are passed over. None if the tags do not say that."""
        if tags is None or len(tags) != count or any(len(tag) != 3 for tag in tags):
            return None
        keep = receipts.keep(task_id, [tag[1:] for tag in tags], count)
        if keep is None:
            return None
        with self._lock:
            dropped = self._dropped.setdefault(task_id, set())
            dropped.update(int(tag[0]) for tag, kept in zip(tags, keep, strict=True) if not kept)
            self._pass_dropped(task_id)
        return keep

    def check_job(self, job_id: int, job_name: str | None) -> None:
        """The reader joined ``job_id``: a restored position must be of that job.

        Raises:
          FailedPreconditionError: the position is of another job (the one it was saved in
            ended and was collected).
        """
        resume = self._resume
        if resume is not None and resume.job_id != job_id and any(resume.tasks.values()):
            raise FailedPreconditionError(
                f"trainer {self.trainer_id!r} saved its position in job {resume.job_id} of "
                f"job_name {job_name!r}, but that job is gone (the name now names job "
                f"{job_id}): the dispatcher collected it job_gc_timeout_ms after its last "
                "trainer left, and the workers' cached elements went with it. Restore while "
                "the job runs (raise DispatcherConfig.job_gc_timeout_ms to give restarts "
                "more time), or start the trainer afresh without set_state (it reads the "
                "new job from its start)"
            )

    def fetch_from(self, task_id: int) -> int:
        """Where a fetch thread starts reading ``task_id``."""
        with self._lock:
            return self._tasks.get(task_id, 0)

    def returned_in(self, task_id: int) -> int:
        """The elements of ``task_id``'s stream before the next one ``next`` returns."""
        with self._lock:
            return self._tasks.get(task_id, 0)

    def returned(self, task_id: int, tag: Sequence[int]) -> None:
        """``next`` returned the element tagged ``tag`` (``[position]`` in ``task_id``'s
        stream, then ``split, offset`` under a fault-tolerant dispatcher)."""
        with self._lock:
            self._tasks[task_id] = max(self._tasks.get(task_id, 0), int(tag[0]) + 1)
            if len(tag) == 3:
                key, offset = int(tag[1]), int(tag[2])
                self._splits[key] = add_ranges(self._splits.get(key, []), [[offset, offset + 1]])
            self._pass_dropped(task_id)

    def _pass_dropped(self, task_id: int) -> None:
        """(Under the lock.) Moves ``task_id``'s position past dropped elements that are next:
        every element before them was returned."""
        dropped = self._dropped.get(task_id)
        if not dropped:
            return
        at = self._tasks.get(task_id, 0)
        while at in dropped:
            dropped.discard(at)
            at += 1
        self._tasks[task_id] = at

    def position(self, job_id: int) -> TrainerPosition:
        """The trainer's position now."""
        with self._lock:
            splits = {key: [list(pair) for pair in ranges] for key, ranges in self._splits.items()}
            return TrainerPosition(self.trainer_id, job_id, dict(self._tasks), splits)
