"""Tests of feedline/service/ledger.py: the split ledger of exactly-once DYNAMIC jobs (open,
done and replayed splits), the consumer's receipts, and the ledger through the dispatcher's
state updates and snapshots."""

from __future__ import annotations

import doctest
import json
import random

import pytest

from feedline.errors import InvalidArgumentError
from feedline.service import ledger as ledger_module
from feedline.service.dispatcher import state as st
from feedline.service.ledger import (
    Receipts,
    Returned,
    SplitLedger,
    add_ranges,
    check_report,
    contains,
    covers,
    ranges_of,
    tag_ranges,
)


def test_ranges_merge_and_answer_membership() -> None:
    rng = random.Random(0)
    offsets = {rng.randrange(200) for _ in range(150)}
    ranges = ranges_of(offsets)
    assert all(a < b for a, b in ranges)
    assert all(ranges[i][1] < ranges[i + 1][0] for i in range(len(ranges) - 1))  # disjoint, apart
    assert {o for o in range(200) if contains(ranges, o)} == offsets
    assert add_ranges([[0, 3]], [[3, 5], [9, 10]]) == [[0, 5], [9, 10]]
    assert covers([[0, 5]], 5) and not covers([[0, 4]], 5) and not covers([[1, 5]], 5)
    assert covers([], 0)


@pytest.mark.parametrize("seed", range(5))
def test_tag_ranges_are_each_splits_offsets_in_whatever_order_they_come(seed: int) -> None:
    # A step's tags: runs of consecutive offsets from replies of several splits, interleaved;
    # an aborted step's elements come again first, so a split's runs may also go backwards.
    rng = random.Random(seed)
    tags = [[key, offset] for key in range(3) for offset in range(0, 400, rng.choice((1, 2)))]
    runs = [tags[i : i + rng.randrange(1, 60)] for i in range(0, len(tags), 60)]
    rng.shuffle(runs)
    tags = [tag for run in runs for tag in run]
    expected = [[key, ranges_of(o for k, o in tags if k == key)] for key in range(3)]
    assert tag_ranges(tags) == expected
    assert tag_ranges([]) == []


def test_receipts_drop_what_was_received_and_report_only_news() -> None:
    receipts = Receipts()
    rng = random.Random(1)
    seen: set[tuple[int, int]] = set()
    for _ in range(2000):
        key, offset = rng.randrange(4), rng.randrange(300)
        assert receipts.take(key, offset) == ((key, offset) not in seen)
        seen.add((key, offset))
    report = dict((key, ranges) for key, ranges in receipts.report())
    for key in range(4):
        assert report[key] == ranges_of(o for k, o in seen if k == key)
    assert receipts.report() == [] and not receipts.unreported()
    receipts.take(9, 0)
    assert [key for key, _ in receipts.report()] == [9]
    assert sorted(key for key, _ in receipts.report(everything=True)) == [0, 1, 2, 3, 9]
    receipts.forget([9])
    assert not receipts.take(9, 1)  # a done split: anything of it that comes is a duplicate


def test_receipts_in_order_extend_the_last_range_and_out_of_order_find_their_place() -> None:
    receipts = Receipts()
    assert all(receipts.take(0, offset) for offset in range(5))
    assert not receipts.take(0, 4) and not receipts.take(0, 0)
    assert receipts.take(0, 9) and receipts.take(0, 10)
    assert receipts.take(0, 6) and receipts.take(0, 5) and not receipts.take(0, 10)
    assert receipts.take(0, 8) and receipts.take(0, 7)
    assert receipts.report() == [[0, [[0, 11]]]]


@pytest.mark.parametrize("seed", range(5))
def test_tags_taken_a_reply_at_a_time_are_what_taking_each_gives(seed: int) -> None:
    # Replies as workers send them: runs of consecutive offsets of a split, from several splits
    # at once, with replays (offsets sent again, some received and some not) and a split done.
    rng = random.Random(seed)
    cursors = dict.fromkeys(range(6), 0)
    replies: list[list[list[int]]] = []
    for _ in range(300):
        tags: list[list[int]] = []
        for _ in range(rng.randrange(1, 4)):
            key = rng.randrange(6)
            start = cursors[key]
            if start and rng.random() < 0.3:  # sent again: from anywhere, or just before
                start = rng.choice((rng.randrange(start), start - 1, max(0, start - 2)))
            count = rng.randrange(1, 40)
            tags += [[key, offset] for offset in range(start, start + count)]
            cursors[key] = max(cursors[key], start + count + rng.choice((0, 0, 3)))
        replies.append(tags)
    by_run, by_tag = Receipts(), Receipts()
    returned_by_run, returned_by_tag = Returned(), Returned()
    for number, tags in enumerate(replies):
        kept = by_run.take_tags(tags)
        assert kept == [by_tag.take(key, offset) for key, offset in tags]
        returned_by_run.take_tags([tag for tag, k in zip(tags, kept, strict=True) if k])
        for (key, offset), k in zip(tags, kept, strict=True):
            if k:
                returned_by_tag.take(key, offset)
        if number == 150:
            by_run.forget([2])
            by_tag.forget([2])
    assert by_run.report(everything=True) == by_tag.report(everything=True)
    assert returned_by_run.position() == returned_by_tag.position()
    assert by_run.take_tags([]) == []


