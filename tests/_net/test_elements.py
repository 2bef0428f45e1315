"""Tests of feedline/_net/elements.py: elements packed into frames and unpacked, exactly, and
malformed descriptions refused."""

from __future__ import annotations

import doctest
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from feedline._net import elements as _elements
from feedline._net.elements import pack_elements, unpack_elements
from feedline._net.wire import Compressor
from feedline.errors import InvalidArgumentError
from feedline.structure import bytes_array, bytes_scalar
from tests._net.element_helpers import assert_same as _assert_same
from tests._net.element_helpers import round_trip as _round_trip

_F4 = np.arange(4, dtype=np.float32).tobytes()


def test_module_docstring_example_runs() -> None:
    result = doctest.testmod(_elements)
    assert result.attempted > 0 and result.failed == 0


# Round trips.


def test_uniform_float_elements_are_described_once() -> None:
    rng = np.random.default_rng(0)
    elements = [[rng.random(1024, dtype=np.float32)] for _ in range(100)]
    got, _, meta = _round_trip(elements)
    _assert_same(got, elements)
    assert meta == {"signatures": [[["<f4", [1024]]]], "count": 100}


def test_uniform_elements_send_numeric_leaves_as_their_own_memory() -> None:
    leaf = np.arange(12, dtype=np.int32).reshape(3, 4)
    _, buffers = pack_elements([[leaf]])
    assert isinstance(buffers[0], memoryview) and buffers[0].obj is leaf


def test_mixed_shapes_and_dtypes_take_the_per_element_path() -> None:
    elements = [
        [np.arange(3, dtype=np.float32)],
        [np.arange(5, dtype=np.float32)],
        [np.arange(3, dtype=np.int16)],
        [np.arange(3, dtype=np.float32)],
        [np.arange(2, dtype=np.float64), np.array(True)],
    ]
    got, _, meta = _round_trip(elements)
    _assert_same(got, elements)
    assert meta["elements"] == [0, 1, 2, 0, 3]
    assert len(meta["signatures"]) == 4


def test_nested_elements_with_several_leaves() -> None:
    elements = [
        [
            np.full((2, 3), i, dtype=np.float32),
            np.array(i, dtype=np.int64),
            bytes_scalar(b"name%d" % i),
            np.array(["a", "bc"]),
            np.array([i % 2 == 0, True]),
        ]
        for i in range(5)
    ]
    got, _, meta = _round_trip(elements)
    _assert_same(got, elements)
    assert meta["count"] == 5


@pytest.mark.parametrize(
    "items",
    [
        [b""],
        [b"a\x00"],
        [b"\x00\x00"],
        [b"", b"x\x00", b"\x00", bytes(range(256))],
    ],
)
def test_bytes_leaves_keep_exact_bytes(items: list[bytes]) -> None:
    elements = [[bytes_scalar(item)] for item in items]
    elements.append([bytes_array(items)])
    elements.append([bytes_array(items * 2).reshape(2, len(items))])
    got, _, _ = _round_trip(elements)
    _assert_same(got, elements)
    assert got[0][0].shape == () and got[0][0].item() == items[0]


def test_uniform_bytes_elements_with_different_lengths() -> None:
    elements = [[bytes_scalar(b"\x00" * i), np.array(i)] for i in range(10)]
    got, _, meta = _round_trip(elements)
    _assert_same(got, elements)
    assert meta["count"] == 10


def test_unicode_bool_big_endian_complex_and_half_leaves() -> None:
    elements = [
        [
            np.array(["héllo", "", "wörld\x00"]),
            np.array("scalar"),
            np.array([True, False]),
            np.arange(4, dtype=">f8"),
            np.arange(3, dtype=">i4").reshape(3, 1),
            np.array([1 + 2j, np.nan], dtype="<c8"),
            np.array([np.nan, -0.0, np.inf], dtype=np.float16),
            np.array(255, dtype=np.uint8),
        ]
    ]
    got, _, meta = _round_trip(elements)
    _assert_same(got, elements)
    assert [leaf[0] for leaf in meta["signatures"][0]] == [
        "<U6",
        "<U6",
        "|b1",
        ">f8",
        ">i4",
        "<c8",
        "<f2",
        "|u1",
    ]


