"""Tests of feedline/_net/wire.py: frames and their compression."""

from __future__ import annotations

import doctest
import json
import struct
from typing import Any

import lz4.block
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedline._net import wire as _wire
from feedline._net.elements import pack_elements
from feedline._net.wire import Compressor, decode_frame, encode_frame
from feedline.errors import InvalidArgumentError
from feedline.structure import bytes_scalar
from tests._net.element_helpers import assert_same as _assert_same
from tests._net.element_helpers import round_trip as _round_trip


def test_module_docstring_example_runs() -> None:
    result = doctest.testmod(_wire)
    assert result.attempted > 0 and result.failed == 0


def test_decoded_numeric_leaves_share_memory_with_the_frame() -> None:
    elements = [[np.arange(10, dtype=np.float64), np.arange(6, dtype=np.int8).reshape(2, 3)]]
    got, frame, _ = _round_trip(elements)
    frame_array = np.frombuffer(frame, np.uint8)
    for leaf in got[0]:
        assert np.shares_memory(leaf, frame_array)
        assert not leaf.flags.writeable


def test_decode_accepts_a_memoryview_and_returns_views_into_it() -> None:
    frame = bytearray(encode_frame({"a": [1, "x"]}, [b"abc", np.arange(2, dtype="<i2")]))
    header, views = decode_frame(memoryview(frame))
    assert header == {"a": [1, "x"]}
    assert [bytes(v) for v in views] == [b"abc", b"\x00\x00\x01\x00"]
    frame[-1] = 9
    assert bytes(views[1]) == b"\x00\x00\x01\x09"


def test_frame_layout() -> None:
    frame = encode_frame({"k": 1}, [b"ab", b"", b"c"])
    magic, version, size = struct.unpack_from("<3sBI", frame)
    assert (magic, version) == (b"FLW", 1)
    assert json.loads(frame[8 : 8 + size]) == {"k": 1, "_frame": {"sizes": [2, 0, 1]}}
    assert frame[8 + size :] == b"abc"


def test_encode_copies_buffers_once_into_the_frame() -> None:
    big = np.arange(1 << 20, dtype=np.float32)
    frame = encode_frame({}, [big, memoryview(b"xy"), bytearray(b"z")])
    _, views = decode_frame(frame)
    assert np.array_equal(np.frombuffer(views[0], np.float32), big)
    assert bytes(views[1]) + bytes(views[2]) == b"xyz"


