"""Tests of feedline/structure.py, the element model (also named feedline.data.structure)."""

from __future__ import annotations

import collections
import inspect

import numpy as np
import pytest

import feedline
from feedline import structure
from feedline.data import structure as data_structure
from feedline.errors import InvalidArgumentError
from feedline.structure import TensorSpec

Point = collections.namedtuple("Point", ["x", "y"])


def test_python_values_become_arrays_with_tf_dtypes() -> None:
    # As tf.constant: int -> int32 (int64 past int32's range), float -> float32, str -> bytes.
    element = structure.normalize((1, 2.5, True, "a", b"b", [1, 2], 2**40, [1, 2**40]))
    dtypes = [np.asarray(v).dtype for v in element]
    assert dtypes[:3] == [np.int32, np.float32, np.bool_]
    assert dtypes[3] == np.dtype(object) and dtypes[4] == np.dtype(object)
    assert element[3].item() == b"a"
    assert element[4].shape == () and element[4].item() == b"b"
    assert element[5].tolist() == [1, 2] and element[5].dtype == np.int32
    assert element[6] == 2**40 and element[6].dtype == np.int64
    assert element[7].dtype == np.int64
    # A list of tuples of Python ints too (the guide's from_tensor_slices([(7, 8), (9, 10)])).
    assert structure.normalize([(7, 8), (9, 10)]).dtype == np.int32
    assert structure.normalize([(1, 2**40)]).dtype == np.int64
    # NumPy values keep their dtypes; only Python ints are narrowed.
    assert structure.normalize(np.int64(3)).dtype == np.int64
    assert structure.normalize([np.int64(1), np.int64(2)]).dtype == np.int64
    assert structure.normalize(np.arange(3)).dtype == np.int64
    # Scalars are NumPy scalars: hashable, as TensorFlow's .numpy() gives them.
    assert {structure.normalize(1), structure.normalize(1)} == {1}


def test_strings_become_utf8_bytes() -> None:
    # tf.string holds bytes: str, NumPy unicode arrays and lists of str become UTF-8 bytes.
    assert structure.normalize("é").item() == "é".encode()
    for value in (np.array(["a", "bé"]), ["a", "bé"], np.array(["a", "bé"], dtype=object)):
        leaf = structure.normalize(value)
        assert leaf.dtype == object and leaf.tolist() == [b"a", "bé".encode()]
    assert structure.normalize(np.str_("x")).item() == b"x"
    assert TensorSpec((), np.str_) == TensorSpec((), feedline.string)


def test_output_elements_have_hashable_scalars() -> None:
    element = structure.normalize((1, b"a\x00", np.arange(2), {"s": "b"}))
    out = structure.as_output(element)
    assert type(out[0]) is np.int32 and {out[0]} == {1}
    # Strings stay 0-d object arrays: .item() gives the exact bytes.
    assert out[1].shape == () and out[1].item() == b"a\x00"
    assert out[2].tolist() == [0, 1] and out[3]["s"].item() == b"b"
    assert out[3]["s"].item().decode() == "b"


def test_bytes_become_object_arrays_of_exact_bytes() -> None:
    for value in (b"", b"\x00", b"a\x00\x00", bytes(range(256))):
        leaf = structure.normalize(value)
        assert isinstance(leaf, np.ndarray) and leaf.shape == () and leaf.dtype == object
        assert type(leaf.item()) is bytes and leaf.item() == value
    assert structure.normalize(b"").item() != structure.normalize(b"\x00").item()
    vector = structure.normalize([b"a\x00", b""])
    assert vector.dtype == object and vector.tolist() == [b"a\x00", b""]
    matrix = structure.normalize({"m": [[b"\x00"], [b"b"]]})["m"]
    assert matrix.shape == (2, 1) and matrix.tolist() == [[b"\x00"], [b"b"]]
    # NumPy bytes given by the user become object arrays of bytes (``S`` has no trailing NULs).
    assert structure.normalize(np.bytes_(b"x")).dtype == object
    converted = structure.normalize(np.array([b"x", b"yy"]))
    assert converted.dtype == object and converted.tolist() == [b"x", b"yy"]
    # Lists of 0-d byte arrays (rows of a batch) stack into one array of their bytes.
    rows = [structure.normalize(b"a\x00"), structure.normalize(b"")]
    assert structure.normalize(rows).tolist() == [b"a\x00", b""]
    assert structure.normalize((rows[0], 1))[0].item() == b"a\x00"


def test_object_arrays_must_hold_bytes() -> None:
    ok = np.array([b"a", b"b\x00"], dtype=object)
    assert structure.normalize(ok) is ok
    for bad, name in [
        (np.array([b"a", 1], dtype=object), "int"),
        (np.array(None, dtype=object), "NoneType"),
    ]:
        with pytest.raises(InvalidArgumentError, match=f"holds an item of type {name}"):
            structure.normalize(bad)
    with pytest.raises(InvalidArgumentError, match="holds an item of type int"):
        structure.normalize([b"a", 1])


