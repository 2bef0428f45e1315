"""A ``CopyBackend`` whose copies finish late, as on a busy GPU, for tests without one.

A copy queued by ``copy_to_device`` reads its source only when its event completes: when the
host waits for it (``wait_host``), when a compute stream is made to wait for it
(``wait_compute``), or when the test calls ``finish_all``. Events of a stream complete in the
order they were recorded. A feed that wrote into a pinned buffer whose copy is still pending
would therefore hand out the later element's values, which the tests see.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from feedline.data._device_feed import HostBackend


@dataclasses.dataclass(eq=False)
class LateEvent:
    copies: list[tuple[torch.Tensor, torch.Tensor]]
    done: bool = False


class LateBackend(HostBackend):
    """``HostBackend`` whose copies happen when their events complete (see the module)."""

    def __init__(self) -> None:
        super().__init__()
        self._queued: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.events: list[LateEvent] = []
        self.compute_waits = 0
        self.recorded_streams = 0

    def copy_to_device(self, source: torch.Tensor, device: torch.device, stream: Any) -> Any:
        self.copies += 1
        target = torch.full_like(source, 0xEE)  # garbage until the copy runs
        self._queued.append((source, target))
        return target

    def record_event(self, stream: Any) -> Any:
        event = LateEvent(self._queued)
        self._queued = []
        self.events.append(event)
        return event

    def event_done(self, event: Any) -> bool:
        return bool(event.done)

    def wait_host(self, event: Any) -> None:
        self._complete(event)

    def wait_compute(self, event: Any, device: torch.device) -> None:
        self.compute_waits += 1
        self._complete(event)

    def use_on_compute(self, tensor: torch.Tensor, device: torch.device) -> None:
        self.recorded_streams += 1

    def finish_all(self) -> None:
        if self.events:
            self._complete(self.events[-1])

    def _complete(self, event: LateEvent) -> None:
        for earlier in self.events[: self.events.index(event) + 1]:
            if not earlier.done:
                for source, target in earlier.copies:
                    target.copy_(source)
                earlier.done = True
