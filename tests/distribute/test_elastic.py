"""Elastic ``MultiWorkerMirroredStrategy``: real worker processes on 127.0.0.1, a real
membership store, real ``kill -9``.

The rounds of the membership protocol are tested in this process (threads meeting in a real
``TCPStore``); the strategy with worker processes that run ``tests/distribute/elastic_job.py``.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from feedline.distribute.elastic import ElasticClusterResolver, Rounds, serve_membership_store
from feedline.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from tests.distribute.elastic_job import job_env
from tests.distribute.elastic_job import read_progress as _progress
from tests.launcher import Processes

WORKER = """
import os
from tests.launcher import report
from tests.distribute.elastic_job import main
report(main(os.environ["FEEDLINE_TEST_NAME"]))
"""


@pytest.fixture
def store() -> Any:
    served = serve_membership_store("127.0.0.1", 0)
    yield served
    del served


def _resolver(store: Any, **kwargs: Any) -> ElasticClusterResolver:
    kwargs.setdefault("timeout_seconds", 10.0)
    return ElasticClusterResolver(f"127.0.0.1:{store.port}", **kwargs)


# -- the rounds, in this process -------------------------------------------------------------
def test_round_ranks_by_committed_steps_then_arrival(store: Any) -> None:
    offers = {"a": 3, "b": 5, "c": -1}
    found: dict[str, Any] = {}

    def meet(name: str) -> None:
        rounds = Rounds(_resolver(store, min_workers=3, settle_seconds=0.1))
        found[name] = (rounds.id, rounds.meet(None, offers[name]))

    threads = [threading.Thread(target=meet, args=(n,)) for n in offers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    generations = {name: gen for name, (_, gen) in found.items()}
    assert {g.number for g in generations.values()} == {1}
    members = generations["a"].members
    assert [m.committed for m in members] == [5, 3, -1]  # rank 0 has the most steps
    assert {name: gen.rank for name, gen in generations.items()} == {"b": 0, "a": 1, "c": 2}
    assert len({g.lineage for g in generations.values()}) == 1


def test_a_worker_of_another_lineage_is_refused(store: Any) -> None:
    first = Rounds(_resolver(store))
    first.meet(None, 0)
    stranger = Rounds(_resolver(store, lineage="another-run"))
    with pytest.raises(FailedPreconditionError, match="belongs to run another-run"):
        stranger.meet(None, 7)


def test_fewer_than_min_workers_fail_after_the_timeout(store: Any) -> None:
    rounds = Rounds(_resolver(store, min_workers=2, timeout_seconds=0.5))
    with pytest.raises(UnavailableError, match=r"1 worker\(s\) met within 0\.5 s, fewer than "):
        rounds.meet(None, 0)


def test_an_unreachable_store_fails_within_the_timeout() -> None:
    from tests.launcher import free_port

    with pytest.raises(UnavailableError, match="feedline membership-store"):
        Rounds(ElasticClusterResolver(f"127.0.0.1:{free_port()}", timeout_seconds=0.5))


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="host:port"):
        ElasticClusterResolver("nowhere")
    with pytest.raises(InvalidArgumentError, match="min_workers"):
        ElasticClusterResolver("127.0.0.1:1", min_workers=3, max_workers=2)


# -- the strategy, in worker processes ---------------------------------------------------------
def _wait(what: str, ready: Any, procs: list[Processes], timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not ready():
        for group in procs:
            failed = [n for n in group.names if group.poll(n) not in (None, 0, -9)]
            assert not failed, f"{failed} failed while waiting for {what}:\n{group._dump()}"
        assert time.monotonic() < end, f"timed out waiting for {what}:\n" + "".join(
            g._dump() for g in procs
        )
        time.sleep(0.05)


def _flat(result: dict[str, Any], key: str) -> np.ndarray:
    return np.concatenate([np.asarray(p, dtype=np.float64) for p in result[key]])


@pytest.mark.timeout(300)  # three interpreters importing torch on a loaded machine
@pytest.mark.parametrize("loop", ["hand", "backup"])
def test_survivors_keep_their_state_and_a_joiner_gets_it(
    store: Any, tmp_path: Path, loop: str
) -> None:
    """kill -9 one of three workers: the two others keep their processes and go on; then a
    new worker joins, gets the parameters and the optimizer state by broadcast, and all three
    end with equal parameters. ``hand``: the hand-written loop that catches
    ``MembershipChangedError``; ``backup``: ``BackupAndRestore.run``."""
    env = job_env(tmp_path, store.port, LOOP=loop, MIN_WORKERS="2")
    names = ["w0", "w1", "w2"]
    with Processes(WORKER, [(n, {}) for n in names], env=env, timeout=240) as workers:
        pids = {n: workers.pid(n) for n in names}
        _wait(
            "three workers training together",
            lambda: all(
                _progress(tmp_path, n)["world"] == 3 and _progress(tmp_path, n)["step"] >= 10
                for n in names
            ),
            [workers],
        )
        workers.send("w2", signal.SIGKILL)
        killed_at = max(_progress(tmp_path, n)["step"] for n in names)
        _wait(
            "the two survivors training on",
            lambda: all(
                _progress(tmp_path, n)["world"] == 2
                and _progress(tmp_path, n)["step"] >= killed_at + 10
                for n in ("w0", "w1")
            ),
            [workers],
        )
        with Processes(WORKER, [("j3", {"SEED": "7"})], env=env, timeout=240) as joiner:
            _wait(
                "the joiner training with them",
                lambda: (
                    _progress(tmp_path, "j3")["world"] == 3
                    and _progress(tmp_path, "j3")["step"] >= _progress(tmp_path, "w0")["step"] - 1
                    and _progress(tmp_path, "j3")["step"] >= killed_at + 20
                ),
                [workers, joiner],
            )
            (tmp_path / "stop").write_text("")
            joined = joiner.wait()
        finished = workers.wait()
    results = {n: finished[n].result for n in ("w0", "w1")} | {"j3": joined["j3"].result}
    assert all(r is not None for r in results.values()), "".join(
        p.describe() for p in [*finished.values(), *joined.values()]
    )
    # the survivors are the processes that started: they kept model and optimizer in memory
    assert {n: results[n]["pid"] for n in ("w0", "w1")} == {n: pids[n] for n in ("w0", "w1")}
    if loop == "hand":
        _check_changes(results)
    else:  # every run call counts one step (a worker that joined starts at the group's count)
        for name in ("w0", "w1"):
            result = results[name]
            assert result["calls"] == result["step"] - result["first_step"], result
            assert len(results[name]["generations"]) >= 3  # lost w2, then j3 joined
    steps = {n: r["step"] for n, r in results.items()}
    assert len(set(steps.values())) == 1, steps
    assert steps["w0"] >= killed_at + 20  # the survivors never went back to step 0
    reference = _flat(results["w0"], "params")
    for name in ("w1", "j3"):
        np.testing.assert_allclose(_flat(results[name], "params"), reference, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(
            _flat(results[name], "moments"), _flat(results["w0"], "moments"), rtol=1e-6, atol=1e-9
        )


def _check_changes(results: dict[str, Any]) -> None:
    for name in ("w0", "w1"):
        changes = results[name]["changes"]
        reasons = [c["reason"] for c in changes]
        # the kill, and (on a machine so loaded that a heartbeat stalls past 3 s) possibly
        # a live peer taken for lost: an extra change, which must cost no more
        assert reasons.count("peer_lost") >= 1, changes
        # at most the step in flight is lost: the group agrees on the step this worker was
        # at, or one more (the step it failed in was committed elsewhere)
        for change in changes:
            assert change["agreed"] - change["mine"] in (-1, 0, 1), change
        assert results[name]["failures"] == len(changes)
    assert results["j3"]["changes"] == []
    assert results["j3"]["world_size"] == 3


@pytest.mark.timeout(300)
def test_a_member_lost_while_the_group_forms_makes_the_others_meet_again(
    store: Any, tmp_path: Path
) -> None:
    """A member that arrived in the round is gone before the group formed (here one that met
    in this process, then stopped its heartbeat and never formed anything, as a process killed
    at that moment): the workers of that generation meet again without it once its heartbeat is
    silent, instead of waiting for it until the group's timeout and failing, and train on."""
    # It waits for the workers' interpreters to import torch, however loaded the machine.
    ghost = Rounds(_resolver(store, min_workers=2, settle_seconds=0.3, timeout_seconds=120))
    met: list[Any] = []

    def arrive_and_vanish() -> None:
        met.append(ghost.meet(None, -1))
        ghost.stop()

    thread = threading.Thread(target=arrive_and_vanish, daemon=True)
    thread.start()  # first in round 1: the round closes with it and the first worker
    env = job_env(
        tmp_path,
        store.port,
        LOOP="hand",
        MIN_WORKERS="2",
        ELASTIC_TIMEOUT="45",  # waiting for the lost member would end them after 45 s
    )
    with Processes(WORKER, [("w0", {}), ("w1", {})], env=env, timeout=240) as workers:
        _wait(
            "the two workers training together",
            lambda: all(
                _progress(tmp_path, n)["world"] == 2 and _progress(tmp_path, n)["step"] >= 10
                for n in ("w0", "w1")
            ),
            [workers],
        )
        (tmp_path / "stop").write_text("")
        finished = workers.wait()
    thread.join(10)
    assert met and met[0].number == 1 and met[0].world_size >= 2  # it was a member
    assert all(r.ok and r.result is not None for r in finished.values()), "".join(
        r.describe() for r in finished.values()
    )
    steps = {n: r.result["step"] for n, r in finished.items()}
    assert len(set(steps.values())) == 1, steps
