"""Tests of feedline/data/ops/prefetch_to_device.py: ``prefetch_to_device``,
``copy_to_device`` and ``as_torch(device=...)``.

The CUDA device is played by ``HostBackend`` (every test here patches ``default_backend``), so
the whole path (ring, copy stream, events, checkpoints) runs on the CPU. On a real GPU:
``test_prefetch_to_device_cuda.py``.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import feedline as tf
from feedline.data import Dataset, Options, _device_feed
from feedline.data.experimental import copy_to_device, prefetch_to_device
from feedline.errors import InvalidArgumentError
from tests.data.checkpoint_utils import assert_elements_equal, checkpoint_test
from tests.data.fake_device import LateBackend


@pytest.fixture(autouse=True)
def backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[LateBackend]:
    """A late backend stands in for CUDA (its devices exist; its copies finish late)."""
    fake = LateBackend()
    monkeypatch.setattr(_device_feed, "default_backend", lambda device: fake)
    yield fake


def pipeline() -> Dataset:
    return Dataset.range(11).map(lambda x: {"x": x * 1.5, "name": b"n"}).batch(3)


def test_elements_arrive_as_tensors_exactly() -> None:
    expected = list(pipeline())
    for transformation in (
        prefetch_to_device("/gpu:0"),
        prefetch_to_device("cuda:0", 3),
        copy_to_device("GPU:0"),
    ):
        got = list(pipeline().apply(transformation))
        assert all(isinstance(e["x"], torch.Tensor) for e in got)
        assert all(isinstance(e["name"], np.ndarray) for e in got)  # strings stay NumPy
        assert_elements_equal([{"x": e["x"].numpy(), "name": e["name"]} for e in got], expected)


def test_the_tensorflow_docs_example() -> None:
    # tf.data.experimental.prefetch_to_device's documented use, ported line by line
    dataset = tf.data.Dataset.range(8).batch(4)
    dataset = dataset.apply(tf.data.experimental.prefetch_to_device("/gpu:0"))
    assert [b.tolist() for b in dataset] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_buffers_are_reused_and_copies_kept_ahead(backend: LateBackend) -> None:
    ds = Dataset.range(40).batch(4).apply(prefetch_to_device("/gpu:0", buffer_size=2))
    it = iter(ds)
    first = next(it)
    assert first.tolist() == [0, 1, 2, 3]
    assert backend.copies == 3  # the one handed out and two queued ahead
    assert [b.tolist()[0] for b in it] == list(range(4, 40, 4))
    assert backend.allocations == 4  # buffer_size + 2 pinned buffers, reused ten times over
    assert backend.compute_waits == 10


def test_pinned_buffer_count_option(backend: LateBackend) -> None:
    options = Options()
    options.experimental_distribute.pinned_buffer_count = 7
    ds = Dataset.range(40).batch(2).with_options(options).apply(prefetch_to_device("/gpu:0"))
    assert len(list(ds)) == 20
    assert backend.allocations == 7


def test_as_torch_device_goes_through_the_feed(backend: LateBackend) -> None:
    loader = Dataset.range(7).batch(2).as_torch(device="/gpu:0")
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6]]
    assert backend.copies == 4 and backend.allocations == 3


def test_as_torch_device_checkpoints() -> None:
    def make() -> torch.utils.data.IterableDataset:
        return Dataset.range(10).shuffle(10, seed=1).batch(2).as_torch(device="cuda:0")

    expected = [b.tolist() for b in make()]
    loader = make()
    it = iter(loader)
    head = [next(it).tolist() for _ in range(2)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    again = make()
    again.load_state_dict(state)
    assert head + [b.tolist() for b in again] == expected


def test_cpu_device_needs_no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    got = list(Dataset.range(3).apply(prefetch_to_device("/cpu:0")))
    assert [t.item() for t in got] == [0, 1, 2] and all(t.device.type == "cpu" for t in got)


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown device 'tpu:0'"):
        Dataset.range(3).apply(prefetch_to_device("tpu:0"))
    with pytest.raises(InvalidArgumentError, match="buffer_size must be >= 0, got -2"):
        Dataset.range(3).apply(prefetch_to_device("/gpu:0", -2))
    with pytest.raises(InvalidArgumentError, match="source_device '/gpu:0' is not the host"):
        copy_to_device("/cpu:0", source_device="/gpu:0")
    with pytest.raises(InvalidArgumentError, match="unknown device 'gpu0'"):
        Dataset.range(3).as_torch(device="gpu0")


def test_cuda_unavailable_is_a_clear_error_when_iterated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()  # the real default backend
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ds = Dataset.range(3).apply(prefetch_to_device("/gpu:0"))  # building it needs no CUDA
    with pytest.raises(InvalidArgumentError, match="CUDA is not available here"):
        next(iter(ds))


def test_spec_and_cardinality_are_the_inputs() -> None:
    ds = pipeline().apply(prefetch_to_device("/gpu:0"))
    assert ds.element_spec == pipeline().element_spec
    assert ds.cardinality() == 4


def test_building_it_does_not_import_torch() -> None:
    code = (
        "import sys, feedline.data as fd\n"
        "from feedline.data.experimental import prefetch_to_device, copy_to_device\n"
        "ds = fd.Dataset.range(3).apply(prefetch_to_device('/gpu:0'))\n"
        "ds = ds.apply(copy_to_device('/gpu:1'))\n"
        "assert 'torch' not in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


test_checkpointing = checkpoint_test(
    __name__,
    prefetch_to_gpu=lambda: (
        Dataset.range(9).map(lambda x: (x, x * 0.5)).batch(2).apply(prefetch_to_device("/gpu:0", 2))
    ),
    copy_to_gpu=lambda: Dataset.range(5).apply(copy_to_device("/gpu:0")),
    prefetch_to_cpu=lambda: Dataset.range(5).batch(2).apply(prefetch_to_device("/cpu:0")),
)


def test_an_input_error_comes_in_its_turn_and_iteration_goes_on() -> None:
    def fail_on_two(x: np.ndarray) -> np.ndarray:
        if x == 2:
            raise ValueError("two")
        return x

    ds = Dataset.range(5).map(fail_on_two).apply(prefetch_to_device("/gpu:0", 3))
    it = iter(ds)
    assert [next(it).item(), next(it).item()] == [0, 1]
    with pytest.raises(ValueError, match="two"):
        next(it)
    assert [t.item() for t in it] == [3, 4]
