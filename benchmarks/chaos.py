"""Chaos: the data service under one fault at a time, with real processes.

Usage (from the repository root)::

    .venv/bin/python benchmarks/chaos.py [--mode at-most-once] [--elements 12000]
        [--only worker-kill-9,consumer-kill] [--repetitions 1] [--fault-at 0.33|random]
    .venv/bin/python benchmarks/chaos.py --fault-tolerant --only dispatcher-restart,both-kill-9
        --repetitions 10 --fault-at random

Each scenario starts a fresh cluster: a ``feedline dispatcher`` and three ``feedline worker``
processes (``tests/service/procs.py``, on the one launcher ``tests/launcher.py``), and two
consumer processes that share one job (``job_name``) of ``--elements`` elements under
``distributed_epoch``. Every element carries the tag of its dataset. Once the consumers have
read about a third of the epoch (``--fault-at``: another fraction, or ``random``: a fraction
drawn in [0.05, 0.95] for each round), the scenario injects its fault:

======================  ====================================================================
baseline                none
worker-kill-9           a worker is killed (SIGKILL)
worker-restart          a worker is killed (SIGKILL) and a new one started at once on its port
                        (its address), as a supervisor restarts a crashed worker in place
worker-sigterm          a worker is stopped cleanly (SIGTERM; it drains first)
dispatcher-restart      the dispatcher is killed (SIGKILL) and started again on its port (and,
                        in a fault-tolerant mode, on its work dir) at once
both-kill-9             a worker and the dispatcher are killed together; the dispatcher is
                        started again as above
map-raises              the map function raises on the workers, from the element at the fault
                        fraction on (whenever a worker reaches it: workers run ahead of the
                        consumers; the fault's time is that of the first raise)
consumer-kill           one of the two consumers is killed (SIGKILL)
======================  ====================================================================

Each consumer writes every element it receives as it receives it, then reads a follow-up
dataset of another tag (a new job; it must hold nothing else). The table gives per scenario:
elements expected, received (distinct), lost (expected, never received), duplicated (received
more than once), wrong (elements of another dataset, in the epoch or the follow-up), hung (a
consumer neither ended nor raised within ``--hang-seconds`` of the fault), each consumer's
outcome (``end`` or the error it raised) and the time from the fault to the first error.

A *mode* says what the service promises under each fault (``MODES``); the verdict column
compares. ``at-most-once`` (the service without a journal) may lose what a killed worker or
consumer held, and tells its consumers with an error when it loses a job (dispatcher restart, a
raising map function), unless the job had handed out everything before it was lost (its workers
ran ahead of the consumers) and they end with every element once; every other column is zero.
``journal`` (``--fault-tolerant``) runs the dispatcher with ``--work-dir D --fault-tolerant``,
which hands out the job's splits exactly once (``feedline.service.ledger``): a dispatcher killed
and started again on the same work dir resumes the job (a split whose ``GetSplit`` reply was on
its way when the dispatcher died is handed out again to the worker that asks again), the splits
a killed worker held are run again on the others minus what the consumers already received, and
under worker kills, dispatcher restarts and both at once the consumers reach the end with
nothing lost or duplicated.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import random
import signal
import sys
import time
from collections import Counter
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.launcher import free_port  # noqa: E402
from tests.service.procs import ServiceProcesses  # noqa: E402

SCENARIOS = (
    "baseline",
    "worker-kill-9",
    "worker-restart",
    "worker-sigterm",
    "dispatcher-restart",
    "both-kill-9",
    "map-raises",
    "consumer-kill",
)
TAG, FOLLOW_UP_TAG = 10**7, 2 * 10**7
FOLLOW_UP_ELEMENTS = 500
OUTSTANDING = 64  # each consumer's max_outstanding_requests
WORKERS = 3


@dataclasses.dataclass(frozen=True)
class Expect:
    """What a mode promises under one fault.

    Attributes:
      outcome: ``"end"`` (every surviving consumer reaches the end of the epoch) or the name
        of the error every surviving consumer raises.
      may_lose: what may be lost, in words (None: nothing, if the consumers reach the end).
      lose_at_most: a bound on the elements lost, where there is one.
      or_all_received: with an error ``outcome``, the consumers may instead reach the end
        having received every element once: the job was lost after it had handed out all it
        had (its workers were done before the fault, as on a loaded machine they can be).
    """

    outcome: str = "end"
    may_lose: str | None = None
    lose_at_most: int | None = None
    or_all_received: bool = False


@dataclasses.dataclass(frozen=True)
class Mode:
    """A delivery mode of the service: how its dispatcher starts and what it promises.

    Attributes:
      fault_tolerant: the dispatcher journals its state (``--work-dir D --fault-tolerant``, a
        fresh ``D`` per scenario, the same after a restart).
    """

    name: str
    expect: dict[str, Expect]
    dispatcher_args: tuple[str, ...] = ()
    fault_tolerant: bool = False


MODES = {
    "at-most-once": Mode(
        "at-most-once",
        {
            "baseline": Expect(),
            "worker-kill-9": Expect(may_lose="what the killed worker held: its buffer and split"),
            "worker-restart": Expect(may_lose="what the killed worker held: its buffer and split"),
            "worker-sigterm": Expect(),
            "dispatcher-restart": Expect(outcome="FailedPreconditionError", or_all_received=True),
            "both-kill-9": Expect(outcome="FailedPreconditionError", or_all_received=True),
            "map-raises": Expect(outcome="RuntimeError"),
            "consumer-kill": Expect(
                may_lose="what the killed consumer held: its max_outstanding_requests",
                lose_at_most=OUTSTANDING,
            ),
        },
    ),
    "journal": Mode(
        "journal",
        {
            "baseline": Expect(),
            "worker-kill-9": Expect(),
            "worker-restart": Expect(),
            "worker-sigterm": Expect(),
            "dispatcher-restart": Expect(),
            "both-kill-9": Expect(),
            "map-raises": Expect(outcome="RuntimeError"),
            "consumer-kill": Expect(
                may_lose="what the killed consumer held: its max_outstanding_requests",
                lose_at_most=OUTSTANDING,
            ),
        },
        fault_tolerant=True,
    ),
}

CONSUMER = """
import os, time
from feedline.data import Dataset, Options
from feedline.service import distribute
from tests.launcher import report

