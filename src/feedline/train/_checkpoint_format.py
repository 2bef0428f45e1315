"""Checkpoint files of format version 2: sections with a CRC-32C each, and one for the file.

A checkpoint's state (``{"format", "version", "save_counter", "objects"}``) is written as::

    HEAD      b"FLCKPT\\r\\n", uint32 version                                   (12 bytes)
    sections  back to back: the pickled state with its tensors left out, then
              the bytes of each tensor (and each numeric NumPy array), C order
    TOC       JSON: {"sections": [{"name", "offset", "length", "crc32c", ...}]}
    TAIL      uint64 toc offset, uint64 toc length, uint32 CRC-32C of the TOC,
              uint32 CRC-32C of every byte before the tail, b"FLCKEND\\n"      (32 bytes)

(little-endian; the CRC-32C of TFRecord, ``google_crc32c``, unmasked). Each tensor section
names the tensor by its path in the state (``model.1.weight``,
``optimizer.state.2.exp_avg_sq``) with its dtype and shape. ``load`` checks the tail, the TOC,
every section and the whole file before it unpickles anything: a flipped bit or overwritten
bytes are a ``DataLossError`` that names the file, the tensor (or part) and its byte range,
never a value. The pickled part still runs code when loaded, as ``torch.load`` does: restore
only files from a trusted source.

Example:
  >>> import io, torch
  >>> buffer = io.BytesIO()
  >>> dump({"w": torch.ones(2)}, buffer)
  >>> buffer.getvalue()[:8]
  b'FLCKPT\\r\\n'
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import struct
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

import google_crc32c
import numpy as np
import torch

from feedline import _fs
from feedline.errors import DataLossError

__all__ = ["MAGIC", "VERSION", "dump", "load", "read_version"]

MAGIC = b"FLCKPT\r\n"
VERSION = 2
_HEAD = struct.Struct("<8sI")
_TAIL = struct.Struct("<QQII8s")
_END = b"FLCKEND\n"
_STATE = "the pickled state"
_PLAIN_KINDS = frozenset("biufc")
_CHUNK = 1 << 20


def read_version(path: str) -> int | None:
    """The format version in ``path``'s header; None when the file is not of this format.
    ``path`` may be a URL of the file-system layer (``s3://...``).

    Raises:
      DataLossError: the file is empty or a cut-off header, or its header is damaged (it ends
        as a checkpoint of this format does).
      NotFoundError: there is no file at ``path``.
    """
    with _opened(path, block_size=64 << 10) as (file, size):  # two small reads
        head = file.read(_HEAD.size)
        file.seek(max(0, size - len(_END)))
        end = file.read()
    if len(head) < _HEAD.size and MAGIC.startswith(head[: len(MAGIC)]):
        raise _damaged(path, f"it is {size} bytes long: a checkpoint cut short (truncated)", 0)
    if head.startswith(MAGIC):
        return int(_HEAD.unpack(head)[1])
    if end == _END:
        raise _damaged(path, f"its header (bytes 0-{_HEAD.size}) is damaged", 0)
    return None


@contextlib.contextmanager
def _opened(path: str, block_size: int = 8 << 20) -> Iterator[tuple[Any, int]]:
    """``path`` open for reading, and its size: a local file, or an object of a store read in
    ranged requests of ``block_size`` bytes that are made again after transient failures
    (``feedline._fs.RemoteReader``)."""
    local = _fs.local_path(path)
    if local is not None:
        with _fs.translate_errors(path, "restoring a checkpoint"), open(local, "rb") as file:
            yield file, os.fstat(file.fileno()).st_size
        return
    reader = _fs.RemoteReader(path, 0, "restoring a checkpoint", block_size=block_size)
    try:
        yield reader, reader.size
    finally:
        reader.close()


def _read_into(file: Any, buffer: bytearray) -> int:
    """Fills ``buffer`` from ``file``; the number of bytes read (fewer at the end of file)."""
    if hasattr(file, "readinto"):
        return int(file.readinto(buffer))
    view = memoryview(buffer)
    filled = 0
    while filled < len(view):
        data = file.read(min(len(view) - filled, 8 << 20))
        if not data:
            break
        view[filled : filled + len(data)] = data
        filled += len(data)
    return filled


def dump(state: Any, file: BinaryIO) -> None:
    """Writes ``state`` to ``file`` in format version 2 (see the module docstring)."""
    refs: list[torch.Tensor | np.ndarray] = []
    index: dict[int, int] = {}

    class _Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if not _is_plain(obj):
                return None
            if id(obj) not in index:
                index[id(obj)] = len(refs)
                refs.append(obj)
            return ("tensor", index[id(obj)])

    skeleton = io.BytesIO()
    _Pickler(skeleton, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
    names = _names(state)
    head = _HEAD.pack(MAGIC, VERSION)
    file.write(head)
    whole = _crc(head)
    offset = len(head)
    sections: list[dict[str, Any]] = []
    parts: list[tuple[dict[str, Any], Any]] = [({"name": _STATE}, skeleton.getbuffer())]
    for number, value in enumerate(refs):
        entry: dict[str, Any] = {"name": names.get(id(value), f"tensor {number}")}
        parts.append((entry, _describe(value, entry)))
    for entry, data in parts:
        view = memoryview(data).cast("B")
        file.write(view)
        entry.update(offset=offset, length=len(view), crc32c=_crc(view))
        whole = _crc(view, whole)
        offset += len(view)
        sections.append(entry)
    toc = json.dumps({"sections": sections}, separators=(",", ":")).encode()
    file.write(toc)
    whole = _crc(toc, whole)
    file.write(_TAIL.pack(offset, len(toc), _crc(toc), whole, _END))


def load(path: str) -> Any:
    """The state in the version-2 file ``path`` (a local path or a URL), every checksum verified
    first.

    Raises:
      DataLossError: the file is truncated or any part of it fails its checksum; the error's
        ``filename`` is ``path`` and its ``offset`` where the damaged part starts.
    """
    with _opened(path) as (file, size):
        if size < _HEAD.size + _TAIL.size:
            raise _damaged(path, f"it is {size} bytes long, shorter than any checkpoint", 0)
        head = file.read(_HEAD.size)
        file.seek(size - _TAIL.size)
        toc_offset, toc_length, toc_crc, whole_crc, end = _TAIL.unpack(file.read(_TAIL.size))
        if end != _END or toc_offset < _HEAD.size or toc_offset + toc_length != size - _TAIL.size:
            raise _damaged(
                path,
                f"its trailer (bytes {size - _TAIL.size}-{size}) is damaged, or the file is "
                "truncated",
                size - _TAIL.size,
            )
        file.seek(toc_offset)
        toc = file.read(toc_length)
        if _crc(toc) != toc_crc:
            raise _damaged(
                path,
                f"its table of contents (bytes {toc_offset}-{toc_offset + toc_length}) fails its "
                "CRC-32C checksum",
                toc_offset,
            )
        sections = _sections(path, toc, toc_offset)
        file.seek(_HEAD.size)
        whole = _crc(head)
        buffers: list[bytearray] = []
        for entry in sections:
            buffer = bytearray(entry["length"])
            if _read_into(file, buffer) != len(buffer):
                raise _damaged(path, f"{_what(entry)} is cut short", entry["offset"])
            found = _crc(buffer)
            if found != entry["crc32c"]:
                raise _damaged(
                    path,
                    f"{_what(entry)} fails its CRC-32C checksum (stored {entry['crc32c']:#010x}, "
                    f"computed {found:#010x})",
                    entry["offset"],
                )
            whole = _crc(buffer, whole)
            buffers.append(buffer)
    whole = _crc(toc, whole)
    if whole != whole_crc:
        raise _damaged(path, f"its header (bytes 0-{_HEAD.size}) or trailer is damaged", 0)
    pairs = zip(sections[1:], buffers[1:], strict=True)
    values = [_rebuild(entry, buffer) for entry, buffer in pairs]

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            return values[pid[1]]

    return _Unpickler(io.BytesIO(buffers[0])).load()


def _crc(data: Any, crc: int | None = None) -> int:
    """The CRC-32C of ``data`` (any buffer), continuing ``crc`` if given. ``google_crc32c``
    takes ``bytes`` only: large buffers go through it in ``_CHUNK`` pieces."""
    view = memoryview(data).cast("B")
    value = 0 if crc is None else crc
    for start in range(0, len(view), _CHUNK):
        value = google_crc32c.extend(value, bytes(view[start : start + _CHUNK]))
    return int(value)


def _damaged(path: str, what: str, offset: int) -> DataLossError:
    return DataLossError(
        f"checkpoint {path} is damaged: {what}. Nothing was restored; restore an earlier "
        "checkpoint (CheckpointManager keeps several)",
        filename=path,
        offset=offset,
    )


def _what(entry: Mapping[str, Any]) -> str:
    start, end = entry["offset"], entry["offset"] + entry["length"]
    if entry["name"] == _STATE:
        return f"{_STATE} (bytes {start}-{end})"
    return (
        f"tensor {entry['name']!r} ({entry['dtype']}, shape {tuple(entry['shape'])}, bytes "
        f"{start}-{end})"
    )


def _sections(path: str, toc: bytes, toc_offset: int) -> list[dict[str, Any]]:
    """The TOC's sections, checked to tile the file from the head to the TOC."""
    try:
        sections = json.loads(toc)["sections"]
        offset = _HEAD.size
        for entry in sections:
            if entry["offset"] != offset or entry["length"] < 0:
                raise ValueError(f"section {entry['name']!r} is not where the previous ends")
            offset += entry["length"]
        if offset != toc_offset or not sections or sections[0]["name"] != _STATE:
            raise ValueError("the sections do not fill the file")
    except (ValueError, KeyError, TypeError) as error:
        raise _damaged(path, f"its table of contents does not read ({error})", toc_offset) from None
    return list(sections)


def _is_plain(obj: Any) -> bool:
    """A dense tensor or numeric array, saved as a section of its own."""
    if type(obj) in (torch.Tensor, torch.nn.Parameter):
        return (
            obj.layout == torch.strided
            and not obj.is_quantized
            and not obj.is_nested
            and obj.device.type != "meta"
        )
    return type(obj) is np.ndarray and obj.dtype.kind in _PLAIN_KINDS and obj.dtype.names is None


def _describe(value: torch.Tensor | np.ndarray, entry: dict[str, Any]) -> np.ndarray:
    """Fills ``entry`` with what rebuilds ``value``; returns its bytes as a uint8 array."""
    if isinstance(value, np.ndarray):
        entry.update(kind="ndarray", dtype=value.dtype.str, shape=list(value.shape))
        return np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    entry.update(
        kind="tensor",
        dtype=str(value.dtype).removeprefix("torch."),
        shape=list(value.shape),
        requires_grad=value.requires_grad,
        parameter=isinstance(value, torch.nn.Parameter),
    )
    flat = value.detach().resolve_conj().resolve_neg().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy()


def _rebuild(entry: Mapping[str, Any], buffer: bytearray) -> torch.Tensor | np.ndarray:
    shape = tuple(entry["shape"])
    if entry["kind"] == "ndarray":
        return np.frombuffer(buffer, dtype=np.dtype(entry["dtype"])).reshape(shape)
    dtype = getattr(torch, entry["dtype"])
    if not buffer:
        tensor = torch.empty(shape, dtype=dtype)
    else:
        tensor = torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).reshape(shape)
    if entry["parameter"]:
        return torch.nn.Parameter(tensor, requires_grad=entry["requires_grad"])
    return tensor.requires_grad_(entry["requires_grad"])


def _names(state: Any) -> dict[int, str]:
    """The dotted path of every tensor and array reachable through dicts, lists and tuples
    (a nested checkpoint's ``objects`` leave no ``objects.`` in the path)."""
    names: dict[int, str] = {}
    pending: list[tuple[str, Any]] = [("", state)]
    while pending:
        path, value = pending.pop()
        if _is_plain(value):
            names.setdefault(id(value), path or "the state")
            continue
        if isinstance(value, Mapping):
            if "objects" in value and "format" in value:
                value = value["objects"]
            children = list(value.items()) if isinstance(value, Mapping) else []
        elif isinstance(value, list | tuple):
            children = list(enumerate(value))
        else:
            continue
        for key, child in reversed(children):
            pending.append((f"{path}.{key}" if path else str(key), child))
    return names
