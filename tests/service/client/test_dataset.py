"""Tests of feedline/service/client/dataset.py, job_reader.py and fetch.py: distribute() and its
options, end to end in process.

The seed's examples are tests with their printed outputs.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import numpy as np
import pytest

from feedline import errors, service
from feedline.data import Dataset, TensorSpec, TextLineDataset
from feedline.data.auto_shard import ShardMode, auto_shard
from feedline.data.options import AutoShardPolicy
from feedline.service.client import fetch as _fetch
from feedline.service.client import job_reader as _job_reader
from feedline.service.dispatcher import split_handout as _split_handout
from feedline.service.protocol import JobView
from feedline.service.worker import task as _task
from tests.service.conftest import static_cluster, waiting_reads_taken


def ints(dataset: Any) -> list[int]:
    return sorted(int(x) for x in dataset)


# -- the seed's examples --------------------------------------------------------------------


def test_parallel_epochs_gives_every_element_once_per_worker(make_cluster: Any) -> None:
    cluster = make_cluster(2)
    dataset = Dataset.range(10).apply(
        service.distribute(processing_mode="parallel_epochs", service=cluster.target)
    )
    assert ints(dataset.as_numpy_iterator()) == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        3,
        4,
        4,
        5,
        5,
        6,
        6,
        7,
        7,
        8,
        8,
        9,
        9,
    ]


def test_distributed_epoch_gives_every_element_once(make_cluster: Any) -> None:
    cluster = make_cluster(2)
    dataset = Dataset.range(10).apply(
        service.distribute(processing_mode="distributed_epoch", service=cluster.target)
    )
    assert ints(dataset) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]


_ran_in: dict[str, set[str]] = {"square": set(), "plus_one": set()}


def _square(x: Any) -> Any:
    _ran_in["square"].add(threading.current_thread().name)
    return x * x


def _plus_one(x: Any) -> Any:
    _ran_in["plus_one"].add(threading.current_thread().name)
    return x + 1


def test_transformations_before_distribute_run_on_workers_after_it_locally(
    make_cluster: Any,
) -> None:
    cluster = make_cluster(2)
    dataset = Dataset.range(5)
    dataset = dataset.map(_square)
    dataset = dataset.apply(service.distribute("parallel_epochs", cluster.target))
    dataset = dataset.map(_plus_one)
    _ran_in["square"].clear()
    _ran_in["plus_one"].clear()
    assert ints(dataset) == [1, 1, 2, 2, 5, 5, 10, 10, 17, 17]
    here = threading.current_thread().name
    assert _ran_in["plus_one"] == {here}
    # One task per worker, each running the dataset on its own producer thread.
    assert len(_ran_in["square"]) == 2
    assert all(name.startswith("feedline-task-") for name in _ran_in["square"])


def test_dynamic_with_more_elements_and_a_batch_on_the_workers(make_cluster: Any) -> None:
    cluster = make_cluster(2)
    dataset = (
        Dataset.range(1000)
        .batch(7)
        .apply(service.distribute(service.ShardingPolicy.DYNAMIC, cluster.target))
    )
    rows = np.concatenate([batch for batch in dataset])
    assert sorted(rows.tolist()) == list(range(1000))


def test_dynamic_over_repeat_gives_each_element_once_per_repetition(make_cluster: Any) -> None:
    cluster = make_cluster(2)
    dataset = (
        Dataset.range(20).repeat(3).apply(service.distribute("distributed_epoch", cluster.target))
    )
    assert ints(dataset) == sorted(list(range(20)) * 3)


def test_dynamic_needs_a_splittable_source(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    generated = Dataset.from_generator(
        lambda: iter(range(3)), output_signature=TensorSpec((), np.int64)
    )
    with pytest.raises(errors.InvalidArgumentError, match="splittable"):
        generated.apply(service.distribute("distributed_epoch", cluster.target))


def test_any_python_runs_on_the_workers(make_cluster: Any) -> None:
    cluster = make_cluster(2)
    table = {i: i * 100 for i in range(4)}  # a closure over a Python dict travels with map's fn
    dataset = Dataset.from_tensor_slices({"word": [f"w{i}" for i in range(4)], "n": np.arange(4)})
    dataset = dataset.map(lambda e: {"word": e["word"], "n": np.int64(table[int(e["n"])])})
    dataset = dataset.apply(service.distribute("distributed_epoch", cluster.target))
    got = sorted((e["word"].item(), int(e["n"])) for e in dataset)
    assert got == [(b"w0", 0), (b"w1", 100), (b"w2", 200), (b"w3", 300)]


def test_from_generator_runs_on_the_workers(make_cluster: Any) -> None:
    cluster = make_cluster(2)
    dataset = Dataset.from_generator(
        lambda: ((i, f"row {i}".encode()) for i in range(3)),
        output_signature=(TensorSpec((), np.int64), TensorSpec((), object)),
    ).apply(service.distribute("parallel_epochs", cluster.target))
    got = sorted((int(i), bytes(b.item())) for i, b in dataset)
    assert got == sorted([(i, f"row {i}".encode()) for i in range(3)] * 2)


def test_an_error_in_the_workers_pipeline_reaches_the_consumer(make_cluster: Any) -> None:
    cluster = make_cluster(1)

    def fail(x: Any) -> Any:
        if int(x) == 3:
            raise ValueError(f"bad element {int(x)}")
        return x

    dataset = (
        Dataset.range(10).map(fail).apply(service.distribute("parallel_epochs", cluster.target))
    )
    with pytest.raises(ValueError, match="bad element 3"):
        list(dataset)


# -- job_name -----------------------------------------------------------------------------------


def test_consumers_of_a_named_job_share_one_epoch(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    dataset = Dataset.range(50).apply(
        service.distribute(
            "parallel_epochs", cluster.target, job_name="shared", max_outstanding_requests=2
        )
    )
    first, second = iter(dataset), iter(dataset)  # iteration 0 and 1 of one consumer...
    other = Dataset.range(50).apply(
        service.distribute(
            "parallel_epochs", cluster.target, job_name="shared", max_outstanding_requests=2
        )
    )
    joined = iter(other)  # ...and iteration 0 of another consumer: the job of `first`
    seen_first, seen_joined = [], []
    for _ in range(10):
        seen_first.append(int(next(first)))
        seen_joined.append(int(next(joined)))
    seen_first += [int(x) for x in first]
    seen_joined += [int(x) for x in joined]
    assert sorted(seen_first + seen_joined) == list(range(50))
    assert seen_first and seen_joined
    assert ints(second) == list(range(50))  # iteration 1 is a job of its own


@pytest.mark.parametrize(("mode", "workers"), [("parallel_epochs", 1), ("distributed_epoch", 2)])
def test_a_consumer_that_joins_late_shares_the_rest_of_the_job(
    make_cluster: Any, mode: str, workers: int
) -> None:
    # TF: consumers of a shared job share its elements, each element to one consumer. A
    # consumer that read 200 of 1,000 elements must leave the rest at the workers (it holds a
    # few ahead, not the whole job), so that one joining now shares the ~800 left; read in
    # turns, neither ends while the job still has more than the other's few in hand.
    cluster = make_cluster(workers)

    def make() -> Dataset:
        return Dataset.range(1000).apply(service.distribute(mode, cluster.target, job_name="late"))

    first = iter(make())
    seen: list[list[int]] = [[int(next(first)) for _ in range(200)], []]
    time.sleep(0.5)  # the first consumer's fetch threads run ahead as far as they may
    iterators = [first, iter(make())]
    ended_at: dict[int, int] = {}
    while len(ended_at) < 2:
        for i, iterator in enumerate(iterators):
            if i in ended_at:
                continue
            try:
                seen[i].append(int(next(iterator)))
            except StopIteration:
                ended_at[i] = len(seen[0]) + len(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(1000))
    assert len(seen[1]) >= 300, (len(seen[0]), len(seen[1]))
    assert min(ended_at.values()) >= 1000 - 64, ended_at


def test_each_repeat_pass_is_a_new_job(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    dataset = Dataset.range(5).apply(
        service.distribute("parallel_epochs", cluster.target, job_name="passes")
    )
    assert ints(dataset.repeat(3)) == sorted(list(range(5)) * 3)


def test_a_finished_jobs_name_gives_end_of_input_at_once(make_cluster: Any) -> None:
    cluster = make_cluster(1)

    def make() -> Dataset:
        return Dataset.range(5).apply(
            service.distribute("parallel_epochs", cluster.target, job_name="once")
        )

    assert ints(make()) == [0, 1, 2, 3, 4]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the worker reports the end at its next heartbeat
        if not list(make()):
            break
        time.sleep(0.2)
    else:
        pytest.fail("a new consumer of the finished job 'once' still got elements")


def test_consumers_of_a_job_must_read_it_the_same_way(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    a = Dataset.range(10).apply(service.distribute("parallel_epochs", cluster.target, job_name="j"))
    b = Dataset.range(10).apply(
        service.distribute("distributed_epoch", cluster.target, job_name="j")
    )
    iterator = iter(a)
    with pytest.raises(errors.InvalidArgumentError, match="share a job must read"):
        iter(b)
    iterator.close()


def test_a_named_job_serves_its_first_dataset_to_consumers_of_another(make_cluster: Any) -> None:
    # TF's dispatcher finds a job by its name alone (GetOrCreateJob, ValidateMatchingJob checks
    # the processing mode and target workers, not the dataset): a consumer that names the job
    # with another dataset joins it and shares the job's elements.
    cluster = make_cluster(1)
    first = Dataset.range(10).apply(
        service.distribute(
            "parallel_epochs", cluster.target, job_name="j", max_outstanding_requests=1
        )
    )
    other = Dataset.range(100, 110).apply(
        service.distribute(
            "parallel_epochs", cluster.target, job_name="j", max_outstanding_requests=1
        )
    )
    a = iter(first)
    seen_a = [int(next(a))]
    b = iter(other)
    seen_b = [int(x) for x in b]
    seen_a += [int(x) for x in a]
    assert sorted(seen_a + seen_b) == list(range(10))
    assert seen_b


def test_a_named_job_refuses_a_dataset_with_other_elements(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    ints_job = Dataset.range(10).apply(
        service.distribute("parallel_epochs", cluster.target, job_name="j")
    )
    floats = Dataset.from_tensor_slices(np.zeros(4, np.float32)).apply(
        service.distribute("parallel_epochs", cluster.target, job_name="j")
    )
    iterator = iter(ints_job)
    with pytest.raises(errors.InvalidArgumentError, match="job with name j") as caught:
        iter(floats)
    assert "element" in str(caught.value)
    iterator.close()


def test_a_job_name_keeps_auto_sharding_off() -> None:
    shared = Dataset.range(8).apply(
        service.distribute("parallel_epochs", "127.0.0.1:1", job_name="job")
    )
    own = Dataset.range(8).apply(service.distribute("parallel_epochs", "127.0.0.1:1"))
    batched = shared.batch(2)
    assert auto_shard(batched, 2, 1, AutoShardPolicy.DATA) == (batched, ShardMode.OFF)
    assert auto_shard(own.batch(2), 2, 1, AutoShardPolicy.DATA)[1] == ShardMode.DATA


# -- round robin --------------------------------------------------------------------------------


def _read_in_threads(datasets: list[Dataset], count: int) -> list[list[int]]:
    results: list[list[int]] = [[] for _ in datasets]
    failures: list[BaseException] = []

    def read(index: int) -> None:
        try:
            iterator = iter(datasets[index])
            results[index] = [int(next(iterator)) for _ in range(count)]
            iterator.close()
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(datasets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    return results


def _round_robin_pair(target: str) -> list[Dataset]:
    """Consumers 0 and 1 of a round-robin job of ``range(1_000_000).repeat()``."""
    return [
        Dataset.range(1_000_000)
        .repeat()
        .apply(
            service.distribute(
                "parallel_epochs", target, job_name="rr", consumer_index=i, num_consumers=2
            )
        )
        for i in range(2)
    ]


@pytest.mark.parametrize(
    ("num_workers", "first", "second"),
    [
        # One worker: consumer i takes element i of each round of two.
        (1, [0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]),
        # Two workers, each running the whole range: rounds alternate between them, and at
        # each step both consumers read the same worker.
        (2, [0, 0, 2, 2, 4, 4], [1, 1, 3, 3, 5, 5]),
    ],
)
def test_round_robin_consumers_take_turns_within_each_round(
    make_cluster: Any, num_workers: int, first: list[int], second: list[int]
) -> None:
    cluster = make_cluster(num_workers)
    datasets = _round_robin_pair(cluster.target)
    assert _read_in_threads(datasets, 6) == [first, second]


def test_round_robin_replies_of_several_rounds_keep_every_consumer_in_step(
    make_cluster: Any,
) -> None:
    # A reply carries a task's complete rounds from the one asked for (up to 64): the consumer
    # keeps those of one worker while it reads the other's rounds in between.
    cluster = make_cluster(2)
    datasets = _round_robin_pair(cluster.target)
    rounds = 600
    assert _read_in_threads(datasets, rounds) == [
        [2 * (r // 2) + i for r in range(rounds)] for i in range(2)
    ]


def test_round_robin_needs_an_infinite_dataset(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    dataset = Dataset.range(10).apply(
        service.distribute(
            "parallel_epochs", cluster.target, job_name="finite", consumer_index=0, num_consumers=2
        )
    )
    with pytest.raises(errors.FailedPreconditionError, match="infinite"):
        iter(dataset)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"consumer_index": 0, "num_consumers": 2}, "job_name"),
        ({"job_name": "j", "consumer_index": 0}, "together"),
        ({"job_name": "j", "consumer_index": 2, "num_consumers": 2}, "consumer_index"),
        ({"job_name": ""}, "job_name"),
        ({"max_outstanding_requests": 0}, "max_outstanding_requests"),
        ({"compression": "gzip"}, "compression"),
        ({"target_workers": "SOME"}, "target_workers"),
        ({"data_transfer_protocol": "http"}, "data_transfer_protocol"),
    ],
)
def test_distribute_refuses_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=match):
        service.distribute("parallel_epochs", "localhost:5000", **kwargs)


@pytest.mark.parametrize(
    "target", ["grpc://localhost:5000", "localhost:5000", ("grpc", "localhost:5000")]
)
def test_service_forms(target: Any) -> None:
    dataset = Dataset.range(3).apply(service.distribute("parallel_epochs", target))
    assert dataset.element_spec == Dataset.range(3).element_spec


@pytest.mark.parametrize("target", ["localhost", ("grpc",), 5000])
def test_bad_service_forms(target: Any) -> None:
    with pytest.raises(errors.InvalidArgumentError):
        service.distribute("parallel_epochs", target)


@pytest.mark.parametrize(
    "target", ["grp://localhost:5000", "http://localhost:5000", ("grp", "localhost:5000")]
)
def test_unknown_protocol_is_not_found(target: Any) -> None:
    # TF: "No credentials factory has been registered for protocol grp", a NotFoundError.
    with pytest.raises(errors.NotFoundError, match="grpc") as caught:
        service.distribute("parallel_epochs", target)
    assert caught.value.name in ("grp", "http")


def test_bad_processing_mode() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="processing_mode") as caught:
        service.distribute("every_epoch", "localhost:5000")
    assert "ShardingPolicy.FILE_OR_DATA" in str(caught.value)
    assert "'parallel_epochs'" in str(caught.value)


@pytest.mark.parametrize(
    ("typed", "policy"),
    [
        ("DATA", service.ShardingPolicy.DATA),
        ("file_or_data", service.ShardingPolicy.FILE_OR_DATA),
        ("Dynamic", service.ShardingPolicy.DYNAMIC),
        ("parallel_epochs", service.ShardingPolicy.OFF),
        ("distributed_epoch", service.ShardingPolicy.DYNAMIC),
        (service.ShardingPolicy.HINT, service.ShardingPolicy.HINT),
    ],
)
def test_processing_mode_accepts_policy_names(typed: Any, policy: Any) -> None:
    assert service.ShardingPolicy.parse(typed) is policy
    service.distribute(typed, "localhost:5000")  # accepted; nothing is contacted until read


# -- flow control, compression, workers -----------------------------------------------------


def test_max_outstanding_requests_bounds_what_the_consumer_holds(make_cluster: Any) -> None:
    cluster = make_cluster(2)
    dataset = (
        Dataset.range(200)
        .map(lambda x: np.full(1000, x, np.float32))
        .apply(service.distribute("parallel_epochs", cluster.target, max_outstanding_requests=3))
    )
    iterator = iter(dataset)
    seen = [float(next(iterator)[0])]
    time.sleep(0.5)  # time for the fetchers to fill whatever room there is
    reader = iterator._reader  # type: ignore[attr-defined]
    held, credits = len(reader.queue), reader.queue.credits
    assert held <= 3 and credits >= 0
    seen += [float(e[0]) for e in iterator]
    assert sorted(seen) == sorted([float(x) for x in range(200)] * 2)


@pytest.mark.parametrize("compression", ["AUTO", None, "SNAPPY"])
def test_compression_gives_the_same_elements(make_cluster: Any, compression: Any) -> None:
    cluster = make_cluster(1)
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((4, 50_000)).astype(np.float32)

    def element(i: Any) -> Any:
        i = int(i)
        return {
            "zeros": np.zeros(100_000, np.float32) + i,
            "noise": noise[i % 4],
            "text": np.array(f"element {i}"),
        }

    dataset = (
        Dataset.range(12)
        .map(element)
        .apply(service.distribute("parallel_epochs", cluster.target, compression=compression))
    )
    got = sorted(dataset, key=lambda e: float(e["zeros"][0]))
    assert len(got) == 12
    for i, e in enumerate(got):
        np.testing.assert_array_equal(e["zeros"], np.full(100_000, i, np.float32))
        np.testing.assert_array_equal(e["noise"], noise[i % 4])
        assert e["text"].item() == f"element {i}".encode()


def test_large_elements_arrive_intact(make_cluster: Any) -> None:
    cluster = make_cluster(2)
    dataset = (
        Dataset.range(6)
        .map(lambda x: np.arange(3_000_000, dtype=np.float32) + np.float32(x))
        .apply(service.distribute("distributed_epoch", cluster.target))
    )
    got = sorted(dataset, key=lambda e: float(e[0]))
    assert [float(e[0]) for e in got] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    np.testing.assert_array_equal(got[5], np.arange(3_000_000, dtype=np.float32) + 5)


def test_target_workers_local_reads_only_workers_in_this_process(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = make_cluster(2)
    local = cluster.workers[0].worker_address
    monkeypatch.setattr(_job_reader, "local_worker_addresses", lambda: frozenset({local}))
    dataset = Dataset.range(10).apply(
        service.distribute("parallel_epochs", cluster.target, target_workers="LOCAL")
    )
    assert ints(dataset) == list(range(10))  # one worker's epoch, not two


def test_target_workers_local_without_a_local_worker_is_an_error(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = make_cluster(1)
    monkeypatch.setattr(_job_reader, "local_worker_addresses", lambda: frozenset())
    dataset = Dataset.range(10).apply(
        service.distribute("parallel_epochs", cluster.target, target_workers="local")
    )
    with pytest.raises(errors.FailedPreconditionError, match="LOCAL"):
        list(dataset)


def test_a_worker_that_joins_later_gets_a_task(make_cluster: Any) -> None:
    cluster = make_cluster(0)
    dataset = Dataset.range(10).apply(service.distribute("parallel_epochs", cluster.target))
    iterator = iter(dataset)
    cluster.add_worker()
    assert sorted(int(x) for x in iterator) == list(range(10))


def test_a_consumer_that_stops_reading_does_not_stall_the_others(make_cluster: Any) -> None:
    cluster = make_cluster(1)

    def shared() -> Dataset:
        return Dataset.range(300).apply(
            service.distribute(
                "parallel_epochs", cluster.target, job_name="stall", max_outstanding_requests=4
            )
        )

    idle = iter(shared())
    taken = [int(next(idle))]  # then it never reads again, and never closes
    rest = [int(x) for x in iter(shared())]
    reader = idle._reader  # type: ignore[attr-defined]
    held = [int(e) for e in reader.queue.held()]
    assert len(held) <= 4
    assert sorted(taken + held + rest) == list(range(300))


def test_elements_on_their_way_are_read_before_the_end(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = make_cluster(1)
    deliver = _fetch.Fetchers._deliver

    def slow_deliver(fetchers: Any, elements: list[Any], *rest: Any) -> None:
        if elements:  # meanwhile the worker says its task is done, and the job ends
            time.sleep(2.5)
        deliver(fetchers, elements, *rest)

    monkeypatch.setattr(_fetch.Fetchers, "_deliver", slow_deliver)
    dataset = Dataset.range(5).apply(service.distribute("parallel_epochs", cluster.target))
    assert ints(dataset) == [0, 1, 2, 3, 4]


def test_an_exactly_once_job_ends_when_its_reader_waits_not_at_the_reports_turn(
    make_cluster: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An exactly-once job ends once its consumers' receipts settle its last splits. With the
    # consumer's reports 30 s apart and the workers' GetSplit waiting as long at the
    # dispatcher, the end still comes at once: the reader, finding nothing, has its heartbeat
    # report now, and the dispatcher answers the waiting GetSplit as the report settles the job.
    monkeypatch.setattr(_job_reader, "_HEARTBEAT_S", 30.0)
    monkeypatch.setattr(_job_reader, "_REPORT_S", 30.0)
    monkeypatch.setattr(_task, "_GRANT_WAIT_MS", 30_000)
    monkeypatch.setattr(_split_handout, "MAX_SPLIT_WAIT_S", 30.0)
    cluster = make_cluster(
        2, work_dir=str(tmp_path), fault_tolerant_mode=True, client_timeout_ms=240_000
    )
    dataset = Dataset.range(200).apply(service.distribute("distributed_epoch", cluster.target))
    started = time.monotonic()
    assert sorted(ints(dataset)) == list(range(200))
    assert time.monotonic() - started < 10


def test_an_iterator_dropped_unclosed_releases_its_job(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    dataset = Dataset.range(10**6).apply(
        service.distribute("parallel_epochs", cluster.target, job_name="dropped")
    )
    for _ in dataset:
        break  # the loop's iterator is dropped here, unclosed
    gc.collect()
    state = cluster.dispatcher._state
    deadline = time.monotonic() + 10
    while not all(client.released for client in state.clients.values()):
        assert time.monotonic() < deadline, "the dropped iterator's consumer was not released"
        time.sleep(0.05)


def test_dynamic_service_iterators_cannot_be_checkpointed(make_cluster: Any) -> None:
    # OFF and static sharding can (tests/service/test_checkpoint.py).
    cluster = make_cluster(1)
    iterator = iter(Dataset.range(3).apply(service.distribute("distributed_epoch", cluster.target)))
    with pytest.raises(errors.FailedPreconditionError, match="checkpoint"):
        iterator.get_state()
    iterator.close()


# -- static sharding ------------------------------------------------------------------------


def test_data_sharding_splits_elements_by_worker_index(make_cluster: Any) -> None:
    cluster = static_cluster(make_cluster)
    dataset = (
        Dataset.range(10)
        .map(lambda x: x)
        .apply(service.distribute("DATA", cluster.target))  # the policy's name works too
    )
    assert ints(dataset) == list(range(10))


def test_file_sharding_splits_files_by_worker_index(make_cluster: Any, tmp_path: Any) -> None:
    cluster = static_cluster(make_cluster)
    for index in range(4):
        (tmp_path / f"part-{index}.txt").write_text(
            "".join(f"{index}-{line}\n" for line in range(3))
        )
    lines = TextLineDataset(sorted(str(p) for p in tmp_path.glob("*.txt")))
    for policy in (service.ShardingPolicy.FILE, service.ShardingPolicy.FILE_OR_DATA):
        dataset = lines.apply(service.distribute(policy, cluster.target))
        got = sorted(bytes(x.item()).decode() for x in dataset)
        assert got == sorted(f"{i}-{line}" for i in range(4) for line in range(3))


def test_static_sharding_needs_the_worker_list(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    dataset = Dataset.range(4).apply(
        service.distribute(service.ShardingPolicy.DATA, cluster.target)
    )
    with pytest.raises(errors.FailedPreconditionError, match="worker_addresses"):
        iter(dataset)


def test_a_worker_outside_the_fixed_list_is_refused(make_cluster: Any) -> None:
    cluster = make_cluster(0, worker_addresses=["127.0.0.1:1"])
    with pytest.raises(errors.FailedPreconditionError, match="worker_addresses"):
        cluster.add_worker()


# -- register_dataset / from_dataset_id -----------------------------------------------------


def test_register_and_read_by_id(make_cluster: Any) -> None:
    cluster = make_cluster(2)
    dataset = Dataset.range(8).map(lambda x: (x, x * 2))
    dataset_id = service.register_dataset(cluster.target, dataset)
    assert service.register_dataset(cluster.target, dataset) == dataset_id
    read = service.from_dataset_id("distributed_epoch", cluster.target, dataset_id)
    assert read.element_spec == dataset.element_spec
    assert sorted((int(a), int(b)) for a, b in read) == [(i, 2 * i) for i in range(8)]


def test_register_with_a_chosen_id(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    assert service.register_dataset(cluster.target, Dataset.range(3), dataset_id="mine") == "mine"
    with pytest.raises(errors.InvalidArgumentError, match="already registered"):
        service.register_dataset(cluster.target, Dataset.range(4), dataset_id="mine")
    read = service.from_dataset_id("parallel_epochs", cluster.target, "mine")
    assert ints(read) == [0, 1, 2]


def test_from_dataset_id_scopes_a_job_name_by_the_dataset(make_cluster: Any) -> None:
    # As TensorFlow's from_dataset_id: one job_name over two registered datasets is two jobs,
    # and consumers of one dataset that give the name still share one.
    cluster = make_cluster(1)
    ids = [service.register_dataset(cluster.target, Dataset.range(s, s + 6)) for s in (0, 100)]

    def reader(dataset_id: str) -> Any:
        return iter(
            service.from_dataset_id(
                "distributed_epoch", cluster.target, dataset_id, job_name="shared"
            )
        )

    first, same, other = reader(ids[0]), reader(ids[0]), reader(ids[1])
    seen_first = [int(next(first))]
    seen_other = [int(x) for x in other]
    seen_first += [int(x) for x in first] + [int(x) for x in same]
    assert sorted(seen_first) == list(range(6))
    assert sorted(seen_other) == list(range(100, 106))


def test_from_an_unknown_id(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    with pytest.raises(errors.NotFoundError, match="not registered"):
        service.from_dataset_id("parallel_epochs", cluster.target, "nope")


def test_strategies_do_not_auto_shard_a_shared_job(make_cluster: Any) -> None:
    pytest.importorskip("torch")
    from feedline.data import Options
    from feedline.distribute.experimental.worker import distribute_dataset_for_worker

    cluster = make_cluster(1)
    options = Options()
    options.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA

    def training_worker(index: int, job_name: str | None) -> Any:
        # Each training worker builds its own dataset, as separate processes would.
        dataset = Dataset.range(16).apply(
            service.distribute(
                "parallel_epochs", cluster.target, job_name=job_name, max_outstanding_requests=2
            )
        )
        return iter(
            distribute_dataset_for_worker(
                dataset.batch(4).with_options(options), num_workers=2, worker_index=index
            )
        )

    shared = [training_worker(i, "train") for i in range(2)]
    rows = [np.asarray(batch).tolist() for it in shared for batch in it]
    # The shared job splits the data between the workers; nothing is dropped by sharding.
    assert sorted(x for row in rows for x in row) == list(range(16))
    own = [training_worker(i, None) for i in range(2)]
    halves = [[x for batch in it for x in np.asarray(batch).tolist()] for it in own]
    # Without a job name each worker reads a whole epoch of its own and DATA keeps its half.
    assert halves == [[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]]


# -- static sharding of readers made inside interleave / flat_map ------------------------------


def _lines_by_worker(dataset: Dataset, policy: Any, target: str) -> list[list[str]]:
    """Each worker's lines, in order: the pipeline tags every line with the thread of the task
    that read it (one producer thread per worker's task)."""
    tagged = dataset.map(lambda line: (line, threading.current_thread().name))
    by_task: dict[str, list[str]] = {}
    iterator = iter(tagged.apply(service.distribute(policy, target)))
    try:
        for line, task in iterator:
            by_task.setdefault(str(task.item()), []).append(bytes(line.item()).decode())
    finally:
        iterator.close()
    return sorted(by_task.values())


@pytest.mark.parametrize(
    "policy", [service.ShardingPolicy.FILE, service.ShardingPolicy.FILE_OR_DATA]
)
def test_file_sharding_finds_readers_made_inside_interleave(
    make_cluster: Any, tmp_path: Any, policy: Any
) -> None:
    # TF 2.21 shards the file names feeding the interleave: worker 0 reads part-0 and part-2,
    # worker 1 reads part-1 and part-3, each file whole.
    from feedline.data import TFRecordDataset
    from feedline.io import TFRecordWriter

    cluster = static_cluster(make_cluster)
    text, records = [], []
    for index in range(4):
        path = tmp_path / f"part-{index}.txt"
        path.write_text("".join(f"{index}-{line}\n" for line in range(3)))
        text.append(str(path))
        records.append(str(tmp_path / f"part-{index}.tfrecord"))
        with TFRecordWriter(records[-1]) as writer:
            for line in range(3):
                writer.write(f"{index}-{line}".encode())
    expected = [
        ["0-0", "0-1", "0-2", "2-0", "2-1", "2-2"],
        ["1-0", "1-1", "1-2", "3-0", "3-1", "3-2"],
    ]
    names = Dataset.from_tensor_slices(text)
    listed = Dataset.list_files(str(tmp_path / "*.tfrecord"), shuffle=False)
    pipelines = {
        "names.interleave(lambda)": names.interleave(
            lambda path: TextLineDataset(path), cycle_length=1
        ),
        "names.flat_map(TextLineDataset)": names.flat_map(TextLineDataset),
        "list_files.interleave(TFRecordDataset)": listed.interleave(
            TFRecordDataset, cycle_length=1
        ),
    }
    for name, lines in pipelines.items():
        assert _lines_by_worker(lines, policy, cluster.target) == expected, name


def test_file_sharding_without_files_fails_the_job_instead_of_waiting(make_cluster: Any) -> None:
    cluster = static_cluster(make_cluster)
    dataset = Dataset.range(4).apply(
        service.distribute(service.ShardingPolicy.FILE, cluster.target)
    )
    iterator = iter(dataset)
    try:
        with pytest.raises(errors.NotFoundError, match="unshardable source dataset, RangeDataset"):
            list(iterator)
    finally:
        iterator.close()
    # FILE_OR_DATA falls back to DATA: every element once, split by worker index.
    assert ints(
        Dataset.range(4).apply(
            service.distribute(service.ShardingPolicy.FILE_OR_DATA, cluster.target)
        )
    ) == [0, 1, 2, 3]


def test_a_task_made_after_the_consumer_joined_is_read_before_the_end(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # worker 0: [0, 1, 2, 3, 4]; worker 1, registered mid-job (it gets a task of the running
    # job): [0, 1, 2, 3, 4]. The heartbeat that tells the consumer of worker 1's task is slow, so
    # worker 0's task ends first: the consumer must not take that for the end of the job.
    cluster = make_cluster(1)
    apply_view = _job_reader._JobReader._apply_view
    slowed = threading.Event()

    def slow_news(reader: Any, view: JobView, *args: Any) -> bool:
        known = {task_id for task_id, _ in reader.queue.tasks()}
        if known and any(task.task_id not in known for task in view.tasks):
            slowed.set()
            time.sleep(1.5)  # meanwhile worker 0's task ends
        return apply_view(reader, view, *args)

    monkeypatch.setattr(_job_reader._JobReader, "_apply_view", slow_news)
    dataset = Dataset.range(5).apply(
        service.distribute("parallel_epochs", cluster.target, max_outstanding_requests=1)
    )
    iterator = iter(dataset)
    first = int(next(iterator))  # worker 0's task holds the rest: it has not ended
    cluster.add_worker()
    rest = [int(x) for x in iterator]
    assert slowed.is_set()
    assert sorted([first, *rest]) == sorted(2 * list(range(5)))


def test_a_consumer_released_at_exit_stops_waiting_at_once(make_cluster: Any) -> None:
    # The process exits: the exit hook releases the consumer while a thread (a prefetch
    # producer) waits in next() for an element that will not come. It raises at once instead
    # of waiting out service_timeout_ms, and never ends the epoch silently.
    cluster = make_cluster(1)
    dataset = Dataset.from_generator(
        lambda: (time.sleep(10), (yield 0)), output_signature=TensorSpec((), np.int64)
    ).apply(service.distribute("parallel_epochs", cluster.target))
    iterator = iter(dataset)
    raised: list[BaseException] = []

    def read() -> None:
        try:
            next(iterator)
        except BaseException as error:
            raised.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(0.5)
    assert reader.is_alive()  # waiting for the first element
    started = time.monotonic()
    iterator._reader.stop_at_exit()  # type: ignore[attr-defined]
    reader.join(timeout=5)
    assert not reader.is_alive() and time.monotonic() - started < 2
    assert len(raised) == 1 and isinstance(raised[0], errors.FailedPreconditionError), raised


def test_a_consumer_of_a_worker_whose_waiting_reads_are_taken_still_reads_everything(
    make_cluster: Any,
) -> None:
    # Every read that may wait at the worker is taken: the consumer's requests that find
    # nothing ready are answered at once with retry_after_ms, which it waits out, and it still
    # reads every element.
    cluster = make_cluster(1)
    with waiting_reads_taken(cluster.workers[0]):
        slow = Dataset.range(20).map(lambda x: (time.sleep(0.02), x)[1])  # nothing ready at first
        dataset = slow.apply(service.distribute("parallel_epochs", cluster.target))
        assert sorted(int(x) for x in dataset) == list(range(20))