def test_a_split_is_done_once_its_count_is_known_and_covered() -> None:
    ledger = SplitLedger()
    ledger.grant(0, task_id=1)
    ledger.receive(0, [[0, 3]])
    assert 0 in ledger.open  # the count is not known yet: more may come
    ledger.count(0, 5)
    ledger.receive(0, [[4, 5]])
    assert 0 in ledger.open
    ledger.receive(0, [[3, 4]])
    assert ledger.done == {0: 5} and ledger.settled
    ledger.grant(8, task_id=1)
    ledger.count(8, 0)  # a split whose elements were all filtered out
    assert ledger.done == {0: 5, 8: 0}


def test_a_lost_workers_splits_are_replayed_only_after_every_consumer_closed_it() -> None:
    ledger = SplitLedger()
    ledger.grant(0, task_id=1)
    ledger.grant(4, task_id=2)
    ledger.receive(0, [[0, 2]])
    ledger.holder_lost(1, consumers=[10, 11])
    assert ledger.replay == [] and not ledger.settled
    ledger.closed(10, [1])
    assert ledger.replay == []  # consumer 11 may still hold offsets it did not report
    assert ledger.awaits(11, 1) and not ledger.awaits(10, 1)
    ledger.receive(0, [[2, 3]])
    ledger.closed(11, [1])
    assert ledger.replay == [0]
    ledger.regrant(0, task_id=2)
    assert ledger.replay == [] and ledger.open[0].delivered == [[0, 3]]
    assert ledger.holds(2) == [0, 4]


def test_a_split_keeps_the_first_version_pinned_through_a_replay_and_the_journal() -> None:
    state, job_id, task_id, client_id = _split_handed_out()
    pin = st.PinSplitVersion(job_id, 0, "s3://b/a", '"e1"')
    state.apply(st.update_from_json(json.loads(json.dumps(st.update_to_json(pin)))))
    state.apply(st.PinSplitVersion(job_id, 0, "s3://b/a", '"e2"'))  # the first one stays
    state.apply(st.PinSplitVersion(job_id, 6, "s3://b/z", '"e3"'))  # not open: nothing
    ledger = state.ledgers[job_id]
    assert (ledger.pinned(0, "s3://b/a"), ledger.pinned(0, "s3://b/b")) == ('"e1"', None)
    assert ledger.pinned(6, "s3://b/z") is None
    state.apply(st.RemoveWorker("w:1"))
    state.apply(st.ReportSplits(job_id, client_id, [], [task_id]))
    copy = st.state_from_json(json.loads(json.dumps(st.state_to_json(state))))
    assert copy.ledgers[job_id].replay == [0]
    assert copy.ledgers[job_id].open[0].versions == {"s3://b/a": '"e1"'}


def test_a_consumer_that_leaves_is_not_waited_for() -> None:
    ledger = SplitLedger()
    ledger.grant(0, task_id=1)
    ledger.holder_lost(1, consumers=[10])
    ledger.client_gone(10)
    assert ledger.replay == [0]
    ledger.holder_lost(3, consumers=[])  # a task that held nothing
    assert ledger.replay == [0]


def test_a_split_done_while_it_waited_is_not_replayed() -> None:
    ledger = SplitLedger()
    ledger.grant(0, task_id=1)
    ledger.count(0, 2)
    ledger.holder_lost(1, consumers=[10])
    ledger.receive(0, [[0, 2]])  # the consumer's report with its closure covers the split
    ledger.closed(10, [1])
    assert ledger.replay == [] and ledger.done == {0: 2} and ledger.settled


def test_reports_are_checked() -> None:
    assert check_report([[3, [[0, 2]]]], [7]) == ([(3, [[0, 2]])], [7])
    for received, closed in [
        ("x", []),
        ([[3]], []),
        ([[3, [[0]]]], []),
        ([[3, [[-1, 2]]]], []),
        ([], ["a"]),
    ]:
        with pytest.raises(InvalidArgumentError, match="malformed request"):
            check_report(received, closed)


