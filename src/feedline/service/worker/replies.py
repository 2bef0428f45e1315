"""What a task hands its consumers: ``GetElements`` replies, first come, first served or in
round robin (``num_consumers``).

Part of ``_task._Task``: ``TaskReplies`` holds its methods that answer consumers, using the task's
buffer and lock. First come, first served: a reply carries as many buffered elements as fit in
the consumer's request, but while another consumer waits, the buffer is split between them and a
consumer holding ``_AHEAD`` unread elements takes no more (``_share``); a task of a shared job
gathers its consumers for ``_GATHER_S`` first. Round robin: the task cuts its output into rounds
of ``num_consumers`` elements and consumer ``i`` gets element ``i`` of each round it asks for;
rounds more than ``_ROUND_WINDOW`` behind the newest are dropped. A reply says, besides the
elements, ``eos``, ``gone``, ``error`` or nothing (``_end_frame``); in exactly-once jobs it
carries each element's ``[split, offset]`` (``tags``).
"""

from __future__ import annotations

import time
from typing import Any

from feedline._net.elements import pack_elements
from feedline._net.rpc import field
from feedline._net.wire import encode_frame
from feedline.errors import InvalidArgumentError, OutOfRangeError

__all__ = ["TaskReplies"]

# Round-robin rounds kept behind the newest one asked for.
_ROUND_WINDOW = 256
# The longest a GetElements request waits for elements.
_MAX_WAIT_S = 1.0
# While another consumer of a task waits, a consumer holding this many elements it has not
# returned yet takes no more (see TaskReplies._share).
_AHEAD = 4
# A consumer whose request got nothing counts as waiting for this long after.
_HUNGRY_S = 0.05
# A task of a shared job hands out nothing for this long after the first request, unless every
# consumer of the job (two at least) asks: consumers that start together share its first
# elements. A job read by one consumer alone starts this much later.
_GATHER_S = 0.1