def test_zero_size_arrays_and_elements_without_leaves() -> None:
    for elements in (
        [[np.zeros((0, 3), np.float32), bytes_array([]).reshape(0, 2)]] * 3,
        [[]] * 4,
        [[], [np.zeros(0, np.int8)], []],
        [],
    ):
        got, _, _ = _round_trip(elements)
        _assert_same(got, elements)


def test_elements_that_take_no_buffers_are_listed_one_by_one() -> None:
    # A count alone would let a frame claim any number of them; a list costs header bytes.
    _, _, meta = _round_trip([[]] * 4)
    assert meta == {"signatures": [[]], "elements": [0, 0, 0, 0]}


def test_non_contiguous_and_scalar_leaves() -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    elements = [[base[:, ::2], np.asfortranarray(base), base.T, np.float32(2.5)]]
    _, buffers = pack_elements(elements)
    assert all(buffer.c_contiguous for buffer in buffers)
    got, _, _ = _round_trip(elements)
    _assert_same(got, elements)
    assert got[0][3].shape == () and got[0][3].dtype == np.float32


def test_pack_refuses_leaves_it_cannot_send() -> None:
    with pytest.raises(InvalidArgumentError, match="of type str"):
        pack_elements([[np.array(["a"], dtype=object)]])
    with pytest.raises(InvalidArgumentError, match="of type int"):
        pack_elements([[bytes_scalar(b"a")], [np.array(3, dtype=object)]])
    with pytest.raises(InvalidArgumentError, match="datetime64"):
        pack_elements([[np.array(["2020-01-01"], dtype="datetime64[D]")]])
    with pytest.raises(InvalidArgumentError, match="dtype"):
        pack_elements([[np.zeros(2, dtype="f4,i4")]])


# Compression.