def _exactly_once_job(state: st.DispatcherState) -> int:
    job_id = state.new_id()
    state.apply(st.CreateJob(job_id, "d", 3, None, 0, None, "ANY", exactly_once=True))
    return job_id


def _split_handed_out() -> tuple[st.DispatcherState, int, int, int]:
    """A dispatcher's state with an exactly-once job, its task on worker ``w:1``, a consumer,
    and split 0 handed out to the task: (state, job, task, consumer)."""
    state = st.DispatcherState(incarnation=5)
    state.apply(st.RegisterWorker("w:1"))
    job_id = _exactly_once_job(state)
    task_id = state.new_id()
    state.apply(st.CreateTask(task_id, job_id, "w:1", 0, 1))
    client_id = state.new_id()
    state.apply(st.AcquireClient(client_id, job_id))
    cursor = {"num_units": 10, "split_size": 2, "position": 0, "seed": None}
    state.apply(st.MoveSplitCursor(job_id, 0, dict(cursor, position=2), task_id, 0, cursor))
    return state, job_id, task_id, client_id


def test_the_ledger_follows_the_state_updates_and_survives_a_snapshot() -> None:
    state, job_id, task_id, client_id = _split_handed_out()
    assert state.ledgers[job_id].holds(task_id) == [0]
    state.apply(st.ReportSplits(job_id, client_id, [[0, [[0, 1]]]], []))
    state.apply(st.RemoveWorker("w:1"))  # the task is lost: split 0 waits for the consumer
    ledger = state.ledgers[job_id]
    assert ledger.open[0].awaiting == [client_id]
    # Through JSON, as the journal writes the updates and the snapshot.
    copy = st.state_from_json(st.state_to_json(state))
    assert copy.ledgers[job_id] == ledger
    closing = st.ReportSplits(job_id, client_id, [], [task_id])
    copy.apply(st.update_from_json(st.update_to_json(closing)))
    assert copy.ledgers[job_id].replay == [0]
    copy.apply(st.CountSplit(job_id, 0, 2))
    copy.apply(st.ReportSplits(job_id, client_id, [[0, [[1, 2]]]], []))
    assert copy.ledgers[job_id].settled and copy.ledgers[job_id].done == {0: 2}
    copy.apply(st.RemoveJob(job_id))
    assert job_id not in copy.ledgers


def test_once_a_consumer_left_a_split_handed_out_whole_is_done() -> None:
    """What a consumer that left had not reported is not waited for: the others reach the end."""
    ledger = SplitLedger()
    ledger.grant(0, task_id=1)
    ledger.grant(4, task_id=1)
    ledger.count(0, 3)
    ledger.receive(0, [[0, 1]])  # offsets 1 and 2 went to a consumer that never reported them
    ledger.handed_out(0, task_id=1)
    assert 0 in ledger.open  # every consumer still there: their reports decide
    ledger.handed_out(4, task_id=2)  # not its holder: ignored
    ledger.client_gone(10)
    assert ledger.done == {0: 3} and list(ledger.open) == [4]
    ledger.count(4, 2)
    assert 4 in ledger.open  # not handed out whole yet
    ledger.handed_out(4, task_id=1)
    assert ledger.settled
    copy = SplitLedger.from_json(ledger.to_json())
    assert copy == ledger and copy.consumer_left


def test_a_cross_trainer_split_is_done_once_every_trainer_reading_the_job_has_it() -> None:
    """A per-trainer ledger counts what each trainer received, by trainer id, whichever
    consumer id it reads with; a trainer that left is not waited for until it rejoins."""
    ledger = SplitLedger(per_trainer=True)
    ledger.joined(1, "a")
    ledger.joined(2, "b")
    ledger.grant(0, task_id=7)
    ledger.grant(4, task_id=7)
    ledger.count(0, 3)
    ledger.count(4, 2)
    assert ledger.adds(0, [[0, 3]], 1) and not ledger.adds(0, [[0, 3]], 99)  # 99: unknown
    ledger.receive(0, [[0, 3]], client_id=1)
    ledger.receive(0, [[0, 3]], client_id=99)  # not a trainer of the job: ignored
    ledger.receive(4, [[0, 2]], client_id=1)
    assert not ledger.adds(0, [[1, 2]], 1)  # a has it already
    ledger.receive(0, [[0, 2]], client_id=2)
    assert sorted(ledger.open) == [0, 4] and not ledger.done  # b lacks 0's offset 2, and 4
    ledger.client_gone(2)  # b is killed: not waited for while it is away
    assert ledger.done == {0: 3, 4: 2} and ledger.settled
    assert not ledger.consumer_left  # a trainer leaving is not a plain consumer leaving
    # b comes back (a new consumer id) while a new split is open: it is waited for again.
    ledger.joined(3, "b")
    ledger.grant(8, task_id=7)
    ledger.count(8, 1)
    ledger.receive(8, [[0, 1]], client_id=1)
    assert list(ledger.open) == [8]
    ledger.receive(8, [[0, 1]], client_id=3)
    # b lacks what it missed of 0 and 4, which it reads from task 7's cache: not settled yet.
    assert not ledger.open and not ledger.settled and ledger.reading() == {"a", "b"}
    ledger.receive(0, [[2, 3]], client_id=3)
    ledger.receive(4, [[0, 2]], client_id=3)
    assert ledger.settled
    copy = SplitLedger.from_json(ledger.to_json())
    assert copy == ledger


