"""``CheckpointManager``: numbered checkpoints in a directory, the newest ``max_to_keep`` kept.

The files it writes, their ``checkpoint`` index and ``latest_checkpoint`` are
``feedline.train._checkpoint_files``; ``latest_checkpoint``, ``PathLike`` and ``INDEX_FILENAME``
are re-exported here, where TensorFlow keeps them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
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
    read_index,
    remove,
    write_index,
)
from feedline.train.checkpoint import Checkpoint

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
        checkpoint_name: str = "ckpt",
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
        self._checkpoint = checkpoint
        self._directory = _fs.as_url(directory)
        self._prefix = join(self._directory, checkpoint_name)
        self._max_to_keep = max_to_keep
        self._storage_options = _fs.check_storage_options(storage_options, "CheckpointManager")
        with self.storage_scope():
            _, listed = read_index(self._directory) or (None, [])
            self._checkpoints = [
                path
                for path in listed
                if number_of(path, self._prefix) is not None and is_file(path)
            ]

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

    def save(self, checkpoint_number: int | None = None) -> str:
        """Writes a checkpoint, updates the index, deletes the ones beyond ``max_to_keep``.

        Args:
          checkpoint_number: the file's number (a training step, say); by default the next
            number as ``Checkpoint.save`` picks it.

        Returns:
          The path written.
        """
        with self.storage_scope():
            return self._save(checkpoint_number)

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
        kept = [p for p in self._checkpoints if p != path] + [path]
        stale: list[str] = []
        if self._max_to_keep is not None and len(kept) > self._max_to_keep:
            stale, kept = kept[: -self._max_to_keep], kept[-self._max_to_keep :]

        def index_and_prune() -> None:
            write_index(self._directory, path, kept)
            for old in stale:  # after the index: it never names a deleted file
                remove(old)

        checkpoint._write(cluster, path, counter, index_and_prune)
        self._checkpoints = kept
        return path