@pytest.mark.parametrize(
    ("header", "buffers", "match"),
    [
        ({"_frame": 1}, [], "reserved"),
        ({"a": object()}, [], "JSON"),
        ({}, [np.array([b"a"], dtype=object)], "object array"),
        ({}, [memoryview(np.array([b"a"], dtype=object))], "Python objects"),
    ],
)
def test_encode_refuses_bad_input(header: dict[str, Any], buffers: list[Any], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        encode_frame(header, buffers)


def test_compressor_modes() -> None:
    assert Compressor(None).mode is None and Compressor("AUTO").mode == "AUTO"
    with pytest.raises(InvalidArgumentError, match="'AUTO' or None"):
        Compressor("GZIP")


def test_auto_compresses_compressible_data() -> None:
    elements = [[np.zeros(1024, np.float32)] for _ in range(64)]
    got, frame, _ = _round_trip(elements, Compressor("AUTO"))
    _assert_same(got, elements)
    assert len(frame) < 64 * 4096 / 20
    header_size = struct.unpack_from("<I", frame, 4)[0]
    info = json.loads(frame[8 : 8 + header_size])["_frame"]
    assert info["codec"] == "lz4" and info["raw_size"] == 64 * 4096


def test_auto_gives_up_on_random_data_and_tries_again_later() -> None:
    rng = np.random.default_rng(1)
    compressor = Compressor("AUTO")
    raw_size = None
    for call in range(1, 40):
        elements = [[rng.random(2048)]]
        got, frame, _ = _round_trip(elements, compressor)
        _assert_same(got, elements)
        raw_size = raw_size or len(frame)
        assert len(frame) == raw_size  # never compressed
        # Tried on call 1, then 16 calls skipped, tried on call 18, then 32 skipped.
        assert compressor.attempts == (1 if call < 18 else 2)


def test_auto_backoff_doubles_up_to_a_limit() -> None:
    compressor = Compressor("AUTO")
    noise = np.random.default_rng(2).bytes(8192)
    attempts_at = []
    for call in range(1200):
        before = compressor.attempts
        assert compressor.compress(noise) == (None, noise)
        if compressor.attempts > before:
            attempts_at.append(call)
    # Tried, then 16, 32, 64, 128, 256, 256, ... calls skipped.
    assert np.diff(attempts_at).tolist() == [17, 33, 65, 129, 257, 257, 257]


def test_auto_backoff_resets_after_a_success() -> None:
    compressor = Compressor("AUTO")
    noise = np.random.default_rng(3).bytes(8192)
    zeros = bytes(8192)
    for _ in range(1 + 16 + 1):  # two failed attempts: the wait is now 32 calls
        compressor.compress(noise)
    assert compressor.attempts == 2
    for _ in range(32):
        assert compressor.compress(zeros) == (None, zeros)  # skipped though compressible
    codec, compressed = compressor.compress(zeros)
    assert codec == "lz4" and len(compressed) < 100 and compressor.attempts == 3
    assert lz4.block.decompress(compressed, uncompressed_size=8192) == zeros
    compressor.compress(noise)  # fails; the wait is 16 again, not 64
    for _ in range(16):
        compressor.compress(noise)
    assert compressor.attempts == 4
    compressor.compress(noise)
    assert compressor.attempts == 5


def test_auto_keeps_only_compressions_that_save_a_fifth() -> None:
    rng = np.random.default_rng(4)
    for zeros, kept in ((10, False), (30, True)):  # lz4 saves about 5% and 25% of these
        region = b"".join(rng.bytes(100 - zeros) + bytes(zeros) for _ in range(100))
        compressor = Compressor("AUTO")
        codec, out = compressor.compress(region)
        assert compressor.attempts == 1
        assert (codec == "lz4") is kept
        assert out is region if not kept else len(out) <= 0.8 * len(region)


def test_small_regions_and_mode_none_are_never_compressed() -> None:
    compressor = Compressor("AUTO")
    assert compressor.compress(bytes(4095)) == (None, bytes(4095))
    assert compressor.attempts == 0
    zeros = [[np.zeros(1 << 16, np.uint8)]]
    got, frame, _ = _round_trip(zeros, Compressor(None))
    _assert_same(got, zeros)
    assert len(frame) > 1 << 16
    got, frame, _ = _round_trip(zeros, None)
    assert len(frame) > 1 << 16


def test_compressed_frame_buffers_view_the_decompressed_region() -> None:
    elements = [[np.zeros((64, 64), np.float64), bytes_scalar(b"\x00" * 5000)]]
    got, frame, _ = _round_trip(elements, Compressor("AUTO"))
    _assert_same(got, elements)
    assert len(frame) < 2000
    assert not np.shares_memory(got[0][0], np.frombuffer(frame, np.uint8))


# Malformed frames.


def _frame_with(header: Any, region: bytes = b"", raw_header: bytes | None = None) -> bytes:
    encoded = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<3sBI", b"FLW", 1, len(encoded)) + encoded + region


def test_truncated_frames_are_refused_at_every_offset() -> None:
    elements = [[np.arange(5, dtype=np.float32), bytes_scalar(b"ab\x00")]] * 3
    meta, buffers = pack_elements(elements)
    frame = encode_frame({"elements": meta}, buffers)
    for end in range(len(frame)):
        with pytest.raises(InvalidArgumentError):
            decode_frame(frame[:end])


def test_truncated_compressed_frames_are_refused_at_every_offset() -> None:
    frame = encode_frame({}, [np.zeros(8192, np.uint8)], compressor=Compressor("AUTO"))
    assert len(frame) < 200
    for end in range(len(frame)):
        with pytest.raises(InvalidArgumentError):
            decode_frame(frame[:end])


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (b"XYZ\x01" + bytes(4), "not a feedline frame"),
        (b"FLW\x02" + bytes(4), "version 2"),
        (b"FLW\x01\x00\x00", "truncated"),
        (struct.pack("<3sBI", b"FLW", 1, 100) + b"{}", "truncated"),
        (struct.pack("<3sBI", b"FLW", 1, 1 << 21), "max_header_bytes"),
        (_frame_with(None, raw_header=b'{"_frame":'), "JSON"),
        (_frame_with(None, raw_header=b'{"\xff":1}'), "UTF-8"),
        (_frame_with(None, raw_header=b"[" * 100_000), "JSON"),
        (_frame_with(None, raw_header=b'"\x00\x00"'), "JSON"),
        (_frame_with([1, 2]), "JSON object"),
        (_frame_with({}), "'_frame'"),
        (_frame_with({"_frame": [1]}), "'_frame'"),
        (_frame_with({"_frame": {}}), "sizes"),
        (_frame_with({"_frame": {"sizes": "3"}}, b"abc"), "sizes"),
        (_frame_with({"_frame": {"sizes": [-1, 4]}}, b"abc"), "non-negative"),
        (_frame_with({"_frame": {"sizes": [1.0, 2]}}, b"abc"), "non-negative integers"),
        (_frame_with({"_frame": {"sizes": [True, 2]}}, b"abc"), "non-negative integers"),
        (_frame_with({"_frame": {"sizes": [2, 2]}}, b"abc"), "add up to 4 bytes"),
        (_frame_with({"_frame": {"sizes": [1]}}, b"abc"), "add up to 1 bytes"),
        (_frame_with({"_frame": {"sizes": [3], "codec": "zstd"}}, b"abc"), "codec 'zstd'"),
        (
            _frame_with({"_frame": {"sizes": [5], "codec": "lz4"}}, b"abc"),
            "uncompressed size of None",
        ),
        (
            _frame_with({"_frame": {"sizes": [5], "codec": "lz4", "raw_size": "5"}}, b"abc"),
            "uncompressed size",
        ),
        (
            _frame_with({"_frame": {"sizes": [5], "codec": "lz4", "raw_size": 5 << 32}}, b"ab"),
            "uncompressed size",
        ),
        (
            _frame_with({"_frame": {"sizes": [9000], "codec": "lz4", "raw_size": 9000}}, b"a"),
            "uncompressed size",
        ),
        (
            _frame_with({"_frame": {"sizes": [3], "codec": "lz4", "raw_size": 3}}, b"\xff" * 9),
            "does not decompress",
        ),
    ],
)
def test_malformed_frames_are_refused(frame: bytes, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        decode_frame(frame)


def test_header_longer_than_the_limit_is_refused() -> None:
    frame = encode_frame({"text": "x" * 100})
    assert decode_frame(frame)[0] == {"text": "x" * 100}
    with pytest.raises(InvalidArgumentError, match="max_header_bytes=64"):
        decode_frame(frame, max_header_bytes=64)


def test_decompressed_size_must_match_the_declared_size() -> None:
    compressed = lz4.block.compress(bytes(6000), store_size=False)
    ok = _frame_with({"_frame": {"sizes": [6000], "codec": "lz4", "raw_size": 6000}}, compressed)
    assert bytes(decode_frame(ok)[1][0]) == bytes(6000)
    for raw_size in (5999, 6001, 7000):
        info = {"sizes": [raw_size], "codec": "lz4", "raw_size": raw_size}
        with pytest.raises(InvalidArgumentError, match="decompress"):
            decode_frame(_frame_with({"_frame": info}, compressed))


def test_corrupted_json_in_a_valid_frame_is_refused() -> None:
    frame = bytearray(encode_frame({"key": "value"}, [b"abc"]))
    frame[frame.index(b":")] = ord(",")
    with pytest.raises(InvalidArgumentError, match="JSON"):
        decode_frame(bytes(frame))


# Malformed element meta.

# Properties.


@settings(max_examples=100, deadline=None)
@given(
    header=st.dictionaries(
        st.text(max_size=5).filter(lambda k: k != "_frame"),
        st.one_of(st.integers(-(2**60), 2**60), st.text(max_size=5), st.booleans(), st.none()),
        max_size=4,
    ),
    buffers=st.lists(st.binary(max_size=5000), max_size=5),
)
def test_frame_round_trip_property(header: dict[str, Any], buffers: list[bytes]) -> None:
    compressor = Compressor("AUTO")
    frame = encode_frame(header, buffers, compressor=compressor)
    got_header, views = decode_frame(frame)
    assert got_header == header
    assert [bytes(v) for v in views] == buffers


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200), flip=st.integers(0, 10_000), value=st.integers(0, 255))
def test_corrupted_frames_never_raise_anything_else(data: bytes, flip: int, value: int) -> None:
    frame = bytearray(encode_frame({"a": 1}, [data, b"xyz"]))
    frame[flip % len(frame)] = value
    try:
        header, views = decode_frame(bytes(frame))
    except InvalidArgumentError:
        return
    assert isinstance(header, dict) and all(isinstance(v, memoryview) for v in views)
