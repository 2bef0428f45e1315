"""Tests of feedline/_py_functions.py: ``tf.py_function`` and ``tf.numpy_function``."""

from __future__ import annotations

import numpy as np

import feedline as tf


def test_py_function_calls_the_function_and_casts_to_tout() -> None:
    out = tf.py_function(lambda a, b: a + b, [np.int64(1), 2], tf.float32)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and float(out) == 3.0
    pair = tf.py_function(lambda x: (x, x * 2), [np.arange(2)], [tf.int32, tf.int64])
    assert [p.dtype for p in pair] == [np.int32, np.int64] and pair[1].tolist() == [0, 2]
    assert tf.py_function(lambda: b"s", [], tf.string).item() == b"s"


def test_numpy_function_in_a_dataset_map() -> None:
    def upper(line: bytes) -> bytes:
        return line.upper()

    ds = tf.data.Dataset.from_tensor_slices([b"a", b"b"]).map(
        lambda x: tf.numpy_function(upper, [x], tf.string, stateful=False)
    )
    assert [x.item() for x in ds] == [b"A", b"B"]
    squares = tf.data.Dataset.range(3).map(lambda x: tf.py_function(np.square, [x], tf.int64))
    assert [int(x) for x in squares] == [0, 1, 4]


def test_numpy_function_hands_scalars_over_as_tensorflow_does() -> None:
    # The tf.data guide's example: a string scalar comes as bytes, so .decode() works.
    d = tf.data.Dataset.from_tensor_slices(["hello", "world"])
    d = d.map(lambda x: tf.numpy_function(lambda t: t.decode("utf-8").upper(), [x], tf.string))
    assert [x.item() for x in d] == [b"HELLO", b"WORLD"]
    seen: list[type] = []

    def record(*args: object) -> np.int64:
        seen.extend(type(a) for a in args)
        return np.int64(0)

    inputs = [np.array(3), np.float32(2), np.arange(2), np.array(b"s", object)]
    tf.numpy_function(record, inputs, tf.int64)
    assert seen == [np.int64, np.float32, np.ndarray, bytes]
    # py_function keeps its inputs as they are (TensorFlow's are tensors: drop .numpy()).
    assert tf.py_function(lambda t: type(t).__name__, [np.array(3)], tf.string).item() == b"ndarray"
