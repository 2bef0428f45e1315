"""What a task hands its consumers: ``GetElements`` replies, first come, first served or in
round robin (``num_consumers``), from the task's ``buffer.TaskBuffer``.

First come, first served: a reply carries as many buffered elements as fit in the consumer's
request, but while another consumer waits, the buffer is split between them and a consumer
holding ``_AHEAD`` unread elements takes no more (``_share``); a task of a shared job gathers its
consumers for ``_GATHER_S`` first. Round robin: consumer ``i`` gets element ``i`` of each round
it asks for (``TaskBuffer.take_round``). A reply says, besides the elements, ``eos``, ``gone``,
``error`` or nothing (``buffer.Ending``); in exactly-once jobs it carries each element's
``[split, offset]`` (``tags``).

A consumer may keep two or more first come, first served requests to a task in flight, numbered
(``seq``): request ``n`` takes its elements only after request ``n - 1`` took its own (or after
``_TURN_WAIT_S``, should that request never arrive), so the replies carry the task's elements in
the order of their requests while the first is still being copied and sent.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

from feedline._net.elements import pack_elements
from feedline._net.wire import Compressor, encode_frame
from feedline.errors import InvalidArgumentError, OutOfRangeError
from feedline.service.protocol import ElementsReply, GetElementsRequest
from feedline.service.worker.buffer import Ending, TaskBuffer
from feedline.service.worker.host import TaskHost
from feedline.service.worker.trainer_cache import TrainerCache

# The worker's logger.
logger = logging.getLogger("feedline.service.worker.server")

__all__ = ["NOTHING_YET", "TaskReplies", "wait_seconds"]

# The longest a GetElements request waits for elements.
_MAX_WAIT_S = 1.0
# While another consumer of a task waits, a consumer holding this many elements it has not
# returned yet takes no more (see TaskReplies._share).
_AHEAD = 4
# A request of a consumer that holds elements (it asked for the next reply while it still had
# some to hand out) waits up to this long for the reply to fill: fewer, fuller replies.
_LINGER_S = 0.002
_LINGER_STEP_S = 0.0005
# A consumer whose request got nothing counts as waiting for this long after.
_HUNGRY_S = 0.05
# A task of a shared job hands out nothing for this long after the first request, unless every
# consumer of the job (two at least) asks: consumers that start together share its first
# elements. A job read by one consumer alone starts this much later.
_GATHER_S = 0.1
# The longest a consumer's numbered request waits for its predecessor to take its elements.
_TURN_WAIT_S = 1.0
# Round robin: the most consecutive rounds one reply carries.
_MAX_ROUNDS = 256
# Round robin: the shortest time between two warnings that a consumer waits for a slower one.
_HELD_WARNING_S = 10.0


#: The reply that says nothing yet: the consumer asks again.
NOTHING_YET = encode_frame(ElementsReply().to_header())


def wait_seconds(request: GetElementsRequest) -> float:
    """How long ``request`` may wait for elements."""
    return min(request.wait_ms / 1000, _MAX_WAIT_S)


def end_frame(ending: Ending, report: dict[str, Any] | None) -> bytes:
    """The reply that says ``ending`` (``report``: the task's error, for ``FAILED``)."""
    reply = ElementsReply(
        eos=ending is Ending.INPUT_ENDED,
        error=report if ending is Ending.FAILED else None,
        gone=ending is Ending.GONE,
    )
    return encode_frame(reply.to_header())


class TaskReplies:
    """The consumer side of a task: answers ``GetElements`` from ``buffer``.

    Args:
      task_id: the task.
      buffer: the task's buffer, which its producer fills.
      host: the worker (its shared-memory arenas and counters).
      num_consumers: round robin among that many consumers; None: first come, first served.
      shared: a task of a named job whose consumers share its elements (they gather first).
    """

    def __init__(
        self,
        task_id: int,
        buffer: TaskBuffer,
        host: TaskHost,
        num_consumers: int | None,
        shared: bool,
    ) -> None:
        self.task_id = task_id
        self._buffer = buffer
        self._host = host
        self._num_consumers = num_consumers
        self._shared = shared
        self._compressor = Compressor(None)
        # First come, first served, shared fairly: consumers whose request waits here now,
        # and consumers whose last request got nothing (hungry until the time given).
        self._waiting: collections.Counter[int] = collections.Counter()
        self._hungry: dict[int, float] = {}
        self._consumers_hint = 1  # the job's consumers, as the requests tell
        self._turns: dict[int, int] = {}  # by consumer: its last numbered request that took
        self._turn_waiting = 0  # requests waiting for their turn
        self._first_ask: float | None = None
        self._handed_out = False
        self._held_warned_at = -_HELD_WARNING_S  # (round robin: ``_warn_if_held``)
        #: Elements and their bytes handed to consumers (for the status pages).
        self.served_elements = 0
        self.served_bytes = 0

    def use_compression(self, compression: str | None) -> None:
        """Compresses replies over gRPC with ``compression`` (the dataset's, once fetched)."""
        self._compressor = Compressor(compression)

    def get_elements(self, request: GetElementsRequest) -> bytes:
        """The reply frame to ``request``.

        Raises:
          InvalidArgumentError: a round-robin request without its consumer index or round, or
            one out of range.
          OutOfRangeError: the round asked for was dropped.
        """
        if self._num_consumers is not None:
            return self._get_round(request, self._num_consumers)
        buffer = self._buffer
        consumer, held = request.consumer, request.held
        max_elements = max(1, request.max_elements)
        max_bytes = max(1, request.max_bytes)
        tags: list[list[int]] = []
        deadline = time.monotonic() + wait_seconds(request)
        turn = request.seq  # until this request passes the turn on
        try:
            with buffer.cond:
                self._consumers_hint = max(self._consumers_hint, request.consumers)
                if self._first_ask is None:
                    self._first_ask = time.monotonic()
                if turn is not None:
                    self._wait_turn(consumer, turn)
                self._waiting[consumer] += 1
                buffer.cond.notify_all()  # a gathering task may have waited for this consumer
                try:
                    limit = self._wait_for_share(consumer, held, max_elements, deadline)
                finally:
                    self._waiting[consumer] -= 1
                    if not self._waiting[consumer]:
                        del self._waiting[consumer]
            if limit > 1 and held > 0:  # outside the lock: the producer goes on meanwhile
                self._linger(limit, max_bytes, min(deadline, time.monotonic() + _LINGER_S))
            with buffer.cond:
                elements, taken = buffer.take_many(limit, max_bytes, tags)
                if turn is not None:
                    self._pass_turn(consumer, turn)
                    turn = None
                if not elements:
                    ending = None if len(buffer) else buffer.ending()
                    if ending is not None:
                        return end_frame(ending, buffer.failure())
                    if held < _AHEAD:
                        self._hungry[consumer] = time.monotonic() + _HUNGRY_S
                        if len(self._hungry) > 64:
                            now = time.monotonic()
                            self._hungry = {c: t for c, t in self._hungry.items() if t > now}
                    return NOTHING_YET
                self._hungry.pop(consumer, None)
                self._handed_out = True
                self._count(len(elements), taken)
        finally:
            if turn is not None:  # failed before taking: the next request goes on all the same
                with buffer.cond:
                    self._pass_turn(consumer, turn)
        return self._reply(request, elements, tags)

    def _wait_turn(self, consumer: int, seq: int) -> None:
        """(Under the lock.) Waits until ``consumer``'s request ``seq - 1`` took its elements,
        for at most ``_TURN_WAIT_S``. A consumer's first numbered request here does not wait:
        the consumer sends a second one only after a reply with elements, so the first one
        seen here is the first it sent."""
        buffer = self._buffer
        until = time.monotonic() + _TURN_WAIT_S
        while self._turns.get(consumer, seq - 1) < seq - 1 and not buffer.stopped:
            remaining = until - time.monotonic()
            if remaining <= 0:
                return
            self._turn_waiting += 1
            try:
                buffer.cond.wait(remaining)
            finally:
                self._turn_waiting -= 1

    def _pass_turn(self, consumer: int, seq: int) -> None:
        """(Under the lock.) ``consumer``'s request ``seq`` took its elements."""
        self._turns[consumer] = max(self._turns.get(consumer, -1), seq)
        if self._turn_waiting:
            self._buffer.cond.notify_all()

    def _wait_for_share(self, consumer: int, held: int, wanted: int, deadline: float) -> int:
        """(Under the lock.) Waits until ``consumer`` may take elements, the input ended, or
        the ``deadline``; how many it may take (0: none)."""
        buffer = self._buffer
        while not buffer.stopped:
            if len(buffer):
                limit = self._share(consumer, held, wanted)
                if limit:
                    return limit
            elif buffer.ended:
                return 0
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return 0
            buffer.cond.wait(remaining if not len(buffer) else min(remaining, 0.01))
        return 0

    def _linger(self, limit: int, max_bytes: int, until: float) -> None:
        """Waits until ``limit`` elements or ``max_bytes`` are buffered, the input ends, or
        ``until``: a consumer that holds elements to go on with gets them in fewer, fuller
        replies. It looks every ``_LINGER_STEP_S`` rather than at each element put, which
        would wake it for every small element."""
        buffer = self._buffer
        while True:
            with buffer.cond:
                if (
                    len(buffer) >= limit
                    or buffer.nbytes >= max_bytes
                    or buffer.ended
                    or buffer.stopped
                ):
                    return
            remaining = until - time.monotonic()
            if remaining <= 0:
                return
            time.sleep(min(remaining, _LINGER_STEP_S))

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

    def _get_round(self, request: GetElementsRequest, num_consumers: int) -> bytes:
        consumer, round_index = request.round_position()
        if not 0 <= consumer < num_consumers:
            raise InvalidArgumentError(
                f"consumer_index {consumer} is out of range [0, {num_consumers})"
            )
        buffer = self._buffer
        with buffer.cond:
            got = buffer.take_round(round_index, consumer, num_consumers, wait_seconds(request))
            if isinstance(got, Ending):
                return end_frame(got, buffer.failure())
            if got is None:
                # nothing yet: the consumer asks again
                self._warn_if_held(consumer, round_index, num_consumers)
                return NOTHING_YET
            elements = [got]
            size = sum(leaf.nbytes for leaf in got)
            # The consumer's elements of the rounds after it that are complete now (up to
            # max_elements rounds and max_bytes): the first round was waited for, these are not.
            # A round not complete yet, or the input's end, shows at the consumer's next request.
            rounds = min(max(1, request.max_elements), _MAX_ROUNDS)
            for later in range(round_index + 1, round_index + rounds):
                if size >= request.max_bytes:
                    break
                try:
                    more = buffer.take_round(later, consumer, num_consumers, 0.0)
                except OutOfRangeError:
                    break
                if more is None or isinstance(more, Ending):
                    break
                elements.append(more)
                size += sum(leaf.nbytes for leaf in more)
            self._count(len(elements), size)
        return self._reply(request, elements)

    def _warn_if_held(self, consumer: int, round_index: int, num_consumers: int) -> None:
        """Logs (at most every ``_HELD_WARNING_S``) that round-robin ``consumer`` waits because
        others have not taken the oldest round kept: they read slower, or stopped reading."""
        oldest, behind = self._buffer.laggards(num_consumers)
        now = time.monotonic()
        if not behind or now - self._held_warned_at < _HELD_WARNING_S:
            return
        self._held_warned_at = now
        logger.warning(
            "task %d: round-robin consumer %d waits for round %d: consumer(s) %s have not taken "
            "round %d yet, and the worker keeps at most %d rounds that not every consumer took "
            "(round-robin consumers move in step: one that stopped reading holds the others)",
            self.task_id,
            consumer,
            round_index,
            ", ".join(map(str, behind)),
            oldest,
            self._buffer.round_window,
        )

    def get_cached(self, request: GetElementsRequest, cache: TrainerCache) -> bytes:
        """The reply frame to a trainer's ``request`` in a cross-trainer job: the elements
        from its position on, read from the task's ``cache``, and where they start.

        Raises:
          InvalidArgumentError: the request does not say which trainer asks.
        """
        if request.trainer_id is None:
            raise InvalidArgumentError(
                f"task {self.task_id} belongs to a cross-trainer job: its consumers read with "
                "distribute(..., cross_trainer_cache=CrossTrainerCache(trainer_id))"
            )
        tags: list[list[int]] = []
        got = cache.read(
            request.trainer_id,
            max(0, request.index),
            max(0, request.returned),
            max(1, request.max_elements),
            max(1, request.max_bytes),
            wait_seconds(request),
            tags,
        )
        if isinstance(got, Ending):
            return end_frame(got, self._buffer.failure())
        if got is None:  # nothing yet: the trainer asks again
            return NOTHING_YET
        first, elements = got
        with self._buffer.cond:
            self._count(len(elements), sum(leaf.nbytes for leaves in elements for leaf in leaves))
        # In an exactly-once job each element also carries its [split, offset] (``ledger``).
        return self._reply(request, elements, tags, first=first)

    def _count(self, elements: int, nbytes: int) -> None:
        """(Under the lock.) ``elements`` of ``nbytes`` were handed out."""
        self.served_elements += elements
        self.served_bytes += nbytes
        self._host.telemetry.served(elements, nbytes)

    def _reply(
        self,
        request: GetElementsRequest,
        elements: list[list[Any]],
        tags: list[list[int]] | None = None,
        first: int | None = None,
    ) -> bytes:
        meta, buffers = pack_elements(elements)
        # In exactly-once jobs, tags: [split key, offset] of each element; in cross-trainer
        # jobs, first: the position of the first element in the task's stream.
        header = ElementsReply(meta=meta, tags=tags or None, first=first).to_header()
        # Through the consumer's shared-memory arena when it offers one (shm), else gRPC.
        return self._host.shm.reply(request.shm, request.task_id, header, buffers, self._compressor)
