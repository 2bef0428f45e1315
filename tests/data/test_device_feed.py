"""Tests of feedline/data/_device_feed.py, on the CPU: the ring, the packing and the events.

The CUDA calls are behind ``CopyBackend``; ``HostBackend`` and the late backend of
``fake_device`` stand in for a GPU. The same path on a real GPU: ``test_device_feed_cuda.py``.
"""

from __future__ import annotations

import collections
import threading

import numpy as np
import pytest
import torch

from feedline.data import TensorSpec, _device_feed
from feedline.data._device_feed import (
    ALIGNMENT,
    CudaBackend,
    DeviceFeed,
    HostBackend,
    Placed,
    parse_device,
    spec_bytes,
)
from feedline.errors import InvalidArgumentError
from feedline.structure import RaggedArray
from tests.data.checkpoint_utils import assert_elements_equal
from tests.data.fake_device import LateBackend

GPU = torch.device("cuda", 0)  # fed through a stand-in backend: no GPU is touched


def batches(n: int, rows: int = 4) -> list[dict[str, object]]:
    return [
        {
            "image": np.full((rows, 3, 2), i, np.float32),
            "label": (np.arange(rows, dtype=np.int64) + 10 * i, np.bool_(i % 2)),
        }
        for i in range(n)
    ]


def test_every_dtype_and_structure_arrives_exactly() -> None:
    Point = collections.namedtuple("Point", ["x", "y"])
    element = {
        "f16": np.linspace(0, 1, 7, dtype=np.float16),
        "f64": np.arange(6, dtype=np.float64).reshape(2, 3).T,  # not contiguous
        "big_endian": np.arange(5, dtype=">i4"),
        "u8": np.arange(3, dtype=np.uint8),
        "scalar": np.int16(-3),
        "empty": np.zeros((0, 4), np.float32),
        "point": Point(np.array([1.5]), np.array([True, False])),
        "text": np.array([b"a", b"bc"], dtype=object),
        "ragged": RaggedArray(np.arange(5, dtype=np.int32), np.array([0, 2, 5])),
    }
    out = DeviceFeed(backend=HostBackend()).put(element, GPU).ready()
    assert set(out) == set(element)
    assert isinstance(out["point"], Point)
    assert out["text"] is element["text"]  # strings stay NumPy
    for key in ("f16", "f64", "big_endian", "u8", "scalar", "empty"):
        assert isinstance(out[key], torch.Tensor)
        assert out[key].shape == np.shape(element[key])
        np.testing.assert_array_equal(out[key].numpy(), element[key])
    assert out["scalar"].dtype == torch.int16
    assert out["big_endian"].dtype == torch.int32
    np.testing.assert_array_equal(out["point"].y.numpy(), [True, False])
    assert out["ragged"].is_nested


def test_leaves_are_aligned_views_of_one_copy_per_element() -> None:
    backend = HostBackend()
    out = DeviceFeed(backend=backend).put(batches(1)[0], GPU).ready()
    assert backend.copies == 1
    storages = {t.untyped_storage().data_ptr() for t in (out["image"], *out["label"])}
    assert len(storages) == 1
    offsets = [t.storage_offset() * t.element_size() for t in (out["image"], *out["label"])]
    assert all(offset % ALIGNMENT == 0 for offset in offsets)


def test_the_ring_reuses_its_buffers() -> None:
    backend = HostBackend()
    feed = DeviceFeed(depth=2, backend=backend)
    assert feed.buffer_count == 4  # elements kept ahead + 2
    elements = batches(20)
    for element in elements:
        assert_elements_equal(feed.put(element, GPU).ready(), element)
    assert backend.allocations == 4  # one per slot, then reused
    assert backend.copies == 20


def test_buffer_count_and_one_ring_per_device() -> None:
    backend = HostBackend()
    feed = DeviceFeed(buffer_count=3, backend=backend)
    for element in batches(10):
        feed.put(element, torch.device("cuda", 0)).ready()
        feed.put(element, torch.device("cuda", 1)).ready()
    assert backend.allocations == 6
    assert sorted(str(d) for d in feed.rings()) == ["cuda:0", "cuda:1"]
    with pytest.raises(InvalidArgumentError, match="buffer_count must be >= 1, got 0"):
        DeviceFeed(buffer_count=0)


def test_slots_are_sized_from_the_spec_and_grow_for_larger_elements() -> None:
    spec = {"image": TensorSpec((4, 3, 2), np.float32), "label": TensorSpec((4,), np.int64)}
    assert spec_bytes(spec) == 128 + 64
    assert spec_bytes(TensorSpec((None, 3), np.float32)) is None  # the ring learns the size
    assert spec_bytes(TensorSpec((2,), object)) == 0  # strings stay on the host
    backend = HostBackend()
    feed = DeviceFeed(buffer_count=2, spec=TensorSpec((None,), np.float64), backend=backend)
    for rows in (4, 4, 4, 100, 4, 4, 100):
        element = np.arange(rows, dtype=np.float64)
        np.testing.assert_array_equal(feed.put(element, GPU).ready().numpy(), element)
    # two slots, each grown once to the 100-row element (the slot sized for it keeps its size)
    assert backend.allocations == 4


