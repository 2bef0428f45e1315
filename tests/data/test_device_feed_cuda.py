"""Tests of feedline/data/_device_feed.py and prefetch_to_device on a real CUDA device.

They skip where ``torch.cuda.is_available()`` is False; the CPU tests of the same path
(``test_device_feed.py``, ``test_prefetch_to_device.py``) run everywhere.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from feedline.data import Dataset
from feedline.data._device_feed import CudaBackend, DeviceFeed
from feedline.data.experimental import copy_to_device, prefetch_to_device
from feedline.errors import InvalidArgumentError

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"
)

GPU = torch.device("cuda", 0)


class CountingCudaBackend(CudaBackend):
    def __init__(self) -> None:
        self.allocations = 0

    def pinned_buffer(self, nbytes: int) -> torch.Tensor:
        self.allocations += 1
        return super().pinned_buffer(nbytes)


def test_values_arrive_exactly_on_the_device() -> None:
    element = {
        "f32": np.random.default_rng(0).standard_normal((64, 3, 8, 8)).astype(np.float32),
        "i64": np.arange(64, dtype=np.int64),
        "f16": np.linspace(0, 1, 5, dtype=np.float16),
        "b": np.array([True, False]),
        "empty": np.zeros((0, 2), np.float32),
        "text": np.array([b"a"], dtype=object),
    }
    out = DeviceFeed().put(element, GPU).ready()
    for key in ("f32", "i64", "f16", "b", "empty"):
        assert out[key].device == GPU
        np.testing.assert_array_equal(out[key].cpu().numpy(), element[key])
    assert out["text"] is element["text"]


def test_buffers_are_pinned_reused_and_copied_on_a_stream_of_their_own() -> None:
    backend = CountingCudaBackend()
    feed = DeviceFeed(depth=1, backend=backend)
    for i in range(30):
        x = feed.put(np.full((256, 1024), i, np.float32), GPU).ready()
        assert float(x.sum()) == 256 * 1024 * i
    ring = feed.rings()[GPU]
    assert backend.allocations == feed.buffer_count == 3
    assert all(slot.buffer.is_pinned() for slot in ring.slots)
    assert ring.stream != torch.cuda.current_stream(GPU)


def test_no_batch_is_corrupted_while_the_compute_stream_is_busy() -> None:
    # Long kernels on the compute stream, copies queued ahead on the copy stream, a ring of
    # two buffers: any reuse of a buffer before its copy finished would change a batch.
    feed = DeviceFeed(buffer_count=2)
    weight = torch.randn(2048, 2048, device=GPU)
    ahead = [feed.put(np.full((512, 2048), i, np.float32), GPU) for i in range(2)]
    for i in range(40):
        batch = ahead.pop(0).ready()
        ahead.append(feed.put(np.full((512, 2048), i + 2, np.float32), GPU))
        for _ in range(3):
            weight = torch.tanh(weight @ weight) * 0.01
        assert float(batch[0, 0]) == i and float(batch.mean()) == i


def test_prefetch_to_device_and_as_torch_device() -> None:
    ds = Dataset.range(100).batch(8)
    expected = [b.tolist() for b in ds]
    for transformation in (prefetch_to_device("/gpu:0", 2), copy_to_device("cuda:0")):
        got = list(ds.apply(transformation))
        assert all(b.device == GPU for b in got)
        assert [b.tolist() for b in got] == expected
    loader = ds.as_torch(device="cuda")
    assert [b.tolist() for b in loader] == expected


def test_a_device_that_does_not_exist() -> None:
    missing = torch.cuda.device_count()
    ds = Dataset.range(3).apply(prefetch_to_device(f"/gpu:{missing}"))
    with pytest.raises(InvalidArgumentError, match=f"device cuda:{missing} does not exist"):
        next(iter(ds))
