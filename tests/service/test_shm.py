"""Replies through shared memory (``feedline/service/shm.py``): the same elements as over gRPC,
the fallbacks, the checks of hostile arenas, and no arena descriptor left open, with in-process
workers and with ``feedline worker`` processes killed mid-stream. Every wait has a timeout."""

from __future__ import annotations

import gc
import mmap
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from feedline._net.wire import decode_frame
from feedline.data import Dataset
from feedline.errors import InvalidArgumentError
from feedline.service import distribute
from feedline.service import shm as _shm
from feedline.service.client import job_reader as _job_reader
from feedline.service.client.fetch import IN_FLIGHT
from tests.launcher import run
from tests.service.conftest import Cluster
from tests.service.procs import ServiceProcesses, read_in_thread

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(_shm.host_identity() is None, reason="no sealable shared memory here"),
]


#: The arenas this process held when the running test started (another test's, in the same
#: process, that the test did not make).
_HELD_BEFORE: set[str] = set()


@pytest.fixture(autouse=True)
def _arenas_before() -> None:
    gc.collect()
    _HELD_BEFORE.clear()
    _HELD_BEFORE.update(_shm.arena_descriptors())


def arenas(timeout: float = 30.0, close: Sequence[Any] = ()) -> list[str]:
    """The arenas made during this test that this process still holds a descriptor of, once
    what it read is gone (a mapping holds one: a consumer's while one of its elements lives,
    an in-process worker's until the task ends), waiting up to ``timeout`` for them to go; and
    any feedline file in ``/dev/shm`` (there should never be one). ``close``: in-process
    workers whose mappings are closed meanwhile, as when their tasks end (again while waiting:
    a request still in flight when a consumer closed may map its arena once more)."""
    deadline = time.monotonic() + timeout
    while True:
        for worker in close:
            worker._shm.close()
        gc.collect()
        held = [name for name in _shm.arena_descriptors() if name not in _HELD_BEFORE]
        if not held or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    left = [name for name in os.listdir("/dev/shm") if name.startswith(_shm.PREFIX)]
    return held + sorted(left)


def holders(names: Sequence[str]) -> str:
    """What may still hold the arenas ``names`` (whether each is still mapped, the objects
    that refer to arenas and to open mmaps of an arena's size, and every thread's innermost
    frames): the message of a failed check of ``arenas``."""

    def describe(thing: Any) -> str:
        # A dict: whose attributes; a memoryview (of elements, which gc does not track): who
        # refers to it.
        owners = (
            [type(o).__name__ for o in gc.get_referrers(thing)]
            if isinstance(thing, dict | memoryview)
            else []
        )
        return f"{type(thing).__module__}.{type(thing).__qualname__}" + (
            f" (referred to by {owners})" if owners else ""
        )

    size = _shm.DATA_OFFSET + _shm.RING_REPLIES * _job_reader._REPLY_BYTES
    with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
        mapped = [line.strip() for line in maps if any(name in line for name in names)]
    lines = [f"mapped: {mapped}"]
    for thing in gc.get_objects():
        if isinstance(thing, _shm._Arena | _shm._Mapped) and getattr(thing, "name", None) in names:
            lines.append(f"{type(thing).__name__} {thing.name}, referred to by:")
        elif isinstance(thing, mmap.mmap) and not thing.closed and len(thing) == size:
            lines.append(f"an open mmap of {len(thing)} bytes, referred to by:")
        else:
            continue
        lines += [f"  {describe(r)}" for r in gc.get_referrers(thing)]
    for ident, frame in sys._current_frames().items():
        stack = traceback.format_stack(frame, limit=4)
        lines.append(f"thread {ident}:\n" + "".join(stack))
    return "\n".join(lines)


