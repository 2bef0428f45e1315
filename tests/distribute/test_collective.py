"""Tests of feedline/distribute/collective.py under torchrun's elastic agents: workers whose
agents joined the rendezvous in different rounds (and so count different restarts) meet in one
process group, and see each other's heartbeats.

torch's own agents hang when a node joins a later round while they share their rendezvous store
with the workers (pytorch#135712): the agents run as ``feedline torchrun``, which turns the
sharing off, and a worker of torchrun's agents says so where it may happen
(``shared_store_warning``); the workers' meeting in a shared agent store (one agent, restarted)
is what test_shared_service_jobs.py and train/test_backup_and_restore.py run."""

from __future__ import annotations

import datetime
import pathlib
import threading

import pytest
import torch.distributed as dist

from feedline.cli._torchrun import SHARE_STORE_VARIABLE
from feedline.distribute.collective import _meeting_generation
from feedline.errors import UnavailableError
from tests.launcher import Processes, Torchrun, free_port

pytestmark = pytest.mark.timeout(180)

_WORKER = """
import os, pathlib, sys, time
from tests.launcher import report

folder = pathlib.Path(sys.argv[1])
restarts = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if os.environ.get("FAIL_ONCE") and restarts == 0:
    sys.exit(3)                        # this agent restarts its worker: one restart counted
if os.environ["WORLD_SIZE"] == "1":
    (folder / "alone").write_text(str(restarts))
    time.sleep(120)                    # until the other node joins and the agent restarts it
    sys.exit(4)
import torch
import feedline.distribute as fdist
strategy = fdist.MultiWorkerMirroredStrategy(
    communication_options=fdist.experimental.CommunicationOptions(timeout_seconds=30))
total = strategy.reduce("SUM", strategy.run(lambda: torch.tensor(1.0)), axis=None)
rank = strategy.extended.worker_index
time.sleep(2.5)                        # a heartbeat a second
heartbeats = fdist.collective.active()._store
report({"restarts": restarts, "sum": float(total), "rank": rank,
        "peer_beats": bool(heartbeats.check([str(1 - rank)]))})
fdist.collective.active().barrier()   # neither ends before the other read its beat
"""


def test_agents_that_joined_in_different_rounds_meet(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `feedline torchrun` sets the variable: with torch's default the second node's agent
    # waits for ever for the first round's store (pytorch#135712).
    monkeypatch.delenv(SHARE_STORE_VARIABLE, raising=False)
    port = free_port()

    def node(name: str, env: dict[str, str]) -> Processes:
        return Processes(
            _WORKER,
            [(name, env)],
            argv=[str(tmp_path)],
            torchrun=Torchrun(
                nproc_per_node=1, max_restarts=3, port=port, nnodes="1:2", launcher="feedline"
            ),
            timeout=150,
        )

    with node("first", {"FAIL_ONCE": "1"}) as first:
        first.wait_for(tmp_path / "alone", timeout=90)  # round 1, alone, after one restart
        with node("second", {}) as second:  # joins in a later round: no restart counted
            results = {**first.wait(), **second.wait()}
            reports = [*first.reports().values(), *second.reports().values()]
            logs = [*first.worker_outputs("first", "stderr").values()]
            logs += second.worker_outputs("second", "stderr").values()
    assert all(r.returncode == 0 for r in results.values()), [
        r.describe() for r in results.values()
    ]
    assert sorted((r["rank"], r["sum"], r["peer_beats"]) for r in reports) == [
        (0, 2.0, True),
        (1, 2.0, True),
    ]
    assert sorted(r["restarts"] for r in reports) == [0, 1]
    # Their store was not shared: no worker warned of it.
    assert len(logs) >= 2 and not any("pytorch#135712" in log for log in logs)


_WARNS = """
import feedline.distribute as fdist
from tests.launcher import report
strategy = fdist.MultiWorkerMirroredStrategy(
    communication_options=fdist.experimental.CommunicationOptions(timeout_seconds=30))
report({"workers": strategy.num_replicas_in_sync})
"""


def test_a_worker_of_agents_that_share_their_store_says_a_later_node_would_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SHARE_STORE_VARIABLE, raising=False)
    torchrun = Torchrun(nproc_per_node=1, max_restarts=1, port=free_port(), nnodes="1:2")
    with Processes(_WARNS, [("node", {})], torchrun=torchrun, timeout=90) as node:
        result = node.wait()["node"]
        assert result.returncode == 0, result.describe()
        assert [*node.reports().values()] == [{"workers": 1}]
        (log,) = node.worker_outputs("node", "stderr").values()
    assert "pytorch#135712" in log and "feedline torchrun" in log, log


def test_each_start_of_a_group_meets_under_one_generation_in_a_store_that_outlives_it() -> None:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def start(world_size: int, ranks: range) -> dict[int, int]:
        """The generation each rank of ``ranks`` learns (one thread per worker)."""
        got: dict[int, int] = {}

        def worker(rank: int) -> None:
            store = dist.TCPStore(
                "127.0.0.1", server.port, is_master=False,
                timeout=datetime.timedelta(seconds=10),
            )  # fmt: skip
            got[rank] = _meeting_generation(store, rank, world_size, timeout_s=10)

        threads = [threading.Thread(target=worker, args=(r,)) for r in ranks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        return got

    first = start(3, range(3))
    # A later start, in the same store, whose workers come in any order (the keys of the
    # first start are still there): one new generation for all.
    second = start(2, range(1, -1, -1))
    assert len(set(first.values())) == 1 and len(set(second.values())) == 1
    assert second[0] == first[0] + 1
    # A worker whose rank 0 never comes waits no longer than its timeout.
    store = dist.TCPStore("127.0.0.1", server.port, is_master=False)
    with pytest.raises(UnavailableError, match=r"worker 0 of this start .* did not answer"):
        _meeting_generation(store, 1, 2, timeout_s=0.5)
