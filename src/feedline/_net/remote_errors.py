"""Errors of a task, as they travel from a worker to the dispatcher and to every consumer.

An error raised while a worker builds or runs a task (sharding the dataset, unpickling it, any
element of the pipeline) is the job's error, not a transport failure: it travels *inside* a
successful reply, as a small dict, and is raised again by each consumer as the same type, with
the worker's traceback as a note. Only an RPC that fails means that a worker cannot be reached.

    >>> report = error_report(KeyError("no such key"), worker="127.0.0.1:5051", task_id=7)
    >>> error = error_from_report(report)
    >>> type(error).__name__, str(error)
    ('KeyError', "'no such key'")
    >>> "worker 127.0.0.1:5051" in error.__notes__[0]
    True
"""

from __future__ import annotations

import builtins
import traceback
from typing import Any

from feedline import errors

__all__ = ["error_from_report", "error_report"]

# The longest text kept of a message or a traceback.
_MAX_CHARS = 16_000
# Built-in types that would change the meaning of the consumer's loop if raised as they are.
_NOT_REBUILT = (StopIteration, StopAsyncIteration, GeneratorExit)


def error_report(error: BaseException, **where: Any) -> dict[str, Any]:
    """``error`` as a JSON-able dict: its type name, message and traceback, and ``where`` it
    happened (``worker``, ``task_id``, ...)."""
    text = "".join(traceback.format_exception(error))
    args = error.args
    message = args[0] if len(args) == 1 and isinstance(args[0], str) else str(error)
    return {
        "type": type(error).__name__,
        "message": message[:_MAX_CHARS],
        "traceback": text[-_MAX_CHARS:],
        **where,
    }


def error_from_report(report: dict[str, Any]) -> BaseException:
    """The exception ``error_report`` described: the same feedline or built-in type where one
    of that name exists (else ``UnknownError`` naming it), with the remote traceback as a note.
    """
    name = str(report.get("type", "Exception"))
    message = str(report.get("message", ""))
    error: BaseException | None = None
    kind = getattr(errors, name, None)
    if not (isinstance(kind, type) and issubclass(kind, errors.FeedlineError)):
        kind = getattr(builtins, name, None)
        if not (isinstance(kind, type) and issubclass(kind, Exception)) or issubclass(
            kind, _NOT_REBUILT
        ):
            kind = None
    if kind is not None:
        try:
            error = kind(message)
        except TypeError:  # a type whose constructor wants more than a message
            error = None
    if error is None:
        error = errors.UnknownError(f"{name}: {message}")
    where = ", ".join(f"{key} {report[key]}" for key in ("worker", "task_id") if key in report)
    remote = str(report.get("traceback", "")).rstrip()
    error.add_note(
        f"raised on the data service ({where}); the remote traceback:\n{remote}"
        if remote
        else f"raised on the data service ({where})"
    )
    return error
