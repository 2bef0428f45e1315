"""``feedline autoscale``: keeps as many workers as the dispatcher says its jobs need.

Every ``interval_s`` the ``Autoscaler`` asks the dispatcher (``GetLoad``, ``protocol.LoadReply``)
how many workers the running jobs need (``dispatcher.demand``), and its ``Policy`` turns that into
a worker count, which a back-end (``scaling``: local processes or a Kubernetes Deployment) makes
true. The policy:

=====================  ======================================================================
more are needed        start them at once (up to ``max_workers``): as many as the dispatcher
                       asked for at the least over the last ``scale_up_s`` (2 s), but none
                       within ``settle_s`` (10 s) of a scale-down
fewer are needed       once the dispatcher asked for fewer for ``scale_down_s`` (5 s) since the
                       last change, down to the *most* it asked for over those seconds (at
                       least ``min_workers``): a dip shorter than that does not scale down,
                       and a scale-down is never undone by the demand it just saw
a change of direction  a scale-down right after a scale-up is a reversal: at most one per
                       ``stabilization_s`` (300 s, as long as Kubernetes' HorizontalPodAutoscaler
                       waits). Within that long of the last one, a scale-down after a
                       scale-up waits ``stabilization_s`` since the scale-up and goes down only
                       to the most asked for over it, so a demand that swings to and fro
                       keeps the workers its peaks need
which worker drains    one that is not ``pinned`` (the last worker of a running job, or one
                       with a task of a job that cannot move), the least busy first; a worker
                       drains as ``feedline worker`` does on SIGTERM: no new work, its DYNAMIC
                       split finished, what it holds handed out, then it leaves, and the
                       splits it did not take go to the others (nothing lost under
                       ``fault_tolerant_mode``)
=====================  ======================================================================

So a halved demand costs its workers within ``scale_down_s`` and a few rounds, and the count
changes direction at most once per ``stabilization_s``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from feedline.errors import FeedlineError, InvalidArgumentError
from feedline.service.protocol import LoadReply

__all__ = ["Autoscaler", "Decision", "Policy", "ScalingBackend"]

logger = logging.getLogger(__name__)


class ScalingBackend(Protocol):
    """What starts and drains workers (``scaling.LocalWorkers``, ``scaling.KubernetesWorkers``)."""

    def count(self) -> int:
        """The workers it runs that do not drain, those still starting included."""

    def owns(self, address: str) -> bool:
        """Whether the registered worker at ``address`` is one of its own."""

    def scale_up(self, count: int) -> None:
        """Starts ``count`` more workers."""

    def scale_down(self, count: int, candidates: Sequence[str]) -> int:
        """Drains ``count`` workers, taken from ``candidates`` (addresses, the best first)
        where it can choose; how many it drains."""

    def close(self) -> None:
        """Lets go of what it runs (a local back-end drains its workers)."""


@dataclasses.dataclass
class Policy:
    """When and how far to scale (the module's docstring).

    Args:
      min_workers: never fewer.
      max_workers: never more.
      stabilization_s: at most one reversal (a scale-down right after a scale-up) this long;
        within it, a scale-down after a scale-up waits this long after the scale-up and goes
        down only to the most the dispatcher asked for over this long.
      scale_down_s: a scale-down waits until the dispatcher asked for fewer this long since the
        last change, and goes down to the most it asked for over this long.
      scale_up_s: a scale-up goes up to the least the dispatcher asked for over this long (one
        high estimate does not start workers).
      settle_s: no scale-up this long after a scale-down: the drains disturb what the
        consumers measure for a while (their wait while the drained splits move).
    """

    min_workers: int
    max_workers: int
    stabilization_s: float = 300.0
    scale_down_s: float = 5.0
    scale_up_s: float = 2.0
    settle_s: float = 10.0
    _asked: collections.deque[tuple[float, int]] = dataclasses.field(
        default_factory=collections.deque, repr=False
    )
    _last_up: float = dataclasses.field(default=-math.inf, repr=False)
    _last_down: float = dataclasses.field(default=-math.inf, repr=False)
    _last_reversal: float = dataclasses.field(default=-math.inf, repr=False)
    _since: float | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.min_workers <= self.max_workers or self.max_workers < 1:
            raise InvalidArgumentError(
                f"min_workers {self.min_workers} and max_workers {self.max_workers} must satisfy "
                "0 <= min_workers <= max_workers and max_workers >= 1 (--min-workers, "
                "--max-workers)"
            )
        for name, flag in (
            ("stabilization_s", "--stabilization"),
            ("scale_down_s", "--scale-down"),
        ):
            if getattr(self, name) < 0:
                raise InvalidArgumentError(
                    f"{name} must be >= 0, got {getattr(self, name)} ({flag})"
                )

    def target(self, now: float, desired: int, current: int) -> int:
        """The worker count to have now, given the ``desired`` one and the ``current`` one.

        Example:
          >>> policy = Policy(1, 8, stabilization_s=60, scale_down_s=5, scale_up_s=0, settle_s=0)
          >>> policy.target(0.0, desired=4, current=2)   # up at once
          4
          >>> policy.target(3.0, desired=2, current=4)   # down only after 5 s of asking for 2
          4
          >>> policy.target(8.0, desired=2, current=4)   # a reversal: the first in 60 s
          2
          >>> policy.target(9.0, desired=4, current=2)   # up again at once
          4
          >>> policy.target(20.0, desired=2, current=4)  # a second reversal waits 60 s
          4
          >>> policy.target(70.0, desired=2, current=4)  # 2 is the most asked for since 10 s
          2
        """
        if self._since is None:
            self._since = now
        self._asked.append((now, desired))
        while self._asked and self._asked[0][0] < now - max(
            self.stabilization_s, self.scale_down_s
        ):
            self._asked.popleft()
        least = min(asked for when, asked in self._asked if when >= now - self.scale_up_s)
        wanted = min(self.max_workers, max(self.min_workers, least))
        if wanted > current:
            if now - self._last_down < self.settle_s:
                return current
            self._last_up = now
            return wanted
        if current <= self.min_workers:
            return max(current, self.min_workers)
        reversal = self._last_up > self._last_down
        window = self.scale_down_s
        if reversal and now - self._last_reversal < self.stabilization_s:
            window = self.stabilization_s
        if now - max(self._last_up, self._last_down, self._since) < window:
            return current
        most = max([asked for when, asked in self._asked if when > now - window] or [desired])
        target = min(current, max(self.min_workers, min(self.max_workers, most)))
        if target < current:
            self._last_down = now
            if reversal:
                self._last_reversal = now
        return target


@dataclasses.dataclass(frozen=True)
class Decision:
    """One round of the autoscaler.

    Attributes:
      time: when (the autoscaler's clock).
      desired: the workers the dispatcher said the jobs need.
      current: the workers there were.
      target: the workers the policy chose.
      changed: workers started (> 0) or drained (< 0).
    """

    time: float
    desired: int
    current: int
    target: int
    changed: int


class Autoscaler:
    """Runs the loop: asks ``load`` for the dispatcher's ``LoadReply``, has ``backend`` start or
    drain workers as ``policy`` says.

    Args:
      load: asks the dispatcher for its load (``GetLoad``).
      backend: starts and drains workers.
      policy: when and how far to scale.
      interval_s: seconds between rounds.
      clock: the time of the policy (``time.monotonic``).
    """

    def __init__(
        self,
        load: Callable[[], LoadReply],
        backend: ScalingBackend,
        policy: Policy,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = load
        self._backend = backend
        self._policy = policy
        self._interval_s = interval_s
        self._clock = clock
        #: The rounds so far (the last 10,000).
        self.decisions: collections.deque[Decision] = collections.deque(maxlen=10_000)

    def step(self) -> Decision:
        """One round: the dispatcher's load, the policy's target, and the change made."""
        reply = self._load()
        backend = self._backend
        live = [w for w in reply.workers if not w.draining]
        others = sum(1 for w in live if not backend.owns(w.address))
        current = backend.count() + others
        now = self._clock()
        target = self._policy.target(now, reply.desired_workers, current)
        changed = 0
        if target > current:
            backend.scale_up(target - current)
            changed = target - current
        elif target < current:
            # Never the last worker of a running job, nor one holding an unmovable task.
            candidates = [
                w.address
                for w in sorted(live, key=lambda w: (w.busy, w.tasks, w.address))
                if not w.pinned and backend.owns(w.address)
            ]
            changed = -backend.scale_down(current - target, candidates)
        decision = Decision(now, reply.desired_workers, current, target, changed)
        self.decisions.append(decision)
        if changed:
            logger.info(
                "autoscale: the jobs need %d workers, %d run: %s %d",
                reply.desired_workers,
                current,
                "started" if changed > 0 else "draining",
                abs(changed),
            )
        return decision

    def run(self, stop: threading.Event) -> None:
        """Rounds every ``interval_s`` until ``stop`` is set; a dispatcher that cannot be
        reached is asked again next round."""
        while not stop.is_set():
            try:
                self.step()
            except FeedlineError as error:
                logger.warning("autoscale: %s; trying again in %.1f s", error, self._interval_s)
            stop.wait(self._interval_s)