class TaskReplies:
    """The consumer side of ``_Task``.

    A base of ``_Task`` only: its methods use the task's buffer, lock and counters.
    """

    def _end_frame(self) -> bytes | None:
        """(Under the lock, with nothing to hand out.) What a consumer hears from a task that
        gives nothing more; None while more may come."""
        if self._report is not None:
            return encode_frame({"error": self._report})
        if self._stop or (self._ended and self._drained):
            return encode_frame({"gone": True})
        if self._ended:
            return encode_frame({"eos": True})
        return None

    def _share(self, consumer: int, held: int, wanted: int) -> int:
        """(Under the lock, with elements buffered.) How many ``consumer``, which holds
        ``held`` elements it has not returned yet, may take now: all it wants, unless another
        consumer waits, in which case the buffer is split between them and a consumer that
        holds ``_AHEAD`` or more takes nothing until the others had their turn. A task of a
        shared job gathers first (``_GATHER_S``)."""
        now = time.monotonic()
        if (
            self._shared
            and not self._handed_out
            and self._first_ask is not None
            and now < self._first_ask + _GATHER_S
            and len(self._waiting) < max(2, self._consumers_hint)
        ):
            return 0
        others = {c for c in self._waiting if c != consumer}
        others.update(c for c, until in self._hungry.items() if c != consumer and until > now)
        if not others:
            return wanted
        if held >= _AHEAD:
            return 0
        share = -(-len(self._buffer) // (len(others) + 1))
        return max(1, min(wanted, share, _AHEAD - held))

    def get_elements(self, header: dict[str, Any]) -> bytes:
        wait_s = min(field(header, "wait_ms", int, 500) / 1000, _MAX_WAIT_S)
        if self._num_consumers is not None:
            return self._get_round(header, wait_s)
        consumer = field(header, "consumer", int, 0)
        held = field(header, "held", int, 0)
        max_elements = max(1, field(header, "max_elements", int, 1))
        max_bytes = max(1, field(header, "max_bytes", int, 8 << 20))
        elements: list[list[Any]] = []
        tags: list[list[int]] = []
        deadline = time.monotonic() + wait_s
        with self._cond:
            self._consumers_hint = max(self._consumers_hint, field(header, "consumers", int, 1))
            if self._first_ask is None:
                self._first_ask = time.monotonic()
            self._waiting[consumer] += 1
            self._cond.notify_all()  # a gathering task may have waited for this consumer
            try:
                limit = 0
                while not self._stop:
                    if self._buffer:
                        limit = self._share(consumer, held, max_elements)
                        if limit:
                            break
                    elif self._ended:
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining if not self._buffer else min(remaining, 0.01))
            finally:
                self._waiting[consumer] -= 1
                if not self._waiting[consumer]:
                    del self._waiting[consumer]
            taken = 0
            while self._buffer and len(elements) < limit:
                if elements and taken + self._buffer[0][1] > max_bytes:
                    break
                taken += self._buffer[0][1]
                elements.append(self._take(tags))
            if not elements:
                end = None if self._buffer else self._end_frame()
                if end is not None:
                    return end
                if held < _AHEAD:
                    self._hungry[consumer] = time.monotonic() + _HUNGRY_S
                    if len(self._hungry) > 64:
                        now = time.monotonic()
                        self._hungry = {c: t for c, t in self._hungry.items() if t > now}
                return encode_frame({"eos": False})
            self._hungry.pop(consumer, None)
            self._handed_out = True
            self.served_elements += len(elements)
            self.served_bytes += taken
            self._worker._telemetry.served(len(elements), taken)
        return self._reply(elements, tags, header)

    def _reply(
        self,
        elements: list[list[Any]],
        tags: list[list[int]] | None = None,
        request: dict[str, Any] | None = None,
    ) -> bytes:
        meta, buffers = pack_elements(elements)
        header: dict[str, Any] = {"eos": False, "meta": meta}
        if tags:  # exactly-once jobs: [split key, offset] of each element
            header["tags"] = tags
        # Through the consumer's shared-memory arena when it offers one (_shm), else gRPC.
        return self._worker._shm.reply(request or {}, header, buffers, self._compressor)

    def _get_round(self, header: dict[str, Any], wait_s: float) -> bytes:
        num_consumers = self._num_consumers or 1
        consumer = field(header, "consumer_index", int)
        round_index = field(header, "round", int)
        if not 0 <= consumer < num_consumers:
            raise InvalidArgumentError(
                f"consumer_index {consumer} is out of range [0, {num_consumers})"
            )
        deadline = time.monotonic() + wait_s
        with self._cond:
            while self._next_round <= round_index:
                if len(self._buffer) >= num_consumers:
                    self._rounds[self._next_round] = [self._take() for _ in range(num_consumers)]
                    self._round_taken[self._next_round] = set()
                    self._next_round += 1
                    for old in [r for r in self._rounds if r < self._next_round - _ROUND_WINDOW]:
                        del self._rounds[old], self._round_taken[old]
                    continue
                if self._ended or self._stop:
                    self._buffer.clear()  # less than a round: nobody can take it in step
                    end = self._end_frame()
                    assert end is not None
                    return end
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return encode_frame({"eos": False})  # nothing yet: the consumer asks again
                self._cond.wait(remaining)
            if round_index not in self._rounds:
                raise OutOfRangeError(
                    f"round {round_index} of task {self.task_id} was dropped: consumer "
                    f"{consumer} fell more than {_ROUND_WINDOW} rounds behind the others"
                )
            element = self._rounds[round_index][consumer]
            taken = self._round_taken[round_index]
            taken.add(consumer)
            if len(taken) == num_consumers:
                del self._rounds[round_index], self._round_taken[round_index]
            nbytes = sum(leaf.nbytes for leaf in element)
            self.served_elements += 1
            self.served_bytes += nbytes
            self._worker._telemetry.served(1, nbytes)
        return self._reply([element], request=header)