@pytest.fixture
def takes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every reply's buffer count that this process's consumers copied out of an arena; an
    arena is offered after the first reply that carries buffers."""
    calls: list[int] = []
    original = _shm._Arena.take

    def take(self: Any, shm: Any, start: int) -> list[memoryview]:
        buffers = original(self, shm, start)
        calls.append(len(buffers))
        return buffers

    monkeypatch.setattr(_shm._Arena, "take", take)
    monkeypatch.setattr(_shm, "OFFER_BYTES", 0)
    return calls


def mixed(i: Any) -> dict[str, Any]:
    """An element with leaves of many dtypes and shapes, str and bytes among them."""
    i = int(i)
    return {
        "f32": np.full((3, 5), i, np.float32),
        "i64": np.arange(4, dtype=np.int64) + i,
        "u8": np.full((2, 2, 2), i % 256, np.uint8),
        "bool": np.array([i % 2 == 0, True]),
        "f64": np.float64(i) / 3,
        "c64": np.complex64(i + 1j),
        "str": "é" * (i % 5),
        "bytes": b"\x00ab" * (i % 3),
        "byte_list": [b"a" * (i % 4), b"bc"],
        "empty": np.zeros((0, 3), np.float32),
    }


def assert_same(a: Any, b: Any) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        left, right = np.asarray(a[key]), np.asarray(b[key])
        assert left.shape == right.shape, key
        if "O" not in (left.dtype.kind, right.dtype.kind):  # bytes: object arrays when received
            assert left.dtype == right.dtype, key
        assert left.tolist() == right.tolist(), key


def offer_of(arena: Any) -> dict[str, Any]:
    """An offer of ``arena`` (which then holds its place in the ring)."""
    made = arena.offer(_shm.host_identity() or "")
    assert made is not None
    return made[0]


def read(cluster: Cluster, dataset: Dataset, **kw: Any) -> list[Any]:
    return list(dataset.apply(distribute("distributed_epoch", cluster.target, **kw)))


def test_elements_are_the_same_through_shared_memory_and_grpc(
    make_cluster: Callable[..., Cluster], takes: list[int]
) -> None:
    cluster = make_cluster(1)
    dataset = Dataset.range(60).map(mixed)
    through_shm = read(cluster, dataset, max_outstanding_requests=3)
    assert takes, "no reply came through shared memory"
    count = len(takes)
    over_grpc = read(cluster, dataset, max_outstanding_requests=3, data_transfer_protocol="grpc")
    assert len(takes) == count  # data_transfer_protocol="grpc" offers no arena
    assert len(through_shm) == len(over_grpc) == 60
    by_index = {int(e["i64"][0]): e for e in over_grpc}
    for element in through_shm:
        index = int(element["i64"][0])
        assert_same(element, by_index[index])
        expected = {k: v.encode() if isinstance(v, str) else v for k, v in mixed(index).items()}
        assert_same(element, {k: np.asarray(v) for k, v in expected.items()})
    del through_shm, element
    assert arenas() == []


@pytest.mark.parametrize("compression", ["AUTO", None])
def test_elements_stay_valid_after_their_arena_is_written_again(
    make_cluster: Callable[..., Cluster], takes: list[int], compression: str | None
) -> None:
    cluster = make_cluster(2)
    dataset = Dataset.range(400).map(lambda i: np.arange(25_000, dtype=np.float32) + i)
    kept = read(cluster, dataset, max_outstanding_requests=2, compression=compression)
    assert len(takes) > 100  # many replies through the same two arenas
    assert sorted(int(e[0]) for e in kept) == list(range(400))
    for element in kept:  # each still holds its own values: copied out of the arena
        np.testing.assert_array_equal(element, np.arange(25_000, dtype=np.float32) + element[0])
    del kept, element
    assert arenas() == []
    # The job ended: its tasks stop and their workers unmap its arenas.
    deadline = time.monotonic() + 30
    while any(w._shm.mapped() for w in cluster.workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [w._shm.mapped() for w in cluster.workers] == [0, 0]


# Round-robin reads of an endless job on two in-process workers, in a process of their own: the
# count of the process's arena descriptors at the end is then this scenario's alone (in a
# process that ran many tests before, an unrelated holder kept one of them for ~30 s at times).
ROUND_ROBIN = """
import numpy as np
from feedline import service
from feedline.data import Dataset
from feedline.service import shm
from tests.launcher import report
from tests.service.conftest import Cluster
from tests.service.test_shm import arenas, holders

shm.OFFER_BYTES = 0  # an arena is offered after the first reply
takes = []
take = shm._Arena.take


