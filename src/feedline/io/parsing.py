"""Parsing ``Example`` protos into arrays: ``parse_single_example``, ``parse_example``.

Feature specs are ``FixedLenFeature(shape, dtype, default_value)`` (a dense array of that shape)
and ``VarLenFeature(dtype)``, which parses to a ``SparseArray`` (feedline's ``tf.SparseTensor``)
as in TensorFlow: of ``dense_shape [n]`` for one record, ``[batch, longest]`` with indices
``[row, position]`` for a batch; its ``.values`` are the values of every record one after
another. dtypes are ``float32``, ``int64`` and bytes (``feedline.string``): bytes features come
back as object arrays of exact Python ``bytes``, as TensorFlow's ``.numpy()`` gives string
tensors.

Records are ``bytes``, or object arrays of them: a 0-d one (a ``TFRecordDataset`` element) for
``parse_single_example``, a 1-d one (a batch of them) for ``parse_example``. NumPy ``S`` arrays
are still taken, but they drop trailing NUL bytes, so their records are parsed leniently.

``parse_example`` parses a batch at once: records that share one layout (same keys, value
counts and lengths, the usual case for records written by one program) are read with a few
NumPy operations for the whole batch; the others are parsed one by one.

Example:
  >>> from feedline.train import Example, Features, Feature, Int64List
  >>> ex = Example(features=Features(feature={"y": Feature(int64_list=Int64List(value=[3]))}))
  >>> parse_single_example(ex.SerializeToString(), {"y": FixedLenFeature([], np.int64)})
  {'y': array(3)}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from feedline.errors import InvalidArgumentError
from feedline.io._example_fast import BYTES, Irregular, Template, read_varint
from feedline.io.example_pb import Example
from feedline.io.features import (
    DTYPES,
    NAMES,
    FixedLenFeature,
    FixedLenSequenceFeature,
    Spec,
    VarLenFeature,
    check_features,
    kind_of,
)
from feedline.structure import BYTES as OBJECT
from feedline.structure import (
    SparseArray,
    SparseTensorSpec,
    TensorSpec,
    bytes_array,
    bytes_scalar,
    zeros,
)

__all__ = ["parse_example", "parse_single_example", "parsed_spec"]


def _to_bytes(serialized: Any) -> tuple[bytes, bool]:
    """The record's bytes and whether they may have lost or gained trailing NUL bytes (records
    of ``S`` arrays may have; ``bytes`` and object arrays of ``bytes`` are exact)."""
    if type(serialized) is bytes:
        return serialized, False
    if isinstance(serialized, np.ndarray) and serialized.dtype.kind in "SO":
        if serialized.ndim != 0:
            raise InvalidArgumentError(
                f"parse_single_example takes one record, got an array of shape "
                f"{serialized.shape}; use parse_example for a batch"
            )
        if serialized.dtype.kind == "S":
            return serialized.tobytes(), True
        serialized = serialized.item()
        if not isinstance(serialized, bytes):
            raise InvalidArgumentError(
                f"a serialized Example must be bytes, got an object array holding "
                f"{type(serialized).__name__}"
            )
    if isinstance(serialized, np.bytes_):
        return bytes(serialized), True
    if isinstance(serialized, bytes | bytearray | memoryview):
        return bytes(serialized), False
    raise InvalidArgumentError(
        f"a serialized Example must be bytes or a bytes array, got {type(serialized).__name__}"
    )


def _parse_proto(raw: bytes, fuzzy: bool, where: str) -> Any:
    """The Example in ``raw``. ``fuzzy`` records come from ``S`` arrays, which pad strings with
    NUL bytes and drop trailing ones, and an empty string takes one NUL byte: such a record is
    retried at the length its own header gives, then without its trailing NUL bytes."""
    try:
        return Example.FromString(raw)
    except DecodeError as error:
        failure = error
    if fuzzy:
        for candidate in (_header_length(raw), raw.rstrip(b"\0")):
            if candidate is None or candidate == raw:
                continue
            try:
                return Example.FromString(candidate)
            except DecodeError:
                pass
    raise InvalidArgumentError(
        f"Could not parse example input{where}: {failure}; value: {raw[:64]!r}"
        f"{'...' if len(raw) > 64 else ''}"
    ) from None


def _header_length(raw: bytes) -> bytes | None:
    """``raw`` cut or NUL-padded to the length that its Example header says, if it has one."""
    if raw[:1] != b"\x0a":
        return None
    try:
        length, body = read_varint(raw, 1)
    except Irregular:
        return None
    return raw[: body + length].ljust(body + length, b"\0")


def _feature_values(example: Any, features: Mapping[str, Spec], where: str) -> dict[str, Any]:
    found = example.features.feature
    out = {}
    for key, spec in features.items():
        feature = found.get(key)
        kind = feature.WhichOneof("kind") if feature is not None else None
        wanted = kind_of(spec.dtype)
        if kind is None:
            out[key] = _missing(key, spec, where)
            continue
        if kind != wanted:
            raise InvalidArgumentError(
                f"Key: {key}{where}. Data types don't match. Data type: {NAMES[kind]} but "
                f"expected type: {NAMES[wanted]}"
            )
        values = getattr(feature, kind).value
        out[key] = _shaped(key, spec, kind, values, where)
    return out


def _missing(key: str, spec: Spec, where: str) -> np.ndarray:
    if isinstance(spec, VarLenFeature):
        return zeros((0,), spec.dtype)
    if isinstance(spec, FixedLenSequenceFeature):
        return zeros((0, *spec.shape), spec.dtype)
    if spec.default_value is None:
        raise InvalidArgumentError(
            f"Feature: {key} (data type: {NAMES[kind_of(spec.dtype)]}) is required but could not "
            f"be found{where}; give it a default_value or make sure every record has it"
        )
    return np.array(spec.default_value)


def _shaped(key: str, spec: Spec, kind: str, values: Any, where: str) -> np.ndarray:
    n = len(values)
    if isinstance(spec, FixedLenFeature) and n != math.prod(spec.shape):
        raise InvalidArgumentError(
            f"Key: {key}{where}. Number of {NAMES[kind]} values != expected. "
            f"Values size: {n} but output shape: {list(spec.shape)}"
        )
    if isinstance(spec, FixedLenSequenceFeature):
        item = math.prod(spec.shape)
        if (item == 0 and n) or (item and n % item):
            raise InvalidArgumentError(
                f"Key: {key}{where}. Number of {NAMES[kind]} values is not a multiple of "
                f"stride length. Saw {n} values but output shape is: {list(spec.shape)}"
            )
        array = (
            np.fromiter(values, DTYPES[kind], count=n)
            if kind != BYTES
            else bytes_array(list(values))
        )
        return array.reshape((n // item if item else 0, *spec.shape))
    if kind != BYTES:
        array = np.fromiter(values, DTYPES[kind], count=n)
    elif isinstance(spec, FixedLenFeature) and spec.shape == ():
        return bytes_scalar(values[0])
    else:
        array = bytes_array(list(values))
    return array if isinstance(spec, VarLenFeature) else array.reshape(spec.shape)


def parse_single_example(
    serialized: Any,
    features: Mapping[str, Spec],
    example_names: Any = None,
    name: str | None = None,
) -> dict[str, Any]:
    """One serialized ``Example`` parsed into ``{name: array}`` as ``features`` describe.

    Args:
      serialized: the record: ``bytes``, or a 0-d object array holding them (a
        ``TFRecordDataset`` element).
      features: ``{name: FixedLenFeature | VarLenFeature}``.
      example_names: the record's name (a string, or a list of one), said in errors.
      name: TensorFlow's op name: accepted and unused.

    Returns:
      For a ``FixedLenFeature(shape)``, an array of ``shape``; for a ``VarLenFeature``, a
      ``SparseArray`` of ``dense_shape [n]`` holding the record's ``n`` values.

    Raises:
      InvalidArgumentError: the record does not parse, a required feature is missing, or a
        feature has another type or number of values than its spec (the key is named).
    """
    check_features(features)
    raw, fuzzy = _to_bytes(serialized)
    names = _example_names(example_names, 1)
    where = "" if names is None else f" (example {names[0]!r})"
    out = _feature_values(_parse_proto(raw, fuzzy, where), features, where)
    for key, spec in features.items():
        if isinstance(spec, VarLenFeature):
            flat = out[key]
            out[key] = SparseArray(
                np.arange(len(flat), dtype=np.int64)[:, None], flat, (len(flat),), False
            )
    return out


def parse_example(
    serialized: Any,
    features: Mapping[str, Spec],
    example_names: Any = None,
    name: str | None = None,
) -> dict[str, Any]:
    """A batch of serialized ``Example`` protos parsed into ``{name: array}``.

    Args:
      serialized: a 1-d object array of ``bytes`` (as ``TFRecordDataset(...).batch(n)``
        yields) or a list of ``bytes``; a 0-d array is one record.
      features: ``{name: FixedLenFeature | VarLenFeature}``.
      example_names: one name per record (strings), said in the errors of the records that
        fail.
      name: TensorFlow's op name: accepted and unused.

    Returns:
      For a ``FixedLenFeature(shape)``, an array of shape ``(batch, *shape)``; for a
      ``VarLenFeature``, a ``SparseArray`` of ``dense_shape [batch, longest]`` whose indices are
      ``[row, position]`` (``.values``: the values of every record concatenated in order).

    Example:
      >>> from feedline.train import Example, Features, Feature, FloatList
      >>> rows = [Example(features=Features(feature={"x": Feature(float_list=FloatList(
      ...     value=[v, v + 1]))})).SerializeToString() for v in (1.0, 5.0)]
      >>> parse_example(rows, {"x": FixedLenFeature([2], np.float32)})["x"].tolist()
      [[1.0, 2.0], [5.0, 6.0]]
      >>> parse_example(rows, {"x": VarLenFeature(np.float32)})["x"]
      SparseArray(indices=[[0, 0], [0, 1], [1, 0], [1, 1]], values=[1.0, 2.0, 5.0, 6.0], \
dense_shape=[2, 2])
    """
    check_features(features)
    if isinstance(serialized, np.ndarray) and serialized.ndim == 0:
        return parse_single_example(serialized, features, example_names)
    rows, records, fuzzy = _batch_rows(serialized)
    n = len(records) if rows is None else len(rows)
    names = _example_names(example_names, n)
    fast, matched = (
        _parse_fast(rows, features, records) if rows is not None and n > 1 else ({}, None)
    )
    slow_rows = range(n) if matched is None else np.flatnonzero(~matched).tolist()
    slow: dict[int, dict[str, Any]] = {}
    for i in slow_rows:
        raw = records[i] if records else rows[i].tobytes()  # type: ignore[index]
        where = f" (record {i} of the batch{'' if names is None else f', {names[i]!r}'})"
        slow[i] = _feature_values(_parse_proto(raw, fuzzy, where), features, where)
    return {
        key: _assemble(key, spec, n, fast.get(key), matched, slow) for key, spec in features.items()
    }


def _example_names(example_names: Any, n: int) -> list[str] | None:
    """``example_names`` as ``n`` strings (bytes decoded), or None where not given.

    Raises:
      InvalidArgumentError: not one name per record.
    """
    if example_names is None:
        return None
    if isinstance(example_names, str | bytes):
        example_names = [example_names]
    names = [
        n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n)
        for n in np.asarray(example_names, dtype=object).reshape(-1).tolist()
    ]
    if len(names) != n:
        raise InvalidArgumentError(
            f"example_names has {len(names)} names for {n} record(s): give one per record"
        )
    return names


def _batch_rows(serialized: Any) -> tuple[np.ndarray | None, list[bytes], bool]:
    """The records as rows of a 2-d uint8 array where they all have one length (else None),
    the records as ``bytes`` (empty for ``S`` arrays, whose rows are used as they are stored),
    and whether they are fuzzy (``S`` arrays)."""
    if isinstance(serialized, np.ndarray) and serialized.dtype == OBJECT:
        if serialized.ndim != 1:
            raise InvalidArgumentError(
                f"parse_example takes a 1-d batch of records, got shape {serialized.shape}"
            )
        records = serialized.tolist()
        if set(map(type, records)) != {bytes}:
            records = [_to_bytes(r)[0] for r in records]
        return _uniform_rows(records), records, False
    if isinstance(serialized, np.ndarray) and serialized.dtype.kind == "S":
        if serialized.ndim != 1:
            raise InvalidArgumentError(
                f"parse_example takes a 1-d batch of records, got shape {serialized.shape}"
            )
        array = np.ascontiguousarray(serialized)
        return array.view(np.uint8).reshape(len(array), array.dtype.itemsize), [], True
    if isinstance(serialized, np.ndarray | list | tuple):
        records = [_to_bytes(r)[0] for r in serialized]
        return _uniform_rows(records), records, False
    raise InvalidArgumentError(
        f"parse_example takes a 1-d bytes array or a list of bytes, got {type(serialized).__name__}"
    )


# The layout of the batch parsed last (see _parse_fast); replaced, never changed, so threads
# that parse at once at worst build a template again.
_last_template: Template | None = None


def _uniform_rows(records: list[bytes]) -> np.ndarray | None:
    """The records as the rows of a 2-d uint8 array, if they all have one (non-zero) length."""
    if records and records[0] and len(set(map(len, records))) == 1:
        joined = np.frombuffer(b"".join(records), np.uint8)
        return joined.reshape(len(records), len(records[0]))
    return None


def _parse_fast(
    rows: np.ndarray, features: Mapping[str, Spec], records: list[bytes]
) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """Values of the rows that share the first parseable row's layout, and which rows those are.

    ``records`` (the rows as ``bytes``, or empty) is where bytes values are cut from when every
    row matches: slicing them makes each value with one copy.

    The layout of the previous batch is tried first: a row that matches it parses exactly like
    the row it was built from (whatever batch that was), and building one costs more than
    parsing the values of a whole batch. It is kept only where it matches every row.
    """
    global _last_template
    template = _last_template
    if template is not None and template.length == rows.shape[1]:
        matched = template.matching_rows(rows)
        if not matched.all():
            template = None
    else:
        template = None
    if template is None:
        for row in rows[:3]:
            template = Template.build(row.tobytes())
            if template is not None:
                break
        if template is None:
            return {}, None
        matched = template.matching_rows(rows)
        _last_template = template
    out = {}
    everyone = bool(matched.all())
    chosen = rows if everyone else rows[matched]
    sources = records if everyone and records else None
    for key, spec in features.items():
        if isinstance(spec, FixedLenSequenceFeature):
            return {}, None  # records of one length may hold items of several counts
        layout = template.features.get(key)
        if layout is None or layout.kind is None:
            if isinstance(spec, FixedLenFeature) and spec.default_value is None:
                return {}, None
            out[key] = _missing_rows(spec, len(chosen))
            continue
        if layout.kind != kind_of(spec.dtype):
            return {}, None
        if isinstance(spec, FixedLenFeature) and layout.count != math.prod(spec.shape):
            return {}, None
        values = template.values(chosen, layout, sources)
        shape = spec.shape if isinstance(spec, FixedLenFeature) else (layout.count,)
        out[key] = values.reshape((len(chosen), *shape))
    return out, matched


def _missing_rows(spec: Spec, n: int) -> np.ndarray:
    if isinstance(spec, VarLenFeature):
        return zeros((n, 0), spec.dtype)
    if isinstance(spec, FixedLenSequenceFeature):
        return zeros((n, 0, *spec.shape), spec.dtype)
    return np.broadcast_to(spec.default_value, (n, *spec.shape))


def parsed_spec(features: Mapping[str, Spec], batch: int | None) -> dict[str, Any]:
    """The spec of what ``parse_example`` gives for a batch of ``batch`` records (None where
    the batch size is unknown), as TensorFlow's ``parse_example_dataset`` declares it: a
    ``TensorSpec((batch, *shape))`` for a ``FixedLenFeature``, a
    ``SparseTensorSpec((batch, None))`` for a ``VarLenFeature``.

    Example:
      >>> parsed_spec({"ids": VarLenFeature(np.int64)}, None)
      {'ids': SparseTensorSpec(shape=(None, None), dtype=int64)}
    """
    check_features(features)
    return {key: _parsed_spec(spec, batch) for key, spec in features.items()}


def _parsed_spec(spec: Spec, batch: int | None) -> Any:
    if isinstance(spec, VarLenFeature):
        return SparseTensorSpec((batch, None), spec.dtype)
    if isinstance(spec, FixedLenSequenceFeature):
        return TensorSpec((batch, None, *spec.shape), spec.dtype)
    return TensorSpec((batch, *spec.shape), spec.dtype)


def _sparse_rows(values: np.ndarray, counts: np.ndarray) -> SparseArray:
    """``values`` cut into rows of ``counts[i]`` values, as a ``SparseArray`` of dense shape
    ``[len(counts), max(counts)]`` with indices ``[row, position]`` (built with NumPy)."""
    n = len(counts)
    rows = np.repeat(np.arange(n, dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    positions = np.arange(len(rows), dtype=np.int64) - np.repeat(starts, counts)
    width = int(counts.max()) if n else 0
    return SparseArray(np.stack([rows, positions], axis=1), values, (n, width), False)


def _assemble(
    key: str,
    spec: Spec,
    n: int,
    fast: np.ndarray | None,
    matched: np.ndarray | None,
    slow: dict[int, dict[str, Any]],
) -> np.ndarray | SparseArray:
    if fast is not None and not slow:
        if isinstance(spec, VarLenFeature):
            counts = np.full(n, fast.shape[1], dtype=np.int64)
            return _sparse_rows(fast.reshape(-1), counts)
        return np.ascontiguousarray(fast)
    rows: list[Any] = [None] * n
    if fast is not None and matched is not None:  # fast rows come with their mask
        # ``fast[k, ...]``: a row of a 1-d object array as a 0-d array, not a bare ``bytes``.
        for k, i in enumerate(np.flatnonzero(matched).tolist()):
            rows[i] = fast[k, ...]
    for i, parsed in slow.items():
        rows[i] = parsed[key]
    if isinstance(spec, VarLenFeature):
        counts = np.array([len(r) for r in rows], dtype=np.int64)
        parts = [r for r in rows if len(r)]
        values = np.concatenate(parts) if parts else _missing(key, spec, "")
        return _sparse_rows(values, counts)
    if isinstance(spec, FixedLenSequenceFeature):
        return _padded(spec, rows)
    if not rows:
        return zeros((0, *spec.shape), spec.dtype)
    return np.stack(rows)


def _padded(spec: FixedLenSequenceFeature, rows: list[np.ndarray]) -> np.ndarray:
    """The records' items as ``[batch, longest, *shape]``, the shorter padded."""
    longest = max((len(r) for r in rows), default=0)
    out = np.empty((len(rows), longest, *spec.shape), dtype=spec.dtype)
    out[...] = spec.default_value
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out
