"""What the fused ``map().batch()`` stages share: handing their work over to the unfused
pipeline they stand for, at their position, and forwarding to it from then on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from feedline.data.dataset import DatasetIterator


class FusedIterator(DatasetIterator):
    """A fused stage that may hand over to the unfused pipeline (``self._unfused()``, set by the
    subclass with ``self._delegate = None``). Its state always has the unfused pipeline's shape,
    so a state moves between the two. Subclasses give ``_own_state``, ``_set_own_state`` and
    ``_close_own``; their ``_next`` forwards to ``self._delegate`` once it is set."""

    _unfused: Callable[[], DatasetIterator]
    _delegate: DatasetIterator | None

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
