"""Why is my input slow? ``diagnose`` names the bottleneck of each running job.

From a ``protocol.LoadReply`` (what ``GetLoad`` answers: the consumers' wait for input, the
workers' busy time and buffer fill, the busy time of each stage of the workers' pipelines):

==============  ================================================  ==========================
bottleneck      when                                              what to change
==============  ================================================  ==========================
``idle``        no job runs, or no consumer takes elements        nothing
``trainer``     the steps wait for input less than 10% of the     the training step itself;
                time                                              more workers do not help
``map``         the workers are busy, and a map (or filter)       num_parallel_calls, a
                stage takes 60% of their time or more             faster function, workers
``reader``      the workers are busy, and a source (a reader)     parallel reads (interleave),
                takes 60% of their time or more                   more files, workers
``workers``     the workers are busy, no one stage dominates      more workers
``network``     the steps wait, the workers are mostly idle       the transfer: compression,
                (their buffers hold elements that do not arrive   same-host workers (shared
                fast enough)                                      memory), the network
==============  ================================================  ==========================

The predicted gain of one more worker: where the workers are the bottleneck (map, reader,
workers), ``N`` workers make ``R`` elements a second and the consumers would take
``R / (1 - wait)``, so ``N + 1`` make ``min(R (N + 1) / N, R / (1 - wait))``; elsewhere none.
"""

from __future__ import annotations

import dataclasses

from feedline.service.protocol import MAX_WAIT_FRACTION, JobLoad, LoadReply
from feedline.service.stages import source_stage, stage_kind

__all__ = ["Diagnosis", "diagnose", "diagnose_job", "render"]

#: Steps that wait less than this fraction of the time are the trainer's.
TRAINER_WAIT = 0.1
#: Workers busier than this (on average) are the bottleneck.
BUSY = 0.6
#: A stage that takes at least this share of the workers' time is the bottleneck among them.
DOMINANT = 0.6
# Stages whose time is waiting for another thread of theirs, not work.
_WAITING_KINDS = frozenset({"prefetch", "timed"})
_MAP_KINDS = frozenset({"map", "filter", "flatmap", "parallelmap", "mapandbatch"})


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """The bottleneck of one job (or of the idle service).

    Attributes:
      bottleneck: ``idle``, ``trainer``, ``map``, ``reader``, ``workers`` or ``network``.
      summary: what was measured, in a sentence.
      advice: what to change.
      gain: the predicted gain in elements per second of one more worker, as a fraction
        (0.25: 25% more); 0 where a worker more does not help.
      job_id: the job, None for the idle service.
      stage: the stage named (``map#2``), or None.
    """

    bottleneck: str
    summary: str
    advice: str
    gain: float = 0.0
    job_id: int | None = None
    stage: str | None = None


def _percent(value: float) -> str:
    return f"{100 * value:.0f}%"


def one_more_worker(job: JobLoad) -> float:
    """The predicted gain of one more worker for ``job`` whose workers are its bottleneck."""
    workers = max(1, len(job.workers))
    wait = min(job.wait or 0.0, MAX_WAIT_FRACTION)
    return max(0.0, min((workers + 1) / workers, 1.0 / (1.0 - wait)) - 1.0)


def diagnose_job(job: JobLoad) -> Diagnosis:
    """The bottleneck of ``job`` (the module's docstring gives the rules)."""
    if job.wait is None or job.steps_per_s <= 0:
        return Diagnosis(
            "idle",
            f"job {job.job_id} runs but no consumer takes its elements",
            "nothing to change in the service: start (or resume) the training loop",
            job_id=job.job_id,
        )
    workers = max(1, len(job.workers))
    busy = job.busy / workers
    measured = (
        f"the steps of job {job.job_id} wait for input {_percent(job.wait)} of the time; its "
        f"{workers} worker{'s are' if workers > 1 else ' is'} busy {_percent(busy)} "
        f"({job.elements_per_s:.1f} elements/s)"
    )
    if job.wait < TRAINER_WAIT:
        return Diagnosis(
            "trainer",
            measured,
            "the trainer itself is the bottleneck: the input is ready when a step asks; more "
            "workers would not make training faster (speed up the step, or remove workers)",
            job_id=job.job_id,
        )
    if busy < BUSY:
        fill = f"; their buffers are {_percent(job.fill)} full" if job.fill is not None else ""
        return Diagnosis(
            "network",
            measured + fill,
            "the workers make elements faster than they reach the consumers: the network "
            "(or the transfer) is the bottleneck; use compression='AUTO' for large elements, "
            "workers on the trainer's host (shared memory), or a faster network",
            job_id=job.job_id,
        )
    gain = one_more_worker(job)
    work = {name: s for name, s in job.stages.items() if stage_kind(name) not in _WAITING_KINDS}
    total = sum(work.values())
    if total > 0:
        stage, seconds = max(work.items(), key=lambda item: item[1])
        share = seconds / total
        if share >= DOMINANT and source_stage(stage):
            return Diagnosis(
                "reader",
                f"{measured}; the reader {stage.rstrip('$')} takes {_percent(share)} of their time",
                "read in parallel (interleave over more files with num_parallel_calls), "
                f"or add workers: one more is predicted to give {_percent(gain)} more elements/s",
                gain,
                job.job_id,
                stage,
            )
        if share >= DOMINANT and stage_kind(stage) in _MAP_KINDS:
            return Diagnosis(
                "map",
                f"{measured}; the map function of {stage} takes {_percent(share)} of their time",
                "give the map num_parallel_calls=AUTOTUNE (or make its function faster), or add "
                f"workers: one more is predicted to give {_percent(gain)} more elements/s",
                gain,
                job.job_id,
                stage,
            )
    return Diagnosis(
        "workers",
        measured,
        f"too few workers: add workers; one more is predicted to give {_percent(gain)} more "
        "elements/s",
        gain,
        job.job_id,
    )


def diagnose(load: LoadReply) -> list[Diagnosis]:
    """The bottleneck of each running job; one ``idle`` diagnosis where none runs."""
    if not load.jobs:
        workers = len(load.workers)
        registered = f" ({workers} worker{'' if workers == 1 else 's'} registered)"
        return [
            Diagnosis(
                "idle",
                "the service is idle: no job runs" + (registered if load.workers else ""),
                "nothing to change; run diagnose while a training loop reads the service",
            )
        ]
    return [diagnose_job(job) for job in load.jobs]


def render(diagnoses: list[Diagnosis], load: LoadReply) -> str:
    """The diagnoses as text, as ``feedline diagnose`` prints them."""
    lines = [
        f"workers: {load.live_workers} serving, the jobs need {load.desired_workers}",
    ]
    for item in diagnoses:
        where = "service" if item.job_id is None else f"job {item.job_id}"
        lines.append(f"{where}: bottleneck: {item.bottleneck}")
        lines.append(f"  measured: {item.summary}")
        lines.append(f"  change: {item.advice}")
        if item.job_id is not None:
            lines.append(f"  one more worker: +{_percent(item.gain)} elements/s (predicted)")
    return "\n".join(lines)
