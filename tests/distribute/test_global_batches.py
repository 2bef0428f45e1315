"""Tests of feedline/distribute/global_batches.py: the parts of a global batch, reads by index
and as a stream, the commit protocol, and (worker processes under the elastic strategy, a real
kill -9) the same committed global batches on 1, 2 and 3 workers."""

from __future__ import annotations

import hashlib
import itertools
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from feedline import service
from feedline.data import Dataset
from feedline.data.ops._snapshot_format import is_finished, shard_dir
from feedline.data.ops._snapshot_streams import StreamWriter, finish_save, start_save
from feedline.distribute.elastic import serve_membership_store
from feedline.distribute.global_batches import GlobalBatches, part
from feedline.errors import InvalidArgumentError, OutOfRangeError
from tests.distribute import elastic_job
from tests.distribute.elastic_job import read_progress as _progress
from tests.distribute.test_elastic import WORKER, _wait
from tests.launcher import Processes
from tests.service import test_distributed_save as saves
from tests.service.procs import ServiceProcesses


def _global(batches: GlobalBatches, step: int, world_size: int) -> list[int]:
    """Global batch ``step`` as ``world_size`` workers read it, their parts in rank order."""
    parts = [batches.local_batch(step, rank, world_size) for rank in range(world_size)]
    assert sum(len(p) for p in parts) == batches.global_batch_size
    return [int(x) for p in parts for x in p]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 7])
def test_the_parts_split_the_global_batch_in_rank_order(world_size: int) -> None:
    bounds = [part(0, rank, world_size, 12) for rank in range(world_size)]
    assert bounds[0][0] == 0 and bounds[-1][1] == 12
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    sizes = [end - start for start, end in bounds]
    assert max(sizes) - min(sizes) <= 1


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="global_batch_size"):
        GlobalBatches(Dataset.range(10), 0)
    with pytest.raises(InvalidArgumentError, match="epochs"):
        GlobalBatches(Dataset.range(10), 2, epochs=0)
    with pytest.raises(InvalidArgumentError, match="random access"):
        GlobalBatches(Dataset.range(10).map(lambda x: x), 2, shuffle_seed=1)
    with pytest.raises(InvalidArgumentError, match="fewer than one global batch"):
        GlobalBatches(Dataset.range(3), 4, epochs=1)
    batches = GlobalBatches(Dataset.range(10), 4)
    with pytest.raises(InvalidArgumentError, match="cannot share"):
        batches.local_batch(0, 0, 5)
    with pytest.raises(InvalidArgumentError, match="rank 2"):
        batches.local_batch(0, 2, 2)
    with pytest.raises(InvalidArgumentError, match="global batches of 4"):
        GlobalBatches(Dataset.range(10), 5).set_state(batches.get_state())


@pytest.mark.parametrize("stream", [False, True])
def test_the_global_batches_are_the_same_on_any_number_of_workers(stream: bool) -> None:
    def dataset() -> Dataset:  # each GlobalBatches reads the first pass of its own dataset
        ids = Dataset.range(100)
        return ids.shuffle(30, seed=4).map(lambda x: x * 2) if stream else ids

    reference = [[int(x) for x in b] for b in dataset().batch(12, drop_remainder=True)]
    for world_size in (1, 2, 3, 4):
        batches = GlobalBatches(dataset(), 12)
        assert [_global(batches, s, world_size) for s in range(8)] == reference
        with pytest.raises(OutOfRangeError):
            batches.local_batch(8, 0, world_size)


def test_a_stream_reads_a_step_again_and_an_earlier_one() -> None:
    """A redone step (after an abort, under another world size) and a step behind the last
    one read come from kept starts, or from the beginning."""
    reference = [
        [int(x) for x in b]
        for b in Dataset.range(1000).shuffle(50, seed=1).batch(10, drop_remainder=True)
    ]
    batches = GlobalBatches(Dataset.range(1000).shuffle(50, seed=1), 10)
    for step in [0, 1, 2, 2, 9, 7, 8, 3, 40, 39, 0, 99]:
        for world_size in (3, 1):
            assert _global(batches, step, world_size) == reference[step], (step, world_size)


