"""``BackupAndRestore``: a backup every N steps, to restart from after a hard failure.

Keras' ``tf.keras.callbacks.BackupAndRestore`` for custom training loops. A process killed
outright (``kill -9``, a lost machine, an out-of-memory kill) gets no notice to save in, so the
training loop saves a backup every ``save_freq`` steps; a restarted job restores the latest
backup when it makes its ``BackupAndRestore`` and goes on from that step, with the input
position in the checkpoint restored too. When training ends, the backup is deleted, as Keras
does, so that the next run starts afresh::

    backup = BackupAndRestore(checkpoint, "/shared/backup", save_freq=100)
    with backup:
        for step in range(backup.total_run_calls, STEPS):
            backup.run(train_step, next(iterator))

In a cluster every worker makes it and calls ``run`` alike; the chief writes the backups into
``backup_dir``, which every worker must see (checked here, not at the first restart). Under
``torchrun --max-restarts N`` a killed worker brings the group down and back up, and the group
resumes from the last backup: up to ``save_freq - 1`` steps are computed again.

Under an elastic ``MultiWorkerMirroredStrategy`` (``ElasticClusterResolver``) nothing restarts:
when a peer is lost or a worker joins, ``run`` re-forms the group with the workers that remain
and runs the step again, unless the group had committed it (then ``run`` returns None for it);
a joiner's ``BackupAndRestore`` restores nothing from ``backup_dir`` and takes the group's step
count, model and optimizer state. The backups go on as a last resort for a loss of every worker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from feedline.errors import InvalidArgumentError
from feedline.train._run_checkpoint import RunCheckpoint
from feedline.train.checkpoint import Checkpoint
from feedline.train.checkpoint_management import CheckpointManager, PathLike


class BackupAndRestore:
    """Saves ``checkpoint`` every ``save_freq`` steps of a training loop and restores it.

    Args:
      checkpoint: the ``feedline.train.Checkpoint`` of everything a step changes (model,
        optimizer, the iterator the batches come from, metrics), or a ``CheckpointManager``.
      backup_dir: where the backup goes (the latest one is kept); every worker must see it,
        and nothing else should be saved there. None with a ``CheckpointManager``.
      save_freq: a backup after every this many ``run`` calls.
      delete_checkpoint: whether ``on_train_end`` (the end of a ``with`` block that raised
        nothing) deletes the backup.
      storage_options: the file system's arguments for ``backup_dir`` (for ``s3://``,
        ``s3fs.S3FileSystem``'s: ``key``, ``secret``, ``client_kwargs``); a
        ``CheckpointManager`` takes its own. Without them the back-end finds its credentials
        the standard way (environment, config files).

    Raises:
      InvalidArgumentError: ``save_freq`` is not a positive int.
      FailedPreconditionError: a worker of the cluster cannot see ``backup_dir``.
    """

    def __init__(
        self,
        checkpoint: Checkpoint | CheckpointManager,
        backup_dir: PathLike | None,
        save_freq: int,
        delete_checkpoint: bool = True,
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1:
            raise InvalidArgumentError(
                f"save_freq must be a positive number of run() calls, got {save_freq!r} (a "
                "custom loop has no epochs that BackupAndRestore can see: count steps)"
            )
        self._save_freq = save_freq
        self._delete_checkpoint = bool(delete_checkpoint)
        self._state = RunCheckpoint(
            checkpoint,
            backup_dir,
            argument="backup_dir",
            owner="BackupAndRestore",
            storage_options=storage_options,
        )

    @property
    def total_run_calls(self) -> int:
        """The ``run`` calls made so far, those before the restored backup included."""
        return self._state.total_run_calls

    @property
    def backup_dir(self) -> str:
        return self._state.directory

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Runs one training step ``fn(*args, **kwargs)``; after every ``save_freq``-th,
        saves the backup (every worker of a cluster calls ``run`` at each step). Returns what
        ``fn`` returns (None for a step an elastic group committed while this worker's
        attempt failed)."""
        result = self._state.run(fn, args, kwargs)
        if self._state.total_run_calls % self._save_freq == 0:
            self._state.save_absorbing()
        return result

    def on_train_end(self) -> None:
        """Training is over: deletes the backup if ``delete_checkpoint`` (Keras' callback)."""
        if self._delete_checkpoint:
            self._state.delete()

    def __enter__(self) -> BackupAndRestore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None:  # an interrupted run keeps its backup to resume from
            self.on_train_end()
