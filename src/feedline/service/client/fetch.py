"""The consumer's fetch threads: ``Fetchers`` read a job's tasks into the reader's
``ElementQueue``.

First come, first served: one thread per task asks for as many elements as the queue has room
for (``ElementQueue.acquire``), several per reply when they are small, and keeps ``IN_FLIGHT``
requests to its task in flight, numbered, so that the worker takes the next reply's elements
while it copies and sends the last (its replies keep the order of the requests). Round robin:
one thread reads round ``r`` from task ``r % num_tasks``, never skipping one. Replies of
same-host workers come through shared memory (``shm``); in an exactly-once job a reply's
elements carry their ``[split, offset]``, and the reader says which of them to keep
(``ReaderLink.admit``).

The fetchers know the queue, the shared-memory channels and a ``ReaderLink``: nothing else of the
reader.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from feedline import structure
from feedline._net import exit as _exit
from feedline._net import rpc as _rpc
from feedline._net.elements import unpack_elements
from feedline._net.remote_errors import error_from_report
from feedline._net.wire import decode_frame, encode_frame
from feedline.errors import FeedlineError, UnavailableError
from feedline.service.client.channels import _client
from feedline.service.client.cross_trainer import TrainerPositions, trainer_tags
from feedline.service.client.queue import ElementQueue, Item
from feedline.service.protocol import WORKER_SERVICE, ElementsReply, GetElementsRequest
from feedline.service.shm import ConsumerChannels

__all__ = ["IN_FLIGHT", "REPLY_BYTES", "RPC_TIMEOUT_S", "Fetchers", "ReaderLink"]

#: The most bytes one reply carries (one larger element still travels alone).
REPLY_BYTES = 8 << 20
#: The longest one RPC to a reachable server may take.
RPC_TIMEOUT_S = 30.0
#: First come, first served: the requests a fetch thread keeps in flight to its task (one for a
#: trainer of a cross-trainer job, whose request names the position the last reply reached).
IN_FLIGHT = 2
#: ... once the last reply brought this many bytes (the copy of a smaller one is short, and
#: small elements come in fuller replies one request at a time).
TOGETHER_BYTES = 4 << 20
_POLL_MS = 500

logger = logging.getLogger(__name__)


class ReaderLink(Protocol):
    """What the fetch threads need of their reader besides its queue."""

    def consumers(self) -> int:
        """The job's consumers, as the dispatcher last said (a hint for the workers)."""
        ...

    def admit(self, task_id: int, tags: Sequence[Sequence[int]] | None, count: int) -> list[bool]:
        """Which of the ``count`` elements of a reply of ``task_id`` (tagged ``tags`` in an
        exactly-once job) to keep."""
        ...

    def tasks_ended(self) -> None:
        """No task known to the queue can be read any more (the reader asks the dispatcher
        whether the job has others)."""
        ...

    def fail(self, error: BaseException) -> None:
        """The job failed for this consumer."""
        ...


class _Reply:
    """A GetElements reply, its elements unpacked, and the buffers they came in."""

    def __init__(
        self, header: ElementsReply, elements: list[list[np.ndarray]], buffers: list[memoryview]
    ) -> None:
        self.header = header
        self.elements = elements
        self._buffers = buffers

    def nbytes(self) -> int:
        """The bytes of its elements (summed when asked: only a first-come reader asks)."""
        return sum(buffer.nbytes for buffer in self._buffers)


class _InFlight:
    """A request in flight: how to wait for its reply, its credits and its number (the
    queue's ``start_reading``)."""

    __slots__ = ("credits", "number", "receive")

    def __init__(self, receive: Callable[[], _Reply | None], credits: int, number: int) -> None:
        self.receive = receive
        self.credits = credits
        self.number = number


