"""Tests of feedline/io/parsing.py and its vectorised path, feedline/io/_example_fast.py."""

from __future__ import annotations

import doctest
import pathlib
import random

import numpy as np
import pytest

import feedline
from feedline._composite import stack as sparse_stack
from feedline.data import TFRecordDataset
from feedline.errors import InvalidArgumentError
from feedline.io import (
    FixedLenFeature,
    TFRecordWriter,
    VarLenFeature,
    decode_raw,
    parse_example,
    parse_single_example,
    parsing,
)
from feedline.io._example_fast import Template
from feedline.structure import SparseArray
from feedline.train import BytesList, Example, Feature, Features, FloatList, Int64List
from tests.io.test_example import TF_EXAMPLE


def example(**features: tuple[str, list]) -> bytes:
    """An Example from ``name=(kind, values)``, kind "b" (bytes), "f" (float) or "i" (int64)."""
    lists = {
        "b": ("bytes_list", BytesList),
        "f": ("float_list", FloatList),
        "i": ("int64_list", Int64List),
    }
    out = {}
    for name, (kind, values) in features.items():
        field, cls = lists[kind]
        out[name] = Feature(**{field: cls(value=values)})
    return Example(features=Features(feature=out)).SerializeToString()


def test_single_example_as_tensorflow_parses_it() -> None:
    parsed = parse_single_example(
        TF_EXAMPLE,
        {
            "a": FixedLenFeature([2], np.int64),
            "b": FixedLenFeature([], np.float32),
            "c": VarLenFeature(feedline.string),
            "z": FixedLenFeature([], np.float32, default_value=3.0),
        },
    )
    assert list(parsed) == ["a", "b", "c", "z"]
    assert parsed["a"].tolist() == [1, -2] and parsed["a"].dtype == np.int64
    assert parsed["b"].shape == () and parsed["b"] == np.float32(1.5)
    assert isinstance(parsed["c"], SparseArray)  # tf.SparseTensor, rank 1
    assert parsed["c"].indices.tolist() == [[0], [1]]
    assert parsed["c"].values.tolist() == [b"xy", b""]
    assert parsed["c"].dense_shape.tolist() == [2]
    assert parsed["z"] == np.float32(3.0)


def test_var_len_features_are_sparse_as_tensorflow_gives_them() -> None:
    # tf.io.parse_example's VarLenFeature docs: a batch of records with 1, 0 and 2 values gives
    # SparseTensor(indices=[[0, 0], [2, 0], [2, 1]], values=[..], dense_shape=[3, 2]).
    records = [example(v=("i", [7])), example(w=("i", [0])), example(v=("i", [8, 9]))]
    parsed = parse_example(records, {"v": VarLenFeature(np.int64)})["v"]
    assert isinstance(parsed, SparseArray)
    assert parsed.indices.tolist() == [[0, 0], [2, 0], [2, 1]]
    assert parsed.values.tolist() == [7, 8, 9] and parsed.values.dtype == np.int64
    assert parsed.dense_shape.tolist() == [3, 2]
    assert parsed.to_dense().tolist() == [[7, 0], [0, 0], [8, 9]]
    # one layout (the vectorised path): indices built from the per-row counts
    uniform = [example(v=("f", [k, k + 0.5])) for k in range(4)]
    fast = parse_example(uniform, {"v": VarLenFeature(np.float32)})["v"]
    assert fast.indices.tolist() == [[r, c] for r in range(4) for c in range(2)]
    assert fast.dense_shape.tolist() == [4, 2] and fast.values.dtype == np.float32
    single = parse_single_example(records[2], {"v": VarLenFeature(np.int64)})["v"]
    assert single == SparseArray([[0], [1]], np.array([8, 9]), [2])
    missing = parse_single_example(records[1], {"v": VarLenFeature(np.int64)})["v"]
    assert missing.indices.shape == (0, 1) and missing.dense_shape.tolist() == [0]
    empty = parse_example([], {"v": VarLenFeature(np.int64)})["v"]
    assert empty.indices.shape == (0, 2) and empty.dense_shape.tolist() == [0, 0]


