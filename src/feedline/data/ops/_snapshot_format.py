"""The on-disk format of ``save``, ``load`` and ``snapshot`` (described in docs/snapshot_format.md).

A snapshot directory holds one finished *run* (one complete write) and a ``DONE`` marker::

    <path>/DONE                                       JSON, written last: names the finished run
    <path>/<run>/snapshot.metadata                    JSON, written first: element spec, codec
    <path>/<run>/shard_00000/chunk_00000000.flchunk   chunks, each renamed into place when complete

Every file is published whole (``_snapshot_fs.write_atomic``) and carries a CRC-32C that the
reader verifies: damage is a ``DataLossError``, never a wrong element. A directory without
``DONE`` is unfinished, whatever else it holds. A chunk is a header, the compressed payload and
its checksum; the payload holds groups of consecutive elements whose leaves have the same shapes
and dtypes, each group one ``.npy`` record per leaf (byte strings as lengths and bytes), as the
file cache stores them.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import importlib
import io
import json
import struct
import uuid
from typing import Any

import numpy as np

from feedline import structure
from feedline._tfrecord import masked_crc32c
from feedline.data.ops import _snapshot_fs as fs
from feedline.data.ops._cache_files import read_bytes_column, write_bytes_column
from feedline.errors import DataLossError, InvalidArgumentError, NotFoundError
from feedline.structure import TensorSpec

FORMAT = "feedline-snapshot-1"
DONE = "DONE"
METADATA = "snapshot.metadata"
CHUNK_SUFFIX = ".flchunk"
# A chunk holds at most this many elements, and is committed once it holds this many bytes.
CHUNK_ROWS = 1024
CHUNK_BYTES = 4 << 20

_MAGIC = b"FLCHUNK1"
# magic, codec, element count, raw (uncompressed) length, payload length
_HEADER = struct.Struct("<8sB3xIQQ")
_CRC = struct.Struct("<I")

# -- codecs ---------------------------------------------------------------------------------

_CODECS = ("NONE", "GZIP", "LZ4", "SNAPPY")
_CODEC_IDS = {name: index for index, name in enumerate(_CODECS)}


def _lz4() -> Any:
    import lz4.frame

    return lz4.frame


def _snappy() -> Any:
    try:
        return importlib.import_module("snappy")
    except ImportError:
        raise InvalidArgumentError(
            "compression 'SNAPPY' needs the python-snappy package, which is not installed; "
            f"install it or use one of {_supported()}"
        ) from None


def _supported() -> str:
    return "None, 'NONE', 'GZIP', 'LZ4', 'SNAPPY' (with python-snappy)"


def resolve_codec(value: Any, operation: str, allow_auto: bool = False) -> str:
    """``value`` as one of NONE, GZIP, LZ4, SNAPPY; AUTO (snapshot's default) is LZ4."""
    if value is None or value == "":
        return "NONE"
    name = value.upper() if isinstance(value, str) else None
    if name == "AUTO" and allow_auto:
        return "LZ4"
    if name == "SNAPPY":
        _snappy()
    if name not in _CODECS:
        auto = ", 'AUTO'" if allow_auto else ""
        raise InvalidArgumentError(
            f"{operation}: unsupported compression {value!r}; supported: {_supported()}{auto}"
        )
    return name


def _compress(codec: str, raw: bytes) -> bytes:
    if codec == "GZIP":
        return gzip.compress(raw, compresslevel=6, mtime=0)
    if codec == "LZ4":
        return bytes(_lz4().compress(raw))
    if codec == "SNAPPY":
        return bytes(_snappy().compress(raw))
    return raw


def _decompress(codec: str, payload: bytes) -> bytes:
    if codec == "GZIP":
        return gzip.decompress(payload)
    if codec == "LZ4":
        return bytes(_lz4().decompress(payload))
    if codec == "SNAPPY":
        return bytes(_snappy().decompress(payload))
    return payload


# -- element specs as JSON --------------------------------------------------------------------


def spec_to_json(spec: Any) -> Any:
    """``spec`` (a nested structure of ``TensorSpec``) as plain JSON values."""
    if isinstance(spec, TensorSpec):
        dtype = {"O": "bytes", "U": "str"}.get(spec.dtype.kind, spec.dtype.str)
        shape = None if spec.shape is None else list(spec.shape)
        return {"spec": {"shape": shape, "dtype": dtype}}
    if spec is None:
        return {"none": None}
    if isinstance(spec, tuple) and hasattr(spec, "_fields"):
        cls = type(spec)
        return {
            "namedtuple": {
                "module": cls.__module__,
                "name": cls.__qualname__,
                "fields": list(spec._fields),
                "items": [spec_to_json(s) for s in spec],
            }
        }
    if isinstance(spec, tuple):
        return {"tuple": [spec_to_json(s) for s in spec]}
    if isinstance(spec, dict):
        return {"dict": [[key, spec_to_json(value)] for key, value in spec.items()]}
    raise InvalidArgumentError(f"cannot store an element spec component {spec!r}")


def spec_from_json(value: Any) -> Any:
    """The spec that ``spec_to_json`` wrote."""
    ((kind, body),) = value.items()
    if kind == "spec":
        dtype = {"bytes": structure.BYTES, "str": np.dtype("U")}.get(body["dtype"], body["dtype"])
        shape = body["shape"]
        return TensorSpec(None if shape is None else tuple(shape), dtype)
    if kind == "none":
        return None
    if kind == "tuple":
        return tuple(spec_from_json(s) for s in body)
    if kind == "dict":
        return {key: spec_from_json(s) for key, s in body}
    if kind == "namedtuple":
        return _namedtuple(body)(*(spec_from_json(s) for s in body["items"]))
    raise ValueError(f"unknown element spec node {kind!r}")


def _namedtuple(body: dict[str, Any]) -> Any:
    """The namedtuple class that was stored, or one of the same name and fields."""
    fields = tuple(body["fields"])
    try:
        found: Any = importlib.import_module(body["module"])
        for part in body["name"].split("."):
            found = getattr(found, part)
        if getattr(found, "_fields", None) == fields:
            return found
    except (ImportError, AttributeError):
        pass
    return collections.namedtuple(body["name"].rsplit(".", 1)[-1], fields)


# -- JSON files with a checksum -------------------------------------------------------------


def write_json(path: str, body: dict[str, Any]) -> None:
    text = json.dumps(body, sort_keys=True)
    record = {"body": body, "crc32c": masked_crc32c(text.encode())}
    fs.write_atomic(path, json.dumps(record, sort_keys=True).encode())


def read_json(path: str) -> dict[str, Any]:
    """The body of a JSON file ``write_json`` wrote; DataLossError where it is damaged."""
    data = fs.read_bytes(path)
    try:
        record = json.loads(data)
        body = record["body"]
        ok = record["crc32c"] == masked_crc32c(json.dumps(body, sort_keys=True).encode())
    except (ValueError, KeyError, TypeError) as error:
        raise DataLossError(f"{path} is damaged: {error}", filename=path) from error
    if not ok:
        raise DataLossError(f"{path} is damaged: its checksum does not match", filename=path)
    if body.get("format") != FORMAT:
        raise InvalidArgumentError(
            f"{path} is in format {body.get('format')!r}, but this version of feedline reads "
            f"{FORMAT!r}; write the dataset again with this version"
        )
    return dict(body)


# -- chunks ---------------------------------------------------------------------------------


def _encode(groups: list[list[list[np.ndarray]]]) -> bytes:
    """Groups of rows (each a list of leaves of the same shapes and dtypes) as ``.npy``
    records: per group, per leaf, the rows stacked."""
    out = io.BytesIO()
    for rows in groups:
        for column in zip(*rows, strict=True):
            stacked = np.stack(column)
            if stacked.dtype == structure.BYTES:
                write_bytes_column(out, stacked)
            else:
                np.lib.format.write_array(out, stacked, allow_pickle=False)
    return out.getvalue()


def _decode(raw: bytes, count: int, bytes_leaves: list[bool]) -> list[list[np.ndarray]]:
    """The columns of each group of ``_encode``'s output, ``count`` rows in all."""
    f = io.BytesIO(raw)
    groups: list[list[np.ndarray]] = []
    seen = 0
    while seen < count:
        columns = [
            read_bytes_column(f) if is_bytes else np.lib.format.read_array(f, allow_pickle=False)
            for is_bytes in bytes_leaves
        ]
        rows = {len(c) for c in columns}
        if len(rows) != 1 or 0 in rows:
            raise ValueError(f"a group's columns have {sorted(rows)} rows")
        groups.append(columns)
        seen += rows.pop()
    if seen != count or f.tell() != len(raw):
        raise ValueError(f"the chunk holds {seen} elements, its header says {count}")
    return groups


def write_chunk(path: str, codec: str, rows: list[list[np.ndarray]]) -> int:
    """Writes ``rows`` (each the leaves of one element) as a chunk file; returns its size."""
    groups: list[list[list[np.ndarray]]] = []
    kind: list[tuple[tuple[int, ...], np.dtype]] | None = None
    for leaves in rows:
        this = [(a.shape, a.dtype) for a in leaves]
        if this != kind:
            groups.append([])
            kind = this
        groups[-1].append(leaves)
    raw = _encode(groups)
    payload = _compress(codec, raw)
    header = _HEADER.pack(_MAGIC, _CODEC_IDS[codec], len(rows), len(raw), len(payload))
    data = b"".join(
        [
            header,
            _CRC.pack(masked_crc32c(header)),
            payload,
            _CRC.pack(masked_crc32c(payload)),
        ]
    )
    fs.write_atomic(path, data)
    return len(data)


def read_chunk(path: str, count: int, bytes_leaves: list[bool]) -> list[list[np.ndarray]]:
    """The columns of the groups of the chunk at ``path``, which must hold ``count`` elements.

    Raises:
      DataLossError: the file is missing, truncated or damaged.
    """
    try:
        data = fs.read_bytes(path)
    except FileNotFoundError:
        raise DataLossError(
            f"the snapshot chunk {path} is missing, though the snapshot's DONE file lists it; "
            "the snapshot is damaged: write it again",
            filename=path,
        ) from None
    start = _HEADER.size + _CRC.size
    if len(data) < start + _CRC.size:
        raise _damage(path, f"truncated to {len(data)} bytes", 0)
    header = data[: _HEADER.size]
    (header_crc,) = _CRC.unpack_from(data, _HEADER.size)
    if masked_crc32c(header) != header_crc:
        raise _damage(path, "its header's checksum does not match", 0)
    magic, codec_id, elements, raw_length, length = _HEADER.unpack(header)
    if magic != _MAGIC or codec_id >= len(_CODECS):
        raise _damage(path, "it is not a feedline snapshot chunk", 0)
    if len(data) != start + length + _CRC.size:
        raise _damage(
            path, f"it has {len(data)} bytes, its header says {start + length + _CRC.size}", start
        )
    payload = data[start : start + length]
    (payload_crc,) = _CRC.unpack_from(data, start + length)
    if masked_crc32c(payload) != payload_crc:
        raise _damage(path, "its data's checksum does not match", start)
    if elements != count:
        raise _damage(path, f"it holds {elements} elements, the DONE file says {count}", 0)
    try:
        raw = _decompress(_CODECS[codec_id], payload)
        if len(raw) != raw_length:
            raise ValueError(f"{len(raw)} bytes decompressed, {raw_length} expected")
        return _decode(raw, count, bytes_leaves)
    except Exception as error:  # a payload that passed its checksum but does not decode
        raise _damage(path, f"its data does not decode: {error}", start) from error


def _damage(path: str, what: str, offset: int) -> DataLossError:
    return DataLossError(
        f"the snapshot chunk {path} is damaged: {what}; write the snapshot again",
        filename=path,
        offset=offset,
    )


# -- the layout -----------------------------------------------------------------------------


def shard_dir(run_dir: str, shard: int) -> str:
    return fs.join(run_dir, f"shard_{shard:05d}")


def chunk_name(index: int) -> str:
    return f"chunk_{index:08d}{CHUNK_SUFFIX}"


@dataclasses.dataclass(frozen=True)
class ShardChunks:
    """The committed chunks of one shard of a run: file names and element counts."""

    shard: int
    chunks: tuple[tuple[str, int], ...]

    @property
    def elements(self) -> int:
        return sum(count for _, count in self.chunks)


@dataclasses.dataclass(frozen=True)
class Finished:
    """What ``DONE`` and the run's metadata say of a finished snapshot."""

    path: str
    run: str
    element_spec: Any
    codec: str
    sharding: str
    elements: int
    shards: tuple[ShardChunks, ...]

    @property
    def run_dir(self) -> str:
        return fs.join(self.path, self.run)


def is_finished(path: str) -> bool:
    return fs.exists(fs.join(path, DONE))


def read_finished(path: str, operation: str) -> Finished:
    """The finished snapshot at ``path``.

    Raises:
      NotFoundError: ``path`` holds no finished snapshot (none, or one still being written or
        whose writer stopped).
      DataLossError: its files are damaged.
    """
    done_path = fs.join(path, DONE)
    try:
        done = read_json(done_path)
    except FileNotFoundError:
        state = "does not exist" if not fs.exists(path) else "holds no finished snapshot"
        raise NotFoundError(
            f"{operation}: {path} {state}: its {DONE} file, written when a save completes, is "
            "missing (the save may still be running, or it stopped before the end; save the "
            "dataset again)",
            name=path,
        ) from None
    try:
        run = str(done["run"])
        meta = read_json(fs.join(path, run, METADATA))
        spec = spec_from_json(meta["element_spec"])
        shards = tuple(
            ShardChunks(int(s["shard"]), tuple((str(n), int(c)) for n, c in s["chunks"]))
            for s in done["shards"]
        )
        finished = Finished(
            path,
            run,
            spec,
            str(meta["codec"]),
            str(meta["sharding"]),
            int(done["elements"]),
            shards,
        )
    except FileNotFoundError as error:
        raise DataLossError(
            f"{operation}: {path} is damaged: {error.filename} is missing", filename=path
        ) from None
    except (KeyError, TypeError, ValueError) as error:
        if isinstance(error, InvalidArgumentError):
            raise
        raise DataLossError(f"{operation}: {path} is damaged: {error!r}", filename=path) from error
    if finished.elements != sum(s.elements for s in shards):
        raise DataLossError(
            f"{operation}: {done_path} is damaged: its shards' counts do not add up",
            filename=done_path,
        )
    return finished


def finished_run(path: str, run: str, operation: str) -> Finished | None:
    """The snapshot at ``path`` once its save of ``run`` finished; None while it runs.

    Raises:
      DataLossError: ``path`` now holds another snapshot (it was replaced while read).
    """
    if not is_finished(path):
        return None
    finished = read_finished(path, operation)
    if finished.run != run:
        raise DataLossError(
            f"{operation}: {path} was replaced by another snapshot (run {finished.run}) while "
            f"it was read (run {run})",
            filename=path,
        )
    return finished


# -- writing --------------------------------------------------------------------------------


class RunWriter:
    """Writes one run of a snapshot: elements go to shards, shards to chunk files.

    ``add`` buffers an element in its shard; a full buffer becomes a chunk file. ``commit``
    writes the chunks still buffered (what a checkpoint of the writing needs), ``finish``
    publishes the run by writing ``DONE`` and removes the other runs' files, ``abort`` removes
    this run's files. A writer that stops without ``finish`` leaves no ``DONE``.
    """

    def __init__(
        self,
        path: str,
        element_spec: Any,
        codec: str,
        sharding: str,
        run: str | None = None,
        committed: dict[int, list[tuple[str, int]]] | None = None,
    ) -> None:
        self.path = path
        self.run = run or uuid.uuid4().hex
        self.run_dir = fs.join(path, self.run)
        self._codec = codec
        leaves, self._treespec = structure.flatten(element_spec)
        if not leaves:
            raise InvalidArgumentError(
                f"cannot save elements without components (element spec {element_spec!r})"
            )
        self._num_leaves = len(leaves)
        self.committed: dict[int, list[tuple[str, int]]] = {
            int(k): [(str(n), int(c)) for n, c in v] for k, v in (committed or {}).items()
        }
        self._pending: dict[int, list[list[np.ndarray]]] = {}
        self._pending_bytes: dict[int, int] = {}
        self.elements = sum(c for chunks in self.committed.values() for _, c in chunks)
        fs.makedirs(self.run_dir)
        if committed is None:
            meta = {
                "format": FORMAT,
                "element_spec": spec_to_json(element_spec),
                "codec": codec,
                "sharding": sharding,
            }
            write_json(fs.join(self.run_dir, METADATA), meta)
        else:
            self._remove_uncommitted()

    def _remove_uncommitted(self) -> None:
        """Removes the chunks written after the commit this writer resumes from."""
        for name in fs.listdir(self.run_dir):
            if not name.startswith("shard_"):
                continue
            shard = int(name[len("shard_") :])
            keep = {n for n, _ in self.committed.get(shard, [])}
            directory = fs.join(self.run_dir, name)
            for chunk in fs.listdir(directory):
                if chunk not in keep:
                    fs.remove(fs.join(directory, chunk))

    def add(self, element: Any, shard: int) -> None:
        leaves = [np.asarray(a) for a in structure.flatten(element)[0]]
        if len(leaves) != self._num_leaves:
            raise InvalidArgumentError(
                f"an element has {len(leaves)} components, the dataset's spec {self._num_leaves}"
            )
        rows = self._pending.setdefault(shard, [])
        rows.append(leaves)
        size = self._pending_bytes.get(shard, 0) + sum(_nbytes(a) for a in leaves)
        self._pending_bytes[shard] = size
        self.elements += 1
        if len(rows) >= CHUNK_ROWS or size >= CHUNK_BYTES:
            self._write(shard)

    def _write(self, shard: int) -> None:
        rows = self._pending.pop(shard, [])
        self._pending_bytes.pop(shard, None)
        if not rows:
            return
        chunks = self.committed.setdefault(shard, [])
        directory = shard_dir(self.run_dir, shard)
        if not chunks:
            fs.makedirs(directory)
        name = chunk_name(len(chunks))
        write_chunk(fs.join(directory, name), self._codec, rows)
        chunks.append((name, len(rows)))

    def commit(self) -> None:
        """Writes every buffered element to chunk files."""
        for shard in sorted(self._pending):
            self._write(shard)

    def finish(self, remove_other_runs: bool = True) -> None:
        """Commits, writes ``DONE`` (so the run becomes the snapshot) and, unless told not to
        (other writers may be at work), removes the files of other runs."""
        self.commit()
        for shard in sorted(self.committed):
            fs.makedirs(shard_dir(self.run_dir, shard))
        done = {
            "format": FORMAT,
            "run": self.run,
            "elements": self.elements,
            "shards": [
                {"shard": shard, "chunks": [list(c) for c in self.committed[shard]]}
                for shard in sorted(self.committed)
            ],
        }
        write_json(fs.join(self.path, DONE), done)
        if not remove_other_runs:
            return
        for name in fs.listdir(self.path):
            run_dir = fs.join(self.path, name)
            if name != self.run and fs.exists(fs.join(run_dir, METADATA)):
                fs.remove_tree(run_dir)

    def abort(self) -> None:
        fs.remove_tree(self.run_dir)


def _nbytes(leaf: np.ndarray) -> int:
    if leaf.dtype == structure.BYTES:
        return leaf.nbytes + sum(len(item) for item in leaf.ravel().tolist())
    return leaf.nbytes


class ChunkCursor:
    """Reads the elements of one shard of a finished run, chunk after chunk; its place is the
    chunk being read and the row in it."""

    def __init__(self, shard_path: str, chunks: tuple[tuple[str, int], ...], spec: Any) -> None:
        self._dir = shard_path
        self._chunks = chunks
        leaves, self._treespec = structure.flatten(spec)
        self._bytes_leaves = [s.dtype == structure.BYTES for s in leaves]
        self._single = self._treespec.num_nodes == 1
        self.chunk = 0
        self.row = 0
        self._rows: list[list[np.ndarray]] = []
        self._loaded = -1

    def _load(self) -> None:
        name, count = self._chunks[self.chunk]
        groups = read_chunk(fs.join(self._dir, name), count, self._bytes_leaves)
        self._rows = [
            [c[i, ...] for c in columns] for columns in groups for i in range(len(columns[0]))
        ]
        self._loaded = self.chunk

    @property
    def chunks(self) -> tuple[tuple[str, int], ...]:
        """The chunks this cursor reads: names and element counts."""
        return self._chunks

    def extend(self, chunks: tuple[tuple[str, int], ...]) -> None:
        """Reads ``chunks`` from now on: the chunks known so far and more after them (a
        stream still being written)."""
        self._chunks = chunks

    def next(self) -> Any:
        while self.chunk < len(self._chunks) and self.row >= self._chunks[self.chunk][1]:
            self.chunk, self.row = self.chunk + 1, 0
        if self.chunk >= len(self._chunks):
            raise StopIteration
        if self._loaded != self.chunk:
            self._load()
        leaves = self._rows[self.row]
        self.row += 1
        return leaves[0] if self._single else structure.unflatten(self._treespec, leaves)

    def state(self) -> dict[str, int]:
        return {"chunk": self.chunk, "row": self.row}

    def restore(self, state: dict[str, Any]) -> None:
        self.chunk, self.row = int(state["chunk"]), int(state["row"])
        self._rows, self._loaded = [], -1
