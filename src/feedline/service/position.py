"""The consumer's position in a job, as a training checkpoint saves it (tensorflow#63079).

An iterator over a service dataset saves, per task of its job, how many elements it has
*returned* from ``next`` (elements buffered but not yet returned are read again after a
restore). Restoring the position into a new iterator joins a fresh job with that position as
``resume``; the dispatcher gives each task of the new job a ``skip`` (``resume_skips``), which
the worker applies to the task's dataset before serving it.

Which streams the counts belong to:

==================  ==========================================================================
OFF                 every worker runs the whole dataset: a count goes back to the worker at the
                    same address; counts whose worker is not in the new job go to the new
                    job's other workers, in worker order (the streams are the same)
FILE, DATA, ...     worker ``i`` of ``n`` reads shard ``i``: a count goes back to worker index
                    ``i``, and the new job must have the same ``n`` workers
DYNAMIC             with a fault-tolerant dispatcher (exactly-once jobs, ``ledger``): the
                    splits whose elements were all returned (with their element counts) and,
                    for the others, the offsets returned (``SplitPosition``); the new job does
                    not hand out the first, and hands out the second first, skipping those
                    offsets. Any number of workers. Without a fault-tolerant dispatcher: not
                    saved (``FailedPreconditionError``)
round robin         not saved (``FailedPreconditionError``)
==================  ==========================================================================

Example:
  >>> position = JobPosition(0, 2, (TaskPosition(0, "a:1", 3), TaskPosition(1, "b:2", 5)))
  >>> JobPosition.from_state(position.to_state(), 0) == position
  True
  >>> resume_skips(position, 0, ("b:2", "c:3"))
  [5, 3]
"""

from __future__ import annotations

import dataclasses
from typing import Any

from feedline.errors import FailedPreconditionError, InvalidArgumentError
from feedline.service.config import ShardingPolicy
from feedline.service.ledger import add_ranges
from feedline.service.protocol import object_versions

__all__ = [
    "JobPosition",
    "SplitPosition",
    "TaskPosition",
    "check_checkpointable",
    "position_from_state",
    "resume_skips",
]

#: The version of the iterator state written by ``JobPosition.to_state``.
STATE_VERSION = 1

_SUPPORTED = (
    "OFF (parallel_epochs), the static policies (FILE, DATA, FILE_OR_DATA, HINT) and, with a "
    "fault-tolerant dispatcher, DYNAMIC (distributed_epoch)"
)


def check_checkpointable(mode: int, num_consumers: int | None, exactly_once: bool = True) -> None:
    """Raises unless a consumer reading a job of ``mode`` can save its position
    (``exactly_once``: whether a DYNAMIC job's dispatcher is fault-tolerant).

    Raises:
      FailedPreconditionError: DYNAMIC sharding without a fault-tolerant dispatcher, or
        round-robin reads.
    """
    if ShardingPolicy(mode) == ShardingPolicy.DYNAMIC and not exactly_once:
        raise FailedPreconditionError(
            "an iterator over a ShardingPolicy.DYNAMIC (distributed_epoch) job is checkpointed "
            "only with a fault-tolerant dispatcher (DispatcherConfig(work_dir=..., "
            "fault_tolerant_mode=True)), which tags each element with its split and offset: its "
            "position is the splits (and offsets) it returned. Start the dispatcher that way, "
            "or checkpoint the model and start a new job"
        )
    if num_consumers is not None:
        raise FailedPreconditionError(
            "an iterator reading round robin (consumer_index/num_consumers) cannot be "
            f"checkpointed: its consumers move in step. Positions are saved for {_SUPPORTED} "
            "with first-come reads; checkpoint the model and start a new job instead"
        )


@dataclasses.dataclass(frozen=True)
class TaskPosition:
    """How many elements of the stream of worker ``worker_index`` (at ``address``) the
    consumer has returned, counting those its job skipped when it was itself resumed."""

    worker_index: int
    address: str
    count: int


