"""Checkpoint files: the ``checkpoint`` index, numbered files and ``latest_checkpoint``.

Nothing here needs torch, nor ``Checkpoint``: ``Checkpoint`` writes its files with these helpers
and ``CheckpointManager`` (``feedline.train.checkpoint_management``) numbers, lists and prunes
them. The index file is TensorFlow's text format: ``model_checkpoint_path: "..."`` and one
``all_model_checkpoint_paths: "..."`` line per kept checkpoint.

Every path may be a local path or a URL of the file-system layer (``feedline._fs``: ``s3://``,
``gs://``, ``memory://``, ``file://``, ...). Each file is published whole (``atomic_write``):
locally through a temporary file and a rename, on S3 as one multipart upload completed at the
end, on other object stores through a temporary key and a copy, so that a reader, or a process
restarted after a writer was killed, sees either the whole new file or none of it. A
checkpoint's index is written after its file, so the index never names a file that is not
complete.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

from feedline import _fs
from feedline.errors import FailedPreconditionError

__all__ = [
    "INDEX_FILENAME",
    "IndexState",
    "PathLike",
    "atomic_write",
    "basename",
    "dirname",
    "file_version",
    "highest_number",
    "is_dir",
    "is_file",
    "join",
    "latest_checkpoint",
    "number_of",
    "read_index",
    "read_index_state",
    "remove",
    "same_directory",
    "tidy",
    "write_index",
]

PathLike = str | os.PathLike[str]

INDEX_FILENAME = "checkpoint"

_NUMBERED = re.compile(r"(.+)-(\d+)")
_INDEX_LINE = re.compile(r'\s*(\w+)\s*:\s*"((?:[^"\\]|\\.)*)"\s*')
_TIME_LINE = re.compile(
    r"\s*(all_model_checkpoint_timestamps|last_preserved_timestamp)\s*:\s*(\S+)\s*"
)
_OPERATION = "checkpoint"
# Checkpoints of format version 1 are torch.save archives: zip files.
_ZIP_MAGIC = b"PK\x03\x04"


def join(directory: str, name: str) -> str:
    """``name`` in ``directory`` (a local path or a URL)."""
    return _fs.join(directory, name) if directory else name


def dirname(path: str) -> str:
    """The directory of ``path`` (``s3://bucket/run`` for ``s3://bucket/run/ckpt-1``)."""
    if "://" not in path:
        return os.path.dirname(path)
    return path.rstrip("/").rpartition("/")[0]


def basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] if "://" in path else os.path.basename(path)


def _directory_key(directory: str) -> str:
    """What tells two spellings of one directory apart: absolute locally, as written otherwise."""
    local = _fs.local_path(directory)
    if local is not None:
        return os.path.abspath(local or ".")
    return directory.rstrip("/")


def same_directory(first: str, second: str) -> bool:
    """Whether directories ``first`` and ``second`` are the same place."""
    return _directory_key(first) == _directory_key(second)


def is_file(path: str) -> bool:
    """Whether a complete file exists at ``path``."""
    return _fs.file_info(path, _OPERATION) is not None


def is_dir(path: str) -> bool:
    """Whether ``path`` is a directory (on a store: a prefix with objects under it)."""
    local = _fs.local_path(path)
    if local is not None:
        return os.path.isdir(local or ".")
    fs, inner = _fs.filesystem(path)
    with _fs.translate_errors(path, _OPERATION):
        return bool(fs.isdir(inner))


def file_version(path: str) -> Any:
    """What changes when ``path`` is written again (its modification time, ETag or
    generation); None where there is no file."""
    info = _fs.file_info(path, _OPERATION)
    return None if info is None else info["version"]


def remove(path: str) -> None:
    """Deletes ``path``; nothing if it is already gone."""
    _fs.remove_file(path, _OPERATION)


