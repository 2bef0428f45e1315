"""Tests for feedline/_s3_session.py: fast LastModified parsing on a real S3 server (moto)."""

from __future__ import annotations

import datetime
import pickle

import pytest

from feedline import _fs
from feedline._s3_session import parse_timestamp

botocore_parsers = pytest.importorskip("botocore.parsers", reason="s3:// URLs need s3fs")


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-28T18:00:00.000Z",
        "2026-11-28T18:00:00Z",
        "2026-11-28T18:00:00.123456Z",
        "2026-11-28T19:30:00.5+01:30",
        "Sat, 28 Nov 2026 18:00:00 GMT",  # RFC 822: botocore's parser
        1796061600,  # epoch seconds: botocore's parser
    ],
)
def test_parse_timestamp_is_the_instant_botocore_gives(text: object) -> None:
    fast = parse_timestamp(text)
    assert fast.tzinfo is not None
    assert fast == botocore_parsers.DEFAULT_TIMESTAMP_PARSER(text)


def test_listing_gives_the_same_times_as_plain_s3fs(s3_bucket: str) -> None:
    import s3fs

    fs, root = _fs.filesystem(s3_bucket)
    for i in range(3):
        fs.pipe(f"{root}/part-{i}", b"x" * i)
    assert (
        fs.session is not None
        and fs.session.get_component("response_parser_factory")._defaults["timestamp_parser"]
        is parse_timestamp
    )

    plain = s3fs.S3FileSystem(skip_instance_cache=True)
    ours = {e["name"]: e for e in fs.ls(root, detail=True, refresh=True)}
    theirs = {e["name"]: e for e in plain.ls(root, detail=True, refresh=True)}
    assert sorted(ours) == sorted(theirs) == [f"{root}/part-{i}" for i in range(3)]
    for name, entry in ours.items():
        assert isinstance(entry["LastModified"], datetime.datetime)
        assert entry["LastModified"] == theirs[name]["LastModified"]
        assert entry["size"] == theirs[name]["size"]
    # The file system still pickles (datasets and states travel to other processes).
    assert pickle.loads(pickle.dumps(fs)).ls(root) == sorted(ours)


def test_a_session_of_the_callers_own_is_kept(s3_bucket: str) -> None:
    from aiobotocore.session import AioSession

    mine = AioSession()
    fs, _ = _fs.filesystem(s3_bucket, {"session": mine})
    assert fs.session is mine