def _split_of_a_lost_task(b_has: int) -> SplitLedger:
    """A cross-trainer ledger: trainers a (consumer 1) and b (consumer 2), split 0 of 4
    elements made by task 7, which is lost once a received all of it and b its first
    ``b_has``."""
    ledger = SplitLedger(per_trainer=True)
    ledger.joined(1, "a")
    ledger.joined(2, "b")
    ledger.grant(0, task_id=7)
    ledger.count(0, 4)
    ledger.receive(0, [[0, 4]], client_id=1)
    ledger.receive(0, [[0, b_has]], client_id=2)
    ledger.holder_lost(7, consumers=[1, 2])
    return ledger


def test_a_lost_workers_cross_trainer_splits_are_replayed_at_once_and_whole() -> None:
    """A trainer drops what it has of a replayed split itself: nothing is skipped for it and
    no trainer is waited for."""
    ledger = _split_of_a_lost_task(b_has=2)
    assert ledger.replay == [0] and ledger.open[0].awaiting == []
    ledger.regrant(0, task_id=8)
    assert ledger.open[0].delivered == []  # the replay skips nothing
    ledger.receive(0, [[2, 4]], client_id=2)
    assert ledger.done == {0: 4} and ledger.settled


def test_a_done_cross_trainer_split_a_late_trainer_lacks_runs_again_when_its_worker_is_lost() -> (
    None
):
    """A trainer that joins once splits are done reads them from their workers' caches; a
    split whose worker is lost before that trainer received all of it is open again and
    handed out again, while one every trainer reading the job has stays done."""
    ledger = SplitLedger(per_trainer=True)
    ledger.joined(1, "a")
    for key in (0, 4, 8):
        ledger.grant(key, task_id=7)
        ledger.count(key, 4)
        ledger.receive(key, [[0, 4]], client_id=1)
    assert ledger.done == {0: 4, 4: 4, 8: 4} and ledger.settled
    ledger.joined(2, "b")  # late: it reads 0, 4 and 8 from task 7's cache
    assert ledger.adds(4, [[0, 4]], 2) and ledger.adds(8, [[0, 2]], 2)
    ledger.receive(4, [[0, 4]], client_id=2)  # b has all of 4 and part of 8
    ledger.receive(8, [[0, 2]], client_id=2)
    assert not ledger.adds(4, [[1, 3]], 2)
    ledger.joined(3, "c")  # c joins and leaves without any of them: not waited for
    ledger.client_gone(3)
    ledger.holder_lost(7, consumers=[1, 2])
    assert ledger.replay == [0, 8] and ledger.done == {4: 4} and not ledger.settled
    assert SplitLedger.from_json(ledger.to_json()) == ledger
    ledger.regrant(0, task_id=9)
    ledger.receive(0, [[0, 4]], client_id=2)  # a drops the replay: it has all of 0
    assert ledger.done == {0: 4, 4: 4} and ledger.replay == [8]
    ledger.regrant(8, task_id=9)
    ledger.receive(8, [[2, 4]], client_id=2)
    assert ledger.done == {0: 4, 4: 4, 8: 4} and ledger.settled


