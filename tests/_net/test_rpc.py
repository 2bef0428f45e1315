"""Tests of feedline/service/_rpc.py: addresses, limits and how errors travel."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from feedline import errors
from feedline._net import rpc as _rpc
from feedline._net.wire import decode_frame, encode_frame
from tests.launcher import local_auth

TOKEN = "s3cret-token"
DISPATCHER = "feedline.service.Dispatcher"


class Custom(Exception):
    pass


def _handlers() -> dict[str, _rpc.Handler]:
    def echo(header: dict[str, Any], buffers: list[memoryview]) -> Any:
        return {"got": header, "sizes": [b.nbytes for b in buffers]}, [bytes(b) for b in buffers]

    def not_found(header: dict[str, Any], buffers: list[memoryview]) -> Any:
        raise errors.NotFoundError("no such thing")

    def key_error(header: dict[str, Any], buffers: list[memoryview]) -> Any:
        raise KeyError("missing")

    def custom(header: dict[str, Any], buffers: list[memoryview]) -> Any:
        raise Custom("very custom")

    def typed(header: dict[str, Any], buffers: list[memoryview]) -> Any:
        return {"n": _rpc.field(header, "n", int)}, ()

    return {
        "Echo": echo,
        "NotFound": not_found,
        "KeyError": key_error,
        "Custom": custom,
        "Typed": typed,
    }


@pytest.fixture
def server() -> Iterator[str]:
    grpc_server, port = _rpc.start_server(
        "test.Service",
        {**_handlers(), "Upload": _handlers()["Echo"]},
        bind="127.0.0.1",
        port=0,
        token=None,
        max_request_bytes=1 << 16,
        upload_limits={"Upload": 5 * _rpc.UPLOAD_CHUNK_BYTES},
    )
    yield f"127.0.0.1:{port}"
    grpc_server.stop(0.0)


def test_round_trip_with_buffers(server: str) -> None:
    client = _rpc.RpcClient(server, "test.Service")
    header, buffers = client.call("Echo", {"a": [1, 2]}, [b"xyz", b""], timeout=5)
    assert header == {"got": {"a": [1, 2]}, "sizes": [3, 0]}
    assert [bytes(b) for b in buffers] == [b"xyz", b""]
    client.close()


def test_errors_keep_their_type(server: str) -> None:
    client = _rpc.RpcClient(server, "test.Service")
    with pytest.raises(errors.NotFoundError, match="no such thing"):
        client.call("NotFound", {}, timeout=5)
    with pytest.raises(KeyError):
        client.call("KeyError", {}, timeout=5)
    with pytest.raises(errors.UnknownError, match="Custom: very custom"):
        client.call("Custom", {}, timeout=5)
    with pytest.raises(errors.InvalidArgumentError, match="'n'"):
        client.call("Typed", {"n": "three"}, timeout=5)
    with pytest.raises(errors.InvalidArgumentError, match="'n'"):
        client.call("Typed", {"n": True}, timeout=5)
    assert client.call("Typed", {"n": 3}, timeout=5)[0] == {"n": 3}
    client.close()


def test_calls_started_together_are_in_flight_together() -> None:
    both_in = threading.Barrier(2, timeout=20)

    def meet(header: dict[str, Any], buffers: list[memoryview]) -> Any:
        both_in.wait()  # returns only once the other call is in the server too
        return {"n": header["n"]}, ()

    grpc_server, port = _rpc.start_server(
        "test.Service", {**_handlers(), "Meet": meet}, bind="127.0.0.1", port=0, token=None
    )
    client = _rpc.RpcClient(f"127.0.0.1:{port}", "test.Service")
    try:
        waits = [client.start_frame("Meet", encode_frame({"n": n}), timeout=30) for n in (1, 2)]
        assert [decode_frame(wait())[0] for wait in waits] == [{"n": 1}, {"n": 2}]
        failed = client.start_frame("NotFound", encode_frame({}), timeout=30)
        with pytest.raises(errors.NotFoundError, match="no such thing"):
            failed()
    finally:
        client.close()
        grpc_server.stop(0.0)


def test_an_unexpected_error_travels_without_the_server_traceback(
    server: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler's bug reaches the caller as its type and message; the traceback (the
    server's code and paths) stays in the server's log."""
    channel = grpc.insecure_channel(server)
    stub = channel.unary_unary("/test.Service/Custom")
    with (
        caplog.at_level(logging.ERROR, logger="feedline._net.rpc"),
        pytest.raises(grpc.RpcError) as raised,
    ):
        stub(encode_frame({}), timeout=5, metadata=local_auth())
    call = raised.value
    assert isinstance(call, grpc.Call)
    assert call.code() == grpc.StatusCode.UNKNOWN
    details = call.details() or ""
    assert "Custom: very custom" in details and "test.Service/Custom" in details
    assert "Traceback" not in details and "test_rpc.py" not in details, details
    assert any("Traceback" in (r.exc_text or "") for r in caplog.records)
    channel.close()


