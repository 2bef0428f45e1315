"""Tests of feedline/data/torch_loader.py: ``Dataset.as_torch()`` and
``DistributedDataset.as_torch()``."""

from __future__ import annotations

import collections
import doctest
import io
import pickle
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import feedline.data.torch_loader as torch_loader
import feedline.distribute as fdist
from feedline import service
from feedline.data import Dataset
from feedline.data.torch_loader import FeedlineIterableDataset
from feedline.errors import InvalidArgumentError

Pair = collections.namedtuple("Pair", ["image", "label"])


def images(n: int = 20) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((n, 1, 4, 4), dtype=np.float32), np.arange(n) % 3


def pipeline(n: int = 20, seed: int = 7) -> Dataset:
    """Shuffled (a new order every pass) and batched: what a training loop reads."""
    x, y = images(n)
    return Dataset.from_tensor_slices((x, y)).shuffle(n, seed=seed).batch(6)


def as_numpy(element: Any) -> list[np.ndarray]:
    return [t.numpy() for t in element]


def assert_same_batches(actual: list[Any], expected: list[Any]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        for ta, te in zip(a, e, strict=True):
            np.testing.assert_array_equal(np.asarray(ta), np.asarray(te))


def test_docstring_examples() -> None:
    assert doctest.testmod(torch_loader).failed == 0


def test_yields_the_pipeline_as_torch_tensors() -> None:
    loader = pipeline().as_torch()
    assert isinstance(loader, IterableDataset) and isinstance(loader, FeedlineIterableDataset)
    batches = list(loader)
    assert all(isinstance(t, torch.Tensor) for batch in batches for t in batch)
    assert batches[0][0].dtype == torch.float32 and batches[0][1].dtype == torch.int64
    assert [len(b[1]) for b in batches] == [6, 6, 6, 2]
    assert_same_batches(batches, list(pipeline()))  # pass 0 of each: the same order


def test_batches_are_shared_with_numpy_and_read_only_slices_are_copied() -> None:
    made = np.arange(6.0)
    tensor = next(iter(Dataset.from_generator(lambda: [made], output_types=np.float64).as_torch()))
    made[0] = 42.0
    assert tensor[0].item() == 42.0  # torch.from_numpy: no copy
    source = np.zeros((3, 2), np.float32)
    row = next(iter(Dataset.from_tensor_slices(source).as_torch()))
    row += 1  # a read-only view of the source becomes a tensor of its own
    assert source.sum() == 0


def test_structures_and_strings() -> None:
    x, y = images(4)
    ds = Dataset.from_tensor_slices(
        {"pair": Pair(x, y), "name": np.array([b"a", b"b", b"c", b"d"], dtype=object)}
    ).batch(2)
    first = next(iter(ds.as_torch()))
    assert isinstance(first["pair"], Pair) and isinstance(first["pair"].image, torch.Tensor)
    assert isinstance(first["name"], np.ndarray) and first["name"].tolist() == [b"a", b"b"]
    scalar = next(iter(Dataset.range(3).as_torch()))
    assert isinstance(scalar, torch.Tensor) and scalar.shape == () and scalar.item() == 0


def test_len_is_the_cardinality_where_known() -> None:
    assert len(pipeline().as_torch()) == 4
    with pytest.raises(TypeError, match="unknown"):
        len(Dataset.range(9).filter(lambda x: x > 2).as_torch())


def test_dataloader_with_batch_size_none_iterates_in_this_process() -> None:
    loader = DataLoader(pipeline().as_torch(), batch_size=None)
    assert len(loader) == 4
    assert_same_batches(list(loader), list(pipeline()))


def test_dataloader_workers_are_refused_with_what_to_do_instead() -> None:
    loader = DataLoader(pipeline().as_torch(), batch_size=None, num_workers=2)
    with pytest.raises(InvalidArgumentError, match=r"worker \d of 2.*num_workers=0"):
        list(loader)


def test_every_pass_reshuffles_as_iterating_the_dataset_does() -> None:
    dataset, loader = pipeline(), pipeline().as_torch()
    for _ in range(3):
        assert_same_batches(list(loader), list(dataset))
    assert not all(
        np.array_equal(a[1], b[1]) for a, b in zip(list(dataset), list(dataset), strict=True)
    )


def test_state_dict_restores_mid_pass_and_the_passes_after() -> None:
    # The passes of one loader, so that each reshuffles: [pass 0 | pass 1 | pass 2].
    loader = pipeline().as_torch()
    expected = [as_numpy(b) for _ in range(3) for b in loader]
    assert len(expected) == 12

    first = pipeline().as_torch()
    seen = [as_numpy(b) for b in first]  # pass 0
    it = iter(first)  # pass 1
    seen += [as_numpy(next(it)) for _ in range(2)]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    assert state["pass"] == 1 and state["iterator"] is not None

    resumed = pipeline().as_torch()  # a new process would build the same pipeline
    resumed.load_state_dict(state)
    seen += [as_numpy(b) for b in resumed]  # the rest of pass 1
    assert resumed.state_dict() == {"pass": 2, "iterator": None}
    seen += [as_numpy(b) for b in resumed]  # pass 2
    assert_same_batches(seen, expected)


def test_state_dict_before_and_after_a_pass_and_bad_states() -> None:
    loader = pipeline().as_torch()
    assert loader.state_dict() == {"pass": 0, "iterator": None}
    list(loader)
    assert loader.state_dict() == {"pass": 1, "iterator": None}
    with pytest.raises(InvalidArgumentError, match="keys 'pass' and 'iterator'"):
        loader.load_state_dict({"position": 3})
    with pytest.raises(InvalidArgumentError, match="the state does not belong"):
        other = Dataset.range(3).as_torch()
        other.load_state_dict({"pass": 0, "iterator": {"nothing": 1}})
        iter(other)


def test_a_training_loop_resumed_from_a_mid_epoch_checkpoint_trains_identically() -> None:
    """A loop that uses only the DataLoader protocol, checkpointed mid-epoch with torch.save
    (model, optimizer and loader state together), as Lightning or Accelerate would."""

    def make() -> tuple[torch.nn.Module, torch.optim.Optimizer, FeedlineIterableDataset]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
        return model, torch.optim.SGD(model.parameters(), lr=0.1), pipeline().as_torch()

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> float:
        images, labels = batch
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss.item()

    model, optimizer, data = make()
    loader = DataLoader(data, batch_size=None)
    losses = [step(model, optimizer, batch) for _ in range(2) for batch in loader]

    model, optimizer, data = make()
    loader = DataLoader(data, batch_size=None)
    resumed_losses = [step(model, optimizer, batch) for batch in loader]  # epoch 0
    it = iter(loader)
    resumed_losses.append(step(model, optimizer, next(it)))
    buffer = io.BytesIO()
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save({**checkpoint, "data": data.state_dict()}, buffer)
    del model, optimizer, data, loader, it

    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    model, optimizer, data = make()
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    data.load_state_dict(saved["data"])
    resumed_losses += [step(model, optimizer, batch) for batch in DataLoader(data, batch_size=None)]
    assert resumed_losses == losses


def test_lightning_trainer_fits_on_it() -> None:
    lightning = pytest.importorskip("lightning")

    class Model(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
            self.batch_sizes: list[int] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            images, labels = batch
            assert isinstance(images, torch.Tensor)
            self.batch_sizes.append(len(labels))
            return torch.nn.functional.cross_entropy(self.layer(images), labels)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model = Model()
    trainer = lightning.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=DataLoader(pipeline().as_torch(), batch_size=None))
    assert model.batch_sizes == [6, 6, 6, 2] * 2


def test_stateful_dataloader_saves_through_state_dict() -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    loader = stateful.StatefulDataLoader(pipeline().as_torch(), batch_size=None)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["dataset_state"]["pass"] == 0  # ours, not a replay of the batches yielded
    assert state["dataset_state"]["iterator"] is not None
    rest = [as_numpy(b) for b in it]
    resumed = stateful.StatefulDataLoader(pipeline().as_torch(), batch_size=None)
    resumed.load_state_dict(state)
    assert_same_batches([as_numpy(b) for b in resumed], rest)


# -- distributed and service pipelines ---------------------------------------------------------


def test_a_distributed_dataset_as_torch() -> None:
    strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
    dist = strategy.experimental_distribute_dataset(Dataset.range(10).batch(4))
    loader = dist.as_torch()
    steps = [strategy.experimental_local_results(step) for step in loader]
    assert [[t.tolist() for t in step] for step in steps] == [
        [[0, 1], [2, 3]],
        [[4, 5], [6, 7]],
        [[8], [9]],
    ]
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    again = strategy.experimental_distribute_dataset(Dataset.range(10).batch(4)).as_torch()
    again.load_state_dict(state)
    rest = [[t.tolist() for t in strategy.experimental_local_results(s)] for s in again]
    assert rest == [[[4, 5], [6, 7]], [[8], [9]]]
    one = fdist.OneDeviceStrategy("cpu").experimental_distribute_dataset(pipeline())
    batches = list(DataLoader(one.as_torch(), batch_size=None))
    assert all(isinstance(t, torch.Tensor) for batch in batches for t in batch)


def test_a_pipeline_read_from_the_data_service_as_torch() -> None:
    dispatcher = service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    worker = service.WorkerServer(service.WorkerConfig(dispatcher_address=address))
    try:
        ds = (
            Dataset.range(12)
            .map(lambda x: x * 2)
            .apply(service.distribute("parallel_epochs", dispatcher.target))
            .batch(4)
        )
        batches = list(DataLoader(ds.as_torch(), batch_size=None))
        assert all(isinstance(b, torch.Tensor) for b in batches)
        assert sorted(torch.cat(batches).tolist()) == list(range(0, 24, 2))
    finally:
        worker.stop()
        dispatcher.stop()


def test_pickles_without_its_running_pass() -> None:
    loader = pipeline().as_torch()
    it = iter(loader)
    next(it)
    copy = pickle.loads(pickle.dumps(loader))
    assert copy.state_dict() == {"pass": 1, "iterator": None}
    assert len(list(copy)) == 4
