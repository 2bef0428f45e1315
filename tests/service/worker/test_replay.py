"""Tests of feedline/service/worker/replay.py and of exactly-once DYNAMIC jobs end to end: a
fault-tolerant dispatcher hands out each split until its elements were delivered, a worker
killed with kill -9 has its splits run again on the others, and every element of the epoch
reaches the consumers exactly once.

The fault tests run real ``feedline dispatcher --fault-tolerant`` and ``feedline worker``
processes (``tests/service/procs.py``); the consumers run here. Every wait has a timeout.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from feedline import errors, service
from feedline._net import rpc as _rpc
from feedline.data import Dataset, TextLineDataset
from feedline.io import gfile
from feedline.service.protocol import DISPATCHER_SERVICE as SERVICE_NAME
from feedline.service.worker.replay import SplitRunner, check_replayable
from tests.service.conftest import Cluster
from tests.service.procs import ServiceProcesses, read_in_thread

pytestmark = pytest.mark.timeout(180)


def slowly(x: Any) -> Any:
    """1 ms an element: a worker is still producing when it is killed."""
    time.sleep(0.001)
    return x


# -- the pipeline, once per split ---------------------------------------------------------------


def test_a_split_runs_the_pipeline_over_its_units_only_and_the_same_each_time() -> None:
    dataset = Dataset.range(100).map(lambda x: x * 3).shuffle(4, seed=7).batch(3)
    runner = SplitRunner(dataset)
    units = [10, 11, 12, 13, 14, 15, 16]
    first = [b.tolist() for b in runner.run(12, units)]
    again = [b.tolist() for b in runner.run(12, units)]
    assert first == again  # a replayed split gives the same element at each offset
    assert sorted(x for batch in first for x in batch) == [30, 33, 36, 39, 42, 45, 48]
    assert [len(b) for b in first] == [3, 3, 1]  # batches stay within the split
    other = [b.tolist() for b in runner.run(40, units)]  # another key: another shuffle seed
    assert other != first
    assert sorted(x for b in other for x in b) == sorted(x for b in first for x in b)


def test_a_split_run_again_reads_the_object_versions_its_first_run_pinned() -> None:
    # Objects named one by one (no listing pins them) on ``memory://``, whose versions are
    # their size and time: the first run tells ``pin`` each version before any line of it.
    root = f"memory://feedline-replay-{uuid.uuid4().hex}"
    urls = [f"{root}/{name}.txt" for name in ("a", "b")]
    for url in urls:
        gfile.GFile(url, "wb").write(b"one\ntwo\n")
    runner = SplitRunner(TextLineDataset(urls))
    pinned: dict[str, Any] = {}

    def pin(url: str, version: Any) -> Any:
        return pinned.setdefault(url, version)

    first = [x.item() for x in runner.run(0, [0, 1], pin=pin)]
    assert first == [b"one", b"two"] * 2 and sorted(pinned) == urls
    again = [x.item() for x in runner.run(0, [0, 1], dict(pinned), pin=pin)]
    assert again == first  # the same versions: the same lines
    time.sleep(0.01)
    gfile.GFile(urls[1], "wb").write(b"uno\ndos\n")  # as long: only the version tells
    with pytest.raises(errors.DataLossError, match=r"b\.txt' changed since it was listed or"):
        list(runner.run(0, [0, 1], dict(pinned), pin=pin))
    # A run that learns the version from the dispatcher only (the run again had no versions
    # with its split yet, the first run's pin came in later): the same error, from the pin.
    with pytest.raises(errors.DataLossError, match=r"changed since this split was first read"):
        list(runner.run(0, [0, 1], pin=pin))
    assert [x.item() for x in runner.run(1, [1])] == [b"uno", b"dos"]  # no pins: as it is now


def test_a_split_knows_the_versions_its_source_listed_and_pins_only_the_others(
    s3_bucket: str,
) -> None:
    urls = [f"{s3_bucket}/listed/{name}.txt" for name in ("a", "b", "c")]
    for url in urls:
        gfile.GFile(url, "wb").write(b"one\ntwo\n")
    listing = Dataset.list_files(f"{s3_bucket}/listed/*.txt", shuffle=False)
    runner = SplitRunner(TextLineDataset(listing))
    listed = runner.listed([0, 2])  # the split's units index the sorted names
    assert list(listed) == [urls[0], urls[2]] and listed == {
        u: listing._versions[u] for u in listed
    }
    assert SplitRunner(TextLineDataset(urls)).listed([0, 1]) == {}  # named: nothing listed
    pins: list[str] = []

    def pin(url: str, version: Any) -> Any:
        pins.append(url)
        return version

    # The versions the dispatcher holds for the split need no pin; another object does.
    lines = [x.item() for x in runner.run(0, [0, 1, 2], {urls[0]: listed[urls[0]]}, pin=pin)]
    assert lines == [b"one", b"two"] * 3 and pins == urls[1:]
    # A held version that is not the one opened is still a DataLossError.
    with pytest.raises(errors.DataLossError, match=r"a\.txt' changed since it was listed or"):
        list(runner.run(0, [0], {urls[0]: '"another"'}, pin=pin))
    # With pin_all, the first listed object opened pins the split's others, held or not.
    pins.clear()
    batches: list[dict[str, Any]] = []

    def pin_all(versions: dict[str, Any]) -> dict[str, Any]:
        batches.append(versions)
        return dict(versions)

    held = {urls[1]: '"older"'}  # another version held for b: the one its first run read
    with pytest.raises(errors.DataLossError, match=r"b\.txt' changed since it was listed or"):
        list(runner.run(0, [0, 1, 2], held, pin=pin, pin_all=pin_all))
    assert batches == [{urls[0]: listed[urls[0]], urls[2]: listed[urls[2]]}] and pins == []
    batches.clear()
    assert len(list(runner.run(0, [0, 2], pin=pin, pin_all=pin_all))) == 4
    assert batches == [listed] and pins == []
    # A pipeline that hands out the names opens no object: no pin at all.
    assert len(list(SplitRunner(listing).run(0, [0, 1, 2], pin=pin, pin_all=pin_all))) == 3
    assert batches == [listed] and pins == []


def test_a_task_pins_the_objects_its_source_listed_in_one_call_per_split(
    make_cluster: Callable[..., Cluster],
    tmp_path: Path,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from feedline.service.dispatcher.split_handout import SplitHandout

    calls: Counter[str] = Counter()
    for name in ("pin_split_version", "pin_split_versions"):
        method = getattr(SplitHandout, name)
        monkeypatch.setattr(
            SplitHandout,
            name,
            lambda self, *a, _m=method, _n=name: calls.update([_n]) or _m(self, *a),
        )
    for i in range(40):
        gfile.GFile(f"{s3_bucket}/many/{i:02d}.txt", "wb").write(b"%d\n" % i)
    cluster = make_cluster(1, work_dir=str(tmp_path), fault_tolerant_mode=True)
    files = Dataset.list_files(f"{s3_bucket}/many/*.txt", shuffle=False)
    dataset = TextLineDataset(files).apply(service.distribute("distributed_epoch", cluster.target))
    assert sorted(int(x) for x in dataset) == list(range(40))
    # 40 objects, one worker: splits of 2 files (a sixteenth of its share), one call each.
    assert calls == {"pin_split_versions": 20}


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda d: d.repeat(2), "repeat"),
        (lambda d: d.take(5), "take"),
        (lambda d: d.skip(5), "skip"),
        (lambda d: d.enumerate(), "enumerate"),
        (lambda d: d.cache(), "cache"),
        (lambda d: d.batch(4, drop_remainder=True), "drop_remainder"),
        (lambda d: d.shuffle(8), "shuffle without a seed"),
        (lambda d: d.map(lambda x: x, num_parallel_calls=2, deterministic=False), "deterministic"),
    ],
)
def test_a_pipeline_that_cannot_be_replayed_is_named(
    make: Callable[[Dataset], Dataset], named: str
) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=named):
        check_replayable(make(Dataset.range(20)))


def test_replayable_pipelines_pass() -> None:
    check_replayable(
        Dataset.range(20)
        .map(lambda x: x + 1, num_parallel_calls=2)
        .filter(lambda x: x % 2 == 0)
        .shuffle(4, seed=1)
        .batch(2)
        .prefetch(2)
    )


def test_a_fault_tolerant_dispatcher_refuses_such_a_pipeline_with_the_reason(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(1, work_dir=str(tmp_path), fault_tolerant_mode=True)
    dataset = (
        Dataset.range(50).repeat(2).apply(service.distribute("distributed_epoch", cluster.target))
    )
    with pytest.raises(errors.InvalidArgumentError, match="repeat"):
        list(dataset)
    # Without fault tolerance DYNAMIC runs one pipeline over all the splits: repeat works.
    plain = make_cluster(1)
    dataset = (
        Dataset.range(50).repeat(2).apply(service.distribute("distributed_epoch", plain.target))
    )
    assert sorted(int(x) for x in dataset) == sorted(list(range(50)) * 2)


def test_without_faults_every_element_arrives_once(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(3, work_dir=str(tmp_path), fault_tolerant_mode=True)
    dataset = (
        Dataset.range(2_000)
        .filter(lambda x: x % 3 != 0)
        .map(lambda x: x * 2)
        .apply(service.distribute("distributed_epoch", cluster.target))
    )
    got = [int(x) for x in dataset]
    assert sorted(got) == [2 * x for x in range(2_000) if x % 3 != 0]


# -- kill -9 --------------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ServiceProcesses, list[str]]]:
    with ServiceProcesses() as processes:
        # A killed worker is dropped (and its splits run again) after 3 s, not 10.
        processes.start_dispatcher(
            "--work-dir", str(tmp_path / "work"), "--fault-tolerant", "--worker-timeout-ms", "3000"
        )
        workers = [processes.start_worker() for _ in range(3)]
        yield processes, workers


ELEMENTS = 3_000


def read_rest(iterator: Iterator[Any], timeout: float = 90.0) -> list[int]:
    got, raised = read_in_thread(iterator, timeout)
    if raised is not None:
        raise raised
    return got


@pytest.mark.parametrize("read_before", [300, 2_000])
def test_a_killed_workers_splits_run_again_and_each_element_arrives_once(
    cluster: tuple[ServiceProcesses, list[str]], read_before: int
) -> None:
    processes, workers = cluster
    dataset = (
        Dataset.range(ELEMENTS)
        .map(slowly)
        .apply(service.distribute("distributed_epoch", processes.target))
    )
    iterator = iter(dataset)
    first = [int(next(iterator)) for _ in range(read_before)]
    processes.send(workers[0], signal.SIGKILL)
    got = first + read_rest(iterator)
    counts = Counter(got)
    assert not [x for x, n in counts.items() if n > 1], "duplicated"
    assert set(range(ELEMENTS)) - set(got) == set(), "lost"
    assert len(got) == ELEMENTS


def test_consumers_sharing_a_job_never_get_each_others_elements_after_a_kill(
    cluster: tuple[ServiceProcesses, list[str]],
) -> None:
    """A lost worker's split is replayed only once every consumer has said what it received
    of it, so the replay skips what either of them has."""
    processes, workers = cluster

    def consumer() -> Iterator[Any]:
        dataset = (
            Dataset.range(ELEMENTS)
            .map(slowly)
            .apply(service.distribute("distributed_epoch", processes.target, job_name="shared"))
        )
        return iter(dataset)

    iterators = [consumer(), consumer()]
    got: list[list[int]] = [[], []]
    raised: list[BaseException] = []

    def read(index: int) -> None:
        try:
            for x in iterators[index]:
                got[index].append(int(x))
        except BaseException as error:
            raised.append(error)

    threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (len(got[0]) + len(got[1]) < 600 or not all(got)):
        time.sleep(0.01)
    processes.send(workers[1], signal.SIGKILL)
    for thread in threads:
        thread.join(120)
    for iterator in iterators:
        iterator.close()
    assert not raised and not any(thread.is_alive() for thread in threads), raised
    both = got[0] + got[1]
    assert got[0] and got[1]  # both consumers took part
    assert not [x for x, n in Counter(both).items() if n > 1], "duplicated"
    assert sorted(both) == list(range(ELEMENTS))


def test_malformed_reports_are_refused_and_the_job_goes_on(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(1, work_dir=str(tmp_path), fault_tolerant_mode=True)
    iterator = iter(
        Dataset.range(200).apply(service.distribute("distributed_epoch", cluster.target))
    )
    first = [int(next(iterator)) for _ in range(5)]
    state = cluster.dispatcher._state
    (job,) = state.jobs.values()
    assert job.exactly_once
    (task_id,) = job.task_ids
    (client_id,) = job.client_ids
    raw = _rpc.RpcClient(cluster.address, SERVICE_NAME)
    bad = [
        ("GetSplit", {"job_id": job.job_id, "repetition": 0}),  # no task, no request number
        (
            "GetSplit",
            {
                "job_id": job.job_id,
                "repetition": 0,
                "task_id": task_id,
                "request": 99,
                "finished": ["a", 1],
            },
        ),
        ("ClientHeartbeat", {"client_id": client_id, "received": [[0, [[3, 1, 2]]]]}),
        ("ClientHeartbeat", {"client_id": client_id, "received": [], "closed": ["x"]}),
    ]
    for method, header in bad:
        with pytest.raises(errors.InvalidArgumentError):
            raw.call(method, header, timeout=5)
    raw.close()
    assert sorted(first + [int(x) for x in iterator]) == list(range(200))