def test_a_trainer_that_first_joins_after_a_worker_was_lost_gets_its_done_splits() -> None:
    """Splits every trainer had in full when their worker was lost stay done; a trainer that
    joins the job only then lacks them, and they are open again for it, whole."""
    ledger = SplitLedger(per_trainer=True)
    ledger.joined(1, "a")
    ledger.joined(2, "b")
    for key, task in ((0, 7), (4, 7), (8, 9)):
        ledger.grant(key, task_id=task)
        ledger.count(key, 4)
        for client in (1, 2):
            ledger.receive(key, [[0, 4]], client_id=client)
    ledger.holder_lost(7, consumers=[1, 2])
    assert ledger.done == {0: 4, 4: 4, 8: 4} and ledger.settled  # a and b have them
    ledger.joined(3, "late")
    # Task 7's splits are open again for the late trainer; task 9 lives: it reads 8 there.
    assert sorted(ledger.replay) == [0, 4] and ledger.done == {8: 4}
    assert ledger.open[0].holder is None and ledger.open[0].delivered == []
    assert SplitLedger.from_json(ledger.to_json()) == ledger  # the lost tasks too
    ledger.regrant(0, task_id=10)
    ledger.regrant(4, task_id=10)
    ledger.receive(0, [[0, 4]], client_id=3)
    ledger.receive(4, [[0, 3]], client_id=3)
    assert ledger.done == {0: 4, 8: 4} and list(ledger.open) == [4]
    ledger.receive(4, [[3, 4]], client_id=3)
    assert not ledger.open and not ledger.settled  # late lacks 8, in task 9's cache
    ledger.receive(8, [[0, 4]], client_id=3)
    assert ledger.settled
    ledger.joined(4, "later")  # task 10 lives: nothing is open again; it reads the caches
    assert not ledger.open and not ledger.replay and not ledger.settled


def _two_splits_both_trainers_have() -> SplitLedger:
    """A cross-trainer ledger: trainers a (consumer 1) and b (consumer 2) each received all of
    splits 0 and 4 (4 elements each), which task 7 made."""
    ledger = SplitLedger(per_trainer=True)
    ledger.joined(1, "a")
    ledger.joined(2, "b")
    for key in (0, 4):
        ledger.grant(key, task_id=7)
        ledger.count(key, 4)
        for client in (1, 2):
            ledger.receive(key, [[0, 4]], client_id=client)
    return ledger


def test_a_trainer_restored_from_before_a_worker_was_lost_gets_what_its_position_lacks() -> None:
    """A restored trainer is counted as having what its position says it returned, not what
    it had received before it was killed: a done split of a lost task that it lacks since is
    open again."""
    ledger = _two_splits_both_trainers_have()
    ledger.client_gone(2)  # b is killed; its checkpoint had all of 0 and half of 4
    ledger.holder_lost(7, consumers=[1])
    assert ledger.done == {0: 4, 4: 4} and ledger.settled
    ledger.joined(3, "b", restored={0: [[0, 4]], 4: [[0, 2]]})
    ledger.receive(4, [[0, 4]], client_id=2)  # a late report of b's gone consumer: not counted
    assert not ledger.adds(4, [[2, 4]], 2)
    assert ledger.replay == [4] and ledger.done == {0: 4}
    assert ledger.finished[0].trainers["b"] == [[0, 4]]
    assert ledger.open[4].trainers["b"] == [[0, 2]]  # what it had since counts no more
    ledger.regrant(4, task_id=8)
    ledger.receive(4, [[2, 4]], client_id=3)
    assert ledger.settled and ledger.done == {0: 4, 4: 4}
    # Restored with nothing of split 0 (a checkpoint from before it): 0 is open again too.
    ledger.client_gone(3)
    ledger.joined(5, "b", restored={})
    assert ledger.replay == [0] and ledger.done == {4: 4}  # 4's task 8 lives
    # A done split is said done to a trainer only once that trainer has all of it: b, restored
    # with nothing, reads split 4 from task 8's cache.
    assert ledger.done_for(1, [0, 4]) == [(4, 4)] and ledger.done_for(5, [0, 4, 12]) == []
    ledger.receive(4, [[0, 4]], client_id=5)
    assert ledger.done_for(5, [0, 4]) == [(4, 4)]


def test_a_replay_done_while_a_trainer_was_away_runs_again_when_it_comes_back() -> None:
    """A lost task's split waits to be handed out again for a trainer that lacks it; that
    trainer leaves (its consumer is replaced by a restored one) and the split is done for the
    one left. No worker made it since: when the trainer comes back, it is open again."""
    ledger = _split_of_a_lost_task(b_has=3)
    assert ledger.replay == [0]
    ledger.client_gone(2)  # b goes before a worker takes the replay: a has all of it
    assert ledger.done == {0: 4} and not ledger.replay
    ledger.joined(3, "b", restored={})
    assert ledger.replay == [0] and ledger.done == {}
    assert ledger.open[0].holder is None and ledger.open[0].lost_holder == 7
    ledger.regrant(0, task_id=8)
    ledger.receive(0, [[0, 4]], client_id=3)
    assert ledger.settled and ledger.done == {0: 4}