def test_errors_name_the_key_as_tensorflow_does() -> None:
    with pytest.raises(InvalidArgumentError, match=r"Key: a\. Number of int64 values != expected"):
        parse_single_example(TF_EXAMPLE, {"a": FixedLenFeature([3], np.int64)})
    with pytest.raises(
        InvalidArgumentError,
        match=r"Key: a\. Data types don't match\. Data type: int64 but expected type: float",
    ):
        parse_single_example(TF_EXAMPLE, {"a": FixedLenFeature([2], np.float32)})
    with pytest.raises(InvalidArgumentError, match=r"Feature: q \(data type: float\) is required"):
        parse_single_example(TF_EXAMPLE, {"q": FixedLenFeature([2], np.float32)})
    with pytest.raises(InvalidArgumentError, match="Could not parse example input"):
        parse_single_example(b"\x0a\x05zz", {"q": VarLenFeature(np.float32)})
    with pytest.raises(InvalidArgumentError, match=r"record 1 of the batch"):
        parse_example([TF_EXAMPLE, b"\x0a\x05zz"], {"a": VarLenFeature(np.int64)})


def test_example_names_are_said_in_errors_and_name_is_accepted() -> None:
    # TensorFlow's signatures: parse_example(serialized, features, example_names, name).
    spec = {"a": FixedLenFeature([2], np.float32)}
    with pytest.raises(InvalidArgumentError, match=r"record 0 of the batch, 'first'"):
        parse_example([TF_EXAMPLE, TF_EXAMPLE], spec, example_names=["first", "second"], name="p")
    with pytest.raises(InvalidArgumentError, match=r"Key: a \(example 'only'\)"):
        parse_single_example(TF_EXAMPLE, spec, example_names="only", name="p")
    with pytest.raises(InvalidArgumentError, match="2 names for 1 record"):
        parse_example([TF_EXAMPLE], {"a": VarLenFeature(np.int64)}, example_names=["x", "y"])
    parsed = parse_example([TF_EXAMPLE], {"a": VarLenFeature(np.int64)}, ["x"], "p")
    assert (
        parsed["a"].values.tolist()
        == parse_single_example(TF_EXAMPLE, {"a": VarLenFeature(np.int64)})["a"].values.tolist()
    )


def test_fixed_len_sequence_features_are_padded_as_tensorflow_pads_them() -> None:
    from feedline.io import FixedLenSequenceFeature

    def record(ids: list[int], words: list[bytes]) -> bytes:
        feature = {"ids": Feature(int64_list=Int64List(value=ids))}
        if words:
            feature["words"] = Feature(bytes_list=BytesList(value=words))
        return Example(features=Features(feature=feature)).SerializeToString()

    spec = {
        "ids": FixedLenSequenceFeature([2], np.int64, allow_missing=True, default_value=-1),
        "words": FixedLenSequenceFeature([], feedline.string, allow_missing=True),
    }
    rows = [record([1, 2, 3, 4], [b"a"]), record([5, 6], [b"b", b"c"]), record([], [])]
    parsed = parse_example(rows, spec)
    assert parsed["ids"].tolist() == [[[1, 2], [3, 4]], [[5, 6], [-1, -1]], [[-1, -1], [-1, -1]]]
    assert parsed["words"].tolist() == [[b"a", b""], [b"b", b"c"], [b"", b""]]
    one = parse_single_example(rows[0], spec)
    assert one["ids"].tolist() == [[1, 2], [3, 4]] and one["words"].tolist() == [b"a"]
    assert parsing.parsed_spec(spec, 3)["ids"] == feedline.TensorSpec((3, None, 2), np.int64)
    with pytest.raises(InvalidArgumentError, match="not a multiple of stride length"):
        parse_single_example(record([1, 2, 3], []), spec)
    with pytest.raises(InvalidArgumentError, match="requires allow_missing to be True"):
        FixedLenSequenceFeature([2], np.int64)