def counted(self, *args):
    buffers = take(self, *args)
    takes.append(len(buffers))
    return buffers


shm._Arena.take = counted
cluster = Cluster(service.DispatchServer(service.DispatcherConfig()))
for _ in range(2):
    cluster.add_worker()
dataset = Dataset.range(10**6).repeat().map(lambda i: np.full(1000, i, np.int32))
iterator = iter(
    dataset.apply(
        service.distribute(
            "parallel_epochs", cluster.target, job_name="rr", consumer_index=0, num_consumers=1
        )
    )
)
got = [next(iterator) for _ in range(1600)]  # replies of up to 256 rounds: several per task
iterator.close()
result = {
    "takes": len(takes),
    "same": all(bool(np.all(e == e[0])) for e in got),
    "mapped": [w._shm.mapped() for w in cluster.workers],
}
del got, iterator  # what the reader still holds maps its arenas
result["left"] = arenas(close=cluster.workers)  # as when the job's tasks end
result["holders"] = holders(result["left"]) if result["left"] else ""
cluster.stop()
report(result)
"""


def test_round_robin_reads_go_through_shared_memory() -> None:
    (result,) = run(ROUND_ROBIN, [("reader", {})], timeout=90).values()
    assert result.result["takes"] > 0 and result.result["same"], result.result
    assert result.result["mapped"] == [1, 1]  # one arena per worker
    assert result.result["left"] == [], result.result["holders"]


def test_a_consumer_on_another_host_reads_over_grpc(
    make_cluster: Callable[..., Cluster], takes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = make_cluster(1)
    offers: list[str] = []
    original = _shm.WorkerSegments._acquire

    def acquire(self: Any, offer: Any) -> tuple[Any, str]:
        mapped, why = original(self, offer)
        offers.append(why)
        return mapped, why

    monkeypatch.setattr(_shm.WorkerSegments, "_acquire", acquire)
    # The worker was made before: only the consumer sees another host.
    monkeypatch.setattr(_shm, "host_identity", lambda: "another-boot/1:2/1000")
    got = read(cluster, Dataset.range(50).map(mixed), max_outstanding_requests=2)
    assert sorted(int(e["i64"][0]) for e in got) == list(range(50))
    assert takes == [] and cluster.workers[0]._shm.mapped() == 0
    # Refused for the requests in flight when the first refusal came; then never offered again.
    assert set(offers) == {"another host"} and len(offers) <= IN_FLIGHT, offers
    assert arenas() == []


def test_a_worker_with_grpc_refuses_arenas(
    make_cluster: Callable[..., Cluster], takes: list[int]
) -> None:
    cluster = make_cluster(0)
    worker = cluster.add_worker(data_transfer_protocol="grpc")
    got = read(cluster, Dataset.range(30).map(mixed), max_outstanding_requests=2)
    assert sorted(int(e["i64"][0]) for e in got) == list(range(30))
    assert takes == [] and worker._shm.mapped() == 0
    assert arenas() == []


def test_a_reply_larger_than_the_arena_goes_over_grpc(
    make_cluster: Callable[..., Cluster], takes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_job_reader, "_REPLY_BYTES", 64 << 10)  # the arena's size
    cluster = make_cluster(1)
    dataset = Dataset.range(40).map(lambda i: np.full(40_000 if i % 2 else 10, i, np.float32))
    got = read(cluster, dataset, max_outstanding_requests=1)
    assert sorted(int(e[0]) for e in got) == list(range(40))
    assert all(np.all(e == e[0]) and e.size == (40_000 if e[0] % 2 else 10) for e in got)
    assert takes and len(takes) < 40  # the small ones came through it, the large ones did not
    del got
    assert arenas() == []


def test_a_worker_that_forgot_an_arena_gets_a_new_one(
    make_cluster: Callable[..., Cluster], takes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = make_cluster(1)
    worker = cluster.workers[0]
    iterator = iter(
        Dataset.range(10**6)
        .map(lambda i: np.full(100, i, np.int64))
        .apply(distribute("distributed_epoch", cluster.target, max_outstanding_requests=1))
    )
    first = [int(next(iterator)[0]) for _ in range(20)]
    assert takes and worker._shm.mapped() == 1
    deadline = time.monotonic() + 30
    with monkeypatch.context() as patch:  # unmapped once no reply is being written into it
        patch.setattr(_shm, "IDLE_S", -1.0)
        while worker._shm.mapped() and time.monotonic() < deadline:
            worker._shm._forget_idle()
            time.sleep(0.01)
    assert worker._shm.mapped() == 0
    seen = len(takes)
    later = [int(next(iterator)[0]) for _ in range(20)]
    assert worker._shm.mapped() == 1
    iterator.close()
    assert len(set(first + later)) == 40
    assert len(takes) > seen + 10  # through a new arena, after a refusal and a reply over gRPC
    worker._shm.close()  # as when the job's task ends
    del iterator
    assert arenas() == []


def test_an_offer_that_names_another_file_is_refused(tmp_path: Any) -> None:
    segments = _shm.WorkerSegments(True)
    identity = _shm.host_identity()
    arena = _shm._Arena(1 << 16)
    made = arena.offer(identity or "")
    assert made is not None
    good = made[0]
    other = f"{_shm.PREFIX}{_shm._pid_namespace() + 1}-{os.getpid()}-{'0' * 16}"
    bad = [
        {**good, "name": "../etc/passwd"},
        {**good, "nonce": "x"},
        {**good, "pid": os.getpid() + 1},  # not the pid in the name
        {**good, "fd": "3"},
    ]
    with open(tmp_path / "plain", "wb") as plain:
        try:
            assert [segments._acquire(offer)[1] for offer in bad] == ["malformed offer"] * 4
            assert segments._acquire({**good, "name": other, "pid": os.getpid()}) == (
                None,
                "another pid namespace",
            )
            # Another file behind the descriptor number offered (closed and reused).
            assert segments._acquire({**good, "fd": plain.fileno()}) == (None, _shm.UNKNOWN)
            wrong_nonce = {**good, "nonce": "ff" * 16}
            assert segments._acquire(wrong_nonce) == (None, "nonce differs")
            mapped, why = segments._acquire(good)
            assert mapped is not None and why == ""
        finally:
            arena.close_descriptor()
            segments.close()


def test_the_ring_keeps_replies_while_their_elements_live() -> None:
    identity = _shm.host_identity() or ""
    segments = _shm.WorkerSegments(True)
    arena = _shm._Arena(1000)  # a ring of RING_REPLIES replies of up to 1000 bytes
    held: list[tuple[int, np.ndarray]] = []

    def fetch(value: int, count: int) -> np.ndarray:
        made = arena.offer(identity)
        assert made is not None
        offer, start = made
        leaf = np.full(count, value, np.uint8)
        frame = segments.reply(offer, 7, {"n": value}, [leaf], None)
        header, buffers = decode_frame(frame)
        assert header["n"] == value and buffers == []
        (view,) = arena.take(header["shm"], start)
        return np.frombuffer(view, np.uint8)

    try:
        for _ in range(20):  # each dropped at once: the ring's start, again and again
            element = fetch(5, 600)
            assert np.all(element == 5) and not element.flags.writeable
            del element
        assert (arena.kept, arena.copied) == (20, 0)
        for value in range(_shm.RING_REPLIES - 1):  # held: each stays in place
            held.append((value, fetch(value, 1000)))
        assert (arena.kept, arena.copied) == (20 + _shm.RING_REPLIES - 1, 0)
        extra = fetch(99, 1000)  # keeping it would leave no room for the next: copied out
        assert arena.copied == 1 and np.all(extra == 99) and not extra.flags.writeable
        held.pop(0)  # the oldest gone: its place is free again
        again = fetch(42, 1000)
        assert arena.copied == 1 and np.all(again == 42)
        for value, element in held:  # never written over while held
            assert np.all(element == value)
        segments.forget_task(7)
        assert segments.mapped() == 0
    finally:
        arena.close_descriptor()
        segments.close()


def test_several_offers_out_at_once_each_hold_their_place() -> None:
    identity = _shm.host_identity() or ""
    segments = _shm.WorkerSegments(True)
    arena = _shm._Arena(1000)
    try:
        (offer_a, start_a), (offer_b, start_b) = arena.offer(identity), arena.offer(identity)
        assert abs(start_a - start_b) >= 1000  # their places do not overlap
        replies = {}
        for offer, value in ((offer_b, 2), (offer_a, 1)):  # written in either order
            header, _ = decode_frame(
                segments.reply(offer, 7, {}, [np.full(1000, value, np.uint8)], None)
            )
            replies[value] = header["shm"]
        (view_b,) = arena.take(replies[2], start_b)
        (view_a,) = arena.take(replies[1], start_a)
        assert set(np.frombuffer(view_a, np.uint8)) == {1}
        assert set(np.frombuffer(view_b, np.uint8)) == {2}
        with pytest.raises(InvalidArgumentError):  # an offer is taken once
            arena.take(replies[1], start_a)
        # A reply that did not come through the arena gives its place up.
        channels = _shm.ConsumerChannels(True, 1000)
        channels._channel("w").arena = arena  # type: ignore[union-attr]
        request, offer = channels.ask("w", {"task_id": 7})
        assert offer is not None and request["shm"]["offset"] == _shm.DATA_OFFSET + offer.start
        small = memoryview(b"over grpc")
        assert channels.received("w", {}, [small], offer) == [small]
        again = arena.offer(identity)
        assert again is not None and again[1] == offer.start
    finally:
        arena.close_descriptor()
        segments.close()


# -- worker processes ---------------------------------------------------------------------------


def test_a_worker_killed_mid_stream_leaves_nothing_behind(takes: list[int]) -> None:
    with ServiceProcesses() as cluster:
        cluster.start_dispatcher()
        workers = [cluster.start_worker() for _ in range(2)]
        dataset = (
            Dataset.range(3000)
            .map(lambda i: np.full(65_536, i, np.float32))  # 256 KB
            .apply(distribute("distributed_epoch", cluster.target, max_outstanding_requests=8))
        )
        iterator = iter(dataset)
        got = [next(iterator) for _ in range(200)]
        assert takes, "no reply came through shared memory"
        cluster.send(workers[0], signal.SIGKILL)
        rest, raised = read_in_thread(iterator, timeout=90, convert=lambda x: x)
        assert raised is None  # the usual lost worker: what it held is lost, the rest comes
        received = [int(e[0]) for e in got + rest]
        assert len(received) == len(set(received)) and set(received) <= set(range(3000))
        assert len(received) > 1000
        for element in got + rest:  # never a half element
            assert element.shape == (65_536,) and np.all(element == element[0])
        assert not cluster.alive(workers[0])
        del got, rest, element
    assert arenas() == []


def test_no_arena_is_left_after_a_run_in_worker_processes(takes: list[int]) -> None:
    with ServiceProcesses() as cluster:
        cluster.start_dispatcher()
        cluster.start_worker()
        dataset = (
            Dataset.range(300)
            .map(lambda i: (np.full(50_000, i, np.float32), str(i)))
            .apply(distribute("distributed_epoch", cluster.target, max_outstanding_requests=4))
        )
        got = list(dataset)
        assert sorted(int(a[0]) for a, _ in got) == list(range(300))
        assert all(s.item() == b"%d" % int(a[0]) and np.all(a == a[0]) for a, s in got)
        assert takes
        del got
    assert arenas() == []


# -- hostile arenas ------------------------------------------------------------------------------


def test_an_arena_of_another_user_or_open_to_others_is_refused() -> None:
    arena = _shm._Arena(1 << 16)
    assert arena.fd is not None
    try:
        os.fchmod(arena.fd, 0o644)  # readable by every user of the host
        refused = _shm.WorkerSegments(True)
        assert refused._acquire(offer_of(arena)) == (None, "arena open to other users")
        refused.close()
        os.fchmod(arena.fd, 0o600)
        if os.geteuid() == 0:  # a file of another user (nobody), offered under this user's id
            os.fchown(arena.fd, 65534, -1)
            other = _shm.WorkerSegments(True)
            mapped, why = other._acquire(offer_of(arena))
            assert mapped is None and why == "arena owned by another user (uid 65534)"
            other.close()
            os.fchown(arena.fd, os.geteuid(), -1)
        accepted = _shm.WorkerSegments(True)
        mapped, why = accepted._acquire(offer_of(arena))
        assert mapped is not None and why == ""
        accepted.close()
    finally:
        arena.close_descriptor()


def test_an_arena_that_may_shrink_is_never_mapped() -> None:
    # A shared-memory file that looks like an arena in every other way but carries no seal:
    # it could shrink under a mapping (SIGBUS), so the worker refuses it and serves over gRPC.
    identity = _shm.host_identity() or ""
    name = f"{_shm.PREFIX}{_shm._pid_namespace()}-{os.getpid()}-{'ab' * 8}"
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    segments = _shm.WorkerSegments(True)
    try:
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, _shm.DATA_OFFSET + 4096)
        nonce = b"n" * 16
        os.pwrite(fd, nonce, 0)
        offer = {"host": identity, "name": name, "pid": os.getpid(), "fd": fd,
                 "nonce": nonce.hex(), "offset": _shm.DATA_OFFSET, "size": 4096}  # fmt: skip
        leaf = np.full(1000, 7, np.uint8)
        header, buffers = decode_frame(segments.reply(offer, 1, {}, [leaf], None))
        assert header["shm_refused"] == _shm.UNSEALED and segments.mapped() == 0
        assert bytes(buffers[0]) == leaf.tobytes()  # over gRPC instead
        assert os.pread(fd, 8, _shm.DATA_OFFSET) == bytes(8)  # never written
    finally:
        os.close(fd)
        segments.close()


def test_no_process_can_shrink_an_arena_that_a_worker_process_maps() -> None:
    # A consumer (this process, by hand) offers a worker process an arena, which another
    # process then tries to truncate, again and again: the seal refuses it every time, and
    # the worker (which would die of SIGBUS if it could shrink under its mapping) serves on
    # through the arena.
    from feedline._net.rpc import RpcClient
    from feedline.service import register_dataset
    from feedline.service.protocol import (
        DISPATCHER_SERVICE,
        WORKER_SERVICE,
        GetElementsRequest,
        GetOrCreateJobRequest,
    )

    identity = _shm.host_identity() or ""
    with ServiceProcesses() as cluster:
        cluster.start_dispatcher()
        worker = cluster.start_worker()
        dataset = Dataset.range(10**6).map(lambda i: np.full(8192, i % 251, np.uint8))
        dataset_id = register_dataset(cluster.target, dataset)
        dispatcher = RpcClient(cluster.address, DISPATCHER_SERVICE)
        job, _ = dispatcher.call(
            "GetOrCreateJob",
            GetOrCreateJobRequest(dataset_id, 0, None, 0, None, "AUTO").to_header(),
            timeout=30,
        )
        ((task_id, address, _),) = job["tasks"]
        to_worker = RpcClient(address, WORKER_SERVICE)
        arena = _shm._Arena(1 << 20)
        path = f"/proc/{os.getpid()}/fd/{arena.fd}"
        through_shm = 0
        try:
            for _ in range(20):
                made = arena.offer(identity)
                assert made is not None
                request = GetElementsRequest(task_id, wait_ms=1000, shm=made[0])
                header, _ = to_worker.call("GetElements", request.to_header(), timeout=30)
                if "shm" in header:
                    through_shm += 1
                    (view,) = arena.take(header["shm"], made[1])
                    element = np.frombuffer(view, np.uint8)
                    assert element.size == 8192 and np.all(element == element[0])
                    del view, element
                else:
                    arena.cancel(made[1])
                    assert "shm_refused" not in header and header.get("meta") is None
                shrink = subprocess.run(
                    ["truncate", "-s", "0", path], capture_output=True, text=True, timeout=30
                )
                assert shrink.returncode != 0, "a sealed arena was truncated"
                assert os.fstat(arena.fd).st_size == _shm.DATA_OFFSET + arena.size
            assert cluster.alive(worker)
        finally:
            arena.close_descriptor()
            to_worker.close()
            dispatcher.close()
        assert through_shm >= 10