@pytest.mark.parametrize(
    ("header", "match"),
    [
        ({"n": 1 << 63}, "'n' is outside the 64-bit integer range"),
        ({"n": -(1 << 63) - 1}, "'n' is outside the 64-bit integer range"),
        ({"n": 10**400}, "'n' is outside the 64-bit integer range"),
    ],
)
def test_integers_past_64_bits_are_malformed(server: str, header: dict, match: str) -> None:
    client = _rpc.RpcClient(server, "test.Service")
    with pytest.raises(errors.InvalidArgumentError, match=match):
        client.call("Typed", header, timeout=5)
    assert client.call("Typed", {"n": (1 << 63) - 1}, timeout=5)[0] == {"n": (1 << 63) - 1}
    client.close()


def test_a_field_of_something_that_is_no_object_is_malformed() -> None:
    with pytest.raises(errors.InvalidArgumentError, match=r"'name'.*list"):
        _rpc.field([1], "name", str)  # type: ignore[arg-type]


def test_oversized_and_malformed_requests_are_invalid_and_serving_goes_on(server: str) -> None:
    client = _rpc.RpcClient(server, "test.Service")
    with pytest.raises(errors.InvalidArgumentError, match="over the limit"):
        client.call("Echo", {}, [b"x" * (1 << 17)], timeout=5)
    with pytest.raises(errors.InvalidArgumentError):
        client.call_frame("Echo", b"\x00garbage", timeout=5)
    with pytest.raises(errors.InvalidArgumentError):
        client.call_frame("Echo", encode_frame({"a": 1})[:-2], timeout=5)
    assert client.call("Echo", {"a": 1}, timeout=5)[0]["got"] == {"a": 1}
    client.close()


def test_a_request_far_over_the_limit_is_refused_before_it_is_read(server: str) -> None:
    client = _rpc.RpcClient(server, "test.Service")
    # Past twice the limit gRPC itself refuses it (RESOURCE_EXHAUSTED, from the length prefix).
    with pytest.raises(errors.InvalidArgumentError, match="larger than max"):
        client.call("Echo", {}, [b"x" * (4 << 20)], timeout=5)
    assert client.call("Echo", {"a": 1}, timeout=5)[0]["got"] == {"a": 1}
    client.close()


