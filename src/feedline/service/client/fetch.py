"""The consumer's fetch threads: ``Fetchers``, the reading half of ``_job_reader._JobReader``.

First come, first served: one thread per task asks for as many elements as the consumer has room
for (``_acquire``: ``max_outstanding_requests`` elements in flight and buffered, and
``_BUFFER_BYTES``), several per reply when they are small. Round robin: one thread reads round
``r`` from task ``r % num_tasks``, never skipping one. Replies of same-host workers come through
shared memory (``shm``); in an exactly-once job a reply's elements carry their ``[split,
offset]``, and those already received, or from a task this consumer closed, are dropped
(``_first_receipts``).
"""

from __future__ import annotations

import time
from typing import Any

from feedline import structure
from feedline._net import rpc as _rpc
from feedline._net.elements import unpack_elements
from feedline._net.remote_errors import error_from_report
from feedline._net.wire import decode_frame, encode_frame
from feedline.errors import FailedPreconditionError, UnavailableError
from feedline.service.client.channels import _client
from feedline.service.protocol import WORKER_SERVICE

__all__ = ["Fetchers"]

# Elements' bytes a consumer keeps in flight and buffered.
_BUFFER_BYTES = 64 << 20
# The most bytes one reply carries (one larger element still travels alone).
_REPLY_BYTES = 8 << 20
_POLL_MS = 500
# The longest one RPC to a reachable server may take.
_RPC_TIMEOUT_S = 30.0


