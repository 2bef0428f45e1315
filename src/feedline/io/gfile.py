"""``feedline.io.gfile``: TensorFlow's ``tf.io.gfile`` on the one file-system layer (fsspec), so
the same calls work on local paths, ``memory://`` and object stores (``s3://``, ``gs://``, ...).

Behaviour follows TensorFlow 2.21's: ``mkdir`` and ``makedirs`` of an existing directory do
nothing, ``remove`` of a directory is a ``FailedPreconditionError``, ``rename`` and ``copy``
onto an existing file are ``AlreadyExistsError`` unless ``overwrite=True``, ``walk`` of a missing
directory yields nothing, ``listdir`` gives names (no path) and ``glob`` full paths, a path that
does not exist is ``NotFoundError`` naming it.

Example:
  >>> import tempfile
  >>> from feedline.io import gfile
  >>> root = gfile.join(tempfile.mkdtemp(), "run")
  >>> gfile.makedirs(gfile.join(root, "ckpt"))
  >>> with gfile.GFile(gfile.join(root, "notes.txt"), "w") as f:
  ...     _ = f.write("hello\\n")
  >>> sorted(gfile.listdir(root)), gfile.GFile(gfile.join(root, "notes.txt")).read()
  (['ckpt', 'notes.txt'], 'hello\\n')
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import IO, Any

from feedline import _fs
from feedline.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)

__all__ = [
    "FileStatistics",
    "GFile",
    "copy",
    "exists",
    "glob",
    "isdir",
    "join",
    "listdir",
    "makedirs",
    "mkdir",
    "remove",
    "rename",
    "rmtree",
    "stat",
    "walk",
]

join = _fs.join

_MODES = ("r", "w", "a", "r+", "w+", "a+")


class GFile:
    """A file on any file system, as ``tf.io.gfile.GFile``: ``mode`` is ``"r"``, ``"w"``,
    ``"a"`` (or with ``+``), with ``"b"`` for bytes; text is UTF-8.

    Opened when first used, as TensorFlow's; a context manager and an iterator of lines. As in
    TensorFlow, text mode is the file's bytes decoded: lines end at ``\n`` only and nothing is
    translated, ``seek`` and ``tell`` count bytes (relative to the current position or the end
    too), and ``write`` takes ``str`` or ``bytes`` in either mode.
    """

    def __init__(self, name: Any, mode: str = "r") -> None:
        base = mode.replace("b", "")
        if base not in _MODES:
            raise InvalidArgumentError(
                f"GFile: mode {mode!r} is not 'r' or 'w' or 'a' or 'r+' or 'w+' or 'a+' "
                "(with 'b' for bytes)"
            )
        self.name = _fs.as_url(name)
        self.mode = mode
        self._binary = "b" in mode
        self._file: IO[Any] | None = None

    def _open(self) -> IO[Any]:
        if self._file is None:
            fs, path = _fs.filesystem(self.name)
            with _fs.translate_errors(self.name, "GFile"):
                self._file = fs.open(path, self.mode.replace("b", "") + "b")
        return self._file

    def _value(self, data: bytes) -> Any:
        """What a read gives: ``bytes`` in binary mode, else the UTF-8 text."""
        return data if self._binary else data.decode("utf-8")

    def _readable(self) -> IO[Any]:
        if self.mode.replace("b", "") in ("w", "a"):
            raise PermissionDeniedError(f"GFile: {self.name!r} isn't open for reading")
        return self._open()

    def _writable(self) -> IO[Any]:
        if self.mode.replace("b", "") == "r":
            raise PermissionDeniedError(f"GFile: {self.name!r} isn't open for writing")
        return self._open()

    def read(self, n: int = -1) -> Any:
        """``n`` bytes (all with -1), as ``bytes`` or, in text mode, decoded."""
        with _fs.translate_errors(self.name, "GFile.read"):
            return self._value(self._readable().read(n))

    def readline(self) -> Any:
        with _fs.translate_errors(self.name, "GFile.readline"):
            return self._value(self._readable().readline())

    def readlines(self) -> list[Any]:
        with _fs.translate_errors(self.name, "GFile.readlines"):
            return [self._value(line) for line in self._readable().readlines()]

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def write(self, data: Any) -> None:
        """Appends ``data``: ``str`` (written as UTF-8) or bytes-like, in either mode."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        with _fs.translate_errors(self.name, "GFile.write"):
            self._writable().write(raw)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._open().seek(offset, whence)

    def tell(self) -> int:
        return self._open().tell()

    def size(self) -> int:
        """The file's size in bytes."""
        return stat(self.name).length

    def flush(self) -> None:
        if self._file is not None:
            with _fs.translate_errors(self.name, "GFile.flush"):
                self._file.flush()

    def close(self) -> None:
        """Closes the file; for an object store, this is when a written object is stored."""
        if self._file is not None:
            file, self._file = self._file, None
            with _fs.translate_errors(self.name, "GFile.close"):
                file.close()

    def seekable(self) -> bool:
        return True

    def __enter__(self) -> GFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclasses.dataclass(frozen=True)
