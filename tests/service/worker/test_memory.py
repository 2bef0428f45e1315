"""A worker's buffers share one bound (``WorkerConfig.buffer_memory_bytes``,
``feedline worker --buffer-memory-mib``): many stalled jobs cost it no more than that, with a
``feedline worker`` process and consumers that stop reading."""

from __future__ import annotations

import time

import numpy as np
import pytest

from feedline import errors, service
from feedline.data import Dataset
from feedline.service import distribute
from tests.service.procs import ServiceProcesses

pytestmark = pytest.mark.timeout(180)

MIB = 1 << 20


def test_the_buffer_memory_bound_is_checked() -> None:
    config = service.WorkerConfig("localhost:1")
    assert config.buffer_memory_bytes == 256 * MIB
    with pytest.raises(errors.InvalidArgumentError, match="buffer_memory_bytes"):
        service.WorkerConfig("localhost:1", buffer_memory_bytes=0)
    with pytest.raises(errors.InvalidArgumentError, match="buffer_memory_bytes"):
        service.WorkerConfig("localhost:1", buffer_memory_bytes=1.5)  # type: ignore[arg-type]


def test_many_stalled_jobs_stay_within_the_workers_buffer_memory() -> None:
    bound_mib, jobs = 48, 8
    with ServiceProcesses() as cluster:
        cluster.start_dispatcher()
        worker = cluster.start_worker("--buffer-memory-mib", str(bound_mib))
        time.sleep(1.0)
        before = cluster.rss_bytes(worker, shared=False)
        iterators = []
        for job in range(jobs):  # 1 MiB elements; each consumer reads one, then stops
            dataset = Dataset.range(10**6).map(
                lambda i, job=job: np.full(MIB, (i + job) % 251, np.uint8)
            )
            iterator = iter(dataset.apply(distribute("parallel_epochs", cluster.target)))
            assert next(iterator).nbytes == MIB
            iterators.append(iterator)
        # The producers fill what they may: wait until the worker's memory stops growing.
        # Its own memory: the consumers' shared-memory arenas it maps are theirs.
        readings = [cluster.rss_bytes(worker, shared=False)]
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            time.sleep(0.5)
            readings.append(cluster.rss_bytes(worker, shared=False))
            if len(readings) > 6 and max(readings[-6:]) - min(readings[-6:]) < 4 * MIB:
                break
        grown = (max(readings) - before) / MIB
        for iterator in iterators:
            iterator.close()
        assert cluster.alive(worker)
    # The bound, an element in flight per task, and what 8 tasks cost besides their buffers:
    # their threads and what the allocator keeps of freed 1 MiB elements, 33-85 MiB measured
    # (a growth of 89-141 MiB, the most in a full run); without one bound: 8 x 64 MiB.
    assert grown < bound_mib + jobs + 120, f"the worker grew by {grown:.0f} MiB"