class Fetchers:
    """The fetch threads of ``_JobReader``.

    A base of ``_JobReader`` only: its methods use the reader's buffer, lock and task sets.
    """

    def _acquire(self) -> int:
        """Credits for one request (0 when stopping): at most the consumer's share of room."""
        with self._cond:
            while not self._stopping.is_set() and (
                self._credits <= 0 or self._buffered_bytes >= _BUFFER_BYTES
            ):
                self._cond.wait(0.5)
            if self._stopping.is_set():
                return 0
            active = max(1, len(self._tasks) - len(self._completed) - len(self._lost))
            share = max(1, self._credits // active)
            self._credits -= share
            return share

    def _deliver(
        self,
        elements: list[list[Any]],
        credits: int,
        task_id: int,
        tags: list[list[int]] | None = None,
    ) -> None:
        treespec = self._treespec
        items = []
        for index, leaves in enumerate(elements):
            size = sum(leaf.nbytes for leaf in leaves)
            # 0-d numbers come back as NumPy scalars, as feedline.data's sources give them.
            leaves = [
                leaf[()] if leaf.ndim == 0 and leaf.dtype.kind in "biufc" else leaf
                for leaf in leaves
            ]
            tag = tags[index] if tags is not None and index < len(tags) else None
            items.append((structure.unflatten(treespec, leaves), size, task_id, tag))
        with self._cond:
            if self._receipts is not None and items:
                items = self._first_receipts(items, task_id, tags)
            self._results.extend(items)
            self._credits += credits - len(items)
            self._buffered_bytes += sum(item[1] for item in items)
            self._cond.notify_all()

    def _first_receipts(
        self, items: list[Any], task_id: int, tags: list[list[int]] | None
    ) -> list[Any]:
        """(Under the lock.) The elements of an exactly-once job's reply that this consumer
        takes: none from a task it closed, none it received before (a replayed split)."""
        if task_id in self._closed:
            return []
        if tags is None or len(tags) != len(items):
            raise FailedPreconditionError(
                f"the worker {self._tasks.get(task_id)} sent elements of exactly-once job "
                f"{self._job_id} without their [split, offset] tags"
            )
        receipts = self._receipts
        assert receipts is not None
        return [item for item in items if receipts.take(*item[3])]

    def _end_tasks(self, task_ids: Any, completed: bool) -> None:
        """``task_ids`` ended here (a worker said so); if no task this consumer knows can be
        read any more, asks the dispatcher whether the job has others (``_refresh_view``)."""
        with self._cond:
            (self._completed if completed else self._lost).update(task_ids)
            self._task_ends += 1
            self._note_liveness()
            self._cond.notify_all()
            readable = any(t not in self._completed and t not in self._lost for t in self._tasks)
        if not readable:
            self._refresh_view()

    def _read(self, worker: _rpc.RpcClient, request: dict[str, Any]) -> dict[str, Any] | None:
        """One GetElements call: its header, with ``elements`` added; None if the worker
        cannot be reached (only a failed RPC means that)."""
        try:
            frame = worker.call_frame(
                "GetElements",
                encode_frame(self._shm.ask(worker.address, request)),
                timeout=_POLL_MS / 1000 + _RPC_TIMEOUT_S,
            )
        except UnavailableError:
            self._shm.lost(worker.address)
            return None
        header, buffers = decode_frame(frame)
        buffers = self._shm.received(worker.address, header, buffers)
        meta = header.get("meta")
        header["elements"] = [] if meta is None else unpack_elements(meta, buffers)
        return header

    def _fetch_first_come(self, task_id: int) -> None:
        worker = _client(self._tasks[task_id], WORKER_SERVICE)
        try:
            while not self._stopping.is_set():
                with self._cond:
                    if task_id in self._completed or task_id in self._lost:
                        return
                credits = self._acquire()
                if not credits:
                    return
                with self._cond:
                    self._in_flight.add(task_id)
                try:
                    reply = self._read(
                        worker,
                        {
                            "task_id": task_id,
                            "consumer": self._client_id,
                            "consumers": self._consumers,
                            "held": len(self._results),
                            "max_elements": credits,
                            "max_bytes": _REPLY_BYTES,
                            "wait_ms": _POLL_MS,
                        },
                    )
                    self._deliver(
                        [] if reply is None else reply["elements"],
                        credits,
                        task_id,
                        None if reply is None else reply.get("tags"),
                    )
                finally:
                    with self._cond:
                        self._in_flight.discard(task_id)
                        self._cond.notify_all()
                if reply is None:  # unreachable: until it answers or the dispatcher drops it
                    self._stopping.wait(0.1)
                elif reply.get("error") is not None:
                    self._fail(error_from_report(reply["error"]))
                    return
                elif reply.get("eos") or reply.get("gone"):
                    self._end_tasks([task_id], completed=bool(reply.get("eos")))
                    return
        except BaseException as error:
            self._fail(error)

    def _fetch_rounds(self, _: int) -> None:
        """Round robin: round ``r`` from task ``r % n``, never skipping one. A worker that is
        gone fails the read: skipping its rounds would put the consumers out of step."""
        params = self._params
        round_index = 0
        try:
            while not self._stopping.is_set():
                if not self._acquire():
                    return
                with self._cond:
                    tasks = sorted(self._tasks.items())
                task_id, address = tasks[round_index % len(tasks)]
                worker = _client(address, WORKER_SERVICE)
                request = {
                    "task_id": task_id,
                    "consumer_index": params.consumer_index,
                    "round": round_index // len(tasks),
                    "wait_ms": _POLL_MS,
                }
                unreachable_since: float | None = None
                while True:
                    if self._stopping.is_set():
                        return
                    with self._cond:
                        lost = task_id in self._lost
                    reply = None if lost else self._read(worker, request)
                    if reply is not None and reply.get("error") is not None:
                        raise error_from_report(reply["error"])
                    now = time.monotonic()
                    if reply is None:
                        unreachable_since = unreachable_since or now
                    if (
                        lost
                        or (reply or {}).get("gone")
                        or now - (unreachable_since or now) > self._timeout_s
                    ):
                        raise UnavailableError(
                            f"worker {address}, which serves every {len(tasks)}th round of "
                            f"round-robin job {self._job_id}, is gone (at round {round_index}); "
                            "round-robin consumers cannot skip its rounds without falling out "
                            "of step with each other. Iterate the dataset again for a new job"
                        )
                    if reply is not None and (reply["elements"] or reply.get("eos")):
                        break
                    if reply is None:
                        self._stopping.wait(0.1)
                if reply.get("eos"):
                    self._deliver([], 1, task_id)
                    with self._cond:
                        known = list(self._tasks)
                    self._end_tasks(known, completed=True)
                    return
                self._deliver(reply["elements"], 1, task_id)
                round_index += 1
        except BaseException as error:
            self._fail(error)
