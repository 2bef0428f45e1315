"""File access of ``save``, ``load`` and ``snapshot``: every open, rename, list and delete.

Paths are strings: local paths, or URLs of the file-system layer (``feedline._fs``: ``s3://``,
``gs://``, ``memory://``, ...). Everything the snapshot format does to files goes through these
few functions. A file is published with ``write_atomic`` so that a reader sees either nothing or
the whole file: locally it is written under a temporary name, then renamed; on an object store
it is one upload, which the store makes visible only once it is complete (no rename needed).
"""

from __future__ import annotations

import os
import shutil
import uuid

from feedline import _fs


def _local(path: str) -> bool:
    return _fs.is_local(path) and not path.startswith("file://")


def join(*parts: str) -> str:
    return _fs.join(*parts)


def exists(path: str) -> bool:
    if _local(path):
        return os.path.exists(path)
    fs, inner = _fs.filesystem(path)
    with _fs.translate_errors(path, "snapshot"):
        fs.invalidate_cache(inner)  # another process may have written it since a listing
        return bool(fs.exists(inner))


def is_dir(path: str) -> bool:
    if _local(path):
        return os.path.isdir(path)
    fs, inner = _fs.filesystem(path)
    with _fs.translate_errors(path, "snapshot"):
        return bool(fs.isdir(inner))


def makedirs(path: str) -> None:
    if _local(path):
        os.makedirs(path, exist_ok=True)
        return
    fs, inner = _fs.filesystem(path)
    with _fs.translate_errors(path, "snapshot"):
        fs.makedirs(inner, exist_ok=True)


def listdir(path: str) -> list[str]:
    """The names in directory ``path``, sorted; empty where it does not exist."""
    if _local(path):
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []
    fs, inner = _fs.filesystem(path)
    try:
        with _fs.translate_errors(path, "snapshot"):
            entries = fs.ls(inner, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    return sorted({entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries} - {""})


def read_bytes(path: str) -> bytes:
    """The contents of ``path``; FileNotFoundError where it does not exist."""
    if _local(path):
        with open(path, "rb") as f:
            return f.read()
    fs, inner = _fs.filesystem(path)
    with _fs.translate_errors(path, "snapshot"):
        fs.invalidate_cache(inner)  # another process may have written it since a listing
        return bytes(fs.cat_file(inner))


def write_atomic(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` so that ``path`` appears only once complete."""
    if not _local(path):
        fs, inner = _fs.filesystem(path)
        with _fs.translate_errors(path, "snapshot"):
            fs.pipe_file(inner, data)
        return
    temp = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(temp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


def remove(path: str) -> None:
    """Removes the file ``path`` where it exists."""
    try:
        if _local(path):
            os.remove(path)
            return
        fs, inner = _fs.filesystem(path)
        with _fs.translate_errors(path, "snapshot"):
            fs.rm_file(inner)
    except FileNotFoundError:
        return


def remove_tree(path: str) -> None:
    """Removes the directory ``path`` and everything in it, where it exists."""
    if _local(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    fs, inner = _fs.filesystem(path)
    try:
        with _fs.translate_errors(path, "snapshot"):
            fs.rm(inner, recursive=True)
    except FileNotFoundError:
        return
