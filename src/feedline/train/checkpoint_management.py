"""Checkpoint files on disk: the ``checkpoint`` index, numbered files, ``latest_checkpoint`` and
``CheckpointManager``. Nothing here needs torch.

The index file is TensorFlow's text format: ``model_checkpoint_path: "..."`` and one
``all_model_checkpoint_paths: "..."`` line per kept checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO

from feedline.errors import InvalidArgumentError

if TYPE_CHECKING:
    from feedline.train.checkpoint import Checkpoint

PathLike = str | os.PathLike[str]

INDEX_FILENAME = "checkpoint"

_NUMBERED = re.compile(r"(.+)-(\d+)")
_INDEX_LINE = re.compile(r'\s*(\w+)\s*:\s*"((?:[^"\\]|\\.)*)"\s*')


class CheckpointManager:
    """Saves numbered checkpoints into a directory and keeps the newest ``max_to_keep``.

    ``tf.train.CheckpointManager``: ``save()`` writes ``{directory}/{checkpoint_name}-{n}``,
    deletes the oldest files beyond ``max_to_keep`` (None keeps all) and lists the kept ones
    in the directory's ``checkpoint`` index. A manager made on a directory that already has
    an index takes over the checkpoints it lists with its ``checkpoint_name`` prefix. In a
    cluster every worker calls ``save``; the chief writes, numbers and prunes (see
    ``feedline.train.checkpoint``), and every worker's manager lists the same checkpoints.

    Example:
      >>> import tempfile, torch
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
    ) -> None:
        from feedline.train.checkpoint import Checkpoint

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
        self._directory = os.fspath(directory)
        self._prefix = os.path.join(self._directory, checkpoint_name)
        self._max_to_keep = max_to_keep
        _, listed = _read_index(self._directory) or (None, [])
        self._checkpoints = [
            path
            for path in listed
            if _number_of(path, self._prefix) is not None and os.path.isfile(path)
        ]

    @property
    def checkpoint(self) -> Checkpoint:
        return self._checkpoint

    @property
    def directory(self) -> str:
        return self._directory

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
        from feedline.train import _cluster

        checkpoint = self._checkpoint
        cluster = _cluster.current()
        if checkpoint_number is None:
            number = cluster.decide(
                lambda: max(checkpoint.save_counter, _highest_number(self._prefix)) + 1,
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
            _write_index(self._directory, path, kept)
            for old in stale:
                with contextlib.suppress(FileNotFoundError):  # already gone: the goal is met
                    os.remove(old)

        checkpoint._write(cluster, path, counter, index_and_prune)
        self._checkpoints = kept
        return path


def latest_checkpoint(checkpoint_dir: PathLike) -> str | None:
    """The path of the newest checkpoint in ``checkpoint_dir``, or None if there is none.

    Reads the directory's ``checkpoint`` index; without one (or when the file it names is
    gone), falls back to the highest-numbered ``{prefix}-{n}`` file.
    """
    directory = os.fspath(checkpoint_dir)
    index = _read_index(directory)
    if index is not None and index[0] is not None and os.path.isfile(index[0]):
        return index[0]
    best: tuple[int, float, str] | None = None
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return None
    for name in names:
        match = _NUMBERED.fullmatch(name)
        path = os.path.join(directory, name)
        if match and not name.startswith(".") and os.path.isfile(path):
            key = (int(match[2]), os.path.getmtime(path), path)
            best = key if best is None or key > best else best
    return None if best is None else best[2]


# -- objects -------------------------------------------------------------------------------------


def _atomic_write(path: str, write: Callable[[BinaryIO], object]) -> None:
    """Writes through a temporary file in ``path``'s directory, then renames it into place."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, temporary = tempfile.mkstemp(
        dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp"
    )
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.remove(temporary)
        raise


def _number_of(path: str, prefix: str) -> int | None:
    name = os.path.basename(path)
    base = os.path.basename(prefix)
    if os.path.dirname(os.path.abspath(path)) != os.path.dirname(os.path.abspath(prefix)):
        return None
    match = _NUMBERED.fullmatch(name)
    return int(match[2]) if match and match[1] == base else None


def _highest_number(prefix: str) -> int:
    """The highest ``n`` of the ``{prefix}-{n}`` files that exist (0 if none)."""
    directory = os.path.dirname(prefix) or "."
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return 0
    numbers = [_number_of(os.path.join(directory, name), prefix) for name in names]
    return max((n for n in numbers if n is not None), default=0)


def _write_index(directory: str, latest: str, paths: list[str]) -> None:
    """Writes TensorFlow's ``checkpoint`` text file; paths in ``directory`` are relative."""
    directory = directory or "."

    def entry(key: str, path: str) -> str:
        if os.path.dirname(os.path.abspath(path)) == os.path.abspath(directory):
            path = os.path.basename(path)
        escaped = path.replace("\\", "\\\\").replace('"', '\\"')
        return f'{key}: "{escaped}"\n'

    text = entry("model_checkpoint_path", latest)
    text += "".join(entry("all_model_checkpoint_paths", path) for path in paths)
    _atomic_write(os.path.join(directory, INDEX_FILENAME), lambda f: f.write(text.encode()))


def _read_index(directory: str) -> tuple[str | None, list[str]] | None:
    """(latest, all) from ``directory``'s index, paths joined to it; None without an index."""
    try:
        with open(os.path.join(directory, INDEX_FILENAME), encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return None
    latest: str | None = None
    paths: list[str] = []
    for line in lines:
        match = _INDEX_LINE.fullmatch(line)  # unquoted fields (timestamps) are skipped
        if match is None:
            continue
        path = os.path.join(directory, re.sub(r"\\(.)", r"\1", match[2]))
        if match[1] == "model_checkpoint_path":
            latest = path
        elif match[1] == "all_model_checkpoint_paths":
            paths.append(path)
    return latest, paths
