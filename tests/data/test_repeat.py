"""Tests of feedline/data/ops/repeat.py."""

from __future__ import annotations

import numpy as np
import pytest

from feedline import structure
from feedline.data import INFINITE_CARDINALITY, Dataset
from tests.data.checkpoint_utils import assert_sequences_equal, checkpoint_test


def test_repeat_count() -> None:
    assert [int(v) for v in Dataset.range(3).repeat(2)] == [0, 1, 2, 0, 1, 2]
    assert list(Dataset.range(3).repeat(0)) == []
    assert Dataset.range(3).repeat(2).cardinality() == 6


def test_repeat_forever() -> None:
    ds = Dataset.range(2).repeat()
    assert ds.cardinality() == INFINITE_CARDINALITY
    assert [int(v) for v in ds.take(5)] == [0, 1, 0, 1, 0]


def test_repeat_of_empty_ends() -> None:
    assert list(Dataset.range(0).repeat()) == []


def test_seed_example_from_tensors_repeat_batch() -> None:
    ds = Dataset.from_tensors(([1.0], [1.0])).repeat(100).batch(16)
    batches = list(ds)
    assert len(batches) == 7 and batches[-1][0].shape == (4, 1)
    assert batches[0][0].dtype.name == "float32"


def _sources() -> dict[str, Dataset]:
    images = np.arange(7 * 2 * 3, dtype=np.float32).reshape(7, 2, 3)
    labels = np.array([b"a", b"bb", b"c", b"dd", b"e", b"ff", b"g"])
    return {
        "slices": Dataset.from_tensor_slices(images),
        "shuffled": Dataset.from_tensor_slices({"x": images, "y": labels}).shuffle(7, seed=3),
        "range": Dataset.range(5),
    }


@pytest.mark.parametrize("source", ["slices", "shuffled", "range"])
@pytest.mark.parametrize("count", [1, 2, 3, None])
@pytest.mark.parametrize("batch_size", [1, 3, 7, 12])
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_batch_after_repeat_reads_blocks_and_gives_the_rows_of_the_elements(
    source: str, count: int | None, batch_size: int, drop_remainder: bool
) -> None:
    # batch over repeat gathers a batch in one or two blocks (two across an epoch's end);
    # the batches are those of the repeated elements, one by one.
    repeated = _sources()[source].repeat(count)
    iterator = iter(repeated.batch(batch_size, drop_remainder=drop_remainder))
    assert iterator._input._next_batch is not None  # the blocks are read
    batches = 25 if count is None else None
    got = [next(iterator) for _ in range(batches)] if batches else list(iterator)
    elements = list(repeated.take(-1 if count else batches * batch_size))
    expected = [
        structure.batch_elements(elements[i : i + batch_size])
        for i in range(0, len(elements), batch_size)
        if not drop_remainder or i + batch_size <= len(elements)
    ]
    assert_sequences_equal(got, expected[: len(got)])
    assert len(got) == len(expected)


def test_batch_after_repeat_of_an_input_without_blocks_reads_rows() -> None:
    spec = Dataset.range(1).element_spec
    ds = Dataset.from_generator(lambda: iter(range(3)), output_signature=spec)
    assert [b.tolist() for b in ds.repeat(2).batch(4)] == [[0, 1, 2, 0], [1, 2]]


test_checkpointing = checkpoint_test(
    __name__,
    finite=lambda: Dataset.range(4).repeat(3),
    forever=lambda: Dataset.range(3).repeat().take(11),
    batched_across_epochs=lambda: (
        Dataset.from_tensor_slices(np.arange(5) * 10).shuffle(5, seed=1).repeat(3).batch(4)
    ),
)
