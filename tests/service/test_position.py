"""The consumer's position in a training checkpoint (feedline/service/position.py, the
iterator state of client.py, the dispatcher's ``resume`` and the worker's ``skip``).

Each test reads ``k`` elements, saves the iterator with ``feedline.train.Checkpoint``, closes
it, restores the checkpoint into a new iterator of the same job name and reads the rest: what
was read before and after is exactly one epoch of the job.
"""

from __future__ import annotations

import dataclasses
import doctest
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from feedline import _cluster_shares as cluster_shares
from feedline import errors, service
from feedline.data import Dataset, TextLineDataset
from feedline.io import gfile
from feedline.service import position as _position
from feedline.service.dispatcher import state as st
from feedline.service.position import JobPosition, TaskPosition, resume_skips
from feedline.train import Checkpoint
from tests.service.conftest import static_cluster

# Fewer in flight than a task's elements: a restore re-reads what was buffered, not returned.
_OUTSTANDING = 3


def _take(iterator: Any, k: int) -> list[int]:
    return [int(next(iterator)) for _ in range(k)]


def _save_and_resume(
    make_dataset: Any, k: int, tmp_path: Path, exhaust: bool = False
) -> tuple[list[int], list[int]]:
    """Reads ``k`` elements (then to the end, with ``exhaust``), checkpoints the iterator,
    closes it, and restores into a new iterator of a new dataset: (before, after)."""
    first = iter(make_dataset())
    before = _take(first, k)
    if exhaust:
        before += [int(x) for x in first]
    path = Checkpoint(iterator=first).save(str(tmp_path / f"ckpt-k{k}"))
    first.close()
    second = iter(make_dataset())
    Checkpoint(iterator=second).restore(path)
    after = [int(x) for x in second]
    second.close()
    return before, after


def _read_then_resume(make_dataset: Any, k: int) -> tuple[list[int], Any]:
    """Reads ``k`` elements, takes the iterator's state, closes it and restores the state into
    a new iterator of a new dataset: (what was read, the new iterator)."""
    first = iter(make_dataset())
    before = _take(first, k)
    state = first.get_state()
    first.close()
    second = iter(make_dataset())
    second.set_state(state)
    return before, second


# -- OFF and static sharding resume exactly ---------------------------------------------------


def test_parallel_epochs_resume_where_the_consumer_was(make_cluster: Any, tmp_path: Path) -> None:
    cluster = make_cluster(2)
    for k in (0, 1, 7, 19, 20):
        name = f"off-{k}"

        def make(name: str = name) -> Dataset:
            return Dataset.range(10).apply(
                service.distribute(
                    "parallel_epochs",
                    cluster.target,
                    job_name=name,
                    max_outstanding_requests=_OUTSTANDING,
                )
            )

        before, after = _save_and_resume(make, k, tmp_path)
        assert len(before) == k
        # Two workers each run the whole dataset: every element twice, over both halves.
        assert sorted(before + after) == sorted(list(range(10)) * 2), (k, before, after)


def test_parallel_epochs_resume_after_the_end(make_cluster: Any, tmp_path: Path) -> None:
    cluster = make_cluster(2)

    def make() -> Dataset:
        return Dataset.range(6).apply(
            service.distribute("parallel_epochs", cluster.target, job_name="ended")
        )

    before, after = _save_and_resume(make, 0, tmp_path, exhaust=True)
    assert sorted(before) == sorted(list(range(6)) * 2) and after == []


def test_an_anonymous_job_resumes_too(make_cluster: Any, tmp_path: Path) -> None:
    cluster = make_cluster(2)

    def make() -> Dataset:
        return (
            Dataset.range(8)
            .apply(
                service.distribute(
                    "parallel_epochs", cluster.target, max_outstanding_requests=_OUTSTANDING
                )
            )
            .map(lambda x: x * 10)  # a pipeline after the service saves its input's position
        )

    before, after = _save_and_resume(make, 5, tmp_path)
    assert sorted(before + after) == sorted([x * 10 for x in range(8)] * 2)


def test_data_sharding_resumes_each_shard(make_cluster: Any, tmp_path: Path) -> None:
    cluster = static_cluster(make_cluster)
    for k in (0, 4, 9, 10):
        name = f"data-{k}"

        def make(name: str = name) -> Dataset:
            return Dataset.range(10).apply(
                service.distribute(
                    "DATA", cluster.target, job_name=name, max_outstanding_requests=_OUTSTANDING
                )
            )

        before, after = _save_and_resume(make, k, tmp_path)
        assert sorted(before + after) == list(range(10)), (k, before, after)


