"""The wire between ``ProcessPool`` and its workers, and the worker's main loop.

Messages are pickled with protocol 5. A chunk whose elements share structure, dtypes and shapes
travels as columns, one stacked array per leaf (``_pack``). Array buffers of at least
``_SHM_MIN_BYTES``, and any message larger than ``_INLINE_MAX``, go through one shared-memory
segment per message, named after its chunk so that the parent can remove it if the worker that
made it dies; small messages are pickled inline. ``_worker_main`` runs in each spawned worker.
"""

from __future__ import annotations

import os
import pickle
import signal
import traceback
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import numpy as np

from feedline import structure
from feedline.data.ops._functions import UserFunction, apply_chunk

# Array buffers at least this large travel through shared memory.
_SHM_MIN_BYTES = 64 << 10
# Messages larger than this travel through shared memory as a whole.
_INLINE_MAX = 16 << 10

_INLINE, _SHARED = b"I", b"S"
_ALIGN = 64


# -- messages ---------------------------------------------------------------------------------


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _encode(message: Any, segment_name: str) -> bytes:
    """``message`` as one pipe frame: pickled inline, or its bytes put in shared memory."""
    buffers: list[pickle.PickleBuffer] = []

    def keep_in_band(buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes >= _SHM_MIN_BYTES:
            buffers.append(buffer)
            return False
        return True

    data = pickle.dumps(message, protocol=5, buffer_callback=keep_in_band)
    if not buffers and len(data) <= _INLINE_MAX:
        return _INLINE + data
    raws = [buffer.raw() for buffer in buffers]
    spans = []
    end = _align(len(data))
    for raw in raws:
        spans.append((end, raw.nbytes))
        end = _align(end + raw.nbytes)
    segment = shared_memory.SharedMemory(name=segment_name, create=True, size=max(end, 1))
    try:
        view = _segment_view(segment)
        view[: len(data)] = data
        for (start, size), raw in zip(spans, raws, strict=True):
            view[start : start + size] = raw
        del view
    finally:
        segment.close()
    return _SHARED + pickle.dumps((segment_name, len(data), spans))


def _segment_view(segment: shared_memory.SharedMemory) -> memoryview:
    """The memory of an open segment (``buf`` is None only once it is closed)."""
    view = segment.buf
    if view is None:
        raise ValueError(f"shared memory segment {segment.name} is closed")
    return view


def _decode(frame: bytes) -> Any:
    """The message of a frame made by ``_encode``; its shared-memory segment is removed."""
    if frame[:1] == _INLINE:
        return pickle.loads(memoryview(frame)[1:])
    name, size, spans = pickle.loads(frame[1:])
    segment = shared_memory.SharedMemory(name=name)
    try:
        view = _segment_view(segment)
        data = bytes(view[:size])
        buffers = [bytearray(view[start : start + n]) for start, n in spans]
        del view
    finally:
        segment.close()
        segment.unlink()
    return pickle.loads(data, buffers=buffers)


# Leaves of these dtype kinds can be stacked and split again without changing them.
_STACKABLE_KINDS = frozenset("biufcmM")


def _column(values: list[Any]) -> tuple[np.ndarray, bool] | None:
    """``values`` stacked and whether they were NumPy scalars; None unless they are all scalars
    or all arrays of one stackable dtype and shape."""
    first = values[0]
    kind = type(first)
    if issubclass(kind, np.generic):
        dtype = first.dtype
        if dtype.kind not in _STACKABLE_KINDS:
            return None
        if dtype.kind in "mM":  # one scalar type, several units
            if any(type(v) is not kind or v.dtype != dtype for v in values):
                return None
        elif any(type(v) is not kind for v in values):
            return None
        return np.array(values, dtype=dtype), True
    if kind is np.ndarray:
        dtype, shape = first.dtype, first.shape
        if dtype.kind not in _STACKABLE_KINDS or first.nbytes >= _SHM_MIN_BYTES:
            return None  # big arrays go to shared memory one by one, without a stacking copy
        if any(type(v) is not np.ndarray or v.dtype != dtype or v.shape != shape for v in values):
            return None
        return np.stack(values), False
    return None


def _pack(elements: list[Any]) -> tuple[str, Any]:
    """Elements as columns, one stacked array per leaf, where they all share structure, dtypes
    and shapes (pickling one array costs far less than pickling many small ones); else as is.

    The structure is ``None`` for bare arrays, ``"tuple"`` for flat tuples of arrays (the usual
    ``(features, label)``) and a tree spec otherwise.
    """
    if len(elements) < 2:
        return ("list", elements)
    first = elements[0]
    columns = None
    if isinstance(first, np.generic | np.ndarray):
        spec: Any = None
        columns = _columns([elements])
    elif type(first) is tuple:
        spec, width = "tuple", len(first)
        if all(type(e) is tuple and len(e) == width for e in elements):
            columns = _columns([list(c) for c in zip(*elements, strict=True)])
    if columns is None:
        flat = [structure.flatten(element) for element in elements]
        spec = flat[0][1]
        if any(s != spec for _, s in flat):
            return ("list", elements)
        columns = _columns([list(c) for c in zip(*(leaves for leaves, _ in flat), strict=True)])
        if columns is None:
            return ("list", elements)
    return ("columns", (spec, [_raw(c) for c, _ in columns], [scalar for _, scalar in columns]))


def _raw(column: np.ndarray) -> np.ndarray | tuple[str, tuple[int, ...], bytes]:
    """A small column as (dtype, shape, bytes), which pickles several times faster than an
    array; a large one stays an array, whose buffer ``_encode`` puts in shared memory."""
    if column.nbytes >= _SHM_MIN_BYTES:
        return column
    return (column.dtype.str, column.shape, column.tobytes())


def _cooked(column: np.ndarray | tuple[str, tuple[int, ...], bytes]) -> np.ndarray:
    if isinstance(column, np.ndarray):
        return column
    dtype, shape, data = column
    return np.frombuffer(bytearray(data), dtype).reshape(shape)


def _columns(leaf_lists: list[list[Any]]) -> list[tuple[np.ndarray, bool]] | None:
    if not leaf_lists:
        return None
    columns = []
    for values in leaf_lists:
        column = _column(values)
        if column is None:
            return None
        columns.append(column)
    return columns


def _unpack(packed: tuple[str, Any]) -> list[Any]:
    """The elements that ``_pack`` packed: rows of the columns, as NumPy scalars where they
    were scalars and as (writable, non-overlapping) array views otherwise."""
    kind, payload = packed
    if kind == "list":
        return payload
    spec, raw_columns, scalars = payload
    columns = [_cooked(column) for column in raw_columns]
    rows = [
        list(column) if scalar or column.ndim > 1 else [column[i, ...] for i in range(len(column))]
        for column, scalar in zip(columns, scalars, strict=True)
    ]
    if spec is None:
        return rows[0]
    if spec == "tuple":
        return list(zip(*rows, strict=True))
    return [structure.unflatten(spec, leaves) for leaves in zip(*rows, strict=True)]


def _discard_frame(frame: bytes) -> None:
    """Removes the shared-memory segment of a frame that will never be decoded."""
    if frame[:1] == _SHARED:
        _discard_segment(pickle.loads(frame[1:])[0])


def _discard_segment(name: str) -> None:
    try:
        segment = shared_memory.SharedMemory(name=name)
    except (FileNotFoundError, ValueError):
        return
    segment.close()
    segment.unlink()


def _portable_error(error: BaseException) -> bytes:
    """``error`` pickled for the parent, with this process's traceback text as a note."""
    notes = error.__dict__.pop("__notes__", None)
    text = "".join(traceback.format_exception(error)).rstrip()
    if notes is not None:
        error.__notes__ = notes
    error.add_note(f"traceback in worker process {os.getpid()}:\n{text}")
    try:
        blob = cloudpickle.dumps(error)
        pickle.loads(blob)
        return blob
    except Exception as pickling_error:
        kind = type(error)
        stand_in = RuntimeError(
            f"{kind.__module__}.{kind.__qualname__}: {error} (the exception could not be sent "
            f"from the worker process: {pickling_error!r})"
        )
        for note in error.__notes__:
            stand_in.add_note(note)
        return pickle.dumps(stand_in)


def _load_error(blob: bytes) -> BaseException:
    try:
        return pickle.loads(blob)
    except Exception as error:
        return RuntimeError(f"an exception from a worker process could not be unpickled: {error!r}")


# -- the worker process -----------------------------------------------------------------------


def _worker_main(payload: bytes, tasks: Connection, results: Connection, prefix: str) -> None:
    """Maps chunks from ``tasks`` until told to stop or the parent goes away."""
    # Ctrl-C reaches the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        fn = pickle.loads(payload)
    except BaseException as error:
        message = ("init_error", None, _portable_error(error))
        results.send_bytes(_encode(message, f"{prefix}n{os.getpid()}"))
        return
    while True:
        try:
            frame = tasks.recv_bytes()
        except (EOFError, OSError):
            return
        if frame == _STOP_FRAME:
            return
        try:
            results.send_bytes(_run_chunk(fn, frame, prefix))
        except (EOFError, OSError):
            return


def _run_chunk(fn: UserFunction, frame: bytes, prefix: str) -> bytes:
    chunk_id = None
    try:
        _, chunk_id, packed = _decode(frame)
        outcomes, seconds = apply_chunk(fn, _unpack(packed))
        payload: tuple[str, Any]
        if all(ok for ok, _ in outcomes):
            payload = ("values", _pack([value for _, value in outcomes]))
        else:
            payload = (
                "outcomes",
                [(ok, value if ok else _portable_error(value)) for ok, value in outcomes],
            )
        return _encode(("result", chunk_id, payload, seconds), f"{prefix}r{chunk_id}")
    except BaseException as error:
        name = f"{prefix}e{os.getpid() if chunk_id is None else chunk_id}"
        return _encode(("chunk_error", chunk_id, _portable_error(error)), name)


_STOP_FRAME = _INLINE + pickle.dumps(("stop",), protocol=5)
