"""Tests for feedline/_s3_session.py: fast timestamps and listings, and shared model files, on a
real S3 server (moto): each gives what botocore and s3fs give on their own."""

from __future__ import annotations

import copy
import datetime
import pickle
from typing import Any

import pytest

from feedline import _fs, _s3_session
from feedline._s3_session import parse_listing, parse_timestamp

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


# Keys that a listing sends URL-encoded (botocore asks for EncodingType=url and decodes them).
NAMES = ["plain", "with space", "ü-umlaut", "a&b<c>", "deep/er/key", "x" * 200]


def raw_pages(bucket: str, **params: Any) -> list[dict[str, Any]]:
    """The raw ListObjectsV2 responses (botocore's ``response_dict``) of a listing of
    ``bucket`` by a plain boto3 client, and what that client parsed of each."""
    import boto3

    client = boto3.client("s3")
    pages: list[dict[str, Any]] = []
    client.meta.events.register(
        "before-parse.s3.ListObjectsV2",
        lambda response_dict, **kw: pages.append(copy.deepcopy(response_dict)),
    )
    token: dict[str, str] = {}
    while True:
        page = client.list_objects_v2(Bucket=bucket, **params, **token)
        pages[-1]["parsed"] = page
        if not page.get("IsTruncated"):
            return pages
        token = {"ContinuationToken": page["NextContinuationToken"]}


def both_ways(response_dict: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``response_dict`` parsed by botocore alone, and by ``parse_listing`` and then botocore,
    as a client with the handler does (the same timestamp parser for both)."""
    import botocore.session

    operation = botocore.session.get_session().get_service_model("s3")
    model = operation.operation_model("ListObjectsV2")
    parser = botocore_parsers.RestXMLParser(timestamp_parser=parse_timestamp)
    plain = parser.parse(dict(response_dict), model.output_shape)
    ours, customized = dict(response_dict), {}
    parse_listing(ours, model, customized)
    fast = parser.parse(ours, model.output_shape)
    fast.update(customized)
    return plain, fast


@pytest.mark.parametrize(
    "params",
    [
        {"MaxKeys": 4},
        {"MaxKeys": 1000, "FetchOwner": True},
        {"Delimiter": "/"},  # prefixes as well as objects
        {"Prefix": "nothing-here/"},  # a page without objects
    ],
    ids=["pages", "owner", "delimiter", "empty"],
)
def test_a_listing_page_parses_as_botocore_parses_it(
    s3_bucket: str, params: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, root = _fs.filesystem(s3_bucket)
    for i, name in enumerate(NAMES):
        fs.pipe(f"{root}/{name}", b"x" * i)
    pages = raw_pages(root, **params)
    assert len(pages) == (2 if params.get("MaxKeys") == 4 else 1)
    for page in pages:
        parsed = page.pop("parsed")
        plain, fast = both_ways(page)
        assert fast == plain
        assert len(fast.get("Contents", [])) == len(parsed.get("Contents", []))
    # Through the file system, decoded names and all: what plain s3fs lists.
    import s3fs

    parsed_here: list[Any] = []
    parse_element = _s3_session._parse_element

    def counted(node: Any, plan: Any) -> Any:
        parsed_here.append(node)
        return parse_element(node, plan)

    monkeypatch.setattr(_s3_session, "_parse_element", counted)
    ours = fs.find(root, detail=True, prefix=params.get("Prefix", ""))
    theirs = s3fs.S3FileSystem(skip_instance_cache=True).find(
        root, detail=True, prefix=params.get("Prefix", "")
    )
    assert ours == theirs
    assert sorted(ours) == ([] if "Prefix" in params else sorted(f"{root}/{n}" for n in NAMES))
    assert len(parsed_here) == len(ours)  # each object parsed by parse_listing


def test_every_member_of_an_object_parses_as_botocore_parses_it() -> None:
    body = (
        b'<?xml version="1.0" encoding="UTF-8"?>'
        b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        b"<Name>b</Name><Prefix></Prefix><KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys>"
        b"<IsTruncated>false</IsTruncated>"
        b"<Contents><Key>k1</Key><LastModified>2026-11-28T18:00:00.000Z</LastModified>"
        b"<ETag>&quot;abc&quot;</ETag><ChecksumAlgorithm>CRC32</ChecksumAlgorithm>"
        b"<ChecksumAlgorithm>SHA256</ChecksumAlgorithm><ChecksumType>FULL_OBJECT</ChecksumType>"
        b"<Size>12</Size><StorageClass>GLACIER</StorageClass>"
        b"<Owner><DisplayName>me</DisplayName><ID>42</ID></Owner>"
        b"<RestoreStatus><IsRestoreInProgress>false</IsRestoreInProgress>"
        b"<RestoreExpiryDate>Sat, 28 Nov 2026 18:00:00 GMT</RestoreExpiryDate></RestoreStatus>"
        b"<SomethingNew>ignored</SomethingNew></Contents>"
        b"<Contents><Key>k2</Key><ETag></ETag><Size>0</Size><Owner/></Contents>"
        b"</ListBucketResult>"
    )
    page = {"status_code": 200, "headers": {}, "body": body}
    plain, fast = both_ways(page)
    assert fast == plain
    assert fast["Contents"][0]["ChecksumAlgorithm"] == ["CRC32", "SHA256"]
    assert fast["Contents"][0]["RestoreStatus"]["IsRestoreInProgress"] is False
    assert fast["Contents"][1] == {"Key": "k2", "ETag": "", "Size": 0, "Owner": {}}


@pytest.mark.parametrize(
    "body",
    [
        b"<ListBucketResult><Contents><Key>k</Key><Size>1</Si",  # cut off mid-page
        b"<ListBucketResult><Contents><Key>k</Key><Size>one</Size></Contents></ListBucketResult>",
    ],
    ids=["truncated", "not-a-number"],
)
def test_a_page_the_plan_cannot_read_is_left_to_botocore(body: bytes) -> None:
    import botocore.session

    model = botocore.session.get_session().get_service_model("s3")
    page, customized = {"status_code": 200, "headers": {}, "body": body}, {}
    parse_listing(page, model.operation_model("ListObjectsV2"), customized)
    assert page["body"] is body and customized == {}


def test_clients_share_the_model_files_unless_told_where_to_read_them(
    s3_bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    first, _ = _fs.filesystem(s3_bucket, {"skip_instance_cache": True})
    second, _ = _fs.filesystem(s3_bucket, {"skip_instance_cache": True, "anon": False})
    assert first is not second
    loader = first.session.get_component("data_loader")
    assert second.session.get_component("data_loader") is loader
    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path))
    own, _ = _fs.filesystem(s3_bucket, {"skip_instance_cache": True})
    assert own.session.get_component("data_loader") is not loader
    # Each still lists the bucket.
    first.pipe(f"{s3_bucket}/a", b"1")
    assert [second.ls(s3_bucket, refresh=True), own.ls(s3_bucket, refresh=True)] == [
        [f"{s3_bucket[5:]}/a"]
    ] * 2
