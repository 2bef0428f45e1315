"""Tests of feedline/data/ops/from_torch.py."""

from __future__ import annotations

import collections
import doctest
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import numpy as np
import pytest
import torch
from torch.utils.data import IterableDataset, Subset, TensorDataset

import feedline.data.ops.from_torch as from_torch_module
from feedline import service
from feedline.data import Dataset, TensorSpec
from feedline.data.ops.from_torch import TorchIterableStyleDataset, TorchMapStyleDataset
from feedline.errors import InvalidArgumentError
from feedline.service.splits import SplitCursor, SplitPlan, split_plan
from feedline.service.worker.split_source import with_split_source
from tests.data.checkpoint_utils import assert_sequences_equal, checkpoint_test

# -- torch datasets written as torchvision and users write them --------------------------------


class FakeMNIST(torch.utils.data.Dataset):
    """A torchvision-style dataset: uint8 images in ``data``, int labels in ``targets``,
    ``transform`` / ``target_transform``; an item is ``(transform(image), target)``."""

    def __init__(
        self,
        n: int = 10,
        transform: Callable[[torch.Tensor], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
    ) -> None:
        generator = torch.Generator().manual_seed(n)
        self.data = torch.randint(0, 256, (n, 6, 6), dtype=torch.uint8, generator=generator)
        self.targets = [i % 10 for i in range(n)]
        self.transform = transform
        self.target_transform = target_transform
        self.getitem_calls = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if not isinstance(index, int):
            raise TypeError(f"index must be an int, got {type(index).__name__}")
        self.getitem_calls += 1
        image, target = self.data[index], self.targets[index]
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


def to_float_tensor(image: torch.Tensor) -> torch.Tensor:
    """What torchvision's ``ToTensor`` does to a HxW uint8 image: 1xHxW float in [0, 1]."""
    return image[None].float() / 255


class Batched(torch.utils.data.Dataset):
    """A map-style dataset with ``__getitems__``, recording which indices each call asked for."""

    def __init__(self, n: int = 10) -> None:
        self.x = torch.arange(n * 2, dtype=torch.float32).reshape(n, 2)
        self.getitems_calls: list[list[int]] = []

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": self.x[index], "i": index}

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        self.getitems_calls.append(list(indices))
        return [{"x": self.x[i], "i": i} for i in indices]


class Stream(IterableDataset):
    """An IterableDataset that yields ``n`` items and counts how often it was started."""

    def __init__(self, n: int = 7) -> None:
        self.n = n
        self.starts = 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, float]]:
        self.starts += 1
        for i in range(self.n):
            yield torch.full((i % 3 + 1,), i), i / 2


