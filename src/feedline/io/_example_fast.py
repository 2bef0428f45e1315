"""Vectorised parsing of a batch of serialized ``Example`` protos that share one layout.

Records written by one program usually differ only in their values: the same keys in the same
order, the same number of values, the same lengths. ``Template.build`` walks one record and
notes which bytes are structure (tags, lengths, keys), which are varint bytes (whose high bit
is structure) and where each feature's values lie. Every row of the batch that has the same
length, the same structure bytes and the same varint high bits parses exactly like the template
row, so its values are read with a few NumPy slices for the whole batch. Anything unusual
(unknown fields, duplicate keys, unpacked numbers) makes ``build`` return None, and the caller
parses record by record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

BYTES, FLOAT, INT64 = "bytes_list", "float_list", "int64_list"
_KINDS = {0x0A: BYTES, 0x12: FLOAT, 0x1A: INT64}


class Irregular(Exception):
    """The record does not have the plain layout the template handles."""


@dataclass
class FeatureLayout:
    kind: str | None
    count: int = 0
    spans: list[tuple[int, int]] = field(default_factory=list)  # bytes values
    start: int = 0  # first byte of packed floats / varints
    varints: list[list[int]] = field(default_factory=list)  # byte positions of each int64


class Template:
    def __init__(self, row: bytes) -> None:
        self.length = len(row)
        self.row = np.frombuffer(row, np.uint8)
        self.structure: list[int] = []
        self.varint_bytes: list[int] = []
        self.features: dict[str, FeatureLayout] = {}

    @classmethod
    def build(cls, row: bytes) -> Template | None:
        """The layout of ``row``, or None where it is not the plain layout."""
        template = cls(row)
        try:
            template._walk(row)
        except (Irregular, IndexError, UnicodeDecodeError):
            return None
        return template

    def _mark(self, lo: int, hi: int) -> None:
        self.structure.extend(range(lo, hi))

    def _header(self, row: bytes, pos: int, tag: int) -> tuple[int, int]:
        """Reads ``tag`` and a length at ``pos``; returns (body start, body end)."""
        if row[pos] != tag:
            raise Irregular
        length, body = read_varint(row, pos + 1)
        end = body + length
        if end > len(row):
            raise Irregular
        self._mark(pos, body)
        return body, end

    def _walk(self, row: bytes) -> None:
        if not row:
            raise Irregular
        pos, end = self._header(row, 0, 0x0A)
        if end != len(row):
            raise Irregular
        while pos < end:
            entry, entry_end = self._header(row, pos, 0x0A)
            key_start, key_end = self._header(row, entry, 0x0A)
            self._mark(key_start, key_end)
            key = row[key_start:key_end].decode("utf-8")
            if key in self.features:
                raise Irregular
            value, value_end = self._header(row, key_end, 0x12)
            if value_end != entry_end:
                raise Irregular
            self.features[key] = self._feature(row, value, value_end)
            pos = entry_end

    def _feature(self, row: bytes, pos: int, end: int) -> FeatureLayout:
        if pos == end:
            return FeatureLayout(None)
        kind = _KINDS.get(row[pos])
        if kind is None:
            raise Irregular
        body, body_end = self._header(row, pos, row[pos])
        if body_end != end:
            raise Irregular
        layout = FeatureLayout(kind)
        if kind == BYTES:
            while body < body_end:
                value, value_end = self._header(row, body, 0x0A)
                layout.spans.append((value, value_end))
                body = value_end
            layout.count = len(layout.spans)
            return layout
        if body == body_end:
            return layout
        values, values_end = self._header(row, body, 0x0A)
        if values_end != body_end:
            raise Irregular
        layout.start = values
        if kind == FLOAT:
            if (values_end - values) % 4:
                raise Irregular
            layout.count = (values_end - values) // 4
            return layout
        self.varint_bytes.extend(range(values, values_end))
        while values < values_end:
            _, after = read_varint(row, values)
            if after > values_end:
                raise Irregular
            layout.varints.append(list(range(values, after)))
            values = after
        layout.count = len(layout.varints)
        return layout

    def matching_rows(self, rows: np.ndarray) -> np.ndarray:
        """A bool per row of ``rows`` (a 2-d uint8 array): whether it has this layout."""
        structure = np.asarray(self.structure, dtype=np.intp)
        ok = (rows[:, structure] == self.row[structure]).all(axis=1)
        if self.varint_bytes:
            positions = np.asarray(self.varint_bytes, dtype=np.intp)
            ok &= ((rows[:, positions] ^ self.row[positions]) & 0x80 == 0).all(axis=1)
        return ok

    def values(
        self, rows: np.ndarray, layout: FeatureLayout, records: list[bytes] | None = None
    ) -> np.ndarray:
        """The feature's values in every row: shape (rows, count). Bytes values are an object
        array of ``bytes``, cut from ``records`` (the rows as ``bytes``) where given."""
        n = len(rows)
        if layout.kind == FLOAT:
            raw = np.ascontiguousarray(rows[:, layout.start : layout.start + 4 * layout.count])
            return raw.view("<f4").astype(np.float32).reshape(n, layout.count)
        if layout.kind == INT64:
            return _decode_varints(rows, layout.varints)
        if layout.kind == BYTES:
            return _byte_strings(rows, layout.spans, records)
        return np.zeros((n, 0), np.float32)


def read_varint(row: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(pos, min(pos + 10, len(row))):
        byte = row[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    raise Irregular


def _decode_varints(rows: np.ndarray, varints: list[list[int]]) -> np.ndarray:
    out = np.zeros((len(rows), len(varints)), np.uint64)
    by_length: dict[int, list[int]] = {}
    for k, positions in enumerate(varints):
        by_length.setdefault(len(positions), []).append(k)
    for m, ks in by_length.items():
        index = np.asarray([varints[k] for k in ks], dtype=np.intp)  # (K, m)
        shifts = (np.arange(m, dtype=np.uint64) * np.uint64(7)).astype(np.uint64)
        digits = (rows[:, index] & 0x7F).astype(np.uint64) << shifts
        out[:, ks] = np.bitwise_or.reduce(digits, axis=2)
    return out.view(np.int64)


def _byte_strings(
    rows: np.ndarray, spans: list[tuple[int, int]], records: list[bytes] | None
) -> np.ndarray:
    """The values at ``spans`` of every row: an object array of exact ``bytes``, (rows, spans)."""
    n = len(rows)
    out = np.empty((n, len(spans)), dtype=object)
    for j, (lo, hi) in enumerate(spans):
        width = hi - lo
        if not width:
            out[:, j] = b""
        elif records is not None:
            out[:, j] = [r[lo:hi] for r in records]
        else:
            data = rows[:, lo:hi].tobytes()
            out[:, j] = [data[k : k + width] for k in range(0, n * width, width)]
    return out
