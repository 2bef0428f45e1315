"""What the status pages show: snapshots of a dispatcher or worker, and their HTML.

A server copies what its page shows into a snapshot (``DispatcherSnapshot``, ``WorkerSnapshot``:
plain values only) under its lock; ``render_dispatcher`` and ``render_worker`` then make the page
outside any lock. Every value goes through ``html.escape``: a job name or dataset id is text on
the page, never markup; and through ``text.printable``: a character no page can encode (a lone
surrogate) shows as its escape. A row that cannot be shown (a value of an unexpected type) is
logged and shown as such, so one odd value never takes the page down. The pages have no
scripts; their only style is inline.
"""

from __future__ import annotations

import dataclasses
import html
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from feedline.service.config import ShardingPolicy
from feedline.service.diagnosis import diagnose
from feedline.service.protocol import LoadReply
from feedline.service.status.text import printable

__all__ = ["DispatcherSnapshot", "WorkerSnapshot", "render_dispatcher", "render_worker"]

logger = logging.getLogger(__name__)

_CARDINALITY = {-1: "infinite", -2: "unknown"}
_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #eee; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
"""


# -- snapshots ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DispatcherSnapshot:
    """What a dispatcher's page shows, copied under its lock (plain values only)."""

    target: str
    incarnation: int
    uptime_s: float
    workers: list[dict[str, Any]]
    datasets: list[dict[str, Any]]
    jobs: list[dict[str, Any]]
    consumers: list[dict[str, Any]]
    errors: list[tuple[str, str]]
    #: The workers that do not drain.
    live_workers: int = 0
    #: The workers the running jobs need (``dispatcher.demand``).
    desired_workers: int = 0
    #: Each running job's load (``dispatcher.demand.JobLoad``).
    loads: list[Any] = dataclasses.field(default_factory=list)
    #: Each ``distributed_save``'s progress (``dispatcher.snapshots.SaveProgress``).
    saves: list[Any] = dataclasses.field(default_factory=list)

    @classmethod
    def capture(
        cls,
        *,
        target: str,
        state: Any,
        started: float,
        worker_seen: dict[str, float],
        client_seen: dict[int, float],
        waiting: Any,
        draining: set[str],
        telemetry: Any,
        loads: Sequence[Any] = (),
        desired_workers: int = 0,
        saves: Sequence[Any] = (),
    ) -> DispatcherSnapshot:
        """The snapshot of a dispatcher whose lock the caller holds.

        Args:
          target: the dispatcher's target.
          state: its ``DispatcherState``.
          started: when it started (``time.monotonic()``).
          worker_seen, client_seen: when each worker and consumer last heartbeated.
          waiting: the workers and consumers whose heartbeat waits at the dispatcher now.
          draining: the workers that drain.
          telemetry: its ``DispatcherTelemetry`` (served counts and rates, recent errors).
          loads: each running job's load (``dispatcher.demand.JobLoad``).
          desired_workers: the workers the running jobs need.
          saves: each ``distributed_save``'s progress (``dispatcher.snapshots.SaveProgress``).
        """
        now = time.monotonic()

        def ago(seen: float | None, who: Any) -> float | None:
            if who in waiting:
                return 0.0
            return None if seen is None else now - seen

        workers = []
        for address, record in sorted(state.workers.items()):
            tasks = state.worker_tasks(address)
            workers.append(
                {
                    "address": address,
                    "tags": ", ".join(map(str, record.tags)),
                    "heartbeat_ago": ago(worker_seen.get(address), address),
                    "state": "draining" if address in draining else "serving",
                    "tasks_running": sum(1 for t in tasks if not t.finished),
                    "tasks": len(tasks),
                }
            )
        reading: dict[str, int] = {}
        for job in state.jobs.values():
            reading[job.dataset_id] = reading.get(job.dataset_id, 0) + 1
        datasets = [
            {
                "dataset_id": record.dataset_id,
                "cardinality": record.cardinality,
                "fingerprint": record.fingerprint[:12],
                "bytes": len(record.payload),
                "splittable": record.split_plan is not None,
                "jobs": reading.get(record.dataset_id, 0),
            }
            for record in state.datasets.values()
        ]
        jobs = []
        for job in state.jobs.values():
            tasks = state.job_tasks(job.job_id)
            counts = {
                "running": sum(1 for t in tasks if not t.finished),
                "done": sum(1 for t in tasks if t.finished and not t.lost),
                "lost": sum(1 for t in tasks if t.lost),
            }
            served = [telemetry.rates.get(t.task_id, now) for t in tasks]
            cursors = sorted((r, c) for (j, r), c in state.split_cursors.items() if j == job.job_id)
            if cursors:
                repetition, cursor = cursors[-1]
                progress = (
                    f"{cursor['position']:,} of {cursor['num_units']:,} units handed out "
                    f"(repetition {repetition})"
                )
            elif job.finished:
                progress = "ended"
            else:
                progress = f"{counts['done']} of {len(tasks)} tasks done"
            ledger = state.ledgers.get(job.job_id)
            if ledger is not None and not job.finished:  # exactly once: what is delivered
                progress += (
                    f"; splits: {len(ledger.done)} delivered, {len(ledger.open)} open, "
                    f"{len(ledger.replay)} to hand out again"
                )
            error = job.error or {}
            jobs.append(
                {
                    "job_id": job.job_id,
                    "job_name": job.job_name,
                    "iteration": job.iteration,
                    "dataset_id": job.dataset_id,
                    "mode": ShardingPolicy(job.mode).name,
                    "consumers": len(state.active_clients(job.job_id)),
                    "num_consumers": job.num_consumers,
                    "tasks": counts,
                    "progress": progress,
                    "state": "failed" if job.error else "finished" if job.finished else "running",
                    "error": f"{error.get('type')}: {error.get('message')}" if error else "",
                    "elements": sum(s[0] for s in served),
                    "bytes": sum(s[1] for s in served),
                    "elements_per_s": 0.0 if job.finished else sum(s[2] for s in served),
                    "bytes_per_s": 0.0 if job.finished else sum(s[3] for s in served),
                }
            )
        consumers = [
            {
                "client_id": client.client_id,
                "job_id": client.job_id,
                "released": client.released,
                "heartbeat_ago": ago(client_seen.get(client.client_id), client.client_id),
            }
            for client in state.clients.values()
        ]
        telemetry.rates.keep_only(state.tasks)
        return cls(
            target=target,
            incarnation=state.incarnation,
            uptime_s=now - started,
            workers=workers,
            datasets=datasets,
            jobs=jobs,
            consumers=consumers,
            errors=telemetry.errors.list(),
            live_workers=len(set(state.workers) - draining),
            desired_workers=desired_workers,
            loads=list(loads),
            saves=list(saves),
        )


