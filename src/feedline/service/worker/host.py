"""What a task needs from the worker that runs it (``TaskHost``), so that a task runs, and is
tested, with any host: ``WorkerServer`` in the service, a small fake in tests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from feedline.data.dataset import Dataset
from feedline.service.protocol import TaskDef
from feedline.service.shm import WorkerSegments

__all__ = ["TaskCounters", "TaskHost"]


class TaskCounters(Protocol):
    """The worker's counters that its tasks add to (``status.metrics.WorkerTelemetry``)."""

    def served(self, elements: int, nbytes: int) -> None:
        """``elements`` of ``nbytes`` went to a consumer."""
        ...

    def task_failed(self, task_id: int, report: Mapping[str, Any]) -> None:
        """Task ``task_id`` failed with ``report``."""
        ...


class TaskHost(Protocol):
    """The worker, as its tasks see it."""

    @property
    def worker_address(self) -> str:
        """The worker's address (named in a failed task's report)."""
        ...

    @property
    def draining(self) -> bool:
        """Whether the worker drains: a DYNAMIC task asks for no new split."""
        ...

    @property
    def shm(self) -> WorkerSegments:
        """The arenas of same-host consumers, through which replies go when offered."""
        ...

    @property
    def telemetry(self) -> TaskCounters:
        """What the task counts: elements served, failures."""
        ...

    def report_failure(self) -> None:
        """Tells the dispatcher at once that a task failed (its ``failure``)."""
        ...

    def call_dispatcher(
        self, method: str, header: dict[str, Any], what: str
    ) -> tuple[dict[str, Any], list[memoryview]]:
        """One call to the dispatcher (``GetSplit``), tried again while it cannot be reached.

        Raises:
          UnavailableError: the dispatcher stayed unreachable; the message says doing ``what``.
        """
        ...

    def dataset(self, task: TaskDef) -> tuple[Dataset, str | None]:
        """The dataset of ``task`` and its compression (called on the task's thread)."""
        ...