def test_bytes_specs_are_object_dtype_shown_as_bytes() -> None:
    spec = structure.spec_of(structure.normalize(b"a"))
    assert spec == TensorSpec((), np.dtype(object)) == TensorSpec((), np.bytes_)
    assert spec == TensorSpec((), np.dtype("S"))  # S dtypes given here mean bytes too
    assert repr(spec) == "TensorSpec(shape=(), dtype=bytes)"
    assert repr(TensorSpec((None,), np.str_)) == "TensorSpec(shape=(None,), dtype=bytes)"
    empty = structure.empty_like_spec(TensorSpec((None, 3), np.bytes_))
    assert empty.shape == (0, 3) and empty.dtype == object


def test_batching_bytes_stacks_object_arrays_exactly() -> None:
    rows = [structure.normalize(b) for b in (b"", b"\x00", b"ab\x00")]
    batch = structure.batch_elements(rows)
    assert batch.dtype == object and batch.shape == (3,)
    assert batch.tolist() == [b"", b"\x00", b"ab\x00"]
    row = structure.slice_element(batch, 1)
    assert isinstance(row, np.ndarray) and row.shape == () and row.item() == b"\x00"
    nested = structure.batch_elements([{"s": r, "i": np.int64(k)} for k, r in enumerate(rows)])
    assert nested["s"].tolist() == batch.tolist() and nested["i"].tolist() == [0, 1, 2]
    with pytest.raises(InvalidArgumentError, match="mixed types"):
        structure.batch_elements([rows[0], np.int64(1)])


def test_nested_structures_are_kept() -> None:
    element = structure.normalize({"p": Point(1, 2.0), "q": (3,)})
    assert isinstance(element["p"], Point)
    spec = structure.spec_of(element)
    assert spec["p"].x == TensorSpec((), np.int32)
    assert spec["q"] == (TensorSpec((), np.int32),)


def test_ragged_list_is_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="ragged"):
        structure.normalize([[1, 2], [3]])


def test_spec_compatibility_and_common_spec() -> None:
    a = TensorSpec((None, 3), np.float32)
    assert a.is_compatible_with(np.zeros((5, 3), np.float32))
    assert not a.is_compatible_with(np.zeros((5, 4), np.float32))
    common = TensorSpec((2, 3), np.float32).most_specific_common(TensorSpec((4, 3), np.float32))
    assert common == a
    assert repr(a) == "TensorSpec(shape=(None, 3), dtype=float32)"


def test_batch_elements_names_the_component() -> None:
    elements = [{"a": np.zeros(2), "b": np.zeros(1)}, {"a": np.zeros(2), "b": np.zeros(3)}]
    with pytest.raises(InvalidArgumentError, match=r"component b.*\(1,\), \(3,\)"):
        structure.batch_elements(elements)


def test_empty_like_spec() -> None:
    empty = structure.empty_like_spec((TensorSpec((None, 4), np.float32),))
    assert empty[0].shape == (0, 4) and empty[0].dtype == np.float32


def test_feedline_data_structure_is_the_element_model_under_its_older_name() -> None:
    defined_here = {
        name
        for name, value in vars(structure).items()
        if not name.startswith("_")
        and (inspect.isfunction(value) or inspect.isclass(value))
        and value.__module__ == structure.__name__
    }
    assert {"TensorSpec", "normalize", "batch_elements"} <= defined_here
    assert defined_here <= set(data_structure.__all__)
    for name in data_structure.__all__:
        assert getattr(data_structure, name) is getattr(structure, name), name
    assert feedline.TensorSpec is structure.TensorSpec
    assert feedline.data.TensorSpec is structure.TensorSpec


def test_tensor_spec_takes_a_name() -> None:
    spec = TensorSpec((None, 3), np.float32, name="features")
    assert spec.name == "features" and TensorSpec((), np.int64).name is None
    assert spec == TensorSpec((None, 3), np.float32, "features")
    assert feedline.TensorSpec(shape=[2], dtype=feedline.int32, name="x").shape == (2,)
    assert repr(spec) == "TensorSpec(shape=(None, 3), dtype=float32, name='features')"


def test_dataset_spec_from_value() -> None:
    from feedline.data import Dataset

    spec = structure.DatasetSpec.from_value(Dataset.range(3).map(lambda x: (x, [x, x])))
    assert spec == structure.DatasetSpec((TensorSpec((), np.int64), TensorSpec((2,), np.int64)))
    assert spec.is_compatible_with(Dataset.range(5).map(lambda x: (x, [x, x])))
    with pytest.raises(TypeError, match="expects a Dataset"):
        structure.DatasetSpec.from_value([1, 2])