def test_feature_specs_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="dtype must be float32, int64 or a string"):
        FixedLenFeature([], np.int32)
    with pytest.raises(InvalidArgumentError, match="shape must be a list of ints"):
        FixedLenFeature([-1], np.int64)
    with pytest.raises(InvalidArgumentError, match="does not fit shape"):
        FixedLenFeature([2], np.int64, default_value=[1, 2, 3])
    assert FixedLenFeature([2, 2], np.float32, 0.0).default_value.shape == (2, 2)
    assert FixedLenFeature(3, np.int64).shape == (3,)
    with pytest.raises(InvalidArgumentError, match="features must be a dict"):
        parse_single_example(TF_EXAMPLE, [FixedLenFeature([], np.int64)])  # type: ignore[arg-type]


def _random_record(rng: random.Random, uniform: bool) -> bytes:
    n = 3 if uniform else rng.randrange(0, 4)
    features: dict[str, tuple[str, list]] = {
        "img": (
            "b",
            [bytes(rng.randrange(256) for _ in range(6 if uniform else rng.randrange(9)))],
        ),
        "label": ("i", [rng.choice([0, 1, 127, 128, 300, -1, -(2**63), 2**63 - 1])]),
        "f": ("f", [rng.uniform(-1, 1) for _ in range(n)]),
        "ids": ("i", [rng.randrange(-5, 2**40) for _ in range(n)]),
        "words": ("b", [b"w" * rng.randrange(0, 3) for _ in range(n)]),
    }
    if not uniform and rng.random() < 0.3:
        del features["f"]
    order = list(features)
    if not uniform:
        rng.shuffle(order)
    return example(**{k: features[k] for k in order})


_SPECS = {
    "img": FixedLenFeature([], feedline.string),
    "label": FixedLenFeature([], np.int64),
    "f": VarLenFeature(np.float32),
    "ids": VarLenFeature(np.int64),
    "words": VarLenFeature(feedline.string),
}


def _one_by_one(records: list[bytes], specs: dict) -> dict[str, np.ndarray]:
    rows = [parse_single_example(r, specs) for r in records]
    out = {}
    for key, spec in specs.items():
        if isinstance(spec, VarLenFeature):
            out[key] = sparse_stack([row[key] for row in rows])
        else:
            out[key] = np.stack([row[key] for row in rows])
    return out


