"""Tests of feedline/io/example_pb.py: the Example protos and their wire format."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

import feedline
from feedline.train import BytesList, Example, Feature, Features, FloatList, Int64List

# tf.train.Example(features={"a": int64 [1, -2], "b": float [1.5], "c": bytes [b"xy", b""]})
# .SerializeToString() as TensorFlow 2.21 writes it (its map order: b, a, c).
TF_EXAMPLE = bytes.fromhex(
    "0a340a0d0a0162120812060a040000c03f0a140a0161120f1a0d0a0b01feffffffffffffffff01"
    "0a0d0a016312080a060a0278790a00"
)


def _example() -> Example:
    return Example(
        features=Features(
            feature={
                "a": Feature(int64_list=Int64List(value=[1, -2])),
                "b": Feature(float_list=FloatList(value=[1.5])),
                "c": Feature(bytes_list=BytesList(value=[b"xy", b""])),
            }
        )
    )


def test_parses_what_tensorflow_writes() -> None:
    example = Example.FromString(TF_EXAMPLE)
    assert example == _example()
    feature = example.features.feature
    assert list(feature["a"].int64_list.value) == [1, -2]
    assert list(feature["b"].float_list.value) == [1.5]
    assert list(feature["c"].bytes_list.value) == [b"xy", b""]
    assert feature["a"].WhichOneof("kind") == "int64_list"


def test_field_numbers_and_packed_encoding() -> None:
    one = Example(features=Features(feature={"x": Feature(int64_list=Int64List(value=[7]))}))
    # Example.features=1 (0a), Features.feature=1 map entry (0a), key=1 (0a 01 'x'),
    # value=2 (12), Feature.int64_list=3 (1a), Int64List.value=1 packed (0a 01 07).
    assert one.SerializeToString() == bytes.fromhex("0a0c0a0a0a017812051a030a0107")
    floats = Feature(float_list=FloatList(value=[1.0, 2.0])).SerializeToString()
    assert floats == bytes.fromhex("120a0a080000803f00000040")  # packed: one length, 8 bytes
    assert Feature(bytes_list=BytesList(value=[b"z"])).SerializeToString() == b"\x0a\x03\x0a\x01z"


def test_round_trip_and_oneof() -> None:
    example = _example()
    again = Example.FromString(example.SerializeToString())
    assert again == example
    feature = Feature(int64_list=Int64List(value=[1]))
    feature.float_list.value.append(2.0)
    assert feature.WhichOneof("kind") == "float_list"  # setting one member clears the other


def test_full_names_are_tensorflow_s_and_exports() -> None:
    assert Example.DESCRIPTOR.full_name == "tensorflow.Example"
    assert Features.DESCRIPTOR.fields_by_name["feature"].message_type.GetOptions().map_entry
    example_names = {"BytesList", "Example", "Feature", "Features", "FloatList", "Int64List"}
    assert example_names <= set(feedline.train.__all__)
    assert feedline.train.__all__ == sorted(feedline.train.__all__)


def test_garbage_does_not_parse() -> None:
    with pytest.raises(DecodeError):
        Example.FromString(b"\x0a\x05zz")
