"""Checkpoint files on disk: the ``checkpoint`` index, numbered files and ``latest_checkpoint``.

Nothing here needs torch, nor ``Checkpoint``: ``Checkpoint`` writes its files with these helpers
and ``CheckpointManager`` (``feedline.train.checkpoint_management``) numbers, lists and prunes
them. The index file is TensorFlow's text format: ``model_checkpoint_path: "..."`` and one
``all_model_checkpoint_paths: "..."`` line per kept checkpoint.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from typing import BinaryIO

__all__ = [
    "INDEX_FILENAME",
    "PathLike",
    "atomic_write",
    "highest_number",
    "latest_checkpoint",
    "number_of",
    "read_index",
    "write_index",
]

PathLike = str | os.PathLike[str]

INDEX_FILENAME = "checkpoint"

_NUMBERED = re.compile(r"(.+)-(\d+)")
_INDEX_LINE = re.compile(r'\s*(\w+)\s*:\s*"((?:[^"\\]|\\.)*)"\s*')


def latest_checkpoint(checkpoint_dir: PathLike) -> str | None:
    """The path of the newest checkpoint in ``checkpoint_dir``, or None if there is none.

    Reads the directory's ``checkpoint`` index; without one (or when the file it names is
    gone), falls back to the highest-numbered ``{prefix}-{n}`` file.
    """
    directory = os.fspath(checkpoint_dir)
    index = read_index(directory)
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


def atomic_write(path: str, write: Callable[[BinaryIO], object]) -> None:
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


def number_of(path: str, prefix: str) -> int | None:
    name = os.path.basename(path)
    base = os.path.basename(prefix)
    if os.path.dirname(os.path.abspath(path)) != os.path.dirname(os.path.abspath(prefix)):
        return None
    match = _NUMBERED.fullmatch(name)
    return int(match[2]) if match and match[1] == base else None


def highest_number(prefix: str) -> int:
    """The highest ``n`` of the ``{prefix}-{n}`` files that exist (0 if none)."""
    directory = os.path.dirname(prefix) or "."
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return 0
    numbers = [number_of(os.path.join(directory, name), prefix) for name in names]
    return max((n for n in numbers if n is not None), default=0)


def write_index(directory: str, latest: str, paths: list[str]) -> None:
    """Writes TensorFlow's ``checkpoint`` text file; paths in ``directory`` are relative."""
    directory = directory or "."

    def entry(key: str, path: str) -> str:
        if os.path.dirname(os.path.abspath(path)) == os.path.abspath(directory):
            path = os.path.basename(path)
        escaped = path.replace("\\", "\\\\").replace('"', '\\"')
        return f'{key}: "{escaped}"\n'

    text = entry("model_checkpoint_path", latest)
    text += "".join(entry("all_model_checkpoint_paths", path) for path in paths)
    atomic_write(os.path.join(directory, INDEX_FILENAME), lambda f: f.write(text.encode()))


def read_index(directory: str) -> tuple[str | None, list[str]] | None:
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
