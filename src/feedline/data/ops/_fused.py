"""What the fused ``map().batch()`` stages share: handing their work over to the unfused
pipeline they stand for, at their position, and forwarding to it from then on."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from feedline.data.dataset import DatasetIterator, IteratorContext
from feedline.data.ops.map import MapDataset

if TYPE_CHECKING:
    from feedline.data.ops.batch import BatchDataset


class FusedIterator(DatasetIterator):
    """A fused ``map().batch()`` (``dataset``, a batch of a map) that may hand over to the
    unfused pipeline that ``unfused`` makes. Its state always has the unfused pipeline's shape,
    so a state moves between the two. Subclasses give ``_own_state``, ``_set_own_state`` and
    ``_close_own``; their ``_next`` forwards to ``self._delegate`` once it is set."""

    def __init__(
        self, dataset: BatchDataset, ctx: IteratorContext, unfused: Callable[[], DatasetIterator]
    ) -> None:
        super().__init__(dataset, ctx)
        map_dataset = dataset.inputs[0]
        assert isinstance(map_dataset, MapDataset)
        self._map = map_dataset
        self._input = map_dataset.inputs[0]._iterator(ctx)
        self._batch_size = dataset._batch_size
        self._drop_remainder = dataset._drop_remainder
        self._unfused = unfused
        self._delegate: DatasetIterator | None = None  # the unfused pipeline, once handed over

    def _own_state(self) -> dict[str, Any]:
        raise NotImplementedError

    def _set_own_state(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def _close_own(self) -> None:
        raise NotImplementedError

    def _hand_over(self) -> None:
        delegate = self._unfused()
        delegate.set_state(self._own_state())
        self._close_own()
        self._delegate = delegate

    def _get_state(self) -> dict[str, Any]:
        if self._delegate is not None:
            return self._delegate.get_state()
        return self._own_state()

    def _set_state(self, state: dict[str, Any]) -> None:
        if self._delegate is not None:
            self._delegate.set_state(state)
        else:
            self._set_own_state(state)

    def _close(self) -> None:
        if self._delegate is not None:
            self._delegate.close()
        else:
            self._close_own()
