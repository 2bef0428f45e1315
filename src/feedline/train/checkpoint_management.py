"""``CheckpointManager``: numbered checkpoints in a directory, the newest ``max_to_keep`` kept.

The files it writes, their ``checkpoint`` index and ``latest_checkpoint`` are
``feedline.train._checkpoint_files``; ``latest_checkpoint``, ``PathLike`` and ``INDEX_FILENAME``
are re-exported here, where TensorFlow keeps them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from feedline import _fs
from feedline.errors import InvalidArgumentError
from feedline.train import _cluster
from feedline.train._checkpoint_files import (
    INDEX_FILENAME,
    PathLike,
    highest_number,
    is_file,
    join,
    latest_checkpoint,
    number_of,
    read_index_state,
    remove,
    write_index,
)
from feedline.train.checkpoint import Checkpoint
from feedline.train.checkpoint_options import CheckpointOptions, check_options, run_write_callbacks

__all__ = ["INDEX_FILENAME", "CheckpointManager", "PathLike", "latest_checkpoint"]


class CheckpointManager:
    """Saves numbered checkpoints into a directory and keeps the newest ``max_to_keep``.

    ``tf.train.CheckpointManager``: ``save()`` writes ``{directory}/{checkpoint_name}-{n}``,
    deletes the oldest files beyond ``max_to_keep`` (None keeps all) and lists the kept ones
    in the directory's ``checkpoint`` index (written after the checkpoint, and before old
    files are deleted, so it names only complete files). ``directory`` may be a URL
    (``s3://bucket/run``; see ``feedline.train.checkpoint``). A manager made on a directory
    that already has an index takes over the checkpoints it lists with its
    ``checkpoint_name`` prefix. ``storage_options`` are the file system's arguments for every
    call the manager makes (for ``s3://``, ``s3fs.S3FileSystem``'s: ``key``, ``secret``,
    ``client_kwargs={"endpoint_url": ...}``); without them the back-end finds its credentials
    the standard way (environment, config files). In a
    cluster every worker calls ``save``; the chief writes, numbers and prunes (see
    ``feedline.train.checkpoint``), and every worker's manager lists the same checkpoints.

    Example:
      >>> import os, tempfile, torch
      >>> manager = CheckpointManager(Checkpoint(model=torch.nn.Linear(2, 1)),
      ...                             tempfile.mkdtemp(), max_to_keep=2)
      >>> [os.path.basename(manager.save()) for _ in range(3)]
      ['ckpt-1', 'ckpt-2', 'ckpt-3']
      >>> [os.path.basename(path) for path in manager.checkpoints]
      ['ckpt-2', 'ckpt-3']
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        directory: PathLike,
        max_to_keep: int | None = 5,
        keep_checkpoint_every_n_hours: float | None = None,
        checkpoint_name: str = "ckpt",
        step_counter: Any = None,
        checkpoint_interval: int | None = None,
        init_fn: Callable[[], Any] | None = None,
        last_checkpoint_step: int | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                f"CheckpointManager manages a feedline.train.Checkpoint, got "
                f"{type(checkpoint).__name__}"
            )
        if max_to_keep is not None and (type(max_to_keep) is not int or max_to_keep < 1):
            raise InvalidArgumentError(
                f"max_to_keep must be a positive int, or None to keep every checkpoint; got "
                f"{max_to_keep!r}"
            )
        if keep_checkpoint_every_n_hours is not None and not keep_checkpoint_every_n_hours > 0:
            raise InvalidArgumentError(
                f"keep_checkpoint_every_n_hours must be positive or None, got "
                f"{keep_checkpoint_every_n_hours!r}"
            )
        if checkpoint_interval is not None:
            if step_counter is None:
                raise ValueError("step_counter should be passed if checkpoint_interval is not None")
            if type(checkpoint_interval) is not int or checkpoint_interval < 1:
                raise InvalidArgumentError(
                    f"checkpoint_interval must be a positive int, got {checkpoint_interval!r}"
                )
        if init_fn is not None and not callable(init_fn):
            raise TypeError(f"init_fn must be callable, got {type(init_fn).__name__}")
        self._checkpoint = checkpoint
        self._directory = _fs.as_url(directory)
        self._prefix = join(self._directory, checkpoint_name)
        self._max_to_keep = max_to_keep
        self._keep_every_s = (
            None if keep_checkpoint_every_n_hours is None else keep_checkpoint_every_n_hours * 3600
        )
        self._step_counter = step_counter
        self._checkpoint_interval = checkpoint_interval
        self._last_checkpoint_step = last_checkpoint_step
        self._init_fn = init_fn
        self._storage_options = _fs.check_storage_options(storage_options, "CheckpointManager")
        now = time.time()
        with self.storage_scope():
            index = read_index_state(self._directory)
        listed = [] if index is None else index.paths
        times = [] if index is None else index.times
        last_preserved = None if index is None else index.last_preserved
        if len(times) != len(listed):
            times = [now] * len(listed)  # an index without TensorFlow's timestamps
        # As TensorFlow: a clock set back slightly, so that a manager made again at once
        # preserves by the same rule; never later than now.
        self._last_preserved = min(now, last_preserved) if last_preserved is not None else now - 1
        with self.storage_scope():
            kept = [
                (path, min(t, now))
                for path, t in zip(listed, times, strict=True)
                if number_of(path, self._prefix) is not None and is_file(path)
            ]
        self._checkpoints = [path for path, _ in kept]
        self._times = dict(kept)

    @property
    def checkpoint(self) -> Checkpoint:
        return self._checkpoint

    @property
    def directory(self) -> str:
        return self._directory

    @property
    def storage_options(self) -> dict[str, Any] | None:
        """The file system's arguments the manager's calls use (None: the standard way)."""
        return None if self._storage_options is None else dict(self._storage_options)

    def storage_scope(self) -> contextlib.AbstractContextManager[None]:
        """A block in which file-system calls use the manager's ``storage_options``."""
        return _fs.with_storage_options(self._storage_options)

    @property
    def checkpoints(self) -> list[str]:
        """The kept checkpoints, oldest first."""
        return list(self._checkpoints)

    @property
    def latest_checkpoint(self) -> str | None:
        """The newest kept checkpoint, or None before the first save."""
        return self._checkpoints[-1] if self._checkpoints else None

    @property
    def checkpoint_interval(self) -> int | None:
        """The fewest steps between two saves (``checkpoint_interval``), or None."""
        return self._checkpoint_interval

    def save(
        self,
        checkpoint_number: int | None = None,
        check_interval: bool = True,
        options: CheckpointOptions | None = None,
    ) -> str | None:
        """Writes a checkpoint, updates the index, deletes the ones beyond ``max_to_keep``
        (keeping one every ``keep_checkpoint_every_n_hours`` on disk, unlisted).

        Args:
          checkpoint_number: the file's number (a training step, say); by default the next
            number as ``Checkpoint.save`` picks it.
          check_interval: with a ``checkpoint_interval``, save only once ``step_counter`` has
            moved that many steps past the last save; False saves unless this step was saved.
          options: a ``CheckpointOptions`` (its write callbacks run once the file is written).

        Returns:
          The path written; None where ``checkpoint_interval`` says not yet.
        """
        check_options(options)
        step = None
        if self._checkpoint_interval is not None:
            step = _step(self._step_counter)
            last = self._last_checkpoint_step
            if last is not None and (
                step == last or (check_interval and step < last + self._checkpoint_interval)
            ):
                return None
        with self.storage_scope():
            path = self._save(checkpoint_number)
        if step is not None:
            self._last_checkpoint_step = step  # once saved: a failed save is tried again
        run_write_callbacks(options, path)
        return path

    def restore_or_initialize(self) -> str | None:
        """Restores the latest checkpoint and returns its path; without one, calls ``init_fn``
        (if given) and returns None."""
        latest = self.latest_checkpoint
        if latest is not None:
            with self.storage_scope():
                self._checkpoint.restore(latest)
            if self._checkpoint_interval is not None:
                self._last_checkpoint_step = _step(self._step_counter)
            return latest
        if self._init_fn is not None:
            self._init_fn()
        return None

    def sync(self) -> None:
        """Waits for saves in flight: none, as saves are synchronous."""
        self._checkpoint.sync()

    def _save(self, checkpoint_number: int | None) -> str:
        checkpoint = self._checkpoint
        cluster = _cluster.current()
        if checkpoint_number is None:
            number = cluster.decide(
                lambda: max(checkpoint.save_counter, highest_number(self._prefix)) + 1,
                f"numbering checkpoint {self._prefix} (every worker calls save)",
            )
            counter = number
        else:
            number, counter = int(checkpoint_number), checkpoint.save_counter + 1
        path = f"{self._prefix}-{number}"
        now = time.time()
        times = {p: t for p, t in self._times.items() if p != path} | {path: now}
        kept = [p for p in self._checkpoints if p != path] + [path]
        stale: list[str] = []
        last_preserved = self._last_preserved
        while self._max_to_keep is not None and len(kept) > self._max_to_keep:
            oldest = kept.pop(0)
            saved_at = times.pop(oldest)
            if self._keep_every_s is not None and saved_at - self._keep_every_s >= last_preserved:
                last_preserved = saved_at  # kept on disk, no longer listed (as TensorFlow)
            else:
                stale.append(oldest)

        def index_and_prune() -> None:
            write_index(self._directory, path, kept, [times[p] for p in kept], last_preserved)
            for old in stale:  # after the index: it never names a deleted file
                remove(old)

        checkpoint._write(cluster, path, counter, index_and_prune)
        self._checkpoints, self._times, self._last_preserved = kept, times, last_preserved
        return path


def _step(step_counter: Any) -> int:
    """The value of a ``step_counter``: a tensor or array (updated in place) or a callable."""
    value = step_counter() if callable(step_counter) else step_counter
    return int(value)
