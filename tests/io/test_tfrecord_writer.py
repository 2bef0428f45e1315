"""Tests of feedline/io/tfrecord.py."""

from __future__ import annotations

import gzip
import pathlib
import zlib
from typing import Any

import numpy as np
import pytest

from feedline.data import TFRecordDataset
from feedline.errors import FailedPreconditionError, InvalidArgumentError
from feedline.io import TFRecordOptions, TFRecordWriter
from feedline.io.tfrecord import masked_crc32c


def test_frame_layout(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "a.tfrecord"
    with TFRecordWriter(path) as writer:
        writer.write(b"abc")
    data = path.read_bytes()
    assert len(data) == 8 + 4 + 3 + 4
    assert data[:8] == (3).to_bytes(8, "little")
    assert int.from_bytes(data[8:12], "little") == masked_crc32c(data[:8])
    assert data[12:15] == b"abc"
    assert int.from_bytes(data[15:], "little") == masked_crc32c(b"abc")
    assert masked_crc32c(b"") == 0xA282EAD8  # crc32c("") is 0


def test_accepts_bytes_like_str_and_0d_arrays(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "b.tfrecord"
    with TFRecordWriter(str(path)) as writer:
        writer.write(bytearray(b"1"))
        writer.write(memoryview(b"2"))
        writer.write("drei")
        writer.write(np.array(b"4\x00", dtype=object))  # a TFRecordDataset element
        writer.write(np.array(b"5\x00"))  # an ``S`` array: its bytes at its item size
        with pytest.raises(InvalidArgumentError, match="takes bytes"):
            writer.write(5)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="takes bytes"):
            writer.write(np.array("6", dtype=object))  # type: ignore[arg-type]
    assert [r.item() for r in TFRecordDataset(str(path))] == [
        b"1", b"2", b"drei", b"4\x00", b"5\x00"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("options", "decompress"),
    [
        ("GZIP", gzip.decompress),
        ("ZLIB", zlib.decompress),
        (TFRecordOptions("GZIP", compression_level=1), gzip.decompress),
        (TFRecordOptions(compression_type="zlib"), zlib.decompress),
    ],
)
def test_compressed_streams(tmp_path: pathlib.Path, options: object, decompress: object) -> None:
    compressed, plain = tmp_path / "c.tfrecord", tmp_path / "p.tfrecord"
    with TFRecordWriter(compressed, options) as a, TFRecordWriter(plain) as b:  # type: ignore[arg-type]
        for i in range(100):
            a.write(b"record %d" % i)
            b.write(b"record %d" % i)
    assert decompress(compressed.read_bytes()) == plain.read_bytes()  # type: ignore[operator]


@pytest.mark.parametrize("compression", ["", "GZIP", "ZLIB"])
def test_flush_makes_records_readable(tmp_path: pathlib.Path, compression: str) -> None:
    path = tmp_path / "f.tfrecord"
    writer = TFRecordWriter(path, compression)
    writer.write(b"early")
    writer.flush()
    reader = iter(TFRecordDataset(str(path), compression_type=compression))
    assert next(reader).item() == b"early"
    writer.close()
    writer.close()  # idempotent
    with pytest.raises(FailedPreconditionError, match="is closed"):
        writer.write(b"late")


def test_bad_options() -> None:
    with pytest.raises(InvalidArgumentError, match="compression_type must be"):
        TFRecordWriter("/tmp/never.tfrecord", "BZ2")
    with pytest.raises(InvalidArgumentError, match="compression_level"):
        TFRecordOptions("GZIP", compression_level=12)


def test_tensorflows_zlib_options(tmp_path: Any) -> None:
    # TFRecordOptions(compression_type, flush_mode, input_buffer_size, output_buffer_size,
    # window_bits, compression_level, compression_method, mem_level, compression_strategy).
    options = TFRecordOptions("ZLIB", None, 1 << 16, 1 << 16, 9, 9, zlib.DEFLATED, 9, 1)
    path = tmp_path / "small-window.tfrecord"
    with TFRecordWriter(str(path), options) as writer:
        for i in range(50):
            writer.write(b"record %d" % i * 100)
    raw = path.read_bytes()
    assert raw[0] >> 4 == 1  # the zlib header's window: 2 ** (8 + 1) bytes, as asked
    got = [r.item() for r in TFRecordDataset(str(path), compression_type="ZLIB")]
    assert got == [b"record %d" % i * 100 for i in range(50)]
    assert TFRecordOptions.get_compression_type_string(options) == "ZLIB"
    assert TFRecordOptions.get_compression_type_string(None) == ""
    assert TFRecordOptions.get_compression_type_string("GZIP") == "GZIP"
    with pytest.raises(InvalidArgumentError, match="window_bits must be an int from 8 to 15"):
        TFRecordOptions("ZLIB", window_bits=20)