def test_a_buffer_is_never_overwritten_while_its_copy_is_pending() -> None:
    backend = LateBackend()
    feed = DeviceFeed(buffer_count=2, backend=backend)
    elements = batches(8)
    placed = [feed.put(element, GPU) for element in elements]  # no copy has run yet...
    ring = feed.rings()[GPU]
    assert ring.host_waits == 6  # ...but reusing a slot waited for the copy that read it
    for element, one in zip(elements, placed, strict=True):
        assert_elements_equal(one.ready(), element)
    assert backend.allocations == 2


def test_the_late_backend_catches_a_ring_that_does_not_wait() -> None:
    backend = LateBackend()
    backend.event_done = lambda event: True  # type: ignore[method-assign]  # a lying event
    backend.wait_host = lambda event: None  # type: ignore[method-assign]
    feed = DeviceFeed(buffer_count=2, backend=backend)
    elements = [np.full(4, i, np.int64) for i in range(3)]
    placed = [feed.put(element, GPU) for element in elements]
    backend.finish_all()
    values = [int(p.ready()[0]) for p in placed]
    assert values == [2, 1, 2]  # element 0's copy read element 2's bytes


def test_ready_waits_on_the_compute_stream_for_its_own_copy_only() -> None:
    backend = LateBackend()
    feed = DeviceFeed(buffer_count=4, backend=backend)
    first, second = (feed.put(element, GPU) for element in batches(2))
    assert not any(event.done for event in backend.events)
    first.ready()
    assert [event.done for event in backend.events] == [True, False]
    assert backend.compute_waits == 1 and backend.recorded_streams == 1
    second.ready()
    assert backend.compute_waits == 2


def test_join_waits_for_every_replica() -> None:
    backend = LateBackend()
    feed = DeviceFeed(backend=backend)
    parts = [feed.put(np.full(2, i), torch.device("cuda", i)) for i in range(3)]
    step = Placed.join(parts, tuple).ready()
    assert [t.tolist() for t in step] == [[0, 0], [1, 1], [2, 2]]
    assert backend.compute_waits == 3


@pytest.mark.parametrize(
    ("name", "device"),
    [
        ("cuda:1", torch.device("cuda", 1)),
        ("/gpu:0", torch.device("cuda", 0)),
        ("GPU:2", torch.device("cuda", 2)),
        ("/job:localhost/replica:0/task:0/device:GPU:3", torch.device("cuda", 3)),
        ("cuda", torch.device("cuda", 0)),
        ("/cpu:0", torch.device("cpu")),
        (torch.device("cuda", 1), torch.device("cuda", 1)),
    ],
)
def test_device_names(name: object, device: torch.device) -> None:
    assert parse_device(name) == device  # type: ignore[arg-type]


def test_unknown_device_names() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown device 'tpu:0'"):
        parse_device("tpu:0")
    with pytest.raises(InvalidArgumentError, match="unknown device 3"):
        parse_device(3)  # type: ignore[arg-type]


def test_cuda_unavailable_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InvalidArgumentError, match="CUDA is not available") as error:
        DeviceFeed().put(np.zeros(2), GPU)
    assert "'/cpu:0'" in str(error.value) and "CUDA build of torch" in str(error.value)


def test_a_device_that_does_not_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(
        InvalidArgumentError, match="device cuda:5 does not exist: this machine has 2 CUDA device"
    ):
        CudaBackend().check_device(torch.device("cuda", 5))


def test_a_large_element_is_packed_by_several_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_device_feed, "PARALLEL_PACK_BYTES", 1024)
    monkeypatch.setattr(_device_feed, "_PACK_THREADS", 3)
    threads: set[str] = set()
    copyto = np.copyto

    def recording_copyto(*args: object, **kwargs: object) -> None:
        threads.add(threading.current_thread().name)
        copyto(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(np, "copyto", recording_copyto)
    feed = DeviceFeed(backend=HostBackend())
    element = (
        np.arange(10_000, dtype=np.float64).reshape(100, 100)[:, ::2],  # strided rows
        np.arange(2, dtype=np.int8),  # fewer rows than threads: one piece
        np.float32(7),
    )
    out = feed.put(element, GPU).ready()
    assert_elements_equal(tuple(t.numpy() for t in out), element)
    assert threads and all(name.startswith("feedline-pack") for name in threads)
    feed.close()
    feed.close()
