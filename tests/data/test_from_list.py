"""Tests of feedline/data/ops/from_list.py."""

from __future__ import annotations

import numpy as np
import pytest

from feedline.data import TensorSpec
from feedline.data.experimental import from_list
from feedline.data.ops.from_list import ListDataset
from feedline.errors import InvalidArgumentError
from tests.data.checkpoint_utils import checkpoint_test


def test_tensorflow_docstring_examples() -> None:
    # TensorFlow 2.21, data.experimental.from_list:
    # from_list([(1, 'a'), (2, 'b'), (3, 'c')]) -> [(1, b'a'), (2, b'b'), (3, b'c')]
    ds = from_list([(1, "a"), (2, "b"), (3, "c")])
    assert type(ds) is ListDataset
    assert [(int(x), y.item()) for x, y in ds] == [(1, b"a"), (2, b"b"), (3, b"c")]
    # from_list([[1], [2, 3]]) -> [array([1]), array([2, 3])]: non-rectangular input.
    ds = from_list([[1], [2, 3]])
    assert [x.tolist() for x in ds] == [[1], [2, 3]]
    assert ds.element_spec.shape == (None,)
    # Nested structures: [(1, ('a', 'b')), (2, ('c', 'd'))] -> (1, (b'a', b'b')), ...
    ds = from_list([(1, ("a", "b")), (2, ("c", "d"))])
    assert [(int(x), (a.item(), b.item())) for x, (a, b) in ds] == [
        (1, (b"a", b"b")),
        (2, (b"c", b"d")),
    ]
    # Dicts: [{'a': 1, 'b': 'x'}, {'a': 2, 'b': 'y'}]
    ds = from_list([{"a": 1, "b": "x"}, {"a": 2, "b": "y"}])
    assert [(int(e["a"]), e["b"].item()) for e in ds] == [(1, b"x"), (2, b"y")]


def test_same_as_from_tensor_slices_for_scalars_and_cardinality() -> None:
    ds = from_list([np.float32(1.5), np.float32(2.5)])
    assert ds.element_spec == TensorSpec((), np.float32)
    assert [x.tolist() for x in ds] == [1.5, 2.5]
    assert ds.cardinality() == 2 and len(ds) == 2


def test_shapes_differ_where_the_elements_do() -> None:
    ds = from_list([np.zeros((2, 3)), np.zeros((4, 3))])
    assert ds.element_spec == TensorSpec((None, 3), np.float64)


def test_elements_are_read_only_and_batches_gather() -> None:
    ds = from_list([np.arange(2), np.arange(2) + 10, np.arange(2) + 20])
    element = next(iter(ds))
    with pytest.raises(ValueError, match="read-only"):
        element[0] = 5
    assert [b.tolist() for b in ds.batch(2)] == [[[0, 1], [10, 11]], [[20, 21]]]
    assert sorted(x.tolist()[0] for x in ds.shuffle(3, seed=1)) == [0, 10, 20]


def test_items_of_different_ranks_have_unknown_rank() -> None:
    # TensorFlow 2.21: TensorSpec(shape=<unknown>, dtype=tf.float64).
    ds = from_list([np.zeros(2), np.ones((2, 2))])
    assert ds.element_spec == TensorSpec(None, np.float64)
    assert [x.tolist() for x in ds] == [[0.0, 0.0], [[1.0, 1.0], [1.0, 1.0]]]


def test_the_name_argument_is_accepted() -> None:
    assert [int(x) for x in from_list([np.int64(4)], name="list")] == [4]


@pytest.mark.parametrize(
    ("elements", "match"),
    [
        ([], "elements must not be empty"),
        ((1, 2), "elements must be a list, got tuple"),
        ([(1, 2), 3], r"elements\[1\] has the structure"),
        ([{"a": 1}, {"b": 1}], r"elements\[1\] has the structure"),
        ([np.float32(1), np.int64(2)], "differ in dtype"),
    ],
)
def test_bad_elements(elements: object, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        from_list(elements)  # type: ignore[arg-type]


test_checkpointing = checkpoint_test(
    __name__,
    from_list=lambda: from_list([np.arange(k) for k in range(6)]),
    from_list_batched=lambda: from_list([(np.int64(k), "s" * k) for k in range(7)]).batch(2),
)
