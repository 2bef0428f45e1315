"""``prefetch_to_device`` and ``copy_to_device``: elements as torch tensors on a device.

TensorFlow 2.21's ``tf.data.experimental.prefetch_to_device(device, buffer_size)`` and
``copy_to_device(target_device, source_device)`` are transformations used with ``apply``; both
give a ``PrefetchToDeviceDataset``. Its elements are those of the input with every numeric NumPy
array made a torch tensor on the device (strings stay NumPy arrays): on CUDA through the device
feed of ``feedline.data._device_feed`` (a ring of reusable pinned buffers, a copy stream per
device, the consumer's stream waiting only for its own element), on the CPU as ``as_torch``
makes them. As in TensorFlow, it must be the last transformation of the pipeline: its elements
are torch tensors, which feedline's transformations do not take; to feed a training loop,
iterate it (or give ``dataset.as_torch()`` to a ``DataLoader`` with ``batch_size=None``).

``buffer_size`` elements are kept on the device ahead of the consumer (``copy_to_device``: 0,
each element is copied when it is asked for, still without blocking the host on the copy). The
iterator's state is the input's position and the elements kept ahead, as NumPy, so a restored
iterator yields exactly what the original would have. torch is imported when the dataset is
iterated, never when it is built.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from feedline.data.dataset import Dataset, DatasetIterator, IteratorContext
from feedline.data.ops._checks import canonical_device, check_int
from feedline.errors import InvalidArgumentError

__all__ = ["PrefetchToDeviceDataset", "copy_to_device", "prefetch_to_device"]


class PrefetchToDeviceDataset(Dataset):
    """The input's elements as torch tensors on ``device``, ``buffer_size`` of them copied ahead.

    Args:
      input_dataset: the pipeline (this is its last transformation).
      device: a CPU or CUDA device, by PyTorch or TensorFlow name.
      buffer_size: elements kept on the device ahead of the consumer (>= 0; None: 1).
    """

    def __init__(self, input_dataset: Dataset, device: Any, buffer_size: int | None) -> None:
        super().__init__((input_dataset,))
        self._device = canonical_device(device)
        if buffer_size is None:
            buffer_size = 1
        buffer_size = check_int("buffer_size", buffer_size, "prefetch_to_device")
        if buffer_size < 0:
            raise InvalidArgumentError(
                f"prefetch_to_device: buffer_size must be >= 0, got {buffer_size}"
            )
        self._buffer_size = buffer_size
        self._element_spec = input_dataset.element_spec

    @property
    def device(self) -> str:
        """The device the elements are placed on: ``"cpu"`` or ``"cuda:N"``."""
        return self._device

    def _cardinality(self) -> int:
        return self._inputs[0].cardinality()

    def _make_iterator(self, ctx: IteratorContext) -> DatasetIterator:
        return _PrefetchToDeviceIterator(self, ctx)


class _PrefetchToDeviceIterator(DatasetIterator):
    """Keeps ``buffer_size`` elements placed ahead; single-threaded (the copies are queued on
    the device's copy stream, the host packs them on the consumer's thread)."""

    def __init__(self, dataset: PrefetchToDeviceDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        from feedline.data import _device_feed  # torch, when the dataset is iterated

        self._input = dataset._inputs[0]._iterator(ctx)
        self._depth = dataset._buffer_size
        device = _device_feed.parse_device(dataset.device)
        self._place: Callable[[Any], Any]
        self._feed: _device_feed.DeviceFeed | None = None
        if device.type == "cpu":
            self._place = _device_feed.on_host
        else:
            count = ctx.options.experimental_distribute.pinned_buffer_count
            feed = _device_feed.DeviceFeed(
                buffer_count=count, depth=self._depth, spec=dataset.element_spec
            )
            self._feed = feed
            self._place = lambda element: feed.put(element, device)
        self._ahead: collections.deque[tuple[Any, Any]] = collections.deque()
        self._error: Exception | None = None  # of the input, raised after the elements ahead

    def _fill(self) -> None:
        """Places elements until ``buffer_size`` (at least 1) are ahead. An error of the input
        waits until the elements before it have been handed out, then is raised in its turn."""
        while self._error is None and len(self._ahead) < max(self._depth, 1):
            try:
                element = self._input._next()
            except StopIteration:
                return
            except Exception as error:  # re-raised in its turn, by _next
                self._error = error
                return
            self._ahead.append((element, self._place(element)))

    def _next(self) -> Any:
        self._fill()
        if not self._ahead:
            error, self._error = self._error, None
            if error is not None:
                raise error.with_traceback(error.__traceback__)
            raise StopIteration
        _, placed = self._ahead.popleft()
        if self._depth:
            self._fill()  # queue the next copies before the consumer computes on this one
        return placed.ready()

    def _get_state(self) -> dict[str, Any]:
        return {"input": self._input.get_state(), "ahead": [host for host, _ in self._ahead]}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._error = None
        self._input.set_state(state["input"])
        self._ahead = collections.deque((host, self._place(host)) for host in state["ahead"])

    def _close(self) -> None:
        self._ahead.clear()
        if self._feed is not None:
            self._feed.close()
        self._input.close()


def prefetch_to_device(device: Any, buffer_size: int | None = None) -> Callable[[Dataset], Dataset]:
    """``tf.data.experimental.prefetch_to_device``: ``ds.apply(prefetch_to_device("/gpu:0"))``
    yields the elements as torch tensors on the device, ``buffer_size`` (default 1) of them
    copied ahead through reusable pinned buffers on a copy stream of the device's own. It must be
    the last transformation of the pipeline.

    Example:
      >>> from feedline.data import Dataset
      >>> ds = Dataset.range(4).batch(2).apply(prefetch_to_device("/cpu:0"))
      >>> [b.tolist() for b in ds]
      [[0, 1], [2, 3]]

    Raises:
      InvalidArgumentError: an unknown device name, or ``buffer_size < 0``; when iterated, a
        CUDA device where CUDA is not available or a device index the machine does not have.
    """

    def _apply_fn(dataset: Dataset) -> Dataset:
        return PrefetchToDeviceDataset(dataset, device, buffer_size)

    return _apply_fn


def copy_to_device(
    target_device: Any, source_device: str = "/cpu:0"
) -> Callable[[Dataset], Dataset]:
    """``tf.data.experimental.copy_to_device``: ``ds.apply(copy_to_device("/gpu:0"))`` yields
    the elements as torch tensors on ``target_device``, each copied when it is asked for.

    Args:
      target_device: where the elements go.
      source_device: where they come from; feedline pipelines always run on the host, so only
        a CPU device is accepted.

    Example:
      >>> from feedline.data import Dataset
      >>> [x.tolist() for x in Dataset.range(2).apply(copy_to_device("/cpu:0"))]
      [0, 1]
    """
    if canonical_device(source_device) != "cpu":
        raise InvalidArgumentError(
            f"copy_to_device: source_device {source_device!r} is not the host; feedline "
            "pipelines run on the host, so leave source_device at '/cpu:0'"
        )

    def _apply_fn(dataset: Dataset) -> Dataset:
        return PrefetchToDeviceDataset(dataset, target_device, 0)

    return _apply_fn