class FileStatistics:
    """What ``stat`` gives: the size in bytes, the modification time in nanoseconds since the
    epoch (0 where the store keeps none), and whether the path is a directory."""

    length: int
    mtime_nsec: int
    is_directory: bool


def _on(path: Any) -> tuple[Any, str, str]:
    url = _fs.as_url(path)
    fs, inner = _fs.filesystem(url)
    return fs, inner, url


def exists(path: Any) -> bool:
    """Whether ``path`` (a file or a directory) exists."""
    fs, inner, url = _on(path)
    with _fs.translate_errors(url, "exists"):
        return bool(fs.exists(inner))


def isdir(path: Any) -> bool:
    """Whether ``path`` is a directory."""
    fs, inner, url = _on(path)
    with _fs.translate_errors(url, "isdir"):
        return bool(fs.isdir(inner))


def glob(pattern: Any) -> list[str]:
    """The paths that match ``pattern`` (``*``, ``?``, ``[...]``), or any of an iterable of
    patterns, sorted; an empty list when none does. As in TensorFlow, a relative local pattern
    gives paths relative to the working directory (``sub/*.py``: ``sub/a.py``), other patterns
    full paths or URLs."""
    if not isinstance(pattern, str | bytes | os.PathLike):
        return sorted({path for one in pattern for path in glob(one)})
    fs, inner, url = _on(pattern)
    with _fs.translate_errors(url, "glob"):
        found = [_fs.unstrip(fs, p, url) for p in fs.glob(inner)]
    if _fs.split_protocol(url)[0] is None and not os.path.isabs(url):
        found = [os.path.relpath(path) for path in found]
    return sorted(found)


def listdir(path: Any) -> list[str]:
    """The names (not paths) of the entries of the directory ``path``.

    Raises:
      NotFoundError: ``path`` is not a directory.
    """
    fs, inner, url = _on(path)
    with _fs.translate_errors(url, "listdir"):
        if not fs.isdir(inner):
            raise NotFoundError(f"listdir: could not find directory {url!r}", name=url)
        names = [entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(inner, detail=False)]
    return sorted(name for name in names if name)


def makedirs(path: Any) -> None:
    """Makes the directory ``path`` and its missing parents; nothing if it exists."""
    fs, inner, url = _on(path)
    with _fs.translate_errors(url, "makedirs"):
        fs.makedirs(inner, exist_ok=True)


def mkdir(path: Any) -> None:
    """Makes the directory ``path`` (its parent must exist); nothing if it exists.

    Raises:
      NotFoundError: the parent directory does not exist.
    """
    fs, inner, url = _on(path)
    with _fs.translate_errors(url, "mkdir"):
        if fs.isdir(inner):
            return
        parent = inner.rstrip("/").rsplit("/", 1)[0] if "/" in inner.rstrip("/") else ""
        if parent and not fs.isdir(parent) and _fs.is_local(url):
            raise NotFoundError(f"mkdir: the parent of {url!r} does not exist", name=url)
        fs.mkdir(inner, create_parents=False)


