"""What a cross-trainer job's split ledger costs the dispatcher per question at the end of a
large epoch: ``settled`` (asked by each waiting GetSplit) and ``complete_for`` (asked by each
trainer's heartbeat), both under the dispatcher's lock.

Usage (from the repository root)::

    PYTHONPATH=src .venv/bin/python benchmarks/cross_trainer_ledger.py [--splits 100000]
        [--trainers 8]

It builds a ``SplitLedger(per_trainer=True)`` whose ``--splits`` splits are all done, every one
received in full by each of ``--trainers`` trainers, and times both questions against the
same answers computed by looking at every done split (what the ledger did before it kept each
trainer's lacking splits), in the same run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from feedline.service.ledger import SplitLedger, covers


def _per_call(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", type=int, default=100_000)
    parser.add_argument("--trainers", type=int, default=8)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    ledger = SplitLedger(per_trainer=True)
    for client in range(args.trainers):
        ledger.joined(client + 1, f"t{client}")
    for key in range(args.splits):
        ledger.grant(key, 7)
        ledger.count(key, 4)
        for client in range(args.trainers):
            ledger.receive(key, [[0, 4]], client + 1)

    def every_split(trainers: set[str]) -> bool:
        return all(
            covers(split.trainers.get(t, []), split.count or 0)
            for split in (*ledger.open.values(), *ledger.finished.values())
            for t in trainers
        )

    rows = [
        ("settled", lambda: ledger.settled, lambda: every_split(ledger.reading())),
        ("complete_for", lambda: ledger.complete_for(1), lambda: every_split({"t0"})),
    ]
    print(f"{args.splits:,} done splits, {args.trainers} trainers, {args.calls} calls each\n")
    print("| question | ledger, ms a call | every split looked at, ms a call | ratio |")
    print("|---|---:|---:|---:|")
    for name, kept, looked in rows:
        assert kept() == looked()
        fast, slow = _per_call(kept, args.calls), _per_call(looked, args.calls)
        print(f"| {name} | {fast * 1e3:.4f} | {slow * 1e3:.1f} | {slow / fast:,.0f}x |")


if __name__ == "__main__":
    main()
