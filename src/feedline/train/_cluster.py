"""Checkpoints written by a cluster of synchronous workers, as TensorFlow writes them.

Under ``MultiWorkerMirroredStrategy`` with several workers, every worker calls ``save`` (it is a
collective, as in TensorFlow): the chief writes the checkpoint and its index; every other worker
writes its copy to a temporary ``workertemp_<worker>`` folder beside it and removes that folder,
so nothing but the chief's files is left. The workers agree on what the chief decides (the
checkpoint's number, the latest checkpoint to restore) and on the outcome: a failed write raises
on every worker, so no worker trains on believing a checkpoint exists that does not.

``current()`` is this process's cluster: ``Alone`` (no other worker; everything is local), or
``Workers`` over the collective of the process's ``MultiWorkerMirroredStrategy``. Besides saves
it gives the fault-tolerance helpers a check that every worker makes once a step
(``any_each_step``: did any worker get a termination notice?), whose all-reduce runs in the
background, and a place to report a worker's own failure to the others (``report_error``).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from feedline import _fs
from feedline.distribute import collective as collectives
from feedline.errors import FailedPreconditionError, FeedlineError, UnknownError
from feedline.train import _checkpoint_files as files

T = TypeVar("T")

WORKER_TEMP_PREFIX = "workertemp_"


class StepAgreement(Protocol):
    """A check, made by every worker once a step, of whether any worker set each of the flags
    that a ``local()`` function gives (a flag once set must stay set); see ``any_each_step``."""

    def __call__(self) -> tuple[bool, ...]: ...

    def settle(self) -> None:
        """Waits for the all-reduce still running, if any (before a save or an exit)."""


class _Immediate:
    """One worker: its own flags, at once."""

    def __init__(self, local: Callable[[], tuple[bool, ...]]) -> None:
        self._local = local

    def __call__(self) -> tuple[bool, ...]:
        return tuple(self._local())

    def settle(self) -> None:
        return None


class _Pipelined:
    """Several workers: the all-reduce of a step's flags runs in the background during the
    next step, whose check answers with it. Every worker learns of a flag at the same step, one
    step after it was set, and no step waits for the all-reduce."""

    def __init__(
        self,
        collective: collectives.Collective,
        local: Callable[[], tuple[bool, ...]],
        size: int,
        what: str,
    ) -> None:
        self._collective = collective
        self._local = local
        self._size = size
        self._what = what
        self._running: list[Callable[[], tuple[bool, ...]]] = []

    def __call__(self) -> tuple[bool, ...]:
        self._running.append(self._collective.start_agree_any(self._local(), self._what))
        if len(self._running) < 2:
            return (False,) * self._size
        return self._running.pop(0)()

    def settle(self) -> None:
        while self._running:
            self._running.pop(0)()


class Cluster(Protocol):
    """The workers that save one checkpoint together."""

    rank: int
    world_size: int

    @property
    def is_chief(self) -> bool: ...

    def decide(self, choose: Callable[[], T], what: str) -> T: ...

    def write(self, path: str, dump: Callable[[str], None], then: Callable[[], None]) -> None: ...

    def check_shared(self, directory: str, argument: str) -> None: ...

    def any_each_step(
        self, local: Callable[[], tuple[bool, ...]], size: int, what: str
    ) -> StepAgreement: ...

    def report_error(self, message: str) -> None: ...


class Alone:
    """One process: it decides, writes and sees everything itself."""

    rank = 0
    world_size = 1
    is_chief = True

    def decide(self, choose: Callable[[], T], what: str) -> T:
        return choose()

    def write(self, path: str, dump: Callable[[str], None], then: Callable[[], None]) -> None:
        dump(path)
        then()

    def check_shared(self, directory: str, argument: str) -> None:
        return None

    def any_each_step(
        self, local: Callable[[], tuple[bool, ...]], size: int, what: str
    ) -> StepAgreement:
        return _Immediate(local)

    def report_error(self, message: str) -> None:
        return None


class Workers:
    """A worker of a synchronous cluster (``feedline.distribute.collective.Collective``)."""

    def __init__(self, collective: collectives.Collective) -> None:
        self._collective = collective
        self.rank: int = collective.rank
        self.world_size: int = collective.world_size

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    def decide(self, choose: Callable[[], T], what: str) -> T:
        """The chief's ``choose()``, on every worker; the chief's failure raises everywhere."""
        outcome: tuple[bool, Any] = (True, None)
        if self.is_chief:
            try:
                outcome = (True, choose())
            except Exception as error:
                outcome = (False, error)
        ok, value = self._collective.broadcast_object(outcome, 0, what)
        if ok:
            return value
        if self.is_chief:
            raise value
        raise UnknownError(f"the chief failed {what}: {type(value).__name__}: {value}")

    def write(self, path: str, dump: Callable[[str], None], then: Callable[[], None]) -> None:
        """The chief dumps to ``path`` and runs ``then``; the others dump to a temporary folder
        and remove it. Raises on every worker if any worker failed."""
        error: Exception | None = None
        try:
            if self.is_chief:
                dump(path)
                then()
            else:
                folder = files.join(files.dirname(path), f"{WORKER_TEMP_PREFIX}{self.rank}")
                try:
                    dump(files.join(folder, files.basename(path)))
                finally:
                    _fs.remove_tree(folder, "removing a worker's temporary checkpoint")
        except Exception as failure:
            error = failure
        report = None if error is None else f"{type(error).__name__}: {error}"
        reports = self._collective.all_gather_object(
            report, f"saving checkpoint {path} (every worker calls save)"
        )
        if error is not None:
            raise error
        failed = [(rank, text) for rank, text in enumerate(reports) if text is not None]
        if failed:
            details = "; ".join(f"worker {rank}: {text}" for rank, text in failed)
            raise UnknownError(
                f"checkpoint {path} was not saved: {details}. Every worker raises this error, "
                "so that none goes on as if the checkpoint existed"
            )

    def any_each_step(
        self, local: Callable[[], tuple[bool, ...]], size: int, what: str
    ) -> StepAgreement:
        return _Pipelined(self._collective, local, size, what)

    def report_error(self, message: str) -> None:
        """Leaves this worker's failure where the others' errors will name it."""
        self._collective.report_error(message)

    def check_shared(self, directory: str, argument: str) -> None:
        """Raises on every worker unless every worker sees what the chief writes in
        ``directory`` (checkpoints there must be restorable by all)."""
        probe = self.decide(lambda: _write_probe(directory), f"checking {argument} {directory}")
        name, token = probe
        seen = _read_probe(files.join(directory, name)) == token
        everyone = self._collective.all_gather_object(seen, f"checking {argument} {directory}")
        if self.is_chief:
            files.remove(files.join(directory, name))
        blind = [rank for rank, ok in enumerate(everyone) if not ok]
        if blind:
            who = ", ".join(f"worker {rank}" for rank in blind)
            raise FailedPreconditionError(
                f"{argument} {directory!r} is not shared by every worker: {who} cannot see the "
                f"file the chief wrote there (each worker resolves the path on its own machine, "
                f"relative paths from its own working directory). The chief writes checkpoints "
                f"there and every worker restores from them: use a path on storage that every "
                f"worker mounts at the same place (a network file system, a bucket mount) or "
                f"an object store's URL (s3://bucket/run, gs://...)"
            )


def _write_probe(directory: str) -> tuple[str, str]:
    _fs.make_dirs(directory, "checking a checkpoint directory")
    token = secrets.token_hex(16)
    name = f".feedline-shared-{token[:12]}"
    files.atomic_write(files.join(directory, name), lambda file: file.write(token.encode()))
    return name, token


def _read_probe(path: str) -> str | None:
    try:
        return _fs.read_small(path, "checking a checkpoint directory").decode("ascii")
    except (OSError, UnicodeDecodeError, FeedlineError):
        return None


def current() -> Cluster:
    """This process's cluster: the workers of its ``MultiWorkerMirroredStrategy`` when it has
    several, else ``Alone``."""
    collective = collectives.active()
    if collective is None or collective.world_size < 2:
        return Alone()
    return Workers(collective)