def remove(path: Any) -> None:
    """Deletes the file ``path``.

    Raises:
      NotFoundError: it does not exist.
      FailedPreconditionError: it is a directory (use ``rmtree``).
    """
    fs, inner, url = _on(path)
    with _fs.translate_errors(url, "remove"):
        if fs.isdir(inner):
            raise FailedPreconditionError(f"remove: {url!r} is a directory; use rmtree")
        if not fs.exists(inner):
            raise NotFoundError(f"remove: {url!r} does not exist", name=url)
        fs.rm_file(inner)


def rmtree(path: Any) -> None:
    """Deletes ``path`` and everything under it.

    Raises:
      NotFoundError: it does not exist.
    """
    fs, inner, url = _on(path)
    with _fs.translate_errors(url, "rmtree"):
        if not fs.exists(inner):
            raise NotFoundError(f"rmtree: {url!r} not found", name=url)
        fs.rm(inner, recursive=True)


def _check_target(fs: Any, inner: str, url: str, overwrite: bool, operation: str) -> None:
    if not overwrite and fs.exists(inner):
        raise AlreadyExistsError(
            f"{operation}: {url!r} already exists; pass overwrite=True to replace it", name=url
        )


def rename(oldname: Any, newname: Any, overwrite: bool = False) -> None:
    """Moves ``oldname`` to ``newname`` (on one file system).

    Raises:
      AlreadyExistsError: ``newname`` exists and ``overwrite`` is False.
      NotFoundError: ``oldname`` does not exist.
    """
    fs, source, old_url = _on(oldname)
    target_fs, target, new_url = _on(newname)
    if type(target_fs) is not type(fs):
        raise InvalidArgumentError(
            f"rename: {old_url!r} and {new_url!r} are on different file systems; copy, then remove"
        )
    with _fs.translate_errors(new_url, "rename"):
        _check_target(fs, target, new_url, overwrite, "rename")
    with _fs.translate_errors(old_url, "rename"):
        fs.mv(source, target)


def copy(oldpath: Any, newpath: Any, overwrite: bool = False) -> None:
    """Copies the file ``oldpath`` to ``newpath``, across file systems too.

    Raises:
      AlreadyExistsError: ``newpath`` exists and ``overwrite`` is False.
      NotFoundError: ``oldpath`` does not exist.
    """
    fs, source, old_url = _on(oldpath)
    target_fs, target, new_url = _on(newpath)
    with _fs.translate_errors(new_url, "copy"):
        _check_target(target_fs, target, new_url, overwrite, "copy")
    with _fs.translate_errors(old_url, "copy"):
        if type(target_fs) is type(fs):
            fs.copy(source, target)
            return
        with fs.open(source, "rb") as src, target_fs.open(target, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)


def stat(path: Any) -> FileStatistics:
    """The size, modification time and kind of ``path``.

    Raises:
      NotFoundError: it does not exist.
    """
    fs, inner, url = _on(path)
    with _fs.translate_errors(url, "stat"):
        info = fs.info(inner)
    directory = info.get("type") == "directory"
    mtime = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
    if hasattr(mtime, "timestamp"):
        mtime = mtime.timestamp()
    return FileStatistics(
        length=0 if directory else int(info.get("size") or 0),
        mtime_nsec=int(float(mtime) * 1e9),
        is_directory=directory,
    )


def walk(
    top: Any, topdown: bool = True, onerror: Callable[[Exception], None] | None = None
) -> Iterator[tuple[str, list[str], list[str]]]:
    """``(directory, subdirectory names, file names)`` for ``top`` and every directory under
    it, parents first (``topdown``) or last; nothing for a missing ``top``."""
    fs, inner, url = _on(top)
    try:
        with _fs.translate_errors(url, "walk"):
            if not fs.isdir(inner):
                return
            entries = fs.ls(inner, detail=True)
    except Exception as error:
        if onerror is not None:
            onerror(error)
        return
    dirs = sorted(
        e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e["type"] == "directory"
    )
    files = sorted(
        e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e["type"] != "directory"
    )
    here = url.rstrip("/") if url.rstrip("/") else url
    if topdown:
        yield here, dirs, files
    for name in dirs:
        yield from walk(join(here, name), topdown, onerror)
    if not topdown:
        yield here, dirs, files