def test_the_splits_do_not_end_while_a_trainer_reading_the_job_lacks_a_done_split() -> None:
    """A trainer restored from a checkpoint lacks a done split whose task lives as far as the
    dispatcher knows: the job's splits are not settled (its tasks are not told they ended)
    until it has received that split from the task's cache, or the task is lost and the split
    runs again for it."""
    ledger = _two_splits_both_trainers_have()
    assert ledger.settled
    ledger.client_gone(2)
    ledger.joined(3, "b", restored={0: [[0, 4]]})  # its checkpoint had split 0 only
    assert ledger.done == {0: 4, 4: 4} and not ledger.replay and not ledger.settled
    ledger.receive(4, [[0, 2]], client_id=3)  # from task 7's cache
    assert not ledger.settled
    ledger.holder_lost(7, consumers=[1, 3])  # the rest runs again, as task 7 is lost
    assert ledger.replay == [4] and not ledger.settled
    ledger.regrant(4, task_id=8)
    ledger.count(4, 4)
    ledger.receive(4, [[2, 4]], client_id=3)
    assert ledger.settled and ledger.done == {0: 4, 4: 4}
    ledger.client_gone(3)
    ledger.joined(5, "c", restored={})  # a new trainer reads split 0 and 4 from the caches
    assert not ledger.settled
    ledger.client_gone(5)  # ... or leaves: nothing is waited for
    assert ledger.settled


@pytest.mark.parametrize("seed", range(8))
def test_what_the_ledger_keeps_of_each_trainers_lacks_is_what_its_splits_say(seed: int) -> None:
    """``settled`` and ``complete_for`` read the done splits each trainer lacks, which the
    ledger keeps as trainers join, report and leave and as splits open again: after every step
    of random traffic they answer as a look at every split would, and so does a ledger read
    back from its JSON."""
    rng = random.Random(seed)
    ledger = SplitLedger(per_trainer=True)
    clients: dict[int, str] = {}
    next_client, next_task = 1, 100

    def looked_at(client: int | None = None) -> bool:
        reading = ledger.reading() if client is None else {ledger.trainer_of[client]}
        splits = list(ledger.finished.values())
        if client is not None:
            splits += list(ledger.open.values())
        return all(
            split.count is not None and covers(split.trainers.get(t, []), split.count)
            for split in splits
            for t in reading
        )

    for _ in range(300):
        action = rng.choice(
            ["join", "grant", "count", "receive", "receive", "receive", "leave", "lose", "regrant"]
        )
        live = [c for c in clients if c not in ledger.left]
        if action == "join" or not live:
            trainer = rng.choice("abc")
            restored = None
            if rng.random() < 0.5:
                keys = rng.sample(
                    sorted({*ledger.open, *ledger.finished}), k=min(2, len(ledger.done))
                )
                restored = {key: [[0, rng.randint(1, 4)]] for key in keys}
            ledger.joined(next_client, trainer, restored)
            clients[next_client] = trainer
            next_client += 1
        elif action == "grant":
            ledger.grant(rng.randrange(0, 12), next_task)
        elif action == "count":
            for key, split in list(ledger.open.items()):
                if split.count is None and split.holder is not None:
                    ledger.count(key, 4)
                    break
        elif action == "receive":
            keys = sorted({*ledger.open, *ledger.finished})
            if keys:
                start = rng.randrange(0, 4)
                ledger.receive(
                    rng.choice(keys), [[start, rng.randint(start + 1, 4)]], rng.choice(live)
                )
        elif action == "leave":
            ledger.client_gone(rng.choice(live))
        elif action == "lose":
            ledger.holder_lost(next_task, consumers=live)
            next_task += 1
        elif ledger.replay:
            ledger.regrant(ledger.replay[0], next_task)
        assert ledger.settled == (not ledger.open and not ledger.replay and looked_at())
        again = SplitLedger.from_json(ledger.to_json())
        assert again.settled == ledger.settled
        for client in ledger.trainer_of:
            if client not in ledger.left:
                assert ledger.complete_for(client) == looked_at(client)
                assert again.complete_for(client) == ledger.complete_for(client)


def _cross_trainer_job() -> tuple[st.DispatcherState, int, int]:
    """A dispatcher state with a fault-tolerant cross-trainer job and its task on worker w:1:
    the state, the job's id and the task's."""
    state = st.DispatcherState(incarnation=6)
    state.apply(st.RegisterWorker("w:1"))
    job_id = state.new_id()
    state.apply(
        st.CreateJob(job_id, "d", 3, "j", 0, None, "ANY", exactly_once=True, cross_trainer=True)
    )
    task_id = state.new_id()
    state.apply(st.CreateTask(task_id, job_id, "w:1", 0, 1))
    return state, job_id, task_id


