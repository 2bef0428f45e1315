"""Fast sessions for feedline's ``s3://`` file systems: listings and new clients.

A listing of 10,000 objects is 10 pages of 1,000, and botocore spends on each page:

- **timestamps**: each object's ``LastModified``, parsed with ``dateutil`` (about 60 µs). S3 and
  its compatible stores send ISO 8601 (``2026-11-28T18:00:00.000Z``), which
  ``datetime.fromisoformat`` parses in about 1 µs (``parse_timestamp``); any other form goes to
  botocore's own parser.
- **the objects**: botocore's XML parser walks each ``<Contents>`` element generically, about
  16 ms a page. ``parse_listing``, a handler of botocore's ``before-parse`` event for
  ``ListObjectsV2``, parses them with a plan made once from the same shape of botocore's model
  (member names, XML names, types: ``_plan``), about half that, and leaves the rest of the page
  (its token, prefixes, counts) to botocore. Where the model has a member it has no plan for,
  or the page is not what the plan expects, botocore parses the page as before.

And a new client reads botocore's model files again (the S3 service model, its endpoint rules:
50-150 ms a client); sessions that read them from botocore's default data path share one loader
(``_shared_loader``), which reads each file once per process.

``use_fast_session(fs)`` gives a new ``S3FileSystem`` the session s3fs would make itself
(``AioSession(**fs.kwargs)``: one per file system, so credentials are found as s3fs finds them)
with all three. A file system the caller gave a session, or one already connected, is left as
it is; nothing global changes.
"""

from __future__ import annotations

import datetime
import functools
import re
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

__all__ = ["parse_listing", "parse_timestamp", "use_fast_session"]

# What S3 sends: date, time, an optional fraction, and Z or an offset.
_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?(Z|[+-]\d\d:\d\d)\Z")
_LOCK = threading.Lock()
_LOADER: Any = None  # the loader of the sessions on botocore's default data path


def parse_timestamp(value: Any) -> datetime.datetime:
    """``value`` (a timestamp in a botocore response) as an aware ``datetime``."""
    if isinstance(value, str) and _ISO.match(value):
        return datetime.datetime.fromisoformat(value)
    from botocore.parsers import DEFAULT_TIMESTAMP_PARSER

    parsed: datetime.datetime = DEFAULT_TIMESTAMP_PARSER(value)
    return parsed


def use_fast_session(fs: Any) -> None:
    """Give ``fs`` (an ``S3FileSystem``) a session whose responses parse timestamps with
    ``parse_timestamp`` and listings with ``parse_listing``, and whose clients share the
    process's model files, unless it has a session or a connection already."""
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
        _shared_loader(session)
        session.register("before-parse.s3.ListObjectsV2", parse_listing)
        fs.session = session


def _shared_loader(session: Any) -> None:
    """(Under ``_LOCK``.) ``session`` reads botocore's model files through the process's one
    loader, which caches what it read, where it reads them from botocore's default data path
    (no ``AWS_DATA_PATH``, no ``data_path`` in its config)."""
    global _LOADER
    if session.get_config_variable("data_path"):
        return
    if _LOADER is None:
        _LOADER = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _LOADER)


# -- listings -------------------------------------------------------------------------------
# A plan parses one element of a structure shape: for each child's tag (with the page's
# namespace), the member's name, how its text or element becomes the value, and whether the
# member is a flattened list (its elements repeat the tag, each an item).
_Plan = dict[str, tuple[str, Callable[[ET.Element], Any], bool]]
_PLANS: dict[tuple[str, str], _Plan | None] = {}
_CONTENTS = "Contents"


def _text(node: ET.Element) -> str:
    return node.text or ""


def _scalar(type_name: str) -> Callable[[ET.Element], Any] | None:
    """How botocore's XML parser reads a scalar of ``type_name`` (None: not planned)."""
    if type_name in ("string", "character"):
        return _text
    if type_name in ("integer", "long"):
        return lambda node: int(_text(node))
    if type_name in ("float", "double"):
        return lambda node: float(_text(node))
    if type_name == "boolean":
        return lambda node: node.text == "true"
    if type_name == "timestamp":
        return lambda node: parse_timestamp(_text(node))
    return None


def _plan(shape: Any, namespace: str) -> _Plan | None:
    """The plan of structure ``shape`` (a botocore ``StructureShape``) in XML ``namespace``
    (``"{uri}"`` or empty), made once; None where a member needs more than a plan does."""
    key = (shape.name, namespace)
    if key not in _PLANS:
        _PLANS[key] = None  # (a shape that contains itself is not planned)
        _PLANS[key] = _make_plan(shape, namespace)
    return _PLANS[key]


def _make_plan(shape: Any, namespace: str) -> _Plan | None:
    if shape.type_name != "structure" or shape.metadata.get("exception"):
        return None
    if getattr(shape, "is_tagged_union", False):
        return None
    plan: _Plan = {}
    for member_name, member in shape.members.items():
        serialization = member.serialization
        if serialization.get("location") or serialization.get("xmlAttribute"):
            return None
        read: Callable[[ET.Element], Any] | None
        flattened = member.type_name == "list" and bool(serialization.get("flattened"))
        if flattened:
            read = _scalar(member.member.type_name)
        elif member.type_name == "structure":
            inner = _plan(member, namespace)
            read = None if inner is None else functools.partial(_parse_element, plan=inner)
        else:
            read = _scalar(member.type_name)
        if read is None:
            return None
        plan[namespace + _xml_name(member, member_name)] = (member_name, read, flattened)
    return plan


def _xml_name(member: Any, member_name: str) -> str:
    """The tag of ``member`` in its structure's element (botocore's ``_member_key_name``)."""
    if member.type_name == "list" and member.serialization.get("flattened"):
        name = member.member.serialization.get("name")
        if name is not None:
            return str(name)
    return str(member.serialization.get("name") or member_name)


def _parse_element(node: ET.Element, plan: _Plan) -> dict[str, Any]:
    """One element of a planned structure as botocore's parser gives it: the members present,
    unknown tags passed over."""
    parsed: dict[str, Any] = {}
    for child in node:
        entry = plan.get(child.tag)
        if entry is None:
            continue
        member_name, read, flattened = entry
        if flattened:
            parsed.setdefault(member_name, []).append(read(child))
        else:
            parsed[member_name] = read(child)
    return parsed


def parse_listing(
    response_dict: dict[str, Any],
    operation_model: Any,
    customized_response_dict: dict[str, Any],
    **kwargs: Any,
) -> None:
    """botocore's ``before-parse.s3.ListObjectsV2``: the page's objects (``Contents``) parsed
    here into ``customized_response_dict``, which botocore merges into its result, and taken
    out of the body it parses next; a page it cannot plan for is left to botocore whole."""
    body = response_dict.get("body")
    if response_dict.get("status_code") != 200 or not isinstance(body, bytes):
        return
    member = operation_model.output_shape.members.get(_CONTENTS)
    if member is None or member.type_name != "list" or not member.serialization.get("flattened"):
        return
    tag = _xml_name(member, _CONTENTS)
    if f"{tag}>".encode() not in body:
        return  # no objects on this page
    try:
        root = ET.fromstring(body)
        namespace = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
        plan = _plan(member.member, namespace)
        if plan is None:
            return
        nodes = root.findall(namespace + tag)
        contents = [_parse_element(node, plan) for node in nodes]
    except (ET.ParseError, ValueError, TypeError):
        return  # botocore parses it, and says what is wrong
    for node in nodes:
        root.remove(node)
    customized_response_dict[_CONTENTS] = contents
    response_dict["body"] = ET.tostring(root)
