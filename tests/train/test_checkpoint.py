"""Tests of feedline/train/checkpoint.py: Checkpoint, its load status, CheckpointManager and
latest_checkpoint, with models, optimizers, feedline iterators and metrics."""

from __future__ import annotations

import doctest
import gc
import os
import pathlib
import pickle
import warnings
from typing import Any

import numpy as np
import pytest
import torch

import feedline.train
from feedline.data import Dataset
from feedline.distribute import MirroredStrategy, PerReplica
from feedline.errors import InvalidArgumentError, NotFoundError
from feedline.metrics import Mean
from feedline.nn import compute_average_loss
from feedline.train import Checkpoint, CheckpointManager, checkpoint_management, latest_checkpoint
from feedline.train import checkpoint as checkpoint_module
from feedline.train.checkpoint import load_state


def make_model(seed: int, hidden: int = 4) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(3, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
    )


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(123)
    return [
        (torch.randn(8, 3, generator=generator), torch.randn(8, 1, generator=generator))
        for _ in range(5)
    ]


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> float:
    x, y = batch
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def assert_states_equal(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_states_equal(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_states_equal(x, y)
    else:
        assert a == b


def test_doctests() -> None:
    for module in (checkpoint_module, checkpoint_management):
        results = doctest.testmod(module)
        assert results.failed == 0 and results.attempted > 0, module.__name__


# -- models and optimizers -------------------------------------------------------------------------
def test_model_and_adam_restore_and_training_continues_identically(tmp_path: pathlib.Path) -> None:
    data = batches()
    model = make_model(seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    checkpoint = Checkpoint(model=model, optimizer=optimizer)
    for batch in data[:2]:
        train_step(model, optimizer, batch)
    path = checkpoint.save(tmp_path / "ckpt")
    uninterrupted = [train_step(model, optimizer, batch) for batch in data[2:]]

    new_model = make_model(seed=1)
    new_optimizer = torch.optim.Adam(new_model.parameters(), lr=0.01)
    status = Checkpoint(model=new_model, optimizer=new_optimizer).restore(path)
    status.assert_consumed()
    saved = load_state(path)["objects"]
    assert_states_equal(new_model.state_dict(), saved["model"])
    assert_states_equal(new_optimizer.state_dict(), saved["optimizer"])
    resumed = [train_step(new_model, new_optimizer, batch) for batch in data[2:]]
    assert resumed == uninterrupted
    assert_states_equal(new_model.state_dict(), model.state_dict())


def test_lr_scheduler_and_tensor_variables(tmp_path: pathlib.Path) -> None:
    model = make_model(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    step = torch.tensor(7)
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    path = Checkpoint(optimizer=optimizer, scheduler=scheduler, step=step).save(tmp_path / "c")

    new_optimizer = torch.optim.SGD(make_model(seed=0).parameters(), lr=1.0)
    new_scheduler = torch.optim.lr_scheduler.StepLR(new_optimizer, step_size=1, gamma=0.5)
    new_step = torch.tensor(0)
    Checkpoint(optimizer=new_optimizer, scheduler=new_scheduler, step=new_step).restore(path)
    assert new_scheduler.last_epoch == 3 and new_scheduler.get_last_lr() == [0.125]
    assert new_optimizer.param_groups[0]["lr"] == 0.125
    assert new_step.item() == 7


def test_mismatched_model_names_the_parameter_and_changes_nothing(tmp_path: pathlib.Path) -> None:
    path = Checkpoint(model=make_model(seed=0), step=torch.tensor(5)).save(tmp_path / "ckpt")
    wider = make_model(seed=1, hidden=5)
    before = {key: value.clone() for key, value in wider.state_dict().items()}
    step = torch.tensor(0)
    with pytest.raises(
        InvalidArgumentError,
        match=r"'0\.weight' has shape \(4, 3\) in the "
        r"checkpoint and \(5, 3\) here",
    ) as raised:
        Checkpoint(step=step, model=wider).restore(path)
    assert "'model' (Sequential)" in str(raised.value)
    assert_states_equal(wider.state_dict(), before)
    assert step.item() == 0  # checked before anything is restored

    other = torch.nn.Sequential(torch.nn.Linear(3, 4))
    with pytest.raises(InvalidArgumentError, match=r"checkpoint has \['2\.weight', '2\.bias'\]"):
        Checkpoint(model=other).restore(path)


def test_tensor_of_another_shape_is_refused(tmp_path: pathlib.Path) -> None:
    path = Checkpoint(step=torch.zeros(3)).save(tmp_path / "ckpt")
    with pytest.raises(InvalidArgumentError, match=r"'the tensor' has shape \(3,\)"):
        Checkpoint(step=torch.zeros(1)).restore(path)


# -- numbering, the index file, latest_checkpoint -------------------------------------------------
def read_index(directory: pathlib.Path) -> list[str]:
    return (directory / "checkpoint").read_text().splitlines()


def test_save_numbers_files_and_writes_tensorflows_index(tmp_path: pathlib.Path) -> None:
    checkpoint = Checkpoint(model=make_model(seed=0))
    prefix = str(tmp_path / "ckpt")
    paths = [checkpoint.save(prefix) for _ in range(3)]
    assert paths == [f"{prefix}-1", f"{prefix}-2", f"{prefix}-3"]
    assert checkpoint.save_counter == 3
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-1", "ckpt-2", "ckpt-3"]
    assert read_index(tmp_path) == [
        'model_checkpoint_path: "ckpt-3"',
        'all_model_checkpoint_paths: "ckpt-3"',
    ]
    assert latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-3")


def test_numbering_continues_from_the_directory_and_the_restored_counter(
    tmp_path: pathlib.Path,
) -> None:
    prefix = tmp_path / "ckpt"
    first = Checkpoint(model=make_model(seed=0))
    first.save(prefix)
    first.save(prefix)
    second = Checkpoint(model=make_model(seed=0))
    assert second.save(prefix) == f"{prefix}-3"  # a new object does not overwrite ckpt-1
    assert Checkpoint(model=make_model(seed=0)).save(tmp_path / "other") == f"{tmp_path}/other-1"

    restored = Checkpoint(model=make_model(seed=0))
    restored.restore(f"{prefix}-2")
    assert restored.save_counter == 2
    elsewhere = tmp_path / "elsewhere" / "ckpt"
    assert restored.save(elsewhere) == f"{elsewhere}-3"  # the counter travels with the objects


def test_write_and_read_have_no_numbering_and_no_index(tmp_path: pathlib.Path) -> None:
    model = make_model(seed=0)
    checkpoint = Checkpoint(model=model)
    path = tmp_path / "sub" / "weights.ckpt"
    assert checkpoint.write(path) == str(path)
    assert os.listdir(tmp_path / "sub") == ["weights.ckpt"]
    assert checkpoint.save_counter == 0
    fresh = make_model(seed=1)
    Checkpoint(model=fresh).read(path).assert_consumed()
    assert_states_equal(fresh.state_dict(), model.state_dict())


def test_latest_checkpoint_without_index_or_files(tmp_path: pathlib.Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    assert latest_checkpoint(tmp_path / "missing") is None
    checkpoint = Checkpoint(model=make_model(seed=0))
    for _ in range(11):
        checkpoint.save(tmp_path / "ckpt")
    (tmp_path / "checkpoint").unlink()
    assert latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-11")  # numeric, not text order
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-7"\n')
    assert latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-7")  # the index wins
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "gone-99"\n')
    assert latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-11")  # its file is gone
    # A numbered file that is not a checkpoint (a data shard) is passed over.
    (tmp_path / "shard-70").write_text("not a checkpoint")
    assert latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-11")
    # TensorFlow's latest_filename names another index.
    (tmp_path / "index_b").write_text('model_checkpoint_path: "ckpt-3"\n')
    assert latest_checkpoint(tmp_path, "index_b") == str(tmp_path / "ckpt-3")


def test_restore_none_is_a_no_op(tmp_path: pathlib.Path) -> None:
    model = make_model(seed=0)
    before = model.state_dict()
    checkpoint = Checkpoint(model=model)
    status = checkpoint.restore(latest_checkpoint(tmp_path))
    assert status.save_path is None and status.unmatched_objects == ("model",)
    assert_states_equal(model.state_dict(), before)
    with pytest.raises(NotFoundError, match="save_path was None"):
        status.assert_consumed()


# -- CheckpointManager -----------------------------------------------------------------------------
def test_manager_keeps_max_to_keep_and_lists_them_in_the_index(tmp_path: pathlib.Path) -> None:
    checkpoint = Checkpoint(model=make_model(seed=0))
    manager = CheckpointManager(checkpoint, tmp_path, max_to_keep=2)
    assert manager.latest_checkpoint is None
    paths = [manager.save() for _ in range(4)]
    assert [os.path.basename(p) for p in paths] == ["ckpt-1", "ckpt-2", "ckpt-3", "ckpt-4"]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-3", "ckpt-4"]
    assert manager.checkpoints == paths[2:] and manager.latest_checkpoint == paths[3]
    lines = read_index(tmp_path)
    assert lines[:3] == [
        'model_checkpoint_path: "ckpt-4"',
        'all_model_checkpoint_paths: "ckpt-3"',
        'all_model_checkpoint_paths: "ckpt-4"',
    ]
    # TensorFlow's timestamps follow: one per listed checkpoint, then the last preserved.
    assert [line.split(":")[0] for line in lines[3:]] == [
        "all_model_checkpoint_timestamps",
        "all_model_checkpoint_timestamps",
        "last_preserved_timestamp",
    ]
    assert latest_checkpoint(tmp_path) == paths[3]

    # A new manager (a restarted job) takes the listed checkpoints over and goes on numbering.
    resumed = CheckpointManager(Checkpoint(model=make_model(seed=0)), tmp_path, max_to_keep=2)
    assert resumed.checkpoints == paths[2:]
    assert os.path.basename(resumed.save()) == "ckpt-5"
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-4", "ckpt-5"]
    assert os.path.basename(resumed.save(checkpoint_number=100)) == "ckpt-100"
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-100", "ckpt-5"]


def test_manager_checks_its_arguments(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidArgumentError, match="max_to_keep must be a positive int"):
        CheckpointManager(Checkpoint(), tmp_path, max_to_keep=0)
    with pytest.raises(TypeError, match="got Sequential"):
        CheckpointManager(make_model(seed=0), tmp_path)  # type: ignore[arg-type]
    keep_all = CheckpointManager(Checkpoint(), tmp_path, max_to_keep=None)
    for _ in range(7):
        keep_all.save()
    assert len(keep_all.checkpoints) == 7


# -- feedline iterators and metrics ---------------------------------------------------------------
def pipeline() -> Dataset:
    return Dataset.range(100).shuffle(100, seed=1).batch(8)


def test_iterator_saved_mid_epoch_continues_with_the_same_batches(tmp_path: pathlib.Path) -> None:
    iterator = iter(pipeline())
    seen = [next(iterator) for _ in range(5)]
    path = Checkpoint(iterator=iterator).save(tmp_path / "ckpt")
    rest = list(iterator)
    assert len(rest) == 8 and sorted(np.concatenate(seen + rest).tolist()) == list(range(100))

    restored = iter(pipeline())
    Checkpoint(iterator=restored).restore(path).assert_consumed()
    after = list(restored)
    assert len(after) == len(rest)
    for a, b in zip(after, rest, strict=True):
        np.testing.assert_array_equal(a, b)


def test_iterator_across_an_epoch_boundary_with_model_and_metric(tmp_path: pathlib.Path) -> None:
    def build() -> Any:
        return iter(Dataset.range(10).shuffle(10, seed=3).repeat(3).batch(4))

    iterator, metric = build(), Mean(name="loss")
    for _ in range(4):  # past the end of the first epoch (10 elements)
        metric.update_state(next(iterator).astype(np.float64))
    path = Checkpoint(it=iterator, loss=metric).save(tmp_path / "ckpt")
    expected = [b.tolist() for b in iterator]

    new_iterator, new_metric = build(), Mean(name="loss")
    Checkpoint(it=new_iterator, loss=new_metric).restore(path)
    assert [b.tolist() for b in new_iterator] == expected
    assert torch.equal(new_metric.result(), metric.result())
    assert torch.equal(new_metric.get_state(), load_state(path)["objects"]["loss"])


def test_metric_state_restores_and_keeps_accumulating(tmp_path: pathlib.Path) -> None:
    metric = Mean()
    metric.update_state([1.0, 2.0, 3.0])
    path = Checkpoint(metric=metric).save(tmp_path / "ckpt")
    restored = Mean()
    Checkpoint(metric=restored).restore(path)
    assert restored.get_state().tolist() == [6.0, 3.0]
    restored.update_state([10.0])
    metric.update_state([10.0])
    assert restored.result().item() == metric.result().item() == 4.0


def test_distributed_iterator_restores(tmp_path: pathlib.Path) -> None:
    strategy = MirroredStrategy(["cpu:0", "cpu:1"])

    def build() -> Any:
        return iter(strategy.experimental_distribute_dataset(pipeline()))

    iterator = build()
    next(iterator)
    next(iterator)
    path = Checkpoint(iterator=iterator).save(tmp_path / "ckpt")
    expected = [[t.tolist() for t in strategy.experimental_local_results(s)] for s in iterator]
    restored = build()
    Checkpoint(iterator=restored).restore(path)
    got = [[t.tolist() for t in strategy.experimental_local_results(s)] for s in restored]
    assert got == expected and len(got) == 11


class _Tally:
    """A Checkpointable: its checkpoint is its count and a marker, which it checks on restore."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.calls: list[str] = []

    def get_state(self) -> int:
        return self.count

    def set_state(self, state: int) -> None:
        self.calls.append("set_state")
        self.count = state

    def checkpoint_state(self) -> dict[str, int]:
        return {"tally": self.count}

    def restore_checkpoint_state(self, state: dict[str, int]) -> None:
        self.calls.append("restore_checkpoint_state")
        self.count = state["tally"]

    def check_restorable(self, state: Any) -> str | None:
        return None if isinstance(state, dict) and "tally" in state else "not a tally"


def test_a_checkpointable_saves_and_restores_through_its_protocol(tmp_path: pathlib.Path) -> None:
    path = Checkpoint(tally=_Tally(7)).save(tmp_path / "ckpt")
    assert load_state(path)["objects"]["tally"] == {"tally": 7}
    restored = _Tally(0)
    Checkpoint(tally=restored).restore(path)
    assert restored.count == 7 and restored.calls == ["restore_checkpoint_state"]

    # A state it refuses raises before anything is restored, the model included.
    bad = Checkpoint(model=make_model(seed=1), tally=_Tally(7)).save(tmp_path / "bad")
    raw = load_state(bad)
    raw["objects"]["tally"] = 7
    torch.save(raw, bad)
    target, tally = make_model(seed=2), _Tally(0)
    before = [p.detach().clone() for p in target.parameters()]
    with pytest.raises(InvalidArgumentError, match=r"cannot restore 'tally'.*: not a tally"):
        Checkpoint(model=target, tally=tally).restore(bad)
    assert all(torch.equal(a, b) for a, b in zip(before, target.parameters(), strict=True))
    assert tally.count == 0 and tally.calls == []


# -- nesting, attributes, matching -----------------------------------------------------------------
def test_nested_checkpoints_and_attribute_access(tmp_path: pathlib.Path) -> None:
    model, metric = make_model(seed=0), Mean()
    metric.update_state([2.0])
    checkpoint = Checkpoint(inner=Checkpoint(model=model), metric=metric)
    assert checkpoint.inner.model is model and checkpoint.metric is metric
    checkpoint.step = torch.tensor(3)  # adding an attribute adds an object, as in TensorFlow
    path = checkpoint.save(tmp_path / "ckpt")

    new_model, new_metric, new_step = make_model(seed=1), Mean(), torch.tensor(0)
    status = Checkpoint(inner=Checkpoint(model=new_model), metric=new_metric, step=new_step)
    status = status.restore(path).assert_consumed()
    assert status.matched == ("inner.model", "metric", "step")
    assert_states_equal(new_model.state_dict(), model.state_dict())
    assert new_metric.result().item() == 2.0 and new_step.item() == 3

    with pytest.raises(InvalidArgumentError, match="saved a nested Checkpoint under that name"):
        Checkpoint(inner=make_model(seed=0)).restore(path)


def test_unsupported_objects_and_reserved_names_are_refused_at_construction() -> None:
    with pytest.raises(TypeError, match=r"cannot save 'epoch': a int has neither"):
        Checkpoint(model=make_model(seed=0), epoch=3)
    with pytest.raises(TypeError, match=r"in 'data': Checkpoint cannot save '0': a int"):
        Checkpoint().data = [1, 2]
    for name in ("save", "restore", "save_counter", "_private"):
        with pytest.raises(InvalidArgumentError, match=f"'{name}' cannot name"):
            Checkpoint(**{name: make_model(seed=0)})
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        _ = Checkpoint().missing


def test_assert_consumed_and_expect_partial(tmp_path: pathlib.Path) -> None:
    path = Checkpoint(model=make_model(seed=0), metric=Mean()).save(tmp_path / "ckpt")
    model, optimizer = make_model(seed=1), None
    optimizer = torch.optim.Adam(model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        status = Checkpoint(model=model, optimizer=optimizer).restore(path).expect_partial()
    assert status.matched == ("model",)
    assert status.unmatched_objects == ("optimizer",) and status.unused_entries == ("metric",)
    with pytest.raises(NotFoundError) as raised:
        status.assert_consumed()
    assert raised.value.name == "optimizer"
    assert "['optimizer']" in str(raised.value) and "['metric']" in str(raised.value)
    with pytest.raises(NotFoundError, match="objects without an entry"):
        status.assert_existing_objects_matched()
    status.assert_nontrivial_match()

    # Extra entries in the file only: every object matched.
    partial = Checkpoint(model=make_model(seed=1)).restore(path).expect_partial()
    partial.assert_existing_objects_matched()
    with pytest.raises(NotFoundError, match=r"entries of the file without an object: \['metric'\]"):
        partial.assert_consumed()

    # Discarding a partial status without expect_partial warns, as TensorFlow does.
    with pytest.warns(UserWarning, match="expect_partial"):
        Checkpoint(model=make_model(seed=1)).restore(path)
        gc.collect()


# -- files that are not checkpoints, atomicity ----------------------------------------------------
class Tripwire:
    """Unpickling one records it: a restore that runs a wrong file's code would trip it."""

    tripped: list[int] = []

    def __reduce__(self) -> Any:
        return (Tripwire.tripped.append, (1,))


@pytest.mark.parametrize(
    ("write", "reason"),
    [
        (lambda path: path.write_text("not a checkpoint"), "not an archive written by torch.save"),
        (lambda path: torch.save({"x": Tripwire()}, path), "no feedline marker"),
        (lambda path: torch.save(make_model(seed=0).state_dict(), path), "no feedline marker"),
        (lambda path: torch.save([1, 2], path), "no feedline marker"),
    ],
    ids=["text", "foreign_pickle", "state_dict", "list"],
)
def test_a_file_that_is_not_a_checkpoint_is_refused_unread(
    tmp_path: pathlib.Path, write: Any, reason: str
) -> None:
    path = tmp_path / "file"
    write(path)
    with pytest.raises(InvalidArgumentError, match=f"is not a feedline checkpoint: it .*{reason}"):
        Checkpoint(model=make_model(seed=0)).restore(path)
    assert Tripwire.tripped == []


def test_missing_files_directories_and_newer_versions(tmp_path: pathlib.Path) -> None:
    checkpoint = Checkpoint(model=make_model(seed=0))
    with pytest.raises(NotFoundError, match="no checkpoint file at") as raised:
        checkpoint.restore(tmp_path / "ckpt-1")
    assert raised.value.name == str(tmp_path / "ckpt-1")
    with pytest.raises(NotFoundError, match=r"is a directory.*latest_checkpoint"):
        checkpoint.restore(tmp_path)  # TensorFlow's NotFoundError
    torch.save(
        {"format": "feedline.train.Checkpoint", "version": 99, "save_counter": 0, "objects": {}},
        tmp_path / "new",
    )
    with pytest.raises(InvalidArgumentError, match="format version 99; this feedline reads"):
        checkpoint.restore(tmp_path / "new")


UNPICKLABLE = (pickle.PicklingError, AttributeError)  # by Python version


class Unpicklable:
    """A stateful object whose state holds a lambda, which does not pickle."""

    def get_state(self) -> Any:
        return {"fn": lambda: 0}

    def set_state(self, state: Any) -> None:
        raise AssertionError("never restored")


def test_a_failed_save_leaves_no_file_and_names_the_object(tmp_path: pathlib.Path) -> None:
    good = Checkpoint(model=make_model(seed=0))
    good.save(tmp_path / "ckpt")
    index_before = read_index(tmp_path)
    bad = Checkpoint(model=make_model(seed=0), trouble=Unpicklable())
    with pytest.raises(UNPICKLABLE) as raised:
        bad.save(tmp_path / "ckpt")
    assert any("'trouble' does not pickle" in note for note in raised.value.__notes__)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-1"]
    assert read_index(tmp_path) == index_before
    assert bad.save_counter == 0
    with pytest.raises(UNPICKLABLE):
        bad.write(tmp_path / "written")
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-1"]


def test_feedline_train_imports_checkpoint_names_lazily() -> None:
    assert feedline.train.__all__ == sorted(feedline.train.__all__)
    for name in ("Checkpoint", "CheckpointLoadStatus", "CheckpointManager", "latest_checkpoint"):
        home = checkpoint_management if name == "CheckpointManager" else checkpoint_module
        assert getattr(feedline.train, name) is getattr(home, name)
        assert name in dir(feedline.train)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = feedline.train.Nope


# -- devices and strategies ------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_restores_onto_the_device_of_the_objects(tmp_path: pathlib.Path) -> None:
    model = make_model(seed=0).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    train_step(model, optimizer, tuple(t.cuda() for t in batches()[0]))
    metric = Mean()
    metric.update_state(torch.tensor([1.0, 2.0], device="cuda"))
    path = Checkpoint(model=model, optimizer=optimizer, metric=metric).save(tmp_path / "ckpt")

    cpu_model = make_model(seed=1)
    cpu_optimizer = torch.optim.Adam(cpu_model.parameters())
    Checkpoint(model=cpu_model, optimizer=cpu_optimizer).restore(path).expect_partial()
    assert all(p.device.type == "cpu" for p in cpu_model.parameters())
    exp_avg = cpu_optimizer.state_dict()["state"][0]["exp_avg"]
    assert exp_avg.device.type == "cpu"
    assert torch.equal(exp_avg, optimizer.state_dict()["state"][0]["exp_avg"].cpu())

    cuda_model = make_model(seed=1).cuda()
    cuda_optimizer = torch.optim.Adam(cuda_model.parameters())
    cuda_metric = Mean()
    cuda_metric.update_state(torch.tensor([0.0], device="cuda"))
    Checkpoint(model=cuda_model, optimizer=cuda_optimizer, metric=cuda_metric).restore(path)
    assert all(p.device.type == "cuda" for p in cuda_model.parameters())
    assert cuda_optimizer.state_dict()["state"][0]["exp_avg"].device.type == "cuda"
    assert cuda_metric.get_state().device.type == "cuda"
    assert cuda_metric.result().item() == 1.5


def mirrored_train_step(
    strategy: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any
) -> float:
    """One step on the global batch ``batch``, split over the replicas, as the seed trains."""
    x, y = batch
    n = len(x) // strategy.num_replicas_in_sync
    per_replica = PerReplica(tuple((x[i : i + n], y[i : i + n]) for i in range(0, len(x), n)))

    def replica_step(inputs: Any) -> torch.Tensor:
        optimizer.zero_grad()
        x, y = inputs
        per_example = ((model(x) - y) ** 2).mean(dim=1)
        loss = compute_average_loss(per_example, global_batch_size=len(batch[0]))
        loss.backward()
        optimizer.step()
        return loss.detach()

    losses = strategy.run(replica_step, args=(per_replica,))
    return strategy.reduce("SUM", losses, axis=None).item()


def test_checkpoint_from_a_mirrored_strategy_restores_without_one_and_back(
    tmp_path: pathlib.Path,
) -> None:
    data = batches()
    strategy = MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():  # as in the seed: model, optimizer and checkpoint in the scope
        model = make_model(seed=0)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        checkpoint = Checkpoint(optimizer=optimizer, model=model)
    for batch in data[:2]:
        mirrored_train_step(strategy, model, optimizer, batch)
    checkpoint.save(tmp_path / "ckpt")

    # Restored without a strategy, as the seed evaluates the saved model; training goes on as
    # it does under the strategy (up to the order of floating-point sums).
    plain_model = make_model(seed=1)
    plain_optimizer = torch.optim.Adam(plain_model.parameters(), lr=0.01)
    Checkpoint(optimizer=plain_optimizer, model=plain_model).restore(
        latest_checkpoint(tmp_path)
    ).assert_consumed()
    assert_states_equal(plain_model.state_dict(), model.state_dict())
    assert_states_equal(plain_optimizer.state_dict(), optimizer.state_dict())
    mirrored_losses = [mirrored_train_step(strategy, model, optimizer, b) for b in data[2:]]
    plain_losses = [train_step(plain_model, plain_optimizer, b) for b in data[2:]]
    np.testing.assert_allclose(mirrored_losses, plain_losses, rtol=1e-5)

    # And back: a checkpoint saved without a strategy, restored into a model and optimizer made
    # under one; every replica computes with the restored weights and training goes on alike.
    plain_path = Checkpoint(optimizer=plain_optimizer, model=plain_model).save(tmp_path / "plain")
    with strategy.scope():
        mirrored = make_model(seed=3)
        mirrored_optimizer = torch.optim.Adam(mirrored.parameters(), lr=0.01)
        Checkpoint(optimizer=mirrored_optimizer, model=mirrored).restore(
            plain_path
        ).assert_consumed()
    x = torch.randn(4, 3)
    with torch.no_grad():
        outputs = strategy.experimental_local_results(strategy.run(mirrored, args=(x,)))
        assert len(outputs) == 2
        for output in outputs:
            assert torch.equal(output, plain_model(x))
    for batch in data[:3]:
        expected = train_step(plain_model, plain_optimizer, batch)
        got = mirrored_train_step(strategy, mirrored, mirrored_optimizer, batch)
        np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_training_restored_mid_epoch_continues_exactly(tmp_path) -> None:
    """Model, optimizer and distributed iterator saved mid-epoch: the restored run sees the same
    batches and ends with the same parameters as the uninterrupted one."""
    import numpy as np

    import feedline.data as fd
    import feedline.distribute as fdist
    import feedline.nn
    from feedline.train import Checkpoint

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 5)).astype(np.float32)
    y = rng.normal(size=(200, 1)).astype(np.float32)

    def build():
        torch.manual_seed(0)
        strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
        with strategy.scope():
            model = torch.nn.Linear(5, 1)
            optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
        data = fd.Dataset.from_tensor_slices((x, y)).shuffle(200, seed=3).batch(16)
        iterator = iter(strategy.experimental_distribute_dataset(data))

        def step(inputs):
            features, labels = inputs
            optimizer.zero_grad()
            per_example = ((model(features) - labels) ** 2).squeeze(1)
            feedline.nn.compute_average_loss(per_example, global_batch_size=16).backward()
            optimizer.step()
            return features

        return strategy, model, optimizer, iterator, step

    strategy, model, optimizer, iterator, step = build()
    seen = [strategy.run(step, args=(batch,)) for batch in iterator]
    expected_rows = [torch.cat(s.values) for s in seen[5:]]
    expected_weights = model.weight.detach().clone()

    strategy, model, optimizer, iterator, step = build()
    for _ in range(5):
        strategy.run(step, args=(next(iterator),))
    path = Checkpoint(model=model, optimizer=optimizer, iterator=iterator).save(
        str(tmp_path / "mid")
    )

    strategy, model, optimizer, iterator, step = build()  # a new process would do the same
    Checkpoint(model=model, optimizer=optimizer, iterator=iterator).restore(path).assert_consumed()
    rows = [torch.cat(strategy.run(step, args=(batch,)).values) for batch in iterator]
    assert len(rows) == len(expected_rows)
    assert all(torch.equal(a, b) for a, b in zip(rows, expected_rows, strict=True))
    torch.testing.assert_close(model.weight, expected_weights, rtol=0, atol=0)


# -- TensorFlow's arguments --------------------------------------------------------------------
def test_a_root_object_and_tensorflows_options(tmp_path: pathlib.Path) -> None:
    # tf.train.Checkpoint(model), as the class's example writes it; options=CheckpointOptions.
    model = make_model(seed=1)
    written: list[str] = []
    called: list[bool] = []
    options = feedline.train.CheckpointOptions(
        experimental_write_callbacks=[written.append, lambda: called.append(True)]
    )
    checkpoint = Checkpoint(model)
    path = checkpoint.save(tmp_path / "ckpt", options=options)
    exact = checkpoint.write(tmp_path / "exact", options)
    assert written == [path, exact] and called == [True, True]
    checkpoint.sync()  # saves are synchronous: nothing to wait for
    fresh = make_model(seed=2)
    status = Checkpoint(fresh).restore(path, options=feedline.train.CheckpointOptions())
    assert status.matched == ("root",)
    assert_states_equal(fresh.state_dict(), model.state_dict())
    with pytest.raises(TypeError, match="CheckpointOptions"):
        checkpoint.save(tmp_path / "ckpt", options={"enable_async": True})  # type: ignore[arg-type]
    assert Checkpoint(root=fresh).restore(path).matched == ("root",)


def test_a_failed_assertion_of_a_restore_is_an_assertion_error(tmp_path: pathlib.Path) -> None:
    # Ported code catches TensorFlow's AssertionError; it is a NotFoundError too.
    path = Checkpoint(model=make_model(seed=0)).save(tmp_path / "ckpt")
    status = Checkpoint(other=make_model(seed=0)).restore(path)
    for error in (AssertionError, NotFoundError, checkpoint_module.CheckpointMismatchError):
        with pytest.raises(error, match="objects without an entry in the file: \\['other'\\]"):
            status.assert_consumed()
    status.expect_partial()


def test_manager_takes_tensorflows_arguments_in_tensorflows_order(tmp_path: pathlib.Path) -> None:
    # (checkpoint, directory, max_to_keep, keep_checkpoint_every_n_hours, checkpoint_name, ...)
    manager = CheckpointManager(Checkpoint(model=make_model(seed=0)), tmp_path, 2, None, "model")
    assert os.path.basename(manager.save()) == "model-1"
    with pytest.raises(ValueError, match="step_counter should be passed"):
        CheckpointManager(Checkpoint(), tmp_path, 2, checkpoint_interval=5)


def test_manager_keeps_one_checkpoint_every_n_hours(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1_000_000.0]
    monkeypatch.setattr(checkpoint_management.time, "time", lambda: clock[0])
    checkpoint = Checkpoint(step=torch.tensor(0))
    manager = CheckpointManager(
        checkpoint, tmp_path, max_to_keep=2, keep_checkpoint_every_n_hours=1
    )
    for _ in range(8):  # a save every 20 minutes
        clock[0] += 1200
        manager.save()
    # ckpt-7 and 8 are listed; of the older ones, the first saved an hour after the manager
    # started (ckpt-3) and an hour after that (ckpt-6) stay on disk, unlisted, as TensorFlow
    # keeps them.
    assert [os.path.basename(p) for p in manager.checkpoints] == ["ckpt-7", "ckpt-8"]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-3", "ckpt-6", "ckpt-7", "ckpt-8"]
    # A restarted manager reads the timestamps back and goes on by the same rule.
    resumed = CheckpointManager(
        Checkpoint(step=torch.tensor(0)), tmp_path, max_to_keep=2, keep_checkpoint_every_n_hours=1
    )
    for _ in range(3):
        clock[0] += 1200
        resumed.save()
    assert "ckpt-9" in os.listdir(tmp_path) and "ckpt-8" not in os.listdir(tmp_path)


def test_manager_saves_every_checkpoint_interval_steps_and_restores_or_initializes(
    tmp_path: pathlib.Path,
) -> None:
    step = torch.tensor(0)
    initialised: list[bool] = []
    checkpoint = Checkpoint(step=step)
    manager = CheckpointManager(
        checkpoint,
        tmp_path,
        max_to_keep=None,
        step_counter=step,
        checkpoint_interval=3,
        init_fn=lambda: initialised.append(True),
    )
    assert manager.restore_or_initialize() is None and initialised == [True]
    saved = []
    for _ in range(8):
        saved.append(manager.save())
        step += 1  # in place, as a training loop counts
    assert [None if p is None else os.path.basename(p) for p in saved] == [
        "ckpt-1", None, None, "ckpt-2", None, None, "ckpt-3", None,
    ]  # fmt: skip
    assert manager.save(check_interval=False) is not None  # step 8: not saved yet
    assert manager.save(check_interval=False) is None  # the same step again
    assert manager.checkpoint_interval == 3
    step.fill_(0)
    again = CheckpointManager(
        Checkpoint(step=step), tmp_path, None, step_counter=step, checkpoint_interval=3
    )
    assert again.restore_or_initialize() == manager.latest_checkpoint and int(step) == 8
    assert again.save() is None  # step 8 was the last saved


def test_lists_tuples_and_dicts_of_objects(tmp_path: pathlib.Path) -> None:
    # TensorFlow: "All kwargs must be trackable objects, or a nested structure of trackable
    # objects (list, dict, or tuple)".
    models = [make_model(seed=0), make_model(seed=1)]
    step = torch.tensor(7)
    path = Checkpoint(models=models, extra={"step": step}, pair=(torch.ones(2),)).save(
        tmp_path / "ckpt"
    )
    fresh = [make_model(seed=2), make_model(seed=3)]
    restored_step = torch.tensor(0)
    status = Checkpoint(
        models=fresh, extra={"step": restored_step}, pair=(torch.zeros(2),)
    ).restore(path)
    assert status.matched == ("models.0", "models.1", "extra.step", "pair.0")
    status.assert_consumed()
    for model, again in zip(models, fresh, strict=True):
        assert_states_equal(again.state_dict(), model.state_dict())
    assert int(restored_step) == 7
    with pytest.raises(TypeError, match="in 'models': Checkpoint cannot save '1'"):
        Checkpoint(models=[make_model(seed=0), 3])
    with pytest.raises(TypeError, match="needs str keys"):
        Checkpoint(models={1: make_model(seed=0)})


def test_an_object_attached_after_the_restore_is_restored_then(tmp_path: pathlib.Path) -> None:
    # TensorFlow: "Dependencies added after this call will be matched if they have a
    # corresponding object in the checkpoint."
    model = make_model(seed=0)
    step = torch.tensor(5)
    path = Checkpoint(model=model, inner=Checkpoint(step=step)).save(tmp_path / "ckpt")
    checkpoint = Checkpoint()
    status = checkpoint.restore(path)
    assert status.unused_entries == ("model", "inner")
    status.expect_partial()
    late = make_model(seed=1)
    checkpoint.model = late
    assert_states_equal(late.state_dict(), model.state_dict())
    later_step = torch.tensor(0)
    checkpoint.inner = Checkpoint(step=later_step)
    assert int(later_step) == 5
    # Matched once: an object attached again under the name is left as it is.
    another = make_model(seed=2)
    before = {k: v.clone() for k, v in another.state_dict().items()}
    checkpoint.model = another
    assert_states_equal(another.state_dict(), before)