def latest_checkpoint(
    checkpoint_dir: PathLike,
    latest_filename: str | None = None,
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> str | None:
    """The path of the newest checkpoint in ``checkpoint_dir``, or None if there is none.

    Reads the directory's ``checkpoint`` index; without one (or when the file it names is
    gone), falls back to the highest-numbered ``{prefix}-{n}`` file that is a feedline
    checkpoint (other files of such names are passed over). ``checkpoint_dir`` may be
    a URL (``s3://bucket/run``); the path returned is then a URL too. ``latest_filename``: the
    index's name, ``checkpoint`` by default (TensorFlow's argument). ``storage_options``: the
    file system's arguments, as ``Checkpoint.save`` takes them.
    """
    options = _fs.check_storage_options(storage_options, "latest_checkpoint")
    with _fs.with_storage_options(options):
        return _latest(_fs.as_url(checkpoint_dir), latest_filename or INDEX_FILENAME)


def _latest(directory: str, index_name: str = INDEX_FILENAME) -> str | None:
    index = read_index(directory, index_name)
    if index is not None and index[0] is not None and is_file(index[0]):
        return index[0]
    candidates: list[tuple[int, Any, str]] = []
    for name in _fs.list_names(directory, _OPERATION):
        match = _NUMBERED.fullmatch(name)
        if not match or name.startswith("."):
            continue
        path = join(directory, name)
        version = file_version(path)
        if version is not None:
            # Ties of number (ckpt-3 of two prefixes) go to the later file where times compare.
            candidates.append(
                (int(match[2]), version if isinstance(version, int | float) else 0, path)
            )
    for _, _, path in sorted(candidates, reverse=True):
        if _is_checkpoint(path):
            return path
    return None


def _is_checkpoint(path: str) -> bool:
    """Whether ``path`` starts as a feedline checkpoint does (either format version)."""
    from feedline.train._checkpoint_format import MAGIC  # torch: only where there is no index

    fs, inner = _fs.filesystem(path)
    with _fs.translate_errors(path, _OPERATION), fs.open(inner, "rb", block_size=4096) as file:
        head = file.read(len(MAGIC))
    return head.startswith(MAGIC) or head.startswith(_ZIP_MAGIC)


def atomic_write(path: str, write: Callable[[BinaryIO], object]) -> None:
    """Calls ``write(file)`` and publishes the file at ``path`` only once it is complete
    (``feedline._fs.write_whole``); the directory is made where needed."""
    _fs.write_whole(path, write, _OPERATION)


def number_of(path: str, prefix: str) -> int | None:
    """``n`` if ``path`` is ``{prefix}-{n}`` (in the prefix's directory), else None."""
    if not same_directory(dirname(path), dirname(prefix)):
        return None
    match = _NUMBERED.fullmatch(basename(path))
    return int(match[2]) if match and match[1] == basename(prefix) else None


def highest_number(prefix: str) -> int:
    """The highest ``n`` of the ``{prefix}-{n}`` files that exist (0 if none)."""
    directory = dirname(prefix)
    names = _fs.list_names(directory, _OPERATION)
    numbers = [number_of(join(directory, name), prefix) for name in names]
    return max((n for n in numbers if n is not None), default=0)


def tidy(directory: str, prefix_name: str) -> None:
    """Removes what a writer killed mid-save left behind in ``directory``: hidden temporary
    files of checkpoints named ``{prefix_name}-*`` (nothing restores them)."""
    for name in _fs.list_names(directory, _OPERATION):
        if name.startswith(f".{prefix_name}-") and name.endswith(".tmp"):
            remove(join(directory, name))


def write_index(
    directory: str,
    latest: str,
    paths: list[str],
    times: list[float] | None = None,
    last_preserved: float | None = None,
) -> None:
    """Writes TensorFlow's ``checkpoint`` text file; paths in ``directory`` are relative.
    ``times`` (each path's save time) and ``last_preserved`` (the time of the last checkpoint
    kept for ``keep_checkpoint_every_n_hours``) are TensorFlow's timestamp fields."""
    directory = directory or "."

    def entry(key: str, path: str) -> str:
        if same_directory(dirname(path), directory):
            path = basename(path)
        escaped = path.replace("\\", "\\\\").replace('"', '\\"')
        return f'{key}: "{escaped}"\n'

    text = entry("model_checkpoint_path", latest)
    text += "".join(entry("all_model_checkpoint_paths", path) for path in paths)
    text += "".join(f"all_model_checkpoint_timestamps: {t!r}\n" for t in times or ())
    if last_preserved is not None:
        text += f"last_preserved_timestamp: {last_preserved!r}\n"
    atomic_write(join(directory, INDEX_FILENAME), lambda f: f.write(text.encode()))


@dataclasses.dataclass(frozen=True)
class IndexState:
    """What a ``checkpoint`` index holds: the latest checkpoint, every listed one (paths joined
    to the directory), their save times (in the listed order; empty where the index has none)
    and the last preserved time (None where it has none)."""

    latest: str | None
    paths: list[str]
    times: list[float]
    last_preserved: float | None


def read_index_state(directory: str, index_name: str = INDEX_FILENAME) -> IndexState | None:
    """``directory``'s index, or None without one."""
    url = join(directory or ".", index_name)
    try:
        # One request on a store: an index that saves keep replacing is read whole, old or new.
        data = _fs.read_small(url, _OPERATION)
    except (FileNotFoundError, FailedPreconditionError):  # no index, or not a directory
        return None
    latest: str | None = None
    paths: list[str] = []
    times: list[float] = []
    last: float | None = None
    for line in data.decode("utf-8").splitlines():
        match = _INDEX_LINE.fullmatch(line)
        if match is not None:
            path = join(directory, re.sub(r"\\(.)", r"\1", match[2]))
            if match[1] == "model_checkpoint_path":
                latest = path
            elif match[1] == "all_model_checkpoint_paths":
                paths.append(path)
            continue
        timed = _TIME_LINE.fullmatch(line)
        if timed is None:
            continue
        try:
            value = float(timed[2])
        except ValueError:
            continue
        if timed[1] == "last_preserved_timestamp":
            last = value
        else:
            times.append(value)
    return IndexState(latest, paths, times, last)


def read_index(
    directory: str, index_name: str = INDEX_FILENAME
) -> tuple[str | None, list[str]] | None:
    """(latest, all) from ``directory``'s index, paths joined to it; None without an index."""
    state = read_index_state(directory, index_name)
    return None if state is None else (state.latest, state.paths)
