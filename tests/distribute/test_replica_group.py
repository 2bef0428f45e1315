"""Tests of feedline/distribute/_replica_group.py: local replicas hand over at collectives, one
at a time, and a failure or a mismatch in one replica ends the run in every replica."""

from __future__ import annotations

import threading
import time
import traceback

import pytest
import torch

import feedline.distribute as fdist
from feedline.errors import FailedPreconditionError

# Every run below must end by itself well within this (a hang fails the test instead).
pytestmark = pytest.mark.timeout(60)


def _strategy(replicas: int = 2) -> fdist.MirroredStrategy:
    return fdist.MirroredStrategy([f"cpu:{i}" for i in range(replicas)])


def _context() -> fdist.ReplicaContext:
    context = fdist.get_replica_context()
    assert context is not None
    return context


def _replica_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("feedline-replica-")]


def test_a_function_without_collectives_runs_every_replica_in_the_callers_thread() -> None:
    threads = _strategy(3).run(lambda: threading.get_ident())
    assert set(threads.values) == {threading.get_ident()}


def test_with_collectives_replicas_run_one_at_a_time_in_replica_order() -> None:
    strategy = _strategy(3)
    events: list[tuple[int, str]] = []
    running = []

    def step() -> int:
        context = _context()
        replica = context.replica_id_in_sync_group
        for phase in range(3):
            running.append(replica)
            assert len(running) == 1, running  # no other replica runs meanwhile
            events.append((replica, f"phase {phase}"))
            time.sleep(0.01)
            running.remove(replica)
            context.all_reduce("SUM", torch.tensor(1.0))
        return threading.get_ident()

    threads = strategy.run(step).values
    assert events == [(r, f"phase {p}") for p in range(3) for r in range(3)]
    assert threads[0] == threading.get_ident()  # replica 0 stays in the caller's thread
    assert len(set(threads)) == 3
    for _ in range(100):  # the replica threads end with the run
        if not _replica_threads():
            break
        time.sleep(0.05)
    assert not _replica_threads()


def test_the_callers_autograd_and_autocast_modes_hold_in_every_replica() -> None:
    def step() -> bool:
        _context().all_reduce("SUM", torch.tensor(1.0))
        return torch.is_grad_enabled()

    with torch.no_grad():
        assert _strategy().run(step) is False  # the same object on both replicas: returned once
    assert _strategy().run(step) is True

    def autocast_step() -> tuple[bool, torch.dtype]:
        _context().all_reduce("SUM", torch.tensor(1.0))
        return torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")

    strategy = _strategy()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        modes = strategy.experimental_local_results(strategy.run(autocast_step))
    assert modes == ((True, torch.bfloat16),) * 2


def _raise_in_replica_1() -> None:
    context = _context()
    context.all_reduce("SUM", torch.tensor(1.0))
    if context.replica_id_in_sync_group == 1:
        raise KeyError("replica 1 lost its key")
    context.all_reduce("SUM", torch.tensor(1.0))  # replica 0 waits here when 1 fails


def test_an_exception_in_one_replica_surfaces_with_its_traceback_and_unwinds_the_others() -> None:
    strategy = _strategy(3)
    unwound = []

    def step() -> None:
        try:
            _raise_in_replica_1()
        finally:
            unwound.append(_context().replica_id_in_sync_group)

    with pytest.raises(KeyError, match="replica 1 lost its key") as raised:
        strategy.run(step)
    frames = [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)]
    assert "_raise_in_replica_1" in frames  # the failing replica's own frames
    assert "(raised in replica 1 of strategy.run)" in raised.value.__notes__
    assert sorted(unwound) == [0, 1, 2]  # replica 0 waited at a collective, 2 at its first
    for _ in range(100):
        if not _replica_threads():
            break
        time.sleep(0.05)
    assert not _replica_threads()
    # the next run starts clean
    assert strategy.run(lambda: _context().all_reduce("SUM", torch.tensor(1.0))).values[1] == 3


def test_an_exception_in_replica_0_unwinds_the_waiting_replicas() -> None:
    strategy = _strategy(2)
    unwound = []

    def step() -> None:
        context = _context()
        try:
            context.all_reduce("SUM", torch.tensor(1.0))
            if context.replica_id_in_sync_group == 0:
                raise RuntimeError("replica 0 broke")
            context.all_reduce("SUM", torch.tensor(1.0))
        except Exception:  # the abort of a waiting replica is no Exception to catch
            unwound.append("caught")
            raise
        finally:
            unwound.append(context.replica_id_in_sync_group)

    with pytest.raises(RuntimeError, match="replica 0 broke"):
        strategy.run(step)
    assert unwound == ["caught", 0, 1]


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        (
            {0: [("all_reduce", "SUM")], 1: [("all_gather", 0)]},
            r"replica 0 called all_reduce\(<ReduceOp.SUM.*collective #1, but replica 1 "
            r"called all_gather\(0",
        ),
        (
            {0: [("all_reduce", "SUM")], 1: [("all_reduce", "MEAN")]},
            r"replica 1 called all_reduce\(<ReduceOp.MEAN",
        ),
        (
            {0: [("all_reduce", "SUM"), ("all_reduce", "SUM")], 1: [("all_reduce", "SUM")]},
            r"replica 1 returned after 1 collectives, but replica 0 waits in all_reduce",
        ),
        (
            {0: [("all_reduce", "SUM")], 1: [("all_reduce", "SUM"), ("all_gather", 0)]},
            r"replica 1 called all_gather.*#2\), but replica 0 returned after 1 collectives",
        ),
        ({0: [], 1: [("all_reduce", "SUM")]}, r"but replica 0 returned without calling it"),
    ],
    ids=["kinds", "ops", "fewer", "more", "none-in-0"],
)
def test_collectives_that_differ_across_replicas_are_an_error_not_a_hang(
    calls: dict[int, list[tuple[str, object]]], message: str
) -> None:
    def step() -> None:
        context = _context()
        for name, arg in calls[context.replica_id_in_sync_group]:
            if name == "all_reduce":
                context.all_reduce(arg, torch.tensor([1.0]))
            else:
                context.all_gather(torch.tensor([1.0]), axis=arg)  # type: ignore[arg-type]

    with pytest.raises(FailedPreconditionError, match=message):
        _strategy(2).run(step)


def test_structures_that_differ_across_replicas_are_an_error() -> None:
    def step() -> None:
        context = _context()
        value = torch.tensor(1.0)
        context.all_reduce("SUM", [value] * (context.replica_id_in_sync_group + 1))

    with pytest.raises(FailedPreconditionError, match=r"same reduce op and structure"):
        _strategy(2).run(step)