class Fetchers:
    """The fetch threads of one consumer of job ``job_id``.

    Args:
      queue: where elements, ends and errors go (the reader's).
      link: the rest of what the threads need of the reader.
      shm: the reader's shared-memory channels.
      treespec: the structure of an element (its leaves arrive flat).
      client_id: the consumer's id (in requests, first come first served).
      job_id: the job's id (in errors).
      consumer_index: the consumer's index in round robin, else None.
      timeout_s: how long a round-robin worker may stay unreachable.
      connect: the channel to a worker at an address.
      trainer: in a cross-trainer job, the trainer's positions: each task is read from the
        trainer's own position in its stream, and each element is tagged ``[position]``.
    """

    def __init__(
        self,
        queue: ElementQueue,
        link: ReaderLink,
        shm: ConsumerChannels,
        treespec: Any,
        *,
        client_id: int,
        job_id: int,
        consumer_index: int | None,
        timeout_s: float,
        connect: Callable[[str], _rpc.RpcClient] = lambda address: _client(address, WORKER_SERVICE),
        trainer: TrainerPositions | None = None,
    ) -> None:
        self._queue = queue
        self._link = link
        self._shm = shm
        self._treespec = treespec
        self._single_leaf = bool(treespec.is_leaf())
        self._client_id = client_id
        self._job_id = job_id
        self._consumer_index = consumer_index
        self._timeout_s = timeout_s
        self._connect = connect
        self._trainer = trainer
        self._lock = threading.Lock()
        self._threads: dict[int, threading.Thread] = {}

    def start_task(self, task_id: int) -> None:
        """Reads ``task_id`` first come, first served, in a thread of its own."""
        self._start(task_id, self._fetch_first_come)

    def start_rounds(self) -> None:
        """Reads the job's tasks in round robin, in one thread (once)."""
        self._start(-1, self._fetch_rounds)

    def _start(self, key: int, target: Callable[[int], None]) -> None:
        with self._lock:
            if self._queue.closed or key in self._threads:
                return
            thread = self._threads[key] = threading.Thread(
                target=target,
                args=(key,),
                name=f"feedline-consumer-{self._client_id}-fetch-{key}",
                daemon=True,
            )
        thread.start()
        _exit.join_at_exit(thread)

    def _deliver(
        self,
        elements: list[list[np.ndarray]],
        credits: int,
        task_id: int,
        tags: list[list[int]] | None = None,
    ) -> None:
        """Puts the ``elements`` a request of ``credits`` brought from ``task_id`` on the
        queue (those the reader admits)."""
        items = []
        single = self._single_leaf
        for index, leaves in enumerate(elements):
            tag = tags[index] if tags is not None and index < len(tags) else None
            if single:  # an element that is one array: no structure to rebuild
                leaf = leaves[0]
                value = leaf[()] if leaf.ndim == 0 and leaf.dtype.kind in "biufc" else leaf
                items.append(Item(value, leaf.nbytes, task_id, tag))
                continue
            size = sum(leaf.nbytes for leaf in leaves)
            # 0-d numbers come back as NumPy scalars, as feedline.data's sources give them.
            values = [
                leaf[()] if leaf.ndim == 0 and leaf.dtype.kind in "biufc" else leaf
                for leaf in leaves
            ]
            items.append(Item(structure.unflatten(self._treespec, values), size, task_id, tag))
        if items:
            keep = self._link.admit(task_id, tags, len(items))
            if not all(keep):  # (a replayed split's elements received before, mostly none)
                items = [item for item, kept in zip(items, keep, strict=True) if kept]
        self._queue.put(task_id, items, credits)

    def _end_tasks(self, task_ids: Sequence[int], completed: bool) -> None:
        """``task_ids`` ended here (a worker said so); if no task known can be read any more,
        the reader asks the dispatcher whether the job has others."""
        if not self._queue.end_tasks(task_ids, completed):
            self._link.tasks_ended()

    def _read(self, worker: _rpc.RpcClient, request: GetElementsRequest) -> _Reply | None:
        """One GetElements call; None if the worker cannot be reached (only a failed RPC means
        that)."""
        return self._request(worker, request, wait=True)()

    def _request(
        self, worker: _rpc.RpcClient, request: GetElementsRequest, *, wait: bool = False
    ) -> Callable[[], _Reply | None]:
        """Sends one GetElements call (with ``wait``, only once its reply is asked for); the
        function returned waits for the reply, None if the worker cannot be reached. Replies
        are asked for in the order of their requests (the shared-memory arena's ring)."""
        sent, offer = self._shm.ask(worker.address, request.to_header())
        frame = encode_frame(sent)
        timeout = _POLL_MS / 1000 + RPC_TIMEOUT_S
        result: Callable[[], bytes]
        if wait:
            result = functools.partial(worker.call_frame, "GetElements", frame, timeout=timeout)
        else:
            result = worker.start_frame("GetElements", frame, timeout=timeout)

        def receive() -> _Reply | None:
            try:
                answer = result()
            except UnavailableError:
                self._shm.lost(worker.address)
                return None
            header, buffers = decode_frame(answer)
            buffers = self._shm.received(worker.address, header, buffers, offer)
            reply = ElementsReply.from_header(header)
            elements = [] if reply.meta is None else unpack_elements(reply.meta, buffers)
            return _Reply(reply, elements, buffers)

        return receive

    def _fetch_first_come(self, task_id: int) -> None:
        queue = self._queue
        trainer = self._trainer
        position = 0 if trainer is None else trainer.fetch_from(task_id)
        # A trainer asks from its position, which each reply moves: one request at a time.
        depth = 1 if trainer is not None else IN_FLIGHT
        pending: collections.deque[_InFlight] = collections.deque()
        sent = 0
        # Requests go out together after a large reply (small ones are cheap to copy, and come
        # fuller one at a time); the worker then knows this consumer's first request, and takes
        # the others' elements in their order (``seq``).
        together = False
        try:
            worker = self._connect(queue.address(task_id) or "")
            while True:
                if (
                    (not pending or (together and len(pending) < depth))
                    and not queue.closed
                    and queue.readable(task_id)
                ):
                    # A batch at a time (a quarter of the queue) while the queue holds elements,
                    # not an element at each step: a consumer of a shared job starts with a
                    # queue of 16, and a trainer reads its own stream from the worker's cache.
                    credits = queue.acquire(
                        max(1, queue.max_elements // 4),
                        parts=depth if together else 1,
                        wait=not pending,
                    )
                    if credits:
                        request = GetElementsRequest(
                            task_id,
                            wait_ms=_POLL_MS,
                            consumer=self._client_id,
                            consumers=self._link.consumers(),
                            held=len(queue),
                            max_elements=credits,
                            max_bytes=REPLY_BYTES,
                            trainer_id=None if trainer is None else trainer.trainer_id,
                            index=position,
                            returned=0 if trainer is None else trainer.returned_in(task_id),
                            seq=sent if depth > 1 else None,
                        )
                        number = queue.start_reading(task_id)
                        # Alone, a blocking call (sent when its reply is asked for): a call
                        # that does not wait makes gRPC start a thread to follow it whenever
                        # none is in flight.
                        receive = self._request(worker, request, wait=not together)
                        pending.append(_InFlight(receive, credits, number))
                        sent += 1
                        continue
                if not pending:
                    return
                reply = self._receive(task_id, pending.popleft())
                if reply is not None and reply.header.first is not None and trainer is not None:
                    position = reply.header.first + len(reply.elements)
                together = depth > 1 and reply is not None and reply.nbytes() >= TOGETHER_BYTES
                if reply is None:  # unreachable: until it answers or the dispatcher drops it
                    queue.wait_closed(0.1)
                elif reply.header.retry_after_ms:  # the worker did not wait: this side does
                    queue.wait_closed(reply.header.retry_after_ms / 1000)
                elif reply.header.error is not None:
                    self._link.fail(error_from_report(reply.header.error))
                    return
                elif reply.header.eos or reply.header.gone:
                    while pending:  # what the requests after it brought, if anything
                        self._receive(task_id, pending.popleft())
                    self._end_tasks([task_id], completed=reply.header.eos)
                    if trainer is not None and reply.header.eos:
                        self._returned_all(worker, task_id, trainer, position)
                    return
        except BaseException as error:
            self._link.fail(error)
        finally:
            for abandoned in pending:  # the reader failed or closed
                queue.done_reading(task_id, abandoned.number)

    def _receive(self, task_id: int, call: _InFlight) -> _Reply | None:
        """Waits for the reply to ``call`` and delivers its elements; None if the worker could
        not be reached."""
        try:
            reply = call.receive()
            if reply is None:
                self._deliver([], call.credits, task_id)
                return None
            tags = reply.header.tags
            first = reply.header.first
            if self._trainer is not None and first is not None:  # their positions
                tags = trainer_tags(first, len(reply.elements), tags)
            self._deliver(reply.elements, call.credits, task_id, tags)
            return reply
        finally:
            self._queue.done_reading(task_id, call.number)

    def _returned_all(
        self, worker: _rpc.RpcClient, task_id: int, trainer: TrainerPositions, end: int
    ) -> None:
        """A trainer's task ended: once ``next`` has returned its last element (at ``end``),
        the worker hears so, and may count the task done for this trainer (a trainer that
        stops reading first, or dies, holds the task, so that it can resume from its
        checkpoint)."""
        while trainer.returned_in(task_id) < end:
            if self._queue.wait_closed(0.05) and trainer.returned_in(task_id) < end:
                return  # released first: what it did not return is not acknowledged
        request = GetElementsRequest(
            task_id, wait_ms=0, trainer_id=trainer.trainer_id, index=end, returned=end
        )
        try:  # over gRPC: the reader may have released its shared memory already
            worker.call_frame(
                "GetElements", encode_frame(request.to_header()), timeout=RPC_TIMEOUT_S
            )
        except FeedlineError as error:  # the task holds on until the job is collected
            logger.debug("task %d: acknowledging its end failed: %s", task_id, error)

    def _fetch_rounds(self, _: int) -> None:
        """Round robin: round ``r`` from task ``r % n``, never skipping one. A worker that is
        gone fails the read: skipping its rounds would put the consumers out of step. A reply
        carries the task's rounds from the one asked for that are complete (as many as the queue
        has room for); the later ones wait here for their turn."""
        queue = self._queue
        round_index = 0
        ahead: dict[int, collections.deque[list[np.ndarray]]] = {}  # by task: its next rounds'
        try:
            while not queue.closed:
                credits = queue.acquire()
                if not credits:
                    return
                tasks = queue.tasks()
                task_id, address = tasks[round_index % len(tasks)]
                waiting = ahead.setdefault(task_id, collections.deque())
                if not waiting:
                    reply = self._read_round(task_id, address, round_index, len(tasks), credits)
                    if reply is None:
                        return
                    if reply.header.eos:
                        self._deliver([], credits, task_id)
                        self._end_tasks([t for t, _ in queue.tasks()], completed=True)
                        return
                    waiting.extend(reply.elements)
                self._deliver([waiting.popleft()], credits, task_id)
                round_index += 1
        except BaseException as error:
            self._link.fail(error)

    def _read_round(
        self, task_id: int, address: str, round_index: int, num_tasks: int, rounds: int = 1
    ) -> _Reply | None:
        """The reply of ``task_id`` with this consumer's element of round ``round_index`` (and
        of the task's next ``rounds - 1`` rounds that are complete), or the end of its input;
        None once the queue closed.

        Raises:
          UnavailableError: the worker is gone, or unreachable for ``timeout_s``.
          BaseException: the error its pipeline raised.
        """
        worker = self._connect(address)
        request = GetElementsRequest(
            task_id,
            wait_ms=_POLL_MS,
            consumer_index=self._consumer_index,
            round=round_index // num_tasks,
            max_elements=rounds,
        )
        unreachable_since: float | None = None
        while not self._queue.closed:
            lost = self._queue.is_lost(task_id)
            reply = None if lost else self._read(worker, request)
            if reply is not None and reply.header.error is not None:
                raise error_from_report(reply.header.error)
            now = time.monotonic()
            if reply is None:
                unreachable_since = unreachable_since or now
            gone = reply is not None and reply.header.gone
            if lost or gone or now - (unreachable_since or now) > self._timeout_s:
                raise UnavailableError(
                    f"worker {address}, which serves every {num_tasks}th round of "
                    f"round-robin job {self._job_id}, is gone (at round {round_index}); "
                    "round-robin consumers cannot skip its rounds without falling out "
                    "of step with each other. Iterate the dataset again for a new job"
                )
            if reply is not None and (reply.elements or reply.header.eos):
                return reply
            if reply is None:
                self._queue.wait_closed(0.1)
            elif reply.header.retry_after_ms:  # the worker did not wait: this side does
                self._queue.wait_closed(reply.header.retry_after_ms / 1000)
        return None