def test_a_restored_trainers_splits_reach_the_ledger_through_the_state_and_journal() -> None:
    state, job_id, task_id = _cross_trainer_job()
    state.apply(st.AcquireClient(100, job_id, "a"))
    cursor = {"num_units": 10, "split_size": 2, "position": 0, "seed": None}
    state.apply(st.MoveSplitCursor(job_id, 0, dict(cursor, position=2), task_id, 0, cursor))
    state.apply(st.CountSplit(job_id, 0, 2))
    state.apply(st.ReportSplits(job_id, 100, [[0, [[0, 2]]]], []))
    state.apply(st.RemoveWorker("w:1"))
    assert state.ledgers[job_id].done == {0: 2}
    acquire = st.AcquireClient(101, job_id, "b", restored=[[0, [[0, 1]]]])
    assert st.update_from_json(st.update_to_json(acquire)) == acquire
    state.apply(acquire)
    ledger = state.ledgers[job_id]
    assert ledger.replay == [0] and ledger.open[0].trainers == {"a": [[0, 2]], "b": [[0, 1]]}
    assert st.state_from_json(st.state_to_json(state)).ledgers[job_id] == ledger


def test_a_trainers_consumer_is_known_to_the_ledger_through_the_state_and_journal() -> None:
    state, job_id, task_id = _cross_trainer_job()
    for client_id, trainer in ((100, "a"), (101, "b")):
        acquire = st.AcquireClient(client_id, job_id, trainer)
        state.apply(st.update_from_json(st.update_to_json(acquire)))
    cursor = {"num_units": 10, "split_size": 2, "position": 0, "seed": None}
    state.apply(st.MoveSplitCursor(job_id, 0, dict(cursor, position=2), task_id, 0, cursor))
    state.apply(st.CountSplit(job_id, 0, 2))
    state.apply(st.ReportSplits(job_id, 100, [[0, [[0, 2]]]], []))
    ledger = state.ledgers[job_id]
    assert ledger.per_trainer and list(ledger.open) == [0]  # b has not reported
    copy = st.state_from_json(st.state_to_json(state))
    assert copy.ledgers[job_id] == ledger
    copy.apply(st.ReleaseClient(101))  # b left: a alone is waited for
    assert copy.ledgers[job_id].done == {0: 2}


def test_doctests() -> None:
    assert doctest.testmod(ledger_module).failed == 0


# -- a ledger acknowledged on commit (``commits``) ------------------------------------------------
def test_on_commit_a_split_is_done_once_committed_not_once_received() -> None:
    ledger = SplitLedger(commits=True)
    ledger.joined(1, None)
    ledger.grant(0, task_id=7)
    ledger.count(0, 3)
    ledger.receive(0, [[0, 3]], client_id=1)
    assert 0 in ledger.open and ledger.open[0].held == {"1": [[0, 3]]}
    assert not ledger.adds(0, [[0, 2]], client_id=1) and ledger.adds(0, [[0, 2]], client_id=2)
    ledger.commit(0, [[0, 2]], client_id=1)
    assert ledger.open[0].held == {"1": [[2, 3]]} and ledger.open[0].delivered == [[0, 2]]
    ledger.commit(0, [[2, 3]], client_id=1)
    assert ledger.done == {0: 3} and ledger.settled
    ledger.receive(0, [[0, 1]], client_id=1)  # a late report of a done split: nothing changes
    assert ledger.done == {0: 3} and not ledger.open


def test_on_commit_a_dead_consumers_offsets_wait_for_the_split_to_be_handed_out_and_flushed() -> (
    None
):
    ledger = SplitLedger(commits=True)
    for client in (1, 2, 3):
        ledger.joined(client, None)
    ledger.grant(0, task_id=7)
    ledger.receive(0, [[0, 2]], client_id=1)
    ledger.receive(0, [[2, 4]], client_id=2)
    ledger.client_gone(1)
    assert ledger.flush_wanted(2) == 0  # its worker still hands the split out
    ledger.count(0, 8)
    ledger.handed_out(0, task_id=7)
    assert ledger.flush_wanted(2) == ledger.flush_wanted(3) == 1 and ledger.flush_wanted(1) == 0
    ledger.flushed(2, 1)
    assert ledger.replay == []  # consumer 3 may hold offsets it did not report yet
    ledger.receive(0, [[4, 6]], client_id=3)
    ledger.flushed(3, 1)
    # 0-1 (the dead consumer's) and 6-7 (reached no one who reported them) go back.
    assert ledger.replay == [0] and ledger.skip_of(0) == [[2, 6]]
    ledger.regrant(0, task_id=8)
    ledger.receive(0, [[0, 2], [6, 8]], client_id=3)
    ledger.commit(0, [[2, 4]], client_id=2)
    ledger.commit(0, [[0, 2], [4, 8]], client_id=3)
    assert ledger.done == {0: 8}