@dataclasses.dataclass(frozen=True)
class WorkerSnapshot:
    """What a worker's page shows (plain values only)."""

    address: str
    dispatcher: str
    incarnation: int | None
    uptime_s: float
    state: str
    since_heartbeat: float | None
    tasks: list[dict[str, Any]]
    ended: list[dict[str, Any]]
    errors: list[tuple[str, str]]


# -- HTML -----------------------------------------------------------------------------------


def _escape(value: Any) -> str:
    """``value`` as text for the page: printable, and escaped for HTML."""
    return html.escape(printable(value))


def _cell(value: Any) -> str:
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(value, float):
        text = f"{value:,.1f}"
    elif isinstance(value, int) and not isinstance(value, bool):
        text = f"{value:,}"
    else:
        text = "" if value is None else str(value)
    attributes = ' class="num"' if numeric else ""
    return f"<td{attributes}>{_escape(text)}</td>"


def _table(
    title: str, headers: Sequence[str], items: Iterable[Any], row: Callable[[Any], Sequence[Any]]
) -> str:
    rows = [_row(row, item, len(headers)) for item in items]
    parts = [f"<h2>{_escape(title)} ({len(rows)})</h2>"]
    if not rows:
        return parts[0] + "<p>none</p>"
    parts.append("<table><tr>" + "".join(f"<th>{_escape(h)}</th>" for h in headers) + "</tr>")
    parts.extend("<tr>" + "".join(_cell(v) for v in cells) + "</tr>" for cells in rows)
    parts.append("</table>")
    return "\n".join(parts)