def test_state_counts_returned_elements_per_worker(make_cluster: Any) -> None:
    cluster = static_cluster(make_cluster)
    dataset = Dataset.range(10).apply(
        service.distribute("DATA", cluster.target, job_name="table", max_outstanding_requests=2)
    )
    iterator = iter(dataset)
    got = _take(iterator, 5)
    state = iterator.get_state()
    iterator.close()
    # worker 0 reads shard 0 (0, 2, 4, ...), worker 1 shard 1 (1, 3, 5, ...).
    counts = {index: count for index, _, count in state["tasks"]}
    assert counts == {0: sum(x % 2 == 0 for x in got), 1: sum(x % 2 == 1 for x in got)}
    assert state["mode"] == "DATA" and state["num_workers"] == 2


_RESTORE_SCRIPT = """
import json, sys
from feedline import service
from feedline.data import Dataset, TextLineDataset
from feedline.io import gfile
from feedline.train import Checkpoint
target, path = sys.argv[1], sys.argv[2]
dataset = Dataset.range(10).apply(
    service.distribute("parallel_epochs", target, job_name="fresh-process"))
iterator = iter(dataset)
Checkpoint(iterator=iterator).restore(path)
print(json.dumps([int(x) for x in iterator]))
iterator.close()
"""


def test_a_fresh_process_resumes_the_job(make_cluster: Any, tmp_path: Path) -> None:
    cluster = make_cluster(2)
    dataset = Dataset.range(10).apply(
        service.distribute(
            "parallel_epochs",
            cluster.target,
            job_name="fresh-process",
            max_outstanding_requests=_OUTSTANDING,
        )
    )
    iterator = iter(dataset)
    before = _take(iterator, 6)
    path = Checkpoint(iterator=iterator).save(str(tmp_path / "ckpt"))
    iterator.close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _RESTORE_SCRIPT, cluster.target, path],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    after = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(before + after) == sorted(list(range(10)) * 2)


# -- what cannot be saved, and clear errors ---------------------------------------------------


