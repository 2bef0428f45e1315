"""Fast timestamps for feedline's ``s3://`` file systems.

Listing a bucket returns a ``LastModified`` timestamp per object, and botocore parses each one
with ``dateutil`` (about 60 µs): for a listing of 10,000 objects that is most of the client's CPU.
S3 and its compatible stores send ISO 8601 (``2026-11-28T18:00:00.000Z``), which
``datetime.fromisoformat`` parses in about 1 µs; any other form goes to botocore's own parser.

``use_fast_timestamps(fs)`` gives a new ``S3FileSystem`` the session s3fs would make itself
(``AioSession(**fs.kwargs)``: one per file system, so credentials are found as s3fs finds them)
with that parser. A file system the caller gave a session, or one already connected, is left as
it is; nothing global changes.
"""

from __future__ import annotations

import datetime
import re
import threading
from typing import Any

__all__ = ["parse_timestamp", "use_fast_timestamps"]

# What S3 sends: date, time, an optional fraction, and Z or an offset.
_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?(Z|[+-]\d\d:\d\d)\Z")
_LOCK = threading.Lock()


def parse_timestamp(value: Any) -> datetime.datetime:
    """``value`` (a timestamp in a botocore response) as an aware ``datetime``."""
    if isinstance(value, str) and _ISO.match(value):
        return datetime.datetime.fromisoformat(value)
    from botocore.parsers import DEFAULT_TIMESTAMP_PARSER

    parsed: datetime.datetime = DEFAULT_TIMESTAMP_PARSER(value)
    return parsed


def use_fast_timestamps(fs: Any) -> None:
    """Give ``fs`` (an ``S3FileSystem``) a session whose responses parse timestamps with
    ``parse_timestamp``, unless it has a session or a connection already."""
    if getattr(fs, "session", True) is not None or getattr(fs, "_s3", True) is not None:
        return
    from aiobotocore.session import AioSession

    with _LOCK:
        if fs.session is not None or fs._s3 is not None:
            return
        session = AioSession(**fs.kwargs)
        session.get_component("response_parser_factory").set_parser_defaults(
            timestamp_parser=parse_timestamp
        )
        fs.session = session