@pytest.mark.parametrize("uniform", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_batch_parse_equals_record_by_record(uniform: bool, seed: int) -> None:
    rng = random.Random(seed)
    records = [_random_record(rng, uniform) for _ in range(rng.randrange(1, 40))]
    expected = _one_by_one(records, _SPECS)
    as_objects = np.array(records, dtype=object)  # what TFRecordDataset batches are
    # a list, an object array of bytes, and a NUL-padded ``S`` array
    for batch in (records, as_objects, np.array(records)):
        got = parse_example(batch, _SPECS)
        for key in _SPECS:
            if isinstance(_SPECS[key], VarLenFeature):
                assert got[key] == expected[key], key  # indices, values and dense_shape
            else:
                assert got[key].tolist() == expected[key].tolist(), key
            assert got[key].dtype == expected[key].dtype
    for key in ("img", "words"):
        assert expected[key].dtype == object
        values = expected[key].values if key == "words" else expected[key]
        assert all(type(v) is bytes for v in values.tolist())


def test_uniform_batches_take_the_vectorised_path() -> None:
    rng = random.Random(1)
    records = [_random_record(rng, True) for _ in range(8)]
    rows = np.array(records).view(np.uint8).reshape(8, -1)
    template = Template.build(records[0])
    assert template is not None and template.features.keys() == _SPECS.keys()
    same_layout = template.matching_rows(rows)
    label_lengths = {len(r) for r in records}
    assert same_layout.sum() >= 1 and (len(label_lengths) > 1 or same_layout.all())
    assert Template.build(b"\x0a\x05zz") is None
    assert Template.build(b"") is None


def test_images_and_labels_through_tfrecords(tmp_path: pathlib.Path) -> None:
    images = np.random.default_rng(0).integers(0, 256, (50, 4, 4), dtype=np.uint8)
    images[:, 2:] = 0  # trailing NUL bytes, as in MNIST
    labels = np.arange(50) % 10
    path = tmp_path / "mnist.tfrecord"
    with TFRecordWriter(path) as writer:
        for image, label in zip(images, labels, strict=True):
            writer.write(example(image=("b", [image.tobytes()]), label=("i", [int(label)])))
    specs = {"image": FixedLenFeature([], feedline.string), "label": FixedLenFeature([], np.int64)}
    got_images, got_labels = [], []
    for batch in TFRecordDataset(str(path)).batch(16):
        parsed = parse_example(batch, specs)
        got_images.append(decode_raw(parsed["image"], np.uint8).reshape(-1, 4, 4))
        got_labels.append(parsed["label"])
    np.testing.assert_array_equal(np.concatenate(got_images), images)
    np.testing.assert_array_equal(np.concatenate(got_labels), labels)
    single = parse_single_example(next(iter(TFRecordDataset(str(path)))), specs)
    np.testing.assert_array_equal(decode_raw(single["image"], np.uint8).reshape(4, 4), images[0])


def test_missing_features_with_defaults_in_a_batch() -> None:
    records = [example(x=("f", [1.0])), example(y=("i", [5])), example(x=("f", [2.0]))]
    specs = {
        "x": FixedLenFeature([], np.float32, default_value=-1.0),
        "y": FixedLenFeature([1], np.int64, default_value=[0]),
    }
    parsed = parse_example(records, specs)
    assert parsed["x"].tolist() == [1.0, -1.0, 2.0] and parsed["y"].tolist() == [[0], [5], [0]]
    with pytest.raises(InvalidArgumentError, match=r"Feature: z .* is required"):
        parse_example(np.array(records), {"z": FixedLenFeature([], np.float32)})


def test_empty_examples_and_batches() -> None:
    empty = Example().SerializeToString()
    assert empty == b""
    parsed = parse_single_example(np.array(empty), {"v": VarLenFeature(np.int64)})
    assert parsed["v"].values.tolist() == [] and parsed["v"].shape == (0,)
    got = parse_example(np.array([empty, empty]), {"f": FixedLenFeature([2], np.int64, [1, 2])})
    assert got["f"].tolist() == [[1, 2], [1, 2]]
    assert parse_example([], {"v": VarLenFeature(np.int64)})["v"].values.tolist() == []


@pytest.mark.parametrize("uniform", [True, False])
def test_bytes_features_come_back_exactly(uniform: bool) -> None:
    values = [b"", b"\x00", b"ab\x00\x00", bytes(range(256))]
    if uniform:  # one layout: the vectorised path parses every record
        values = [b"\x00\x00\x00\x00", b"a\x00\x00\x00", b"ab\x00\x00", b"\xff\x00\x01\x00"]
    records = [
        example(s=("b", [v]), many=("b", [v, v[:1], b"\x00" * (2 if uniform else k)]))
        for k, v in enumerate(values)
    ]
    specs = {"s": FixedLenFeature([], feedline.string), "many": VarLenFeature(feedline.string)}
    batch = np.empty(len(records), dtype=object)
    batch[:] = records
    rows = np.frombuffer(b"".join(records), np.uint8).reshape(4, -1) if uniform else None
    if rows is not None:
        matched = parsing._parse_fast(rows, specs, records)[1]
        assert matched is not None and matched.all()
    for got in (parse_example(batch, specs), parse_example(records, specs)):
        assert got["s"].dtype == object and got["s"].shape == (4,)
        assert got["s"].tolist() == _values_of(records, "s")
        assert got["many"].dtype == object
        assert got["many"].values.tolist() == _values_of(records, "many")
    for record in records:
        for serialized in (record, np.array(record, dtype=object)):
            single = parse_single_example(serialized, specs)
            assert single["s"].shape == () and single["s"].dtype == object
            assert (
                single["s"].item()
                == Example.FromString(record).features.feature["s"].bytes_list.value[0]
            )
        one = parse_example(np.array(record, dtype=object), specs)  # a 0-d array is one record
        assert one["s"].shape == ()


def _values_of(records: list[bytes], key: str) -> list[bytes]:
    out: list[bytes] = []
    for record in records:
        feature = Example.FromString(record).features.feature[key]
        values = list(feature.bytes_list.value)
        out.extend(values if key == "many" else values[:1])
    return out


def test_bytes_defaults_and_missing_bytes_features() -> None:
    records = [example(x=("i", [1])), example(s=("b", [b"a\x00"]), x=("i", [2]))]
    specs = {
        "s": FixedLenFeature([], feedline.string, default_value=b"\x00\x00"),
        "t": FixedLenFeature([2], feedline.string, default_value="é"),
        "v": VarLenFeature(feedline.string),
    }
    got = parse_example(records, specs)
    assert got["s"].tolist() == [b"\x00\x00", b"a\x00"]
    assert got["t"].tolist() == [["é".encode()] * 2] * 2 and got["t"].dtype == object
    assert got["v"].values.tolist() == [] and got["v"].dtype == object
    assert got["v"].dense_shape.tolist() == [2, 0]
    with pytest.raises(InvalidArgumentError, match="parse_single_example takes one record"):
        parse_single_example(np.array(records, dtype=object), specs)
    with pytest.raises(InvalidArgumentError, match="holding int"):
        parse_single_example(np.array(5, dtype=object), specs)


def test_decode_raw_of_object_arrays_keeps_every_byte() -> None:
    image = bytes([7, 1, 2, 0, 0, 0])  # an image whose last pixels are 0
    single = np.array(image, dtype=object)
    assert decode_raw(single, np.uint8).tolist() == list(image)
    assert decode_raw(image, np.uint8).tolist() == list(image)
    batch = np.array([image, image[::-1]], dtype=object)
    assert decode_raw(batch, np.uint8).tolist() == [list(image), list(image[::-1])]
    assert decode_raw(batch, np.int16).shape == (2, 3)
    assert decode_raw([image, image], np.uint8).shape == (2, 6)
    parsed = parse_single_example(
        example(image=("b", [image])), {"image": FixedLenFeature([], feedline.string)}
    )
    assert decode_raw(parsed["image"], np.uint8).tolist() == list(image)
    empty = np.array([b"", b""], dtype=object)
    assert decode_raw(empty, np.uint8).shape == (2, 0)
    assert decode_raw(np.empty(0, dtype=object), np.uint8).shape == (0, 0)
    with pytest.raises(InvalidArgumentError, match="different lengths"):
        decode_raw(np.array([b"ab", b"a"], dtype=object), np.uint8)
    with pytest.raises(InvalidArgumentError, match="holding str"):
        decode_raw(np.array(["ab"], dtype=object), np.uint8)


def test_decode_raw() -> None:
    assert decode_raw(b"\x01\x00\x02\x00", np.int16).tolist() == [1, 2]
    assert decode_raw(b"\x00\x01", np.int16, little_endian=False).tolist() == [1]
    batch = np.array([b"\x01\x02", b"\x03\x04"])
    assert decode_raw(batch, np.uint8).tolist() == [[1, 2], [3, 4]]
    assert decode_raw(np.array(b"\x05\x00\x00\x00"), np.int32).tolist() == [5]
    with pytest.raises(InvalidArgumentError, match="not a whole number of int32"):
        decode_raw(b"abc", np.int32)
    with pytest.raises(InvalidArgumentError, match="takes bytes"):
        decode_raw(np.arange(3), np.uint8)


def test_the_previous_batch_layout_is_reused_only_where_every_row_fits() -> None:
    specs = {
        "a": FixedLenFeature([], np.int64, default_value=-1),
        "b": FixedLenFeature([], np.int64, default_value=-2),
    }
    first = [example(a=("i", [v])) for v in (1, 2, 3)]
    other_key = [example(b=("i", [v])) for v in (4, 5, 6)]  # same length, another key
    longer = [example(a=("i", [v])) for v in (300, 1, 2)]  # a two-byte varint in row 0
    assert len({len(r) for r in first + other_key}) == 1
    assert parse_example(first, specs)["a"].tolist() == [1, 2, 3]
    assert parsing._last_template is not None
    got = parse_example(other_key, specs)
    assert got["a"].tolist() == [-1, -1, -1] and got["b"].tolist() == [4, 5, 6]
    assert parse_example(first, specs)["a"].tolist() == [1, 2, 3]
    assert parse_example(longer, specs)["a"].tolist() == [300, 1, 2]
    assert parse_example(first[:2], specs)["a"].tolist() == [1, 2]


def test_the_docstrings() -> None:
    assert doctest.testmod(parsing).failed == 0