@dataclasses.dataclass(frozen=True)
class JobPosition:
    """A consumer's position in a job of ``mode`` that had ``num_workers`` tasks."""

    mode: int
    num_workers: int
    tasks: tuple[TaskPosition, ...]

    def to_state(self) -> dict[str, Any]:
        """The iterator state (a picklable dict; also the ``resume`` field sent to the
        dispatcher, which is JSON)."""
        return {
            "version": STATE_VERSION,
            "mode": ShardingPolicy(self.mode).name,
            "num_workers": self.num_workers,
            "tasks": [[t.worker_index, t.address, t.count] for t in self.tasks],
        }

    @staticmethod
    def check_state(state: Any, mode: int) -> None:
        """Checks that ``state`` is an iterator state of this version, saved in ``mode``.

        Raises:
          InvalidArgumentError: it is not.
        """
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise InvalidArgumentError(
                f"not the state of a data service iterator (version {STATE_VERSION}): {state!r}"
            )
        policy = ShardingPolicy(mode)
        if state.get("mode") != policy.name:
            raise InvalidArgumentError(
                f"the state was saved from a job of ShardingPolicy.{state.get('mode')}, and "
                f"this iterator reads with ShardingPolicy.{policy.name}; restore it into an "
                "iterator of the same processing mode"
            )

    @classmethod
    def from_state(cls, state: Any, mode: int) -> JobPosition:
        """The position ``to_state`` wrote, for a job of ``mode``.

        Raises:
          InvalidArgumentError: ``state`` is not such a position, or was saved from a job of
            another processing mode.
        """
        cls.check_state(state, mode)
        policy = ShardingPolicy(mode)
        try:
            num_workers = int(state["num_workers"])
            tasks = tuple(
                TaskPosition(int(index), str(address), int(count))
                for index, address, count in state["tasks"]
            )
        except (KeyError, TypeError, ValueError) as error:
            raise InvalidArgumentError(
                f"malformed data service iterator state: {error!r}"
            ) from None
        if num_workers < 0 or any(t.count < 0 or t.worker_index < 0 for t in tasks):
            raise InvalidArgumentError(f"negative counts in a data service iterator state: {state}")
        return cls(int(policy), num_workers, tasks)


def resume_skips(position: JobPosition, mode: int, addresses: tuple[str, ...]) -> list[int]:
    """How many elements each task of a new job skips, for the tasks on ``addresses`` (in
    worker-index order), to resume at ``position``.

    Raises:
      FailedPreconditionError: under static sharding, the new job has another number of
        workers than the one the position was saved from.
    """
    if ShardingPolicy(mode).is_static:
        if len(addresses) != position.num_workers:
            raise FailedPreconditionError(
                f"the consumer's position was saved from a job sharded over "
                f"{position.num_workers} workers, and a new job would have {len(addresses)} "
                "(DispatcherConfig.worker_addresses); worker i reads shard i of n, so a "
                "position resumes only on the same number of workers"
            )
        counts = {t.worker_index: t.count for t in position.tasks}
        return [counts.get(index, 0) for index in range(len(addresses))]
    skips: list[int | None] = [None] * len(addresses)
    unmatched = []
    for task in sorted(position.tasks, key=lambda t: t.worker_index):
        if task.address in addresses and skips[addresses.index(task.address)] is None:
            skips[addresses.index(task.address)] = task.count
        else:
            unmatched.append(task.count)
    for index, skip in enumerate(skips):
        if skip is None:
            skips[index] = unmatched.pop(0) if unmatched else 0
    return [int(skip or 0) for skip in skips]