def test_rows_by_index_shuffle_each_pass_with_the_seed() -> None:
    batches = GlobalBatches(Dataset.range(10), 4, shuffle_seed=3, epochs=3)  # 2 steps a pass
    steps = [_global(batches, s, 2) for s in range(6)]
    for epoch in range(3):
        order = np.random.default_rng([3, epoch]).permutation(10)
        assert steps[2 * epoch] + steps[2 * epoch + 1] == order[:8].tolist()
    assert steps[0:2] != steps[2:4]  # a new order each pass
    with pytest.raises(OutOfRangeError):
        batches.local_batch(6, 0, 1)
    again = GlobalBatches(Dataset.range(10), 4, shuffle_seed=3, epochs=3)
    assert [_global(again, s, 3) for s in range(6)] == steps


def test_a_complete_file_cache_is_read_by_index_in_any_pipeline(tmp_path: Path) -> None:
    prefix = str(tmp_path / "decoded")

    def decoded() -> Dataset:  # the costly part, cached once
        return Dataset.range(700).map(lambda x: x * 3)

    with pytest.raises(InvalidArgumentError, match="a complete file cache"):
        GlobalBatches(decoded().cache(prefix), 32, shuffle_seed=5, epochs=2)
    list(decoded().cache(prefix))  # the first pass writes the files
    steps = []
    for world_size in (1, 2, 3):
        # A new pipeline over the files each time, as a restarted worker makes it.
        batches = GlobalBatches(decoded().cache(prefix), 32, shuffle_seed=5, epochs=2)
        steps.append([_global(batches, s, world_size) for s in range(2 * (700 // 32))])
    assert steps[0] == steps[1] == steps[2]
    for epoch in range(2):
        order = np.random.default_rng([5, epoch]).permutation(700)[: 21 * 32].tolist()
        read = [x for batch in steps[0][21 * epoch : 21 * (epoch + 1)] for x in batch]
        assert read == [3 * i for i in order]


def test_map_func_runs_on_this_workers_elements_only() -> None:
    mapped: list[int] = []

    def double(x: Any) -> Any:
        mapped.append(int(x))
        return x * 2

    for dataset in (Dataset.range(40), Dataset.range(40).shuffle(40, seed=2)):
        mapped.clear()
        batches = GlobalBatches(dataset, 8, map_func=double)
        rows = batches.local_batch(2, 1, 4)
        assert [int(x) for x in rows] == [2 * x for x in mapped] and len(mapped) == 2


def test_the_iterator_commits_and_aborts_steps_and_saves_its_position() -> None:
    batches = GlobalBatches(Dataset.range(20), 4)
    assert [int(x) for x in next(batches)] == [0, 1, 2, 3]
    batches.abort()  # the step failed: the same global batch again
    assert [int(x) for x in next(batches)] == [0, 1, 2, 3]
    batches.commit()
    assert [int(x) for x in next(batches)] == [4, 5, 6, 7]
    saved = batches.get_state()  # mid-step: the step count is the committed steps
    restored = GlobalBatches(Dataset.range(20), 4)
    restored.set_state(saved)
    assert [int(x) for x in next(restored)] == [4, 5, 6, 7]
    for _ in range(3):
        batches.commit()
        next(batches)
    batches.commit()
    with pytest.raises(StopIteration):
        next(batches)


def test_a_snapshot_is_read_by_place_the_same_on_any_number_of_workers(tmp_path: Path) -> None:
    """A pass is the snapshot's streams one after another; with a seed, in a new order each
    pass. (Streams of 30, 30, 30 and 10 elements: a global batch spans two streams.)"""
    path = str(tmp_path / "saved")
    Dataset.range(100).save(path, shard_func=lambda x: x // 30)
    streams = [list(range(k * 30, min(k * 30 + 30, 100))) for k in range(4)]
    reference = [list(range(s * 12, s * 12 + 12)) for s in range(8)]
    for world_size in (1, 2, 3, 4):
        batches = GlobalBatches(Dataset.load(path), 12)
        assert [_global(batches, s, world_size) for s in range(8)] == reference
        with pytest.raises(OutOfRangeError):
            batches.local_batch(8, 0, world_size)
    seeded = [GlobalBatches(Dataset.load(path), 12, shuffle_seed=2, epochs=2) for _ in range(2)]
    passes = [
        [x for k in np.random.default_rng([2, epoch]).permutation(4) for x in streams[k]][:96]
        for epoch in range(2)
    ]
    assert passes[0] != passes[1]
    for world_size, batches in zip((3, 2), seeded, strict=True):
        read = [_global(batches, s, world_size) for s in range(16)]
        assert [x for step in read[:8] for x in step] == passes[0]
        assert [x for step in read[8:] for x in step] == passes[1]
        with pytest.raises(OutOfRangeError):
            batches.local_batch(16, 0, 1)
    with pytest.raises(InvalidArgumentError, match="random access"):  # its reader's order
        GlobalBatches(
            Dataset.load(path, reader_func=lambda d: d.flat_map(lambda x: x)), 12, epochs=1
        )


def test_a_snapshot_being_written_is_read_as_its_streams_are_committed(tmp_path: Path) -> None:
    """Global batches of a ``distributed_save`` still running come as its streams are written,
    each the same as those of the finished snapshot."""
    path = str(tmp_path / "saving")
    spec = Dataset.range(1).element_spec
    start_save(path, "run", spec, "NONE", 5)

    def write() -> None:
        for stream in range(5):
            time.sleep(0.2)
            StreamWriter(shard_dir(f"{path}/run", stream), spec, "NONE").write(
                iter(Dataset.range(stream * 10, stream * 10 + 10))
            )
        finish_save(path, "run", 5)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    batches = GlobalBatches(
        Dataset.load(path, wait=True), 8, map_func=lambda x: x + 1000, timeout_s=30
    )
    read, unfinished = [], 0
    for local in batches:
        read.append([int(x) for x in local])
        unfinished += not is_finished(path)
        batches.commit()
    writer.join(30)
    assert read == [[1000 + x for x in range(s * 8, s * 8 + 8)] for s in range(6)]
    assert unfinished >= 4  # read while the save ran
    again = GlobalBatches(Dataset.load(path), 8, map_func=lambda x: x + 1000)
    assert [_global(again, s, 3) for s in range(6)] == read


@pytest.mark.timeout(180)
def test_a_save_on_service_workers_gives_the_same_global_batches_through_a_kill(
    tmp_path: Path,
) -> None:
    """``distributed_save`` on two real service workers, one killed with kill -9 in the middle
    of a chunk; global batches read while the save runs, as 1, 2 and 3 trainers would: each is
    the elements at its places (``x`` in ``[24 s, 24 s + 24)``: the streams are the source's
    splits in order), whoever wrote them."""
    path = str(tmp_path / "snapshot")
    marker = tmp_path / "stopped"
    read: dict[int, list[list[int]]] = {}
    early = threading.Event()

    def trainers() -> None:
        batches = GlobalBatches(Dataset.load(path, wait=True), 24, timeout_s=60)

        def xs(step: int, world_size: int) -> list[int]:  # (x, pid, row) elements
            parts = [batches.local_batch(step, r, world_size)[0] for r in range(world_size)]
            return [int(x) for p in parts for x in p]

        for step in range(saves.ELEMENTS // 24):
            read[step] = [xs(step, 1), xs(step, 2), xs(step, 3)]
            if step == 3:
                read[-1] = [[int(is_finished(path))]]
                early.set()

    with ServiceProcesses() as cluster:
        config = service.DispatcherConfig(
            port=cluster.port, worker_timeout_ms=1000, job_gc_check_interval_ms=100
        )
        with service.DispatchServer(config):
            names = [cluster.start_worker() for _ in range(2)]
            service.distributed_save(saves.dataset(marker), path, cluster.address)
            reader = threading.Thread(target=trainers, daemon=True)
            reader.start()
            assert early.wait(90), "the trainers read the first global batches"
            killed = saves.kill_mid_chunk(cluster, names, marker)
            reader.join(120)
            assert not reader.is_alive()
            saves.wait_until(lambda: is_finished(path), 60, "the save finishes")
    assert read.pop(-1) == [[0]]  # the first four were read while the save ran
    for step, ways in read.items():
        assert ways == [list(range(step * 24, step * 24 + 24))] * 3, step
    found = saves.saved(path)
    saves.check_exactly_once(found)
    assert {pid for x, pid in found if 100 <= x < 116} == {killed}  # its chunk stayed
    assert killed not in {pid for x, pid in found if 116 <= x < 120}


# -- worker processes under the elastic strategy --------------------------------------------


def _committed(directory: Path) -> dict[int, list[int]]:
    """Per step, the global batch the workers trained on; every worker that logged a step
    (a step redone after a change included) logged the same one."""
    steps: dict[int, list[int]] = {}
    for logged in elastic_job.logged_steps(directory).values():
        for step, ids in logged:
            assert steps.setdefault(step, ids) == ids, f"step {step} trained on two batches"
    return steps


def _digest(steps: dict[int, list[int]], count: int) -> str:
    return hashlib.sha256(json.dumps([steps[s] for s in range(count)]).encode()).hexdigest()


@pytest.mark.timeout(400)  # worker interpreters importing torch on a loaded machine
def test_one_two_and_three_workers_commit_the_same_global_batches_through_a_kill(
    tmp_path: Path,
) -> None:
    """A job of 1 worker, one of 2, and one of 3 workers of which one is killed with kill -9
    and a new one joins: every step that committed trained on the same global batch in all
    three, the function of the data that a single reader gives. (Reads by index; those of a
    stream follow the group in the same way: ``INPUT=stream`` passes too, left out for time.)"""
    kind = "rows"
    stores = {job: serve_membership_store("127.0.0.1", 0) for job in ("one", "two", "three")}
    envs = {
        job: elastic_job.job_env(tmp_path / job, store.port, INPUT=kind)
        for job, store in stores.items()
    }
    groups = {
        "one": [("a0", envs["one"])],
        "two": [("b0", envs["two"]), ("b1", envs["two"])],
        "three": [("c0", envs["three"]), ("c1", envs["three"]), ("c2", envs["three"])],
    }
    jobs = {job: Processes(WORKER, members, timeout=300) for job, members in groups.items()}
    three = tmp_path / "three"
    with jobs["one"] as one, jobs["two"] as two, jobs["three"] as workers:
        _wait(
            "three workers training together",
            lambda: all(
                _progress(three, n)["world"] == 3 and _progress(three, n)["step"] >= 8
                for n in ("c0", "c1", "c2")
            ),
            [one, two, workers],
        )
        workers.send("c2", signal.SIGKILL)
        killed_at = max(_progress(three, n)["step"] for n in ("c0", "c1"))
        _wait(
            "the survivors training on",
            lambda: all(_progress(three, n)["step"] >= killed_at + 8 for n in ("c0", "c1")),
            [workers],
        )
        with Processes(WORKER, [("c3", envs["three"])], timeout=300) as joiner:
            _wait(
                "the joiner training with them, and the other jobs as far",
                lambda: (
                    _progress(three, "c3")["world"] == 3
                    and _progress(three, "c3")["step"] >= killed_at + 16
                    and _progress(tmp_path / "one", "a0")["step"] >= killed_at + 16
                    and _progress(tmp_path / "two", "b0")["step"] >= killed_at + 16
                ),
                [one, two, workers, joiner],
            )
            for job in stores:
                (tmp_path / job / "stop").write_text("")
            joined = joiner.wait()
        finished = {**one.wait(), **two.wait(), **workers.wait()}
    results = {n: p.result for n, p in {**finished, **joined}.items() if n != "c2"}
    assert all(r is not None for r in results.values()), "".join(
        p.describe() for p in [*finished.values(), *joined.values()]
    )
    done = {
        "one": _committed(tmp_path / "one"),
        "two": _committed(tmp_path / "two"),
        "three": _committed(three),
    }
    for job, steps in done.items():  # no step skipped: 0, 1, ... up to the last
        assert sorted(steps) == list(range(len(steps))), (job, sorted(steps))
    shortest = min(len(steps) for steps in done.values())
    assert shortest >= killed_at + 16
    reference = elastic_job.reference_batches(kind, shortest)
    for job, steps in done.items():
        assert [steps[s] for s in range(shortest)] == reference, job
    assert len({_digest(steps, shortest) for steps in done.values()}) == 1
    # the joiner started at the group's step, not at 0, and every worker ended at one step
    assert results["c3"]["batches_step"] == results["c0"]["batches_step"] > killed_at
