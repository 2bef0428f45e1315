"""Round trips of elements through frames, and exact comparison of leaves: shared by the wire
and element tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from feedline._net.elements import pack_elements, unpack_elements
from feedline._net.wire import Compressor, decode_frame, encode_frame

__all__ = ["assert_same", "round_trip"]


def round_trip(
    elements: list[list[np.ndarray]], compressor: Compressor | None = None
) -> tuple[list[list[np.ndarray]], bytes, dict[str, Any]]:
    meta, buffers = pack_elements(elements)
    frame = encode_frame({"elements": meta, "step": 7}, buffers, compressor=compressor)
    header, views = decode_frame(frame)
    assert header["step"] == 7 and "_frame" not in header
    return unpack_elements(header["elements"], views), frame, meta


def assert_same_leaf(got: np.ndarray, want: np.ndarray) -> None:
    want = np.asarray(want)
    assert isinstance(got, np.ndarray)
    assert got.shape == want.shape
    assert got.dtype == want.dtype and got.dtype.str == want.dtype.str
    if want.dtype == object:
        assert all(type(x) is bytes for x in got.ravel().tolist())
        assert got.tolist() == want.tolist()
    else:
        # Exact bits: NaN payloads, -0.0 and byte order are kept.
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()


def assert_same(got: list[list[np.ndarray]], want: list[list[np.ndarray]]) -> None:
    assert len(got) == len(want)
    for got_element, want_element in zip(got, want, strict=True):
        assert len(got_element) == len(want_element)
        for got_leaf, want_leaf in zip(got_element, want_element, strict=True):
            assert_same_leaf(got_leaf, want_leaf)