def _row(row: Callable[[Any], Sequence[Any]], item: Any, width: int) -> Sequence[Any]:
    """The cells of ``item``; one that cannot be shown is logged and shown as what it holds."""
    try:
        return row(item)
    except Exception as error:  # a value of an unexpected type: show the rest of the page
        logger.warning("status page: cannot show %r", item, exc_info=True)
        return [f"cannot show {item!r:.300}: {type(error).__name__}", *[""] * (width - 1)]


def _page(title: str, facts: Sequence[tuple[str, Any]], sections: Sequence[str]) -> str:
    fact_lines = "".join(f"<li>{_escape(name)}: {_escape(value)}</li>" for name, value in facts)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_escape(title)}</title><style>{_STYLE}</style></head><body>\n"
        f"<h1>{_escape(title)}</h1><ul>{fact_lines}</ul>\n"
        + "\n".join(sections)
        + '\n<p><a href="/metrics">Prometheus metrics</a></p></body></html>\n'
    )


def _ago(seconds: float | None) -> str:
    return "never" if seconds is None else "now" if seconds < 0.05 else f"{seconds:.1f} s ago"


def _errors(errors: Sequence[tuple[str, str]]) -> str:
    return _table("Recent errors", ["time", "error"], errors, list)


_WORKER_COLUMNS = ["address", "last heartbeat", "state", "running tasks", "tasks", "tags"]
_JOB_COLUMNS = [
    "job", "name", "dataset", "mode", "consumers", "tasks (running/done/lost)", "progress",
    "elements", "elements/s", "bytes/s", "state",
]  # fmt: skip
_DATASET_COLUMNS = ["dataset", "cardinality", "fingerprint", "bytes", "splittable", "jobs"]
_CONSUMER_COLUMNS = ["consumer", "job", "last heartbeat", "state"]
_SAVE_COLUMNS = ["path", "streams done", "streams writing", "chunks", "elements", "bytes", "state"]
_TASK_COLUMNS = [
    "task", "job", "dataset", "mode", "shard", "consumers", "buffered", "buffered bytes",
    "elements served", "elements/s", "bytes/s", "state",
]  # fmt: skip


def _worker_row(worker: dict[str, Any]) -> list[Any]:
    return [
        worker["address"],
        _ago(worker["heartbeat_ago"]),
        worker["state"],
        worker["tasks_running"],
        worker["tasks"],
        worker["tags"],
    ]


def _job_row(job: dict[str, Any]) -> list[Any]:
    name = "" if job["job_name"] is None else f"{job['job_name']} #{job['iteration']}"
    consumers = job["consumers"]
    if job["num_consumers"] is not None:
        consumers = f"{consumers} (round robin of {job['num_consumers']})"
    state = job["state"] + (f": {job['error']}" if job["error"] else "")
    return [
        str(job["job_id"]),
        name,
        job["dataset_id"],
        job["mode"],
        consumers,
        "{running}/{done}/{lost}".format(**job["tasks"]),
        job["progress"],
        job["elements"],
        job["elements_per_s"],
        round(job["bytes_per_s"]),
        state,
    ]


def _save_row(save: Any) -> list[Any]:
    return [
        save.path,
        f"{save.streams_done} of {save.streams}",
        save.writing,
        save.chunks,
        save.elements,
        save.nbytes,
        "failed" if save.error else "finished" if save.finished else "running",
    ]