target, trigger = os.environ["FEEDLINE_TARGET"], os.environ["TRIGGER"]
raise_from = int(os.environ["RAISE_FROM"])
elements, delay = int(os.environ["ELEMENTS"]), float(os.environ["DELAY"])
options = Options()
options.experimental_distribute.service_timeout_ms = int(os.environ["TIMEOUT_MS"])


def tagged(tag, check):
    def fn(x):
        if check and x >= raise_from:
            try:  # the first raise says when the fault came
                with open(trigger, "x") as mark:
                    mark.write(repr(time.time()))
            except FileExistsError:
                pass
            raise RuntimeError("the map function raises (injected)")
        time.sleep(delay)
        return x + tag
    return fn


def joined():
    open(os.environ["OUT"] + ".joined", "w").close()


def joined_together():
    # Waits (at most 60 s) until every consumer has its first element (or its error): each
    # reads on from the same moment, so that no consumer reads the whole epoch before another
    # arrives.
    joined()
    deadline = time.time() + 60
    while time.time() < deadline and not all(
        os.path.exists(path + ".joined") for path in os.environ["ALL_OUTS"].split(",")
    ):
        time.sleep(0.01)


def read(dataset, out, barrier=False):
    outcome, message, error_at = "end", "", None
    try:
        for x in dataset:
            out.write(f"{int(x)}\\n")
            if barrier:
                joined_together()
                barrier = False
    except Exception as error:
        outcome, message, error_at = type(error).__name__, str(error)[:300], time.time()
        if barrier:  # no element came: the others need not wait for this one
            joined()
    return outcome, message, error_at


epoch = (
    Dataset.range(elements)
    .map(tagged(int(os.environ["TAG"]), True))
    .apply(distribute("distributed_epoch", target, job_name="chaos",
                      max_outstanding_requests=int(os.environ["OUTSTANDING"])))
    .with_options(options)
)
with open(os.environ["OUT"], "w", buffering=1) as out:
    outcome, message, error_at = read(epoch, out, barrier=True)
