"""``CrossTrainerCache``: several trainers read every element of one job, which the workers
compute once (``tf.data.experimental.service.CrossTrainerCache``).

Each trainer names the job (``job_name``) and itself (``trainer_id``). It reads every task of
the job from its own position in the task's stream; the workers keep what the fastest trainer
made for the others (``worker.trainer_cache``). A trainer's position is, per task, the elements
``next`` returned: ``TrainerPosition``, what ``get_state`` saves. Restored into a new iterator
(in this process or a new one), it rejoins the same job and reads each task from there, so a
trainer restarted from its checkpoint gets the rest of the epoch exactly once while the other
trainers go on.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from feedline.errors import FailedPreconditionError, InvalidArgumentError

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


@dataclasses.dataclass(frozen=True)
class TrainerPosition:
    """A trainer's position in a cross-trainer job: per task, the elements of its stream
    before the next one the trainer returns.

    Example:
      >>> position = TrainerPosition("a", 7, {12: 3, 13: 0})
      >>> TrainerPosition.from_state(position.to_state()) == position
      True
    """

    trainer_id: str
    job_id: int
    tasks: dict[int, int]

    def to_state(self) -> dict[str, Any]:
        """The position as an iterator's state (a nested dict of plain values)."""
        return {
            "cross_trainer": {
                "trainer_id": self.trainer_id,
                "job_id": self.job_id,
                "tasks": [[task, count] for task, count in sorted(self.tasks.items())],
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
            return cls(str(saved["trainer_id"]), int(saved["job_id"]), tasks)
        except (KeyError, TypeError, ValueError) as error:
            raise InvalidArgumentError(
                "the state is not the position of a trainer of a cross-trainer job (saved by "
                f"an iterator of distribute(..., cross_trainer_cache=...)): {error}"
            ) from None


class TrainerPositions:
    """The positions of one trainer in its job's tasks, kept by its reader; thread-safe.

    ``fetch_from`` is where a fetch thread starts a task (the restored position, else 0);
    ``returned`` moves a task's position past an element ``next`` returned.
    """

    def __init__(self, trainer_id: str, resume: TrainerPosition | None) -> None:
        self.trainer_id = trainer_id
        self._resume = resume
        self._lock = threading.Lock()
        self._tasks: dict[int, int] = dict(resume.tasks) if resume is not None else {}

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
                f"{job_id}): its cached elements went with it. Restore while the job runs, "
                "or start the trainer afresh"
            )

    def fetch_from(self, task_id: int) -> int:
        """Where a fetch thread starts reading ``task_id``."""
        with self._lock:
            return self._tasks.get(task_id, 0)

    def returned_in(self, task_id: int) -> int:
        """The elements of ``task_id``'s stream before the next one ``next`` returns."""
        with self._lock:
            return self._tasks.get(task_id, 0)

    def returned(self, task_id: int, index: int) -> None:
        """``next`` returned the element at ``index`` of ``task_id``'s stream."""
        with self._lock:
            self._tasks[task_id] = max(self._tasks.get(task_id, 0), index + 1)

    def position(self, job_id: int) -> TrainerPosition:
        """The trainer's position now."""
        with self._lock:
            return TrainerPosition(self.trainer_id, job_id, dict(self._tasks))
