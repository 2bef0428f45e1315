"""What ``PreemptionCheckpointHandler`` and ``BackupAndRestore`` share.

Both count the training steps run through them (``total_run_calls``), keep that count in the
checkpoint as the tensor ``checkpointed_runs`` (TensorFlow's name), save into one directory
through a ``CheckpointManager`` that keeps the latest checkpoint only, and restore that
checkpoint when they are made. In a cluster every worker makes them and calls them alike: the
directory must be seen by every worker (checked at construction, not at the first restart), the
chief picks the checkpoint every worker restores, and saves are the cluster's saves
(``feedline.train._cluster``). A worker other than the chief may give a manager of a directory
of its own, as TensorFlow's guide does (``checkpoint_dir/workertemp_<task_id>``): the chief's
directory is the one written, restored from and checked.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from feedline import _fs
from feedline.data.committed import abort_step, commit_step, counts_steps
from feedline.distribute import elastic as _elastic
from feedline.errors import InvalidArgumentError, MembershipChangedError
from feedline.train import _cluster
from feedline.train._checkpoint_files import basename, join, remove, same_directory, tidy
from feedline.train.checkpoint import Checkpoint
from feedline.train.checkpoint_management import INDEX_FILENAME, CheckpointManager, PathLike

RUNS_NAME = "checkpointed_runs"


class RunCheckpoint:
    """A checkpoint of objects and of the number of steps run, in a directory of its own.

    Args:
      checkpoint_or_manager: a ``Checkpoint`` (saved in ``directory``, latest file only) or a
        ``CheckpointManager`` (its directory; ``directory`` must then be None or the same).
      directory: where checkpoints go; every worker must see it.
      argument: the caller's name for ``directory``, for messages.
      owner: the caller's class name, for messages.
      storage_options: the file system's arguments for a ``Checkpoint``'s directory (a
        ``CheckpointManager`` has its own).

    Raises:
      TypeError: ``checkpoint_or_manager`` is neither.
      InvalidArgumentError: no directory, or one that differs from the manager's.
      FailedPreconditionError: a worker of the cluster cannot see the directory.
    """

    def __init__(
        self,
        checkpoint_or_manager: Checkpoint | CheckpointManager,
        directory: PathLike | None,
        *,
        argument: str,
        owner: str,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.manager = _manager(checkpoint_or_manager, directory, argument, owner, storage_options)
        self.checkpoint = self.manager.checkpoint
        self._runs = _runs_tensor(self.checkpoint, owner)
        elastic = _elastic.active()
        if elastic is not None and elastic.joined_running:
            # A worker admitted into an elastic group that trains: the state and the step
            # count come from the group (the step count now, the rest at the next step).
            self.total_run_calls = elastic.step
            return
        with self.manager.storage_scope():
            latest = self._latest(argument)
            if latest is not None:
                self.checkpoint.restore(latest)
        self.total_run_calls = int(self._runs.item())

    def _latest(self, argument: str) -> str | None:
        """The checkpoint every worker restores: the chief's latest, once every worker was
        found to see the chief's directory."""
        # The chief's directory is where checkpoints are written and restored from. Other
        # workers may give a manager of a directory of their own (TensorFlow's guide gives
        # them checkpoint_dir/workertemp_<task_id>): they write nothing there and restore the
        # chief's checkpoints, so it is the chief's directory that every worker must see.
        directory = self.cluster.decide(
            lambda: self.manager.directory, f"finding the chief's {argument}"
        )
        self.cluster.check_shared(directory, argument)
        return self.cluster.decide(
            lambda: _latest_and_tidy(self.manager), f"finding the latest checkpoint in {directory}"
        )

    @property
    def cluster(self) -> _cluster.Cluster:
        """This process's cluster now (an elastic group's ranks change)."""
        return _cluster.current()

    def run(self, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """Runs one training step and counts it; its arguments that count steps
        (``feedline.data.committed``: a ``CommittedIterator``, a service iterator acknowledging
        on commit) consume the step's input once it returned. Under an elastic strategy, a
        membership change re-forms the group and runs the step again, the input given back,
        unless the group committed it (then the result is None)."""
        iterators = [value for value in (*args, *kwargs.values()) if counts_steps(value)]
        elastic = _elastic.active()
        if elastic is None:
            result = fn(*args, **kwargs)
            self.total_run_calls += 1
        else:
            result, self.total_run_calls = _elastic.run_step(
                elastic,
                self.total_run_calls,
                functools.partial(fn, *args, **kwargs),
                lambda: abort_step(iterators),
            )
        commit_step(iterators)
        return result

    def save_absorbing(self) -> str | None:
        """``save``; under an elastic strategy, a membership change during the save
        re-forms the group and skips this save (None)."""
        elastic = _elastic.active()
        if elastic is None:
            return self.save()
        try:
            return self.save()
        except MembershipChangedError:
            elastic.reform(self.total_run_calls)
            self.total_run_calls = elastic.step
            return None

    @property
    def directory(self) -> str:
        """This worker's manager's directory (on other workers than the chief, possibly a
        directory of their own, where nothing is written)."""
        return self.manager.directory

    def save(self) -> str:
        """Saves the objects and ``total_run_calls`` as checkpoint number ``total_run_calls``
        (every worker of a cluster calls it at the same step)."""
        self._runs.fill_(self.total_run_calls)
        path = self.manager.save(checkpoint_number=self.total_run_calls)
        assert path is not None  # the manager has no checkpoint_interval: it always saves
        return path

    def delete(self) -> None:
        """Removes the checkpoints saved here and their index (the chief; every worker waits)."""
        manager = self.manager
        with manager.storage_scope():
            self.cluster.decide(
                lambda: _remove_checkpoints(manager), f"deleting {manager.directory}"
            )
        manager._checkpoints = []


def _manager(
    checkpoint_or_manager: Any,
    directory: PathLike | None,
    argument: str,
    owner: str,
    storage_options: Mapping[str, Any] | None,
) -> CheckpointManager:
    if isinstance(checkpoint_or_manager, CheckpointManager):
        manager = checkpoint_or_manager
        if storage_options is not None:
            raise InvalidArgumentError(
                f"{owner} was given a CheckpointManager and storage_options; give the "
                "storage_options to the CheckpointManager, whose directory is used"
            )
        if directory is not None and not same_directory(_fs.as_url(directory), manager.directory):
            raise InvalidArgumentError(
                f"{owner} was given a CheckpointManager of {manager.directory!r} and {argument}="
                f"{_fs.as_url(directory)!r}; give one of them (the manager's directory is used)"
            )
        return manager
    if isinstance(checkpoint_or_manager, Checkpoint):
        if directory is None:
            raise InvalidArgumentError(
                f"{owner} needs {argument}, the directory where it saves and restores the "
                "Checkpoint (or give a CheckpointManager instead of the Checkpoint)"
            )
        return CheckpointManager(
            checkpoint_or_manager, directory, max_to_keep=1, storage_options=storage_options
        )
    raise TypeError(
        f"{owner} saves a feedline.train.Checkpoint or CheckpointManager, got "
        f"{type(checkpoint_or_manager).__name__}"
    )


def _runs_tensor(checkpoint: Checkpoint, owner: str) -> torch.Tensor:
    """The checkpoint's step counter, added as ``checkpointed_runs`` if it has none."""
    existing = checkpoint._objects.get(RUNS_NAME)
    if existing is None:
        runs = torch.zeros((), dtype=torch.int64)
        setattr(checkpoint, RUNS_NAME, runs)
        return runs
    if not (isinstance(existing, torch.Tensor) and existing.dim() == 0):
        raise InvalidArgumentError(
            f"{owner} counts steps in the checkpoint object {RUNS_NAME!r}, but the checkpoint "
            f"already holds a {type(existing).__name__} under that name; rename it"
        )
    return existing


def _latest_and_tidy(manager: CheckpointManager) -> str | None:
    """The manager's latest checkpoint; also removes what a writer killed mid-save left behind
    (hidden temporary files of this prefix: nothing restores them)."""
    tidy(manager.directory, basename(manager._prefix))
    return manager.latest_checkpoint


def _remove_checkpoints(manager: CheckpointManager) -> None:
    # The index first: a restart never finds an index naming deleted files.
    for path in [join(manager.directory, INDEX_FILENAME), *manager.checkpoints]:
        remove(path)
    local = _fs.local_path(manager.directory)
    if local is not None:  # an object store has no directories to remove
        with contextlib.suppress(OSError):  # left where other files remain
            os.rmdir(local or ".")