follow_up = (
    Dataset.range(int(os.environ["FOLLOW_UP"]))
    .map(tagged(int(os.environ["FOLLOW_UP_TAG"]), False))
    .apply(distribute("distributed_epoch", target))
    .with_options(options)
)
with open(os.environ["OUT"] + ".follow", "w", buffering=1) as out:
    follow = read(follow_up, out)
report({"outcome": outcome, "message": message, "error_at": error_at, "follow_up": follow[0]})
"""


@dataclasses.dataclass
class Row:
    """One scenario's measurements, and how they compare with the mode's promise."""

    scenario: str
    expected: int
    received: int
    lost: int
    duplicated: int
    wrong: int
    hung: bool
    outcomes: list[str]
    time_to_error: float | None
    epoch_seconds: float
    violations: list[str]
    fault_fraction: float = 1 / 3

    def cells(self) -> list[str]:
        return [
            self.scenario,
            f"{self.fault_fraction:.2f}",
            str(self.expected),
            str(self.received),
            str(self.lost),
            str(self.duplicated),
            str(self.wrong),
            "yes" if self.hung else "no",
            ", ".join(self.outcomes),
            "—" if self.time_to_error is None else f"{self.time_to_error:.1f} s",
            "ok" if not self.violations else "; ".join(self.violations),
        ]


HEADER = [
    "scenario",
    "fault at",
    "expected",
    "received",
    "lost",
    "duplicated",
    "wrong",
    "hung",
    "consumers ended with",
    "time to error",
    "verdict",
]


def run_scenario(
    scenario: str,
    mode: Mode = MODES["at-most-once"],
    *,
    elements: int = 12_000,
    delay: float = 0.0005,
    hang_seconds: float = 60.0,
    timeout_ms: int = 30_000,
    fault_fraction: float = 1 / 3,
    heartbeat_timeout_ms: int | None = None,
    workdir: pathlib.Path,
) -> Row:
    """Runs one scenario on a fresh cluster and measures it (see the module docstring);
    ``fault_fraction`` is the fraction of the epoch read when the fault comes;
    ``heartbeat_timeout_ms``: the dispatcher's ``--worker-timeout-ms`` and
    ``--client-timeout-ms`` (None: their defaults, 10 s), how long a killed worker or consumer
    goes unnoticed."""
    workdir.mkdir(parents=True, exist_ok=True)
    dispatcher_args = mode.dispatcher_args
    if heartbeat_timeout_ms is not None:
        timeout = str(heartbeat_timeout_ms)
        dispatcher_args += ("--worker-timeout-ms", timeout, "--client-timeout-ms", timeout)
    if mode.fault_tolerant:
        dispatcher_args += ("--work-dir", str(workdir / "dispatcher"), "--fault-tolerant")
    trigger = workdir / "raised-at"
    raise_from = round(elements * fault_fraction) if scenario == "map-raises" else elements
    outs = {name: workdir / f"{name}.txt" for name in ("first", "second")}
    env = {
        "ELEMENTS": str(elements),
        "DELAY": str(delay),
        "TAG": str(TAG),
        "FOLLOW_UP": str(FOLLOW_UP_ELEMENTS),
        "FOLLOW_UP_TAG": str(FOLLOW_UP_TAG),
        "TRIGGER": str(trigger),
        "RAISE_FROM": str(raise_from),
        "TIMEOUT_MS": str(timeout_ms),
        "OUTSTANDING": str(OUTSTANDING),
        "ALL_OUTS": ",".join(str(path) for path in outs.values()),
    }
    with ServiceProcesses(timeout=hang_seconds + 240) as cluster:
        dispatcher = cluster.start_dispatcher(*dispatcher_args)
        # Fixed ports: a worker restarted in place comes back at its address.
        ports = [free_port() for _ in range(WORKERS)]
        workers = [cluster.start_worker("--drain-seconds", "30", port=port) for port in ports]
        consumers = cluster.run(
            CONSUMER,
            [(name, {**env, "OUT": str(path)}) for name, path in outs.items()],
            timeout=hang_seconds + 180,
        )
        started = time.monotonic()
        # The map raises from element raise_from on, wherever a worker reaches it: a consumer
        # may see the error before it read anything.
        if scenario != "map-raises":
            count = max(1, round(elements * fault_fraction))
            _wait_for_progress(outs, count, consumers, timeout=120)
        fault_at = time.time()
        if scenario in ("worker-kill-9", "worker-restart"):
            cluster.send(workers[0], signal.SIGKILL)
            if scenario == "worker-restart":
                cluster.wait_exit(workers[0], timeout=30)
                cluster.start_worker("--drain-seconds", "30", port=ports[0])
        elif scenario == "worker-sigterm":
            cluster.send(workers[0], signal.SIGTERM)
        elif scenario in ("dispatcher-restart", "both-kill-9"):
            if scenario == "both-kill-9":
                cluster.send(workers[0], signal.SIGKILL)
            cluster.send(dispatcher, signal.SIGKILL)
            cluster.wait_exit(dispatcher, timeout=30)
            cluster.start_dispatcher(*dispatcher_args)
        elif scenario == "map-raises":
            pass  # the map raises by itself (trigger: when it first did)
        elif scenario == "consumer-kill":
            consumers.send("second", signal.SIGKILL)
        elif scenario != "baseline":
            raise ValueError(f"unknown scenario {scenario!r}; choose from {SCENARIOS}")
        hung = _wait_or_hang(consumers, hang_seconds)
        epoch_seconds = time.monotonic() - started
        results = consumers.wait()
        if trigger.exists():
            fault_at = float(trigger.read_text() or fault_at)
    row = _measure(scenario, mode, elements, outs, results, hung, fault_at, epoch_seconds)
    row.fault_fraction = fault_fraction
    return row


def _wait_for_progress(
    outs: dict[str, pathlib.Path], count: int, consumers: Any, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    # Every consumer has joined the job (it read something), and together they read `count`.
    while sum(_lines(path) for path in outs.values()) < count or not all(
        _lines(path) for path in outs.values()
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the consumers did not read {count} elements in {timeout} s")
        if any(consumers.poll(name) is not None for name in consumers.names):
            raise RuntimeError(
                f"a consumer ended before the fault (read {count} elements between them):\n"
                + "\n".join(consumers.output(name, "stderr")[-3000:] for name in consumers.names)
            )
        time.sleep(0.02)


def _lines(path: pathlib.Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def _wait_or_hang(consumers: Any, seconds: float) -> bool:
    """Whether a consumer is still running ``seconds`` after the fault (it hung)."""
    deadline = time.monotonic() + seconds
    while any(consumers.poll(name) is None for name in consumers.names):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)
    return False


def _read(path: pathlib.Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _measure(
    scenario: str,
    mode: Mode,
    elements: int,
    outs: dict[str, pathlib.Path],
    results: dict[str, Any],
    hung: bool,
    fault_at: float,
    epoch_seconds: float,
) -> Row:
    got = [x for path in outs.values() for x in _read(path)]
    follow = [x for path in outs.values() for x in _read(path.with_name(path.name + ".follow"))]
    counts = Counter(got)
    mine = {x for x in counts if TAG <= x < TAG + elements}
    wrong = sum(n for x, n in counts.items() if x not in mine)
    wrong += sum(1 for x in follow if not FOLLOW_UP_TAG <= x < FOLLOW_UP_TAG + FOLLOW_UP_ELEMENTS)
    duplicated = sum(n - 1 for x, n in counts.items() if x in mine)
    outcomes, errors_at = [], []
    for name, result in sorted(results.items()):
        report = result.result
        if report is None:
            outcomes.append("killed" if scenario == "consumer-kill" and name == "second" else "—")
            continue
        outcomes.append(report["outcome"])
        if report["error_at"] is not None:
            errors_at.append(report["error_at"])
    row = Row(
        scenario=scenario,
        expected=elements,
        received=len(mine),
        lost=elements - len(mine),
        duplicated=duplicated,
        wrong=wrong,
        hung=hung,
        outcomes=outcomes,
        time_to_error=min(errors_at) - fault_at if errors_at else None,
        epoch_seconds=epoch_seconds,
        violations=[],
    )
    row.violations = _violations(row, mode.expect[scenario])
    return row


def _violations(row: Row, expect: Expect) -> list[str]:
    found = []
    if row.wrong:
        found.append(f"{row.wrong} wrong")
    if row.duplicated:
        found.append(f"{row.duplicated} duplicated")
    if row.hung:
        found.append("hung")
    survivors = [outcome for outcome in row.outcomes if outcome != "killed"]
    allowed = {expect.outcome}
    if expect.or_all_received and row.received == row.expected and not row.lost:
        allowed.add("end")  # the job was lost with nothing left to hand out: every element came
    if any(outcome not in allowed for outcome in survivors):
        found.append(f"expected every consumer to end with {expect.outcome}")
    if expect.outcome == "end" and row.lost:
        if expect.may_lose is None:
            found.append(f"{row.lost} lost")
        elif expect.lose_at_most is not None and row.lost > expect.lose_at_most:
            found.append(f"{row.lost} lost, over {expect.lose_at_most}")
    return found


#: The processes each scenario kills with SIGKILL.
KILLS = {
    "worker-kill-9": 1,
    "worker-restart": 1,
    "dispatcher-restart": 1,
    "both-kill-9": 2,
    "consumer-kill": 1,
}


def summary(rows: list[Row]) -> str:
    """Per scenario over its rounds: rounds, kills, elements lost, duplicated and wrong, hangs,
    rounds that broke the mode's promise."""
    lines = [
        "| scenario | rounds | kills | lost (total) | lost (max) | duplicated | wrong | hangs "
        "| broken promises |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario in dict.fromkeys(row.scenario for row in rows):
        mine = [row for row in rows if row.scenario == scenario]
        lines.append(
            f"| {scenario} | {len(mine)} | {KILLS.get(scenario, 0) * len(mine)} "
            f"| {sum(r.lost for r in mine)} | {max(r.lost for r in mine)} "
            f"| {sum(r.duplicated for r in mine)} | {sum(r.wrong for r in mine)} "
            f"| {sum(r.hung for r in mine)} | {sum(bool(r.violations) for r in mine)} |"
        )
    return "\n".join(lines)


def table(rows: list[Any], header: list[str] = HEADER) -> str:
    """A markdown table: ``header``, then each row's ``cells()``."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(MODES), default="at-most-once")
    parser.add_argument(
        "--fault-tolerant",
        action="store_true",
        help="the journal mode: the dispatcher runs with --work-dir D --fault-tolerant",
    )
    parser.add_argument(
        "--fault-at",
        default="0.33",
        help="the fraction of the epoch read when the fault comes, or 'random' (per round)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the seed of --fault-at random")
    parser.add_argument("--elements", type=int, default=12_000)
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    parser.add_argument("--repetitions", type=int, default=1)
    parser.add_argument("--hang-seconds", type=float, default=60.0)
    args = parser.parse_args()
    mode = MODES["journal" if args.fault_tolerant else args.mode]
    rng = random.Random(args.seed)
    rows = []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    scratch = ROOT / "benchmarks" / "results" / f"chaos-{stamp}"
    for repetition in range(args.repetitions):
        for scenario in args.only.split(","):
            fraction = (
                rng.uniform(0.05, 0.95) if args.fault_at == "random" else float(args.fault_at)
            )
            row = run_scenario(
                scenario,
                mode,
                elements=args.elements,
                hang_seconds=args.hang_seconds,
                fault_fraction=fraction,
                workdir=scratch / f"{scenario}-{repetition}",
            )
            rows.append(row)
            print(table([row]).splitlines()[-1], flush=True)
    print(f"\nmode: {mode.name}, {args.elements} elements\n")
    print(table(rows))
    if args.repetitions > 1:
        print(f"\n{summary(rows)}")
    out = scratch.with_suffix(".json")
    out.write_text(json.dumps([dataclasses.asdict(row) for row in rows], indent=2))
    if any(row.violations for row in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
