"""Exception types raised by feedline.

Each type carries the facts of the failure as attributes, so that callers branch on the type and
its data, never on message text. Where a Python built-in means the same thing, the feedline type
subclasses it, so ``except ValueError`` keeps working for code that does not know feedline.
"""

from __future__ import annotations

__all__ = [
    "AlreadyExistsError",
    "ConsumerReleasedError",
    "DataLossError",
    "FailedPreconditionError",
    "FeedlineError",
    "InvalidArgumentError",
    "MembershipChangedError",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "UnavailableError",
    "UnimplementedError",
    "UnknownError",
    "WorkerDiedError",
]


class FeedlineError(Exception):
    """Base class of every feedline error."""


class OutOfRangeError(FeedlineError, IndexError):
    """An iterator has no more elements (``get_next`` at the end of a dataset)."""


class InvalidArgumentError(FeedlineError, ValueError):
    """An argument or an element has a value that the operation cannot accept."""


class NotFoundError(FeedlineError, FileNotFoundError):
    """A file, dataset, job or other named thing does not exist.

    Attributes:
      name: what was looked for (a path, an id).
    """

    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class ConsumerReleasedError(NotFoundError):
    """The data service's dispatcher released this consumer while its job went on: it heard no
    heartbeat from it for ``client_timeout_ms`` (its process was paused, starved or cut off),
    or it was told that the consumer was done. What the consumer held and had not committed
    went back to the job, for its other consumers or one that joins.

    A consumer that acknowledges on commit (``acknowledge="on_commit"``) joins its job again
    by itself: ``commit()`` raises this error for the step whose elements went back (that step
    is not committed; go on with the next), and ``next()`` goes on reading.
    """


class DataLossError(FeedlineError, OSError):
    """Stored data is corrupted or truncated.

    Attributes:
      filename: the file that holds the damaged data.
      offset: the byte offset of the damaged record.
    """

    def __init__(self, message: str, filename: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.filename = filename
        self.offset = offset

    def __str__(self) -> str:
        # OSError would print "[Errno None] None: 'file'" once filename is set.
        return str(self.args[0])


class FailedPreconditionError(FeedlineError, RuntimeError):
    """The system is not in the state that the operation requires."""


class AlreadyExistsError(FeedlineError, FileExistsError):
    """What an operation would create exists already (a file that ``rename`` would replace).

    Attributes:
      name: what exists (a path).
    """

    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class UnimplementedError(FeedlineError, NotImplementedError):
    """The operation is not available here (a file-system scheme nothing serves)."""


class PermissionDeniedError(FeedlineError, PermissionError):
    """The caller may not perform the operation (for example a missing service token)."""


class UnavailableError(FeedlineError, ConnectionError):
    """A service, worker or peer cannot be reached right now; retrying may help."""


class UnknownError(FeedlineError, RuntimeError):
    """An error raised elsewhere (a data service worker running the pipeline) whose type has no
    counterpart here; the message carries the original type and traceback."""


class WorkerDiedError(UnavailableError):
    """A worker process of ``map(use_processes=True)`` died; the chunk it held is lost.

    Attributes:
      pid: the process id of the worker.
      exitcode: its exit code; ``-N`` means it was killed by signal ``N``.
    """

    def __init__(self, message: str, pid: int | None = None, exitcode: int | None = None):
        super().__init__(message)
        self.pid = pid
        self.exitcode = exitcode


class MembershipChangedError(UnavailableError):
    """The workers of an elastic ``MultiWorkerMirroredStrategy`` changed during a step: a peer
    was lost (a collective failed) or a new worker asked to join (found at the start of
    ``strategy.run``, before the step ran).

    This worker's model and optimizer are intact, but the step that was in flight may have
    been applied by some workers and not by others. To continue, call ``strategy.reform()``:
    it meets the workers that remain (and any joiners) in a new process group and returns the
    number of steps the group agrees were committed; the next ``strategy.run`` gives every
    worker the state of the worker with the most committed steps. Then run the step again if
    that number does not include it. ``BackupAndRestore.run`` does all of this itself.

    Attributes:
      generation: the number of the process group that broke.
      reason: ``"peer_lost"`` (a collective failed) or ``"join"`` (a worker asked to join).
    """

    def __init__(self, message: str, generation: int = 0, reason: str = "peer_lost") -> None:
        super().__init__(message)
        self.generation = generation
        self.reason = reason