@dataclasses.dataclass(frozen=True)
class SplitPosition:
    """A consumer's position in an exactly-once DYNAMIC job (``ledger``).

    Attributes:
      cursor: the geometry of the job's splits (``num_units``, ``split_size``, ``seed``: what
        a key means), None if no split had been handed out.
      done: the splits whose elements were all returned: key -> element count.
      partial: the other splits returned from: key -> the offsets returned, as ranges.
      versions: of the ``partial`` splits, the version of each object of a store they read
        (key -> URL -> version): their rest, in the resumed job, is read from those versions
        or is a ``DataLossError``, never from another version after the offsets returned.
    """

    cursor: dict[str, Any] | None
    done: dict[int, int]
    partial: dict[int, list[list[int]]]
    versions: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @classmethod
    def union(cls, positions: list[SplitPosition]) -> SplitPosition:
        """What the consumers of one job returned together: the consumers of a job shared by
        name each return some of its elements, and the job's position is all of them.

        Example:
          >>> a = SplitPosition(None, {0: 4}, {4: [[0, 2]]})
          >>> b = SplitPosition(None, {}, {4: [[2, 3]], 0: [[1, 2]], 8: [[0, 1]]})
          >>> SplitPosition.union([a, b])
          SplitPosition(cursor=None, done={0: 4}, partial={4: [[0, 3]], 8: [[0, 1]]}, versions={})
        """
        cursor = next((p.cursor for p in positions if p.cursor is not None), None)
        done: dict[int, int] = {}
        for position in positions:
            done.update(position.done)
        partial: dict[int, list[list[int]]] = {}
        versions: dict[int, dict[str, Any]] = {}
        for position in positions:
            for key, ranges in position.partial.items():
                if key not in done:
                    partial[key] = add_ranges(partial.get(key, []), ranges)
            for key, held in position.versions.items():
                if key not in done:
                    versions.setdefault(key, {}).update(held)
        return cls(cursor, done, dict(sorted(partial.items())), dict(sorted(versions.items())))

    def to_state(self) -> dict[str, Any]:
        """The iterator state (a picklable dict, also JSON)."""
        return {
            "version": STATE_VERSION,
            "mode": ShardingPolicy.DYNAMIC.name,
            "cursor": self.cursor,
            "done": [[key, count] for key, count in sorted(self.done.items())],
            "partial": [[key, ranges] for key, ranges in sorted(self.partial.items())],
            **(
                {"versions": [[key, held] for key, held in sorted(self.versions.items())]}
                if self.versions
                else {}
            ),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SplitPosition:
        """The position ``to_state`` wrote (checked by ``position_from_state``).

        Raises:
          InvalidArgumentError: a malformed state.
        """
        try:
            cursor = state["cursor"]
            if cursor is not None:
                cursor = {k: cursor[k] for k in ("num_units", "split_size", "seed")}
                if any(not isinstance(cursor[k], int) for k in ("num_units", "split_size")):
                    raise ValueError(f"cursor {cursor}")
            done = {int(key): int(count) for key, count in state["done"]}
            partial = {
                int(key): [[int(a), int(b)] for a, b in ranges] for key, ranges in state["partial"]
            }
            versions = {
                int(key): object_versions(held, "a saved position's versions")
                for key, held in state.get("versions", ())
            }
        except (KeyError, TypeError, ValueError) as error:
            raise InvalidArgumentError(
                f"malformed data service iterator state: {error!r}"
            ) from None
        if any(v < 0 for v in [*done, *done.values(), *partial]) or any(
            a < 0 or b < a for ranges in partial.values() for a, b in ranges
        ):
            raise InvalidArgumentError(f"negative counts in a data service iterator state: {state}")
        return cls(cursor, done, partial, versions)


def position_from_state(state: Any, mode: int) -> JobPosition | SplitPosition:
    """The position a consumer saved (``to_state``), for a job of ``mode``.

    Raises:
      InvalidArgumentError: ``state`` is not such a position, or was saved from a job of
        another processing mode.
    """
    if ShardingPolicy(mode) == ShardingPolicy.DYNAMIC:
        JobPosition.check_state(state, mode)
        return SplitPosition.from_state(state)
    return JobPosition.from_state(state, mode)