def test_dynamic_sharding_needs_a_fault_tolerant_dispatcher(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    dataset = Dataset.range(4).apply(
        service.distribute("distributed_epoch", cluster.target, job_name="dyn")
    )
    iterator = iter(dataset)
    with pytest.raises(errors.FailedPreconditionError, match=r"DYNAMIC.*fault_tolerant_mode"):
        iterator.get_state()
    with pytest.raises(errors.FailedPreconditionError, match="fault_tolerant_mode"):
        iterator.set_state(
            {"version": 1, "mode": "DYNAMIC", "cursor": None, "done": [], "partial": []}
        )
    assert sorted(int(x) for x in iterator) == [0, 1, 2, 3]  # still reads


@pytest.mark.parametrize(("workers_before", "workers_after"), [(2, 3), (3, 1)])
def test_dynamic_sharding_resumes_the_splits_and_offsets_returned(
    make_cluster: Any, tmp_path: Path, workers_before: int, workers_after: int
) -> None:
    """With a fault-tolerant dispatcher every element carries its split and offset: the
    position is the splits returned whole and the offsets returned of the others, and the
    resumed job hands out the rest, on any number of workers."""
    cluster = make_cluster(
        workers_before, work_dir=str(tmp_path / "work"), fault_tolerant_mode=True
    )
    for k in (0, 1, 37, 150, 400):
        name = f"dyn-{workers_after}-{k}"

        def make(name: str = name) -> Dataset:
            return (
                Dataset.range(400)
                .map(lambda i: i * 10)
                .apply(
                    service.distribute(
                        "distributed_epoch",
                        cluster.target,
                        job_name=name,
                        max_outstanding_requests=_OUTSTANDING,
                    )
                )
            )

        first = iter(make())
        before = _take(first, k)
        path = Checkpoint(iterator=first).save(str(tmp_path / f"ckpt-{name}"))
        first.close()
        while len(cluster.workers) < workers_after:
            cluster.add_worker()
        while len(cluster.workers) > workers_after:
            cluster.workers.pop().stop()
        second = iter(make())
        Checkpoint(iterator=second).restore(path)
        after = [int(x) for x in second]
        second.close()
        assert sorted(before + after) == [x * 10 for x in range(400)], (k, len(before + after))


def test_a_dynamic_position_saved_again_after_a_restore_keeps_what_came_before(
    make_cluster: Any, tmp_path: Path
) -> None:
    cluster = make_cluster(2, work_dir=str(tmp_path / "work"), fault_tolerant_mode=True)

    def make() -> Dataset:
        return Dataset.range(300).apply(
            service.distribute("distributed_epoch", cluster.target, job_name="twice")
        )

    part1, second = _read_then_resume(make, 90)
    part2 = _take(second, 60)
    time.sleep(0.5)  # the consumer hears which splits are done (and their counts)
    state = second.get_state()
    assert json.loads(json.dumps(state)) == state  # a plain JSON-able dict
    # The position holds exactly what next() returned: whole splits, and offsets of the others.
    returned = sum(count for _, count in state["done"])
    returned += sum(b - a for _, ranges in state["partial"] for a, b in ranges)
    assert returned == 150 and state["done"]
    second.close()
    third = iter(make())
    third.set_state(state)
    part3 = [int(x) for x in third]
    third.close()
    assert sorted(part1 + part2 + part3) == list(range(300))


@pytest.mark.parametrize("listed", [False, True], ids=["named", "listed"])
def test_a_resumed_split_reads_its_objects_as_its_first_run_did(
    make_cluster: Any, tmp_path: Path, listed: bool, request: pytest.FixtureRequest
) -> None:
    """The position holds the versions of the objects its half-read splits read: resumed after
    one was replaced (as long as before: only its version tells), the rest of that split is a
    DataLossError naming it, not the new version's lines after the old one's, whether the
    objects are named one by one or listed again by the restarted program (on S3, whose
    listing gives each object's ETag: the listing's own versions do not reach the position,
    the ones the first run told the dispatcher do)."""
    cluster = make_cluster(1, work_dir=str(tmp_path / "work"), fault_tolerant_mode=True)
    if listed:
        root = f"{request.getfixturevalue('s3_bucket')}/resume"
    else:
        root = f"memory://feedline-resume-{uuid.uuid4().hex}"
    urls = [f"{root}/{name}.txt" for name in ("a", "b")]
    for url in urls:
        gfile.GFile(url, "wb").write(
            b"".join(b"%s-%d\n" % (url[-5:-4].encode(), i) for i in range(6))
        )

    def make() -> Dataset:
        files: Any = Dataset.list_files(f"{root}/*.txt", shuffle=False) if listed else urls
        return TextLineDataset(files).apply(
            service.distribute(
                "distributed_epoch", cluster.target, job_name=f"versions-{listed}",
                max_outstanding_requests=_OUTSTANDING,
            )
        )  # fmt: skip

    first = iter(make())
    before = [next(first).item() for _ in range(2)]
    state = first.get_state()
    first.close()
    (key, held), *_ = state["versions"]  # the half-read split holds its object's version
    assert key == state["partial"][0][0] and list(held) == [urls[0]] and before[0] == b"a-0"
    time.sleep(0.01)
    gfile.GFile(urls[0], "wb").write(b"".join(b"A-%d\n" % i for i in range(6)))
    second = iter(make())
    second.set_state(state)
    got: list[bytes] = []
    with pytest.raises(errors.DataLossError, match=r"a\.txt' changed since it was listed or"):
        for x in second:
            got.append(x.item())
    second.close()
    assert not [line for line in got if line.startswith(b"A-")], got


def test_round_robin_cannot_be_checkpointed(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    dataset = (
        Dataset.range(4)
        .repeat()
        .apply(
            service.distribute(
                "parallel_epochs", cluster.target, job_name="rr", consumer_index=0, num_consumers=1
            )
        )
    )
    iterator = iter(dataset)
    with pytest.raises(errors.FailedPreconditionError, match="round robin"):
        iterator.get_state()
    iterator.close()


def test_a_job_shared_by_several_consumers_cannot_be_saved(make_cluster: Any) -> None:
    cluster = make_cluster(1)

    def make() -> Dataset:
        return Dataset.range(100).apply(
            service.distribute("parallel_epochs", cluster.target, job_name="shared")
        )

    one, two = iter(make()), iter(make())  # each the first pass: the same job
    next(one)
    with pytest.raises(errors.FailedPreconditionError, match="2 consumers joined"):
        one.get_state()
    # Nor can a position be restored into a job another consumer reads.
    state = {"version": 1, "mode": "OFF", "num_workers": 1, "tasks": []}
    with pytest.raises(errors.FailedPreconditionError, match="other consumer"):
        one.set_state(state)
    two.close()
    one.close()


def test_consumers_sharing_an_exactly_once_job_save_shares_that_resume_only_together(
    make_cluster: Any, tmp_path: Path
) -> None:
    cluster = make_cluster(1, work_dir=str(tmp_path / "work"), fault_tolerant_mode=True)

    def make() -> Dataset:
        return Dataset.range(40).apply(
            service.distribute(
                "distributed_epoch", cluster.target, job_name="shared", max_outstanding_requests=1
            )
        )

    one, two = iter(make()), iter(make())  # each the first pass: the same job
    before = _take(one, 5) + _take(two, 5)
    shares = [one.get_state(), two.get_state()]
    assert all(share[cluster_shares.SHARE] == "data service job 'shared'" for share in shares)
    with pytest.raises(errors.FailedPreconditionError, match="every consumer's share"):
        one.set_state(shares[0])
    one.close()
    two.close()
    # Restored together: the lead resumes a job of its own at the union, the other joins it.
    lead, other = iter(make()), iter(make())
    for iterator, leads in ((lead, True), (other, False)):
        iterator.set_state(
            {cluster_shares.SHARES: shares, cluster_shares.GROUP: "g", cluster_shares.LEAD: leads}
        )
    after = [int(x) for x in lead] + [int(x) for x in other]
    assert sorted(before + after) == list(range(40))


def test_a_state_of_another_mode_is_refused(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    dataset = Dataset.range(4).apply(service.distribute("parallel_epochs", cluster.target))
    iterator = iter(dataset)
    with pytest.raises(errors.InvalidArgumentError, match="same processing mode"):
        iterator.set_state({"version": 1, "mode": "DATA", "num_workers": 2, "tasks": []})
    iterator.close()


def test_static_positions_need_the_same_number_of_workers() -> None:
    position = JobPosition(int(service.ShardingPolicy.DATA), 2, (TaskPosition(0, "a", 1),))
    with pytest.raises(errors.FailedPreconditionError, match=r"2 workers.*would have 3"):
        resume_skips(position, int(service.ShardingPolicy.DATA), ("a", "b", "c"))
    assert resume_skips(position, int(service.ShardingPolicy.DATA), ("x", "y")) == [1, 0]


def test_off_positions_follow_the_address_then_the_worker_order() -> None:
    off = int(service.ShardingPolicy.OFF)
    position = JobPosition(off, 2, (TaskPosition(0, "a", 4), TaskPosition(1, "b", 9)))
    assert resume_skips(position, off, ("b", "a")) == [9, 4]
    assert resume_skips(position, off, ("c", "b", "d")) == [4, 9, 0]


def test_task_skips_are_journaled() -> None:
    update = st.CreateTask(2, 1, "127.0.0.1:1", 0, 2, skip=7)
    assert st.update_from_json(st.update_to_json(update)) == update
    state = st.DispatcherState()
    state.apply(st.CreateJob(1, "1000", 0, "job", 0, None, "ANY"))
    state.apply(update)
    assert st.state_from_json(st.state_to_json(state)).tasks[2].skip == 7


def test_a_resumed_job_survives_a_journaled_dispatcher_restart(tmp_path: Path) -> None:
    config = service.DispatcherConfig(work_dir=str(tmp_path / "work"), fault_tolerant_mode=True)
    dispatcher = service.DispatchServer(config)
    port = int(dispatcher.target.rsplit(":", 1)[1])
    worker = service.WorkerServer(service.WorkerConfig(dispatcher_address=f"127.0.0.1:{port}"))
    try:

        def make() -> Dataset:
            return Dataset.range(12).apply(
                service.distribute(
                    "parallel_epochs",
                    dispatcher.target,
                    job_name="durable",
                    max_outstanding_requests=2,
                )
            )

        before, second = _read_then_resume(make, 5)
        middle = _take(second, 2)
        dispatcher.stop()
        dispatcher = service.DispatchServer(dataclasses.replace(config, port=port))
        # The resumed job and its task's skip come back from the journal; the worker keeps it.
        (job,) = dispatcher._state.jobs.values()
        assert [t.skip for t in dispatcher._state.job_tasks(job.job_id)] == [5]
        after = [int(x) for x in second]
        second.close()
        assert sorted(before + middle + after) == list(range(12))
    finally:
        worker.stop()
        dispatcher.stop()


def test_doctests() -> None:
    results = doctest.testmod(_position)
    assert results.attempted and not results.failed