@pytest.mark.parametrize(
    ("meta", "buffers", "match"),
    [
        ([], [], "'signatures' list"),
        ({"count": 1}, [_F4], "'signatures' list"),
        ({"signatures": [[["O", [1]]]], "count": 1}, [bytes(8)], "'O' is not allowed"),
        ({"signatures": [[["|O", []]]], "count": 1}, [bytes(8)], "not allowed"),
        ({"signatures": [[["<M8[ns]", [1]]]], "count": 1}, [bytes(8)], "not allowed"),
        ({"signatures": [[["|V8", [1]]]], "count": 1}, [bytes(8)], "not allowed"),
        ({"signatures": [[["<f4,<i4", [1]]]], "count": 1}, [bytes(8)], "not allowed"),
        ({"signatures": [[["f4", [4]]]], "count": 1}, [_F4], "not allowed"),
        ({"signatures": [[["<U0", [1]]]], "count": 1}, [b""], "not allowed"),
        ({"signatures": [[[4, [4]]]], "count": 1}, [_F4], "not allowed"),
        ({"signatures": [[["<f4", [-4]]]], "count": 1}, [_F4], "non-negative"),
        ({"signatures": [[["<f4", [4.0]]]], "count": 1}, [_F4], "non-negative"),
        ({"signatures": [[["<f4", 4]]], "count": 1}, [_F4], "\\[dtype, shape\\]"),
        ({"signatures": [[["<f4"]]], "count": 1}, [_F4], "\\[dtype, shape\\]"),
        ({"signatures": [["<f4"]], "count": 1}, [_F4], "\\[dtype, shape\\]"),
        ({"signatures": ["<f4"], "count": 1}, [_F4], "must be a list"),
        ({"signatures": [[["<f4", [1] * 65]]], "count": 1}, [bytes(4)], "at most 64"),
        ({"signatures": [[["<f4", [0, 10**30]]]], "count": 1}, [b""], "not valid"),
        ({"signatures": [[["bytes", [0, 10**30]]]], "count": 0}, [], "not valid"),
        ({"signatures": [[["<f4", [8]]]], "count": 1}, [_F4], "32 bytes"),
        ({"signatures": [[["<f4", [10**12]]]], "count": 1}, [_F4], "holds 16 bytes"),
        ({"signatures": [[["<f4", [2]]]], "count": 1}, [_F4], "holds 16 bytes"),
        ({"signatures": [[["<f4", [4]]]], "count": 2}, [_F4], "describes 2 buffers"),
        ({"signatures": [[["<f4", [4]]]], "count": 10**15}, [_F4], "describes 10+ buffers"),
        ({"signatures": [[["<f4", [4]]]], "count": -1}, [], "count"),
        ({"signatures": [[["<f4", [4]]]], "count": True}, [_F4], "count"),
        ({"signatures": [[["<f4", [4]]]]}, [_F4], "'elements'"),
        ({"signatures": [[["<f4", [4]]]], "elements": [1]}, [_F4], "'elements'"),
        ({"signatures": [[["<f4", [4]]]], "elements": [-1]}, [_F4], "'elements'"),
        ({"signatures": [[["<f4", [4]]]], "elements": [0, 0]}, [_F4], "describes 2"),
        ({"signatures": [[], []], "count": 5}, [], "one signature"),
        ({"signatures": [[]], "count": 10**12}, [], "take buffers"),
        ({"signatures": [[["bytes", [10**9]]]], "count": 1}, [b"a"], "describes 1000000000"),
        ({"signatures": [[["bytes", [3]]]], "elements": [0]}, [b"a", b"b"], "describes 3"),
    ],
)
def test_malformed_meta_is_refused(meta: Any, buffers: list[bytes], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        unpack_elements(meta, [memoryview(b) for b in buffers])


def test_meta_cannot_make_unpack_allocate_much() -> None:
    # Each leaf costs buffers or header bytes: a small frame yields a small result.
    meta = {"signatures": [[["bytes", [0]], ["<f4", [0]]]], "elements": [0] * 1000}
    got = unpack_elements(meta, [memoryview(b"")] * 1000)
    assert len(got) == 1000 and got[0][0].shape == (0,) and got[0][1].shape == (0,)


_NUMERIC_DTYPES = st.sampled_from(
    ["|b1", "|i1", "<i2", ">i4", "<i8", "|u1", "<u4", ">u8", "<f2", "<f4", ">f8", "<c8", ">c16"]
).map(np.dtype)
_SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)


@st.composite
def _leaves(draw: st.DrawFn) -> np.ndarray:
    kind = draw(st.sampled_from(["numeric", "unicode", "bytes"]))
    shape = draw(_SHAPES)
    if kind == "numeric":
        return draw(hnp.arrays(_NUMERIC_DTYPES, shape))
    if kind == "unicode":
        return draw(hnp.arrays(hnp.unicode_string_dtypes(endianness="=", max_len=4), shape))
    size = int(np.prod(shape))
    items = draw(st.lists(st.binary(max_size=6), min_size=size, max_size=size))
    return bytes_scalar(items[0]) if shape == () else bytes_array(items).reshape(shape)


@settings(max_examples=200, deadline=None)
@given(
    elements=st.lists(st.lists(_leaves(), max_size=4), max_size=6),
    repeat=st.integers(1, 3),
    compress=st.booleans(),
)
def test_round_trip_property(elements: list[list[np.ndarray]], repeat: int, compress: bool) -> None:
    elements = elements * repeat  # repeats make the uniform path likely
    got, _, _ = _round_trip(elements, Compressor("AUTO" if compress else None))
    _assert_same(got, elements)
