"""``SplitReceipts``: what a consumer of an exactly-once job received and returned."""

from __future__ import annotations

import threading

from feedline.service.client.exactly_once import SplitReceipts
from feedline.service.position import SplitPosition


def test_what_next_returned_is_the_position_while_another_thread_reads_it() -> None:
    # ``returned`` only queues (the reader calls it for every element); ``position`` and
    # ``report``, from other threads meanwhile, count what was queued: nothing is lost.
    receipts = SplitReceipts()
    stop = threading.Event()
    seen: list[tuple[dict[int, int], dict[int, list[list[int]]]]] = []

    def read_positions() -> None:
        while not stop.is_set():
            seen.append(receipts.position())
            receipts.report()

    reader = threading.Thread(target=read_positions)
    reader.start()
    try:
        for offset in range(20_000):
            receipts.returned([offset % 3, offset // 3])
    finally:
        stop.set()
        reader.join(10)
    assert not reader.is_alive()
    assert len(seen) > 1
    assert receipts.position() == ({}, {0: [[0, 6667]], 1: [[0, 6667]], 2: [[0, 6666]]})
    receipts.heard([[1, 6667]])  # split 1 is done at the dispatcher, and all of it returned
    done, partial = receipts.position()
    assert done == {1: 6667} and sorted(partial) == [0, 2]


def test_a_resumed_consumer_counts_on_from_its_position_and_drops_what_it_received() -> None:
    resume = SplitPosition(None, done={0: 4}, partial={1: [[0, 2]]})
    receipts = SplitReceipts(resume, received={1: [[0, 3]]})  # a trainer's, restored
    assert receipts.position() == ({0: 4}, {1: [[0, 2]]})
    assert receipts.keep(7, [[1, 2], [1, 3]], 2) == [False, True]  # [1, 2] it has
    assert receipts.keep(7, [[1, 3], [1, 4]], 2) == [False, True]
    assert receipts.keep(7, [[1, 5]], 2) is None  # tags that do not tag each element
    assert receipts.unreported()
    assert receipts.report()["received"] == [[1, [[0, 5]]]]
    assert not receipts.unreported()
    for tag in ([1, 2], [1, 4], [1, 3]):
        receipts.returned(tag)
    assert receipts.position() == ({0: 4}, {1: [[0, 5]]})
    receipts.close_tasks([7])
    assert receipts.keep(7, [[1, 5]], 1) == [False]