def images_and_labels(n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.rand(n, 3, 4, generator=generator), torch.arange(n) % 4


def test_docstring_examples() -> None:
    assert doctest.testmod(from_torch_module).failed == 0


# -- map-style: TensorDataset ------------------------------------------------------------------


def test_tensor_dataset_reads_as_from_tensor_slices_of_its_tensors() -> None:
    x, y = images_and_labels()
    ours = Dataset.from_torch(TensorDataset(x, y))
    slices = Dataset.from_tensor_slices((x.numpy(), y.numpy()))
    assert isinstance(ours, TorchMapStyleDataset)
    assert ours.element_spec == (TensorSpec((3, 4), np.float32), TensorSpec((), np.int64))
    assert ours.cardinality() == 12 and len(ours) == 12
    for make in (
        lambda d: d,
        lambda d: d.batch(5),
        lambda d: d.shuffle(12, seed=3).batch(4),
        lambda d: d.shard(3, 1),
    ):
        assert_sequences_equal(list(make(ours)), list(make(slices)))


def test_tensor_dataset_rows_view_the_tensors_without_copies_and_are_read_only() -> None:
    x, y = images_and_labels()
    image, _ = next(iter(Dataset.from_torch(TensorDataset(x, y))))
    assert np.shares_memory(image, x.numpy())
    with pytest.raises(ValueError, match="read-only"):
        image += 1
    batch, _ = next(iter(Dataset.from_torch(TensorDataset(x, y)).batch(4)))
    batch += 1  # batches are new arrays
    np.testing.assert_array_equal(x.numpy()[:4] + 1, batch)


def test_tensor_dataset_checks_output_signature() -> None:
    x, y = images_and_labels()
    signature = (TensorSpec((None, 4), np.float32), TensorSpec((), np.int64))
    assert Dataset.from_torch(TensorDataset(x, y), signature).cardinality() == 12
    with pytest.raises(InvalidArgumentError, match="does not fit output_signature"):
        Dataset.from_torch(TensorDataset(x, y), (TensorSpec((3, 4), np.float64), signature[1]))


def test_tensors_that_require_grad_are_detached() -> None:
    x = torch.ones(3, 2, requires_grad=True)
    rows = list(Dataset.from_torch(TensorDataset(x)))
    assert [r[0].tolist() for r in rows] == [[1.0, 1.0]] * 3


# -- map-style: any dataset --------------------------------------------------------------------


def test_torchvision_style_dataset_with_transforms() -> None:
    source = FakeMNIST(10, transform=to_float_tensor)
    ds = Dataset.from_torch(source)
    assert ds.element_spec == (
        TensorSpec((None, None, None), np.float32),
        TensorSpec((), np.int64),
    )
    elements = list(ds)
    assert len(elements) == 10
    for i, (image, label) in enumerate(elements):
        np.testing.assert_array_equal(image, to_float_tensor(source.data[i]).numpy())
        assert image.shape == (1, 6, 6) and label.dtype == np.int64 and int(label) == i % 10
    images, labels = next(iter(ds.batch(4)))
    assert images.shape == (4, 1, 6, 6) and images.dtype == np.float32
    assert labels.tolist() == [0, 1, 2, 3]


def test_items_are_read_only_views_of_what_the_dataset_returns() -> None:
    source = FakeMNIST(4)  # no transform: the item is a view of source.data
    image, _ = next(iter(Dataset.from_torch(source)))
    assert np.shares_memory(image, source.data.numpy())
    with pytest.raises(ValueError, match="read-only"):
        image += 1


def test_shuffle_is_a_permutation_of_indices_as_over_from_tensor_slices() -> None:
    source = FakeMNIST(10)
    order = [int(label) for _, label in Dataset.from_torch(source).shuffle(10, seed=5)]
    expected = [int(i) for i in Dataset.range(10).shuffle(10, seed=5)]
    assert order == expected and sorted(order) == list(range(10))


def test_batches_use_getitems_when_the_dataset_has_it() -> None:
    source = Batched(10)
    signature = {"x": TensorSpec((2,), np.float32), "i": TensorSpec((), np.int64)}
    batches = list(Dataset.from_torch(source, output_signature=signature).batch(4))
    assert source.getitems_calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [b["i"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    np.testing.assert_array_equal(batches[1]["x"], source.x.numpy()[4:8])
    subset = Subset(Batched(10), [9, 3, 5])
    assert [b["i"].tolist() for b in Dataset.from_torch(subset).batch(2)] == [[9, 3], [5]]


def test_batches_of_torchvision_items_are_gathered_without_per_item_calls() -> None:
    source = FakeMNIST(9, transform=to_float_tensor)
    ds = Dataset.from_torch(source).batch(4, drop_remainder=True)
    assert ds.element_spec[0] == TensorSpec((4, None, None, None), np.float32)
    images, labels = next(iter(ds))
    np.testing.assert_array_equal(images[2], to_float_tensor(source.data[2]).numpy())
    assert labels.tolist() == [0, 1, 2, 3]
    assert len(list(ds)) == 2


def test_lists_are_structure_as_torch_collates_them() -> None:
    class Pairs(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> list[Any]:
            return [torch.tensor([i, i]), i * 0.5]

    ds = Dataset.from_torch(Pairs())
    assert ds.element_spec == (TensorSpec((None,), np.int64), TensorSpec((), np.float32))
    a, b = next(iter(ds.batch(3)))
    assert a.tolist() == [[0, 0], [1, 1], [2, 2]] and b.tolist() == [0.0, 0.5, 1.0]


def test_output_signature_casts_dtypes_and_skips_reading_item_zero() -> None:
    source = FakeMNIST(4)
    signature = (TensorSpec((6, 6), np.float64), TensorSpec((), np.int32))
    ds = Dataset.from_torch(source, output_signature=signature)
    assert ds.element_spec == signature and source.getitem_calls == 0
    image, label = next(iter(ds))
    assert image.dtype == np.float64 and label.dtype == np.int32


def test_items_that_do_not_fit_the_spec_name_the_item() -> None:
    class Ragged(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> Any:
            return (torch.zeros(2), i) if i < 2 else torch.zeros(2)

    with pytest.raises(InvalidArgumentError, match="item 2 has the structure"):
        list(Dataset.from_torch(Ragged()))
    with pytest.raises(InvalidArgumentError, match="different shapes"):
        list(Dataset.from_torch(Stream(4)).batch(4))
    declared = (TensorSpec((3,), np.float32), TensorSpec((), np.int64))
    with pytest.raises(InvalidArgumentError, match=r"item 0 has a component of shape \(2,\)"):
        list(Dataset.from_torch(Ragged(), output_signature=declared))


def test_what_from_torch_refuses() -> None:
    with pytest.raises(InvalidArgumentError, match="map-style dataset"):
        Dataset.from_torch([1, 2, 3].__iter__())
    with pytest.raises(InvalidArgumentError, match="output_signature must hold TensorSpecs"):
        Dataset.from_torch(FakeMNIST(2), output_signature=(np.float32, np.int64))
    with pytest.raises(InvalidArgumentError, match="is empty"):
        _ = Dataset.from_torch(FakeMNIST(0)).element_spec
    empty = Dataset.from_torch(FakeMNIST(0), output_signature=TensorSpec((), np.int64))
    assert list(empty) == []
    with pytest.raises(InvalidArgumentError, match="no NumPy equivalent"):
        list(Dataset.from_torch(TensorDataset(torch.zeros(2, dtype=torch.bfloat16))))


def test_pickles_with_its_torch_dataset() -> None:
    for ds in (
        Dataset.from_torch(TensorDataset(*images_and_labels())).batch(5),
        Dataset.from_torch(FakeMNIST(6, transform=to_float_tensor)).batch(4),
    ):
        assert_sequences_equal(list(cloudpickle.loads(cloudpickle.dumps(ds))), list(ds))
        assert_sequences_equal(list(pickle.loads(pickle.dumps(ds))), list(ds))


# -- iterable-style ----------------------------------------------------------------------------


def test_iterable_dataset_is_a_stream() -> None:
    source = Stream(7)
    ds = Dataset.from_torch(source)
    assert isinstance(ds, TorchIterableStyleDataset)
    assert ds.element_spec == (TensorSpec((None,), np.int64), TensorSpec((), np.float32))
    elements = list(ds)
    assert [(a.tolist(), float(b)) for a, b in elements[:4]] == [
        ([0], 0.0),
        ([1, 1], 0.5),
        ([2, 2, 2], 1.0),
        ([3], 1.5),
    ]
    assert len(elements) == 7
    assert ds.cardinality() < 0  # unknown


def test_iterable_restore_replays_the_stream() -> None:
    source = Stream(7)
    it = iter(Dataset.from_torch(source))
    for _ in range(3):
        next(it)
    state = it.get_state()
    assert state == {"read": 3}
    restored = iter(Dataset.from_torch(source))
    restored.set_state(state)
    assert [int(b * 2) for _, b in restored] == [3, 4, 5, 6]
    short = iter(Dataset.from_torch(Stream(2)))
    with pytest.raises(InvalidArgumentError, match="now yields only 2"):
        short.set_state(state)


def test_splits_of_a_map_style_dataset_for_dynamic_sharding() -> None:
    ds = Dataset.from_torch(FakeMNIST(10, transform=to_float_tensor)).batch(3)
    plan = split_plan(ds)
    assert plan == SplitPlan(num_units=10, shuffle=False, seed=None, unit="element")
    cursors: dict[int, SplitCursor] = {}

    class Dispatcher:
        def next_split(self, repetition: int) -> list[int] | None:
            cursor = cursors.setdefault(repetition, SplitCursor(plan.num_units, split_size=4))
            return cursor.next()

    labels = [b[1].tolist() for b in with_split_source(ds, Dispatcher())]
    assert labels == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    with pytest.raises(InvalidArgumentError, match="splittable source"):
        split_plan(Dataset.from_torch(Stream(3)))


def test_distributed_epoch_service_reads_every_item_once() -> None:
    dispatcher = service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    workers = [
        service.WorkerServer(service.WorkerConfig(dispatcher_address=address)) for _ in range(2)
    ]
    try:
        x, _ = images_and_labels(40)
        ds = (
            Dataset.from_torch(TensorDataset(x, torch.arange(40)))
            .map(lambda image, i: i)
            .apply(service.distribute("distributed_epoch", dispatcher.target))
        )
        assert sorted(int(i) for i in ds) == list(range(40))
    finally:
        for server in [*workers, dispatcher]:
            server.stop()


# -- checkpoints -------------------------------------------------------------------------------


def _tensor_dataset() -> Dataset:
    return Dataset.from_torch(TensorDataset(*images_and_labels(9)))


Point = collections.namedtuple("Point", ["x", "i"])


class _Points(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 9

    def __getitem__(self, i: int) -> Point:
        return Point(torch.tensor([i, -i]), i)


test_checkpointing = checkpoint_test(
    __name__,
    tensor_dataset=_tensor_dataset,
    tensor_dataset_shuffled_batches=lambda: _tensor_dataset().shuffle(9, seed=1).batch(2),
    torchvision_style=lambda: Dataset.from_torch(FakeMNIST(7, transform=to_float_tensor)),
    torchvision_style_batched=lambda: Dataset.from_torch(FakeMNIST(7)).shuffle(4, seed=2).batch(3),
    getitems_batched=lambda: Dataset.from_torch(Batched(7)).batch(3),
    namedtuples=lambda: Dataset.from_torch(_Points()).shard(2, 1),
    iterable=lambda: Dataset.from_torch(Stream(6)),
    iterable_batched=lambda: Dataset.from_torch(Stream(9)).padded_batch(2),
)