def _dataset_row(dataset: dict[str, Any]) -> list[Any]:
    return [
        dataset["dataset_id"],
        _CARDINALITY.get(dataset["cardinality"], dataset["cardinality"]),
        dataset["fingerprint"],
        dataset["bytes"],
        "yes" if dataset["splittable"] else "no",
        dataset["jobs"],
    ]


def _consumer_row(consumer: dict[str, Any]) -> list[Any]:
    return [
        str(consumer["client_id"]),
        str(consumer["job_id"]),
        _ago(consumer["heartbeat_ago"]),
        "released" if consumer["released"] else "reading",
    ]


def _task_row(task: dict[str, Any]) -> list[Any]:
    return [
        str(task["task_id"]),
        str(task["job_id"]),
        task["dataset_id"],
        task["mode"],
        f"{task['worker_index']} of {task['num_workers']}",
        task["consumers"],
        task["buffered"],
        task["buffered_bytes"],
        task["elements"],
        task["elements_per_s"],
        round(task["bytes_per_s"]),
        task["state"] + _trainers(task.get("trainer_cache")),
    ]


def _trainers(cache: dict[str, Any] | None) -> str:
    """A cross-trainer task's trainers and their positions, for its state column."""
    if cache is None:
        return ""
    positions = ", ".join(f"{trainer} at {at}" for trainer, at in cache["trainers"].items())
    return (
        f"; {cache['mode']} [{cache['start']}, {cache['end']}), "
        f"{cache['spilled']} spilled; trainers: {positions or 'none yet'}"
    )


_INPUT_COLUMNS = ["job", "bottleneck", "measured", "what to change", "one more worker"]


def _diagnoses(snap: DispatcherSnapshot) -> list[list[str]]:
    """What holds each running job's input back (``feedline diagnose``'s verdicts)."""
    load = LoadReply(snap.desired_workers, jobs=tuple(snap.loads))
    return [
        [
            "service" if item.job_id is None else str(item.job_id),
            item.bottleneck,
            item.summary,
            item.advice,
            "" if item.job_id is None else f"+{100 * item.gain:.0f}% elements/s (predicted)",
        ]
        for item in diagnose(load)
    ]


def render_dispatcher(snap: DispatcherSnapshot) -> str:
    """The dispatcher's status page for ``snap``."""
    sections = [
        _table("Workers", _WORKER_COLUMNS, snap.workers, _worker_row),
        _table("Jobs", _JOB_COLUMNS, snap.jobs, _job_row),
        _table("Datasets", _DATASET_COLUMNS, snap.datasets, _dataset_row),
        _table("Consumers", _CONSUMER_COLUMNS, snap.consumers, _consumer_row),
        _table("Saves (distributed_save)", _SAVE_COLUMNS, snap.saves, _save_row),
        _table("Input", _INPUT_COLUMNS, _diagnoses(snap), list),
        _errors(snap.errors),
    ]
    facts = [
        ("serving at", snap.target),
        ("incarnation", f"{snap.incarnation:x}"),
        ("up for", f"{snap.uptime_s:.0f} s"),
        ("workers", f"{snap.live_workers} serving, the jobs need {snap.desired_workers}"),
    ]
    return _page("feedline dispatcher", facts, sections)


def render_worker(snap: WorkerSnapshot) -> str:
    """The worker's status page for ``snap``."""
    ended = [[str(e["task_id"]), e["outcome"]] for e in snap.ended]
    sections = [
        _table("Tasks", _TASK_COLUMNS, snap.tasks, _task_row),
        _table("Recently ended tasks", ["task", "outcome"], ended, list),
        _errors(snap.errors),
    ]
    incarnation = "not registered" if snap.incarnation is None else f"{snap.incarnation:x}"
    facts = [
        ("serving at", snap.address),
        ("dispatcher", snap.dispatcher),
        ("dispatcher incarnation", incarnation),
        ("last heartbeat answered", _ago(snap.since_heartbeat)),
        ("state", snap.state),
        ("up for", f"{snap.uptime_s:.0f} s"),
    ]
    return _page("feedline worker", facts, sections)