def test_on_commit_a_lost_worker_replays_what_no_living_consumer_holds() -> None:
    ledger = SplitLedger(commits=True)
    ledger.joined(1, None)
    ledger.joined(2, None)
    ledger.grant(0, task_id=7)
    ledger.receive(0, [[0, 3]], client_id=1)
    ledger.commit(0, [[0, 1]], client_id=1)
    ledger.receive(0, [[3, 5]], client_id=2)
    ledger.holder_lost(7, consumers=[1, 2])
    ledger.closed(1, [7])
    ledger.client_gone(2)  # what it held goes back with the rest
    assert ledger.replay == [0] and ledger.skip_of(0) == [[0, 3]]


def test_on_commit_the_ledger_survives_its_snapshot() -> None:
    ledger = SplitLedger(commits=True)
    ledger.joined(1, None)
    ledger.joined(2, None)
    ledger.grant(0, task_id=7)
    ledger.receive(0, [[0, 3]], client_id=1)
    ledger.client_gone(1)
    ledger.count(0, 4)
    ledger.handed_out(0, task_id=7)
    copy = SplitLedger.from_json(json.loads(json.dumps(ledger.to_json())))
    assert copy == ledger and copy.flush_wanted(2) == 1
    copy.flushed(2, 1)
    assert copy.replay == [0] and copy.skip_of(0) == []


@pytest.mark.parametrize("live_on", [False, True], ids=["dead", "released-live"])
@pytest.mark.parametrize("seed", range(20))
def test_on_commit_every_offset_is_committed_exactly_once_whoever_dies(
    seed: int, live_on: bool
) -> None:
    """Simulated consumers take a split's elements, report some, commit some and die at random;
    the dispatcher's repairs hand out again what the dead held: every offset is committed once.
    With ``live_on``, a consumer the dispatcher released goes on taking elements until it hears
    of it (a paused process that runs again; the dispatcher counts nothing it reports): what
    it takes goes back too, also from a split handed out after it was released."""
    rng = random.Random(seed)
    released: list[int] = []  # released consumers that live on
    ledger = SplitLedger(commits=True)
    count, next_client, task = 40, 1, 100
    alive: dict[int, dict[str, list[int]]] = {}  # per consumer: received, reported, committed
    committed: list[int] = []

    def join() -> None:
        nonlocal next_client
        ledger.joined(next_client, None)
        alive[next_client] = {"got": [], "reported": [], "done": []}
        next_client += 1

    for _ in range(3):
        join()
    ledger.grant(0, task_id=task)
    pending = list(range(count))  # what the split's holder has still to hand out
    for _ in range(10_000):
        if 0 in ledger.done:
            break
        action = rng.random()
        if pending and action < 0.4:
            client = rng.choice([*alive, *released])
            if client in alive:
                alive[client]["got"].append(pending.pop(0))
            else:  # taken by a released consumer: never reported, never committed
                pending.pop(0)
            if not pending:
                ledger.count(0, count)
                ledger.handed_out(0, task)
        elif action < 0.6:  # a report of what was received
            client = rng.choice(list(alive))
            state = alive[client]
            new = [o for o in state["got"] if o not in state["reported"]]
            ledger.receive(0, ranges_of(new), client)
            state["reported"].extend(new)
            wanted = ledger.flush_wanted(client)
            if wanted:  # a flush: everything received was reported with it
                ledger.flushed(client, wanted)
        elif action < 0.8:  # a step commits what it took
            client = rng.choice(list(alive))
            state = alive[client]
            step = [o for o in state["got"] if o not in state["done"]]
            if step:
                ledger.commit(0, ranges_of(step), client)
                state["done"].extend(step)
                committed.extend(step)
        elif action < 0.85 and len(alive) > 1:  # kill -9: what it did not commit is lost to it
            client = rng.choice(list(alive))
            del alive[client]
            ledger.client_gone(client)
            if live_on:
                released.append(client)
            if rng.random() < 0.7:
                join()
        if ledger.replay and not pending:  # a worker hands the split out again
            task += 1
            ledger.regrant(0, task)
            skip = ledger.skip_of(0)
            pending = [o for o in range(count) if not contains(skip, o)]
            if not pending:
                ledger.handed_out(0, task)
    assert ledger.done == {0: count}
    assert sorted(committed) == list(range(count))