def test_an_upload_arrives_in_chunks_up_to_its_limit(server: str) -> None:
    client = _rpc.RpcClient(server, "test.Service")
    chunk = _rpc.UPLOAD_CHUNK_BYTES
    big = bytes(range(256)) * (7 * chunk // 2 // 256)  # 3.5 chunks: far over max_request_bytes
    header, buffers = client.upload("Upload", {"n": 1}, [big, b"tail"], timeout=30)
    assert header == {"got": {"n": 1}, "sizes": [len(big), 4]}
    assert bytes(buffers[0]) == big and bytes(buffers[1]) == b"tail"
    with pytest.raises(errors.InvalidArgumentError, match="over the limit"):
        client.upload("Upload", {}, [b"\0" * (6 * chunk)], timeout=30)
    with pytest.raises(errors.InvalidArgumentError):  # a malformed upload
        client.call_frame("Upload", b"garbage", timeout=5)
    with pytest.raises(errors.InvalidArgumentError, match="larger than max"):
        client.call("Echo", {}, [big], timeout=30)  # the same bytes as one unary request
    assert client.upload("Upload", {"a": 2}, timeout=5)[0]["got"] == {"a": 2}
    client.close()


def test_an_upload_of_one_chunk_is_checked_against_its_own_limit() -> None:
    grpc_server, port = _rpc.start_server(
        "test.Service",
        {"Upload": _handlers()["Echo"]},
        bind="127.0.0.1",
        port=0,
        token=None,
        upload_limits={"Upload": 4096},
    )
    try:
        client = _rpc.RpcClient(f"127.0.0.1:{port}", "test.Service")
        assert client.upload("Upload", {}, [b"\1" * 1000], timeout=5)[0]["sizes"] == [1000]
        # One chunk: a unary call of the method itself, over the upload's limit of 4096 bytes.
        with pytest.raises(errors.InvalidArgumentError, match="over the limit of 4096"):
            client.upload("Upload", {}, [b"\1" * 8000], timeout=5)
        # Several chunks: the method's chunked form, with the same limit.
        with pytest.raises(errors.InvalidArgumentError, match="over the limit of 4096"):
            client.upload("Upload", {}, [b"\1" * (2 * _rpc.UPLOAD_CHUNK_BYTES)], timeout=30)
        client.close()
    finally:
        grpc_server.stop(0.0)


def test_an_upload_method_s_chunked_name_cannot_be_a_method_of_its_own() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="UploadChunks is both"):
        _rpc.start_server(
            "test.Service",
            {"Upload": _handlers()["Echo"], "UploadChunks": _handlers()["Echo"]},
            bind="127.0.0.1",
            port=0,
            token=None,
            upload_limits={"Upload": 4096},
        )


def test_an_unreachable_server_is_unavailable() -> None:
    client = _rpc.RpcClient("127.0.0.1:1", "test.Service")
    with pytest.raises(errors.UnavailableError):
        client.call("Echo", {}, timeout=1)
    client.close()


def test_another_service_at_the_address_is_unavailable(server: str) -> None:
    # Where a server is gone and another process took its port: the call is not served there.
    client = _rpc.RpcClient(server, "feedline.service.Worker")
    with pytest.raises(errors.UnavailableError, match=r"UNIMPLEMENTED.*another server"):
        client.call("GetElements", {}, timeout=5)
    client.close()


def test_a_token_is_checked_before_anything_else() -> None:
    grpc_server, port = _rpc.start_server(
        "test.Service",
        {**_handlers(), "Upload": _handlers()["Echo"]},
        bind="127.0.0.1",
        port=0,
        token="secret",
        upload_limits={"Upload": 1 << 20},
    )
    try:
        address = f"127.0.0.1:{port}"
        for token in (None, "wrong"):
            client = _rpc.RpcClient(address, "test.Service", token)
            with pytest.raises(errors.PermissionDeniedError, match=r"test\.Service/Echo"):
                client.call_frame("Echo", b"garbage", timeout=5)
            # Refused from the metadata: a body far over every limit is not even read.
            with pytest.raises(errors.PermissionDeniedError):
                client.call_frame("Echo", b"\0" * (16 << 20), timeout=10)
            with pytest.raises(errors.PermissionDeniedError):
                client.upload("Upload", {}, [b"\0" * (4 << 20)], timeout=10)
            with pytest.raises(errors.PermissionDeniedError):
                client.call_frame("NoSuchMethod", b"", timeout=5)
            client.close()
        client = _rpc.RpcClient(address, "test.Service", "secret")
        assert client.call("Echo", {"x": 1}, timeout=5)[0]["got"] == {"x": 1}
        client.close()
    finally:
        grpc_server.stop(0.0)


@pytest.mark.parametrize(
    ("service", "address"),
    [
        ("grpc://h:1", "h:1"),
        ("h:1", "h:1"),
        (("grpc", "h:1"), "h:1"),
        ("grpc://[::1]:50", "[::1]:50"),
    ],
)
def test_parse_service(service: Any, address: str) -> None:
    assert _rpc.parse_service(service) == address


def test_resolve_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_rpc.TOKEN_ENV, "from-env")
    assert _rpc.resolve_token(None) == "from-env"
    assert _rpc.resolve_token("given") == "given"
    monkeypatch.delenv(_rpc.TOKEN_ENV)
    assert _rpc.resolve_token(None) is None
