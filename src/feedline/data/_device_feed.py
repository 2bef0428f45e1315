"""Moving elements to a device: reusable pinned host buffers, one copy stream per device.

The path that every feedline input to a GPU takes (a distributed dataset's replicas,
``as_torch(device=...)``, ``prefetch_to_device`` / ``copy_to_device``). For each element and
device it:

1. takes the next *slot* of the device's ring of page-locked host buffers; a slot is reused only
   after the copy that last read it has finished (its event), and the host waits for that event
   only if the copy is still running;
2. packs the element's numeric leaves into the slot (one host memcpy per leaf, each leaf at an
   offset aligned to 64 bytes; an element of 8 MiB or more is packed by up to 4 threads, so
   that packing keeps up with the device copy);
3. copies the slot's bytes to the device in one non-blocking copy on the device's own copy
   stream, records an event after it, and cuts the device bytes into one tensor per leaf;
4. when the element is handed to the consumer (``Placed.ready``), makes the consumer's current
   stream wait for that event (and only that one) and tells the caching allocator that the
   memory is used on that stream (``record_stream``).

So the host never blocks on a copy it does not need, the compute stream never waits for another
batch's copy, and after the first passes over the ring no pinned memory is allocated. A ring
holds ``buffer_count`` slots, by default the number of elements kept ahead on the device plus 2
(one being packed, one whose copy may still run); each slot is sized from the element spec where
its shapes are fully known, else grown to the largest element seen.

The CUDA calls sit behind ``CopyBackend``: ``CudaBackend`` is the real one, ``HostBackend`` runs
the same path on the CPU (a "device copy" is a copy into new host memory), so that the ring, the
packing and the events can be tested on machines without a GPU. Byte and unicode strings stay
NumPy arrays; ragged and sparse values are converted as ``as_torch`` converts them, then moved
with ``Tensor.to``.

Imported only when an element is placed on a device: it imports torch.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import optree
import torch

from feedline import structure
from feedline.data.ops._checks import canonical_device
from feedline.data.torch_loader import to_torch
from feedline.errors import InvalidArgumentError
from feedline.structure import RaggedArray, SparseArray

__all__ = [
    "ALIGNMENT",
    "PARALLEL_PACK_BYTES",
    "CopyBackend",
    "CudaBackend",
    "DeviceFeed",
    "HostBackend",
    "Placed",
    "default_backend",
    "on_host",
    "parse_device",
    "spec_bytes",
]

#: Every leaf starts at a multiple of this many bytes in a slot (and in its device copy).
ALIGNMENT = 64

#: An element of at least this many bytes is packed into its slot by several threads.
PARALLEL_PACK_BYTES = 8 << 20
_PACK_THREADS = min(4, max(1, (os.cpu_count() or 1) // 2))

#: NumPy kinds that stay NumPy (no torch dtype): byte strings (object), unicode, void, times.
_HOST_ONLY = "OSUVMm"


def parse_device(name: str | torch.device) -> torch.device:
    """A torch device from a PyTorch or TensorFlow name (``"cuda:0"``, ``"/gpu:0"``, ``"GPU:1"``,
    ``"/cpu:0"``, ``torch.device("cuda", 0)``); ``"cuda"`` and ``"/gpu"`` mean index 0.

    Raises:
      InvalidArgumentError: not the name of a CPU or CUDA device.
    """
    return torch.device(canonical_device(name))


class CopyBackend(Protocol):
    """The device calls of the feed: CUDA (``CudaBackend``), or a stand-in for tests.

    Events and streams are opaque to the feed; it only passes them back to the backend.
    """

    def check_device(self, device: torch.device) -> None:
        """Raises ``InvalidArgumentError`` (saying what to do) unless ``device`` can be fed."""
        ...

    def pinned_buffer(self, nbytes: int) -> torch.Tensor:
        """A new 1-d ``uint8`` host tensor of ``nbytes`` bytes, page-locked where that exists."""
        ...

    def new_stream(self, device: torch.device) -> Any:
        """A copy stream of its own for ``device``."""
        ...

    def copy_to_device(self, source: torch.Tensor, device: torch.device, stream: Any) -> Any:
        """A new ``uint8`` tensor on ``device``, filled from ``source`` by a non-blocking copy
        queued on ``stream`` (allocated on ``stream``)."""
        ...

    def record_event(self, stream: Any) -> Any:
        """An event recorded on ``stream`` after the work queued so far."""
        ...

    def event_done(self, event: Any) -> bool:
        """Whether the work before ``event`` has finished (never blocks)."""
        ...

    def wait_host(self, event: Any) -> None:
        """Blocks the host until the work before ``event`` has finished."""
        ...

    def wait_compute(self, event: Any, device: torch.device) -> None:
        """Makes ``device``'s current stream wait for ``event`` (the host does not block)."""
        ...

    def use_on_compute(self, tensor: torch.Tensor, device: torch.device) -> None:
        """Tells the allocator that ``tensor`` is used on ``device``'s current stream."""
        ...

    def move(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``tensor`` (ragged, sparse: outside the ring) on ``device``, copied synchronously."""
        ...


class CudaBackend:
    """``CopyBackend`` on CUDA: pinned ``torch.empty``, ``torch.cuda.Stream`` and ``Event``."""

    def check_device(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise InvalidArgumentError(f"CudaBackend feeds CUDA devices, got {device}")
        if not torch.cuda.is_available():
            raise InvalidArgumentError(
                f"cannot feed {device}: CUDA is not available here (torch.cuda.is_available() is "
                f"False: no NVIDIA GPU or driver, or a CPU-only torch {torch.__version__}). Use "
                "'/cpu:0' as the device, leave out prefetch_to_device / copy_to_device / "
                "as_torch(device=...), or install a CUDA build of torch on a machine with a GPU"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise InvalidArgumentError(
                f"device {device} does not exist: this machine has {count} CUDA device(s), "
                f"cuda:0 to cuda:{count - 1}"
            )

    def pinned_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def new_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device=device)

    def copy_to_device(self, source: torch.Tensor, device: torch.device, stream: Any) -> Any:
        with torch.cuda.stream(stream):
            target = torch.empty(source.numel(), dtype=torch.uint8, device=device)
            target.copy_(source, non_blocking=True)
        return target

    def record_event(self, stream: Any) -> Any:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def event_done(self, event: Any) -> bool:
        return bool(event.query())

    def wait_host(self, event: Any) -> None:
        event.synchronize()

    def wait_compute(self, event: Any, device: torch.device) -> None:
        torch.cuda.current_stream(device).wait_event(event)

    def use_on_compute(self, tensor: torch.Tensor, device: torch.device) -> None:
        tensor.record_stream(torch.cuda.current_stream(device))

    def move(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        return tensor.to(device)


class HostBackend:
    """``CopyBackend`` without a device: buffers are ordinary host memory, a "device copy" is a
    copy into new host memory, and every event has finished when it is recorded. It runs the
    feed's whole path (ring, packing, events) on a CPU-only machine; it counts what it does."""

    def __init__(self) -> None:
        self.allocations = 0  # pinned_buffer calls
        self.copies = 0  # copy_to_device calls

    def check_device(self, device: torch.device) -> None:
        pass

    def pinned_buffer(self, nbytes: int) -> torch.Tensor:
        self.allocations += 1
        return torch.empty(nbytes, dtype=torch.uint8)

    def new_stream(self, device: torch.device) -> Any:
        return None

    def copy_to_device(self, source: torch.Tensor, device: torch.device, stream: Any) -> Any:
        self.copies += 1
        return source.clone()

    def record_event(self, stream: Any) -> Any:
        return None

    def event_done(self, event: Any) -> bool:
        return True

    def wait_host(self, event: Any) -> None:
        pass

    def wait_compute(self, event: Any, device: torch.device) -> None:
        pass

    def use_on_compute(self, tensor: torch.Tensor, device: torch.device) -> None:
        pass

    def move(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        return tensor


def default_backend(device: torch.device) -> CopyBackend:
    """The backend that feeds ``device``: ``CudaBackend`` for CUDA devices (checked)."""
    backend = CudaBackend()
    backend.check_device(device)
    return backend


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def spec_bytes(spec: Any) -> int | None:
    """Bytes a slot needs for an element of ``spec`` (aligned leaves), or None where a shape
    or dtype is not fully known (the ring then sizes slots from the elements it sees)."""
    total = 0
    for leaf in structure.spec_leaves(spec):
        shape = getattr(leaf, "shape", None)
        dtype = getattr(leaf, "dtype", None)
        if shape is None or dtype is None or any(d is None for d in shape):
            return None
        dtype = np.dtype(dtype)
        if dtype.kind in _HOST_ONLY:
            continue
        total += _aligned(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
    return total


_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {}


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    found = _TORCH_DTYPES.get(dtype)
    if found is None:
        found = _TORCH_DTYPES[dtype] = torch.from_numpy(np.empty(0, dtype)).dtype
    return found


@dataclasses.dataclass
class _Slot:
    buffer: torch.Tensor  # uint8, page-locked where the backend has it
    array: np.ndarray  # the same bytes, as NumPy writes them
    event: Any = None  # recorded after the copy that last read the slot
    pending: bool = False


class _Ring:
    """One device's copy stream and its ring of slots."""

    def __init__(self, backend: CopyBackend, device: torch.device, count: int, size: int) -> None:
        self.backend = backend
        self.device = device
        self.stream = backend.new_stream(device)
        self.count = count
        self.size = size  # bytes of a new slot
        self.slots: list[_Slot] = []
        self.next = 0
        self.host_waits = 0  # acquisitions that had to wait for a copy still running

    def acquire(self, nbytes: int) -> _Slot:
        """The next slot, at least ``nbytes`` long, whose last copy has finished."""
        if len(self.slots) < self.count:
            slot = self._new_slot(nbytes)
            self.slots.append(slot)
            return slot
        slot = self.slots[self.next]
        self.next = (self.next + 1) % self.count
        if slot.pending:
            if not self.backend.event_done(slot.event):
                self.host_waits += 1
                self.backend.wait_host(slot.event)
            slot.pending, slot.event = False, None
        if slot.buffer.numel() < nbytes:
            fresh = self._new_slot(nbytes)
            slot.buffer, slot.array = fresh.buffer, fresh.array
        return slot

    def _new_slot(self, nbytes: int) -> _Slot:
        self.size = max(self.size, nbytes)
        buffer = self.backend.pinned_buffer(max(self.size, ALIGNMENT))
        return _Slot(buffer, buffer.numpy())


class Placed:
    """An element whose copies to the device were queued; ``ready()`` hands it to the consumer.

    Single-threaded; call ``ready`` once, on the thread (and current stream) that computes.
    """

    __slots__ = ("_backend", "_copies", "_element")

    def __init__(
        self, element: Any, copies: Sequence[tuple[Any, torch.Tensor, torch.device]], backend: Any
    ) -> None:
        self._element = element
        self._copies = copies
        self._backend = backend

    @staticmethod
    def join(parts: Sequence[Placed], combine: Callable[[list[Any]], Any]) -> Placed:
        """One element of several placed ones (a step's replicas, ``combine`` making the step
        of their elements), whose ``ready()`` waits for every part's copy."""
        backend = next((p._backend for p in parts if p._backend is not None), None)
        copies = [copy for p in parts for copy in p._copies]
        return Placed(combine([p._element for p in parts]), copies, backend)

    def ready(self) -> Any:
        """The element, after making each device's current stream wait for its copy."""
        for event, blob, device in self._copies:
            self._backend.wait_compute(event, device)
            self._backend.use_on_compute(blob, device)
        return self._element


def on_host(element: Any) -> Placed:
    """``element`` as ``as_torch`` gives it, on the host (nothing to copy or wait for)."""
    return Placed(to_torch(element), (), None)


class DeviceFeed:
    """Places elements on devices through per-device rings of reusable pinned buffers.

    Single-threaded. One feed serves any number of devices (a ring and a copy stream each).

    Args:
      buffer_count: slots in each device's ring (>= 1); the default is ``depth + 2``.
      depth: elements the caller keeps placed ahead of the consumer (sizes the default ring).
      spec: the element spec; where fully known it sizes the slots.
      backend: the device calls; None chooses ``CudaBackend`` (devices checked when first fed).

    Example:
      >>> import numpy as np
      >>> feed = DeviceFeed(backend=HostBackend())
      >>> x, y = feed.put((np.arange(3), np.float32(2)), torch.device("cpu")).ready()
      >>> x.tolist(), y.item()
      ([0, 1, 2], 2.0)
    """

    def __init__(
        self,
        *,
        buffer_count: int | None = None,
        depth: int = 1,
        spec: Any = None,
        backend: CopyBackend | None = None,
    ) -> None:
        if buffer_count is not None and buffer_count < 1:
            raise InvalidArgumentError(f"buffer_count must be >= 1, got {buffer_count}")
        self._count = buffer_count if buffer_count is not None else max(depth, 0) + 2
        self._size = (spec_bytes(spec) or 0) if spec is not None else 0
        self._backend = backend
        self._rings: dict[torch.device, _Ring] = {}
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def buffer_count(self) -> int:
        """Slots in each device's ring."""
        return self._count

    def rings(self) -> dict[torch.device, _Ring]:
        """Each device's ring (for tests and statistics)."""
        return dict(self._rings)

    def _ring(self, device: torch.device) -> _Ring:
        ring = self._rings.get(device)
        if ring is None:
            if self._backend is None:
                self._backend = default_backend(device)
            else:
                self._backend.check_device(device)
            ring = self._rings[device] = _Ring(self._backend, device, self._count, self._size)
        return ring

    def _pack(self, pairs: list[tuple[np.ndarray, np.ndarray]], total: int) -> None:
        """Copies each array into its slot view; a large element on several threads (NumPy's
        copy releases the GIL), so that packing keeps up with the device copy."""
        if total < PARALLEL_PACK_BYTES or _PACK_THREADS < 2:
            for target, array in pairs:
                np.copyto(target.reshape(array.shape), array, casting="equiv")
            return
        chunks = []
        for target, array in pairs:
            shaped = target.reshape(array.shape)
            if array.ndim == 0 or array.shape[0] < _PACK_THREADS:
                chunks.append((shaped, array))
                continue
            bounds = np.linspace(0, array.shape[0], _PACK_THREADS + 1).astype(int)
            chunks += [(shaped[a:b], array[a:b]) for a, b in itertools.pairwise(bounds) if b > a]
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                _PACK_THREADS, thread_name_prefix="feedline-pack"
            )
        for done in self._pool.map(lambda c: np.copyto(c[0], c[1], casting="equiv"), chunks):
            del done

    def close(self) -> None:
        """Stops the packing threads, if any were started; idempotent."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def put(self, element: Any, device: torch.device) -> Placed:
        """Queues the copy of ``element`` (nested NumPy arrays) to ``device``."""
        ring = self._ring(device)
        leaves, treespec = optree.tree_flatten(element, is_leaf=_is_leaf, none_is_leaf=True)
        offsets: list[int] = []
        total = 0
        packed: list[np.ndarray | None] = []
        for leaf in leaves:
            array = _numeric(leaf)
            packed.append(array)
            offsets.append(total)
            if array is not None:
                total += _aligned(array.nbytes)
        out: list[Any] = list(leaves)
        copies: list[tuple[Any, torch.Tensor, torch.device]] = []
        if any(array is not None for array in packed):
            slot = ring.acquire(total)
            pairs = [
                (slot.array[offset : offset + array.nbytes].view(array.dtype), array)
                for array, offset in zip(packed, offsets, strict=True)
                if array is not None and array.nbytes
            ]
            self._pack(pairs, total)
            backend = ring.backend
            blob = backend.copy_to_device(slot.buffer[: max(total, 1)], device, ring.stream)
            event = backend.record_event(ring.stream)
            slot.event, slot.pending = event, True
            copies.append((event, blob, device))
            for i, (array, offset) in enumerate(zip(packed, offsets, strict=True)):
                if array is not None:
                    part = blob[offset : offset + array.nbytes]
                    out[i] = part.view(_torch_dtype(array.dtype)).view(array.shape)
        for i, (leaf, array) in enumerate(zip(leaves, packed, strict=True)):
            if array is None:
                out[i] = _other_leaf(leaf, device, ring.backend)
        return Placed(optree.tree_unflatten(treespec, out), copies, self._backend)


def _is_leaf(value: Any) -> bool:
    return isinstance(value, np.ndarray | np.generic | torch.Tensor | RaggedArray | SparseArray)


def _numeric(leaf: Any) -> np.ndarray | None:
    """``leaf`` as a NumPy array in native byte order if it goes through the ring, else None."""
    if (
        isinstance(leaf, torch.Tensor)
        and leaf.device.type == "cpu"
        and leaf.layout == torch.strided
    ):
        leaf = leaf.detach().numpy()
    if isinstance(leaf, np.generic):
        leaf = np.asarray(leaf)
    if not isinstance(leaf, np.ndarray) or leaf.dtype.kind in _HOST_ONLY:
        return None
    if not leaf.dtype.isnative:
        return leaf.astype(leaf.dtype.newbyteorder("="))
    return leaf


def _other_leaf(leaf: Any, device: torch.device, backend: CopyBackend) -> Any:
    """A leaf outside the ring: strings stay NumPy; ragged, sparse and other tensors move with
    ``Tensor.to`` (synchronously)."""
    converted = to_torch(leaf)
    if isinstance(converted, torch.Tensor):
        return backend.move(converted, device)
    return converted
