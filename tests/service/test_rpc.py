"""Tests of feedline/service/_rpc.py: addresses, limits and how errors travel."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from feedline import errors, service
from feedline.data import Dataset
from feedline.service import _rpc
from feedline.service._wire import encode_frame
from tests import launcher

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


def test_an_unreachable_server_is_unavailable() -> None:
    client = _rpc.RpcClient("127.0.0.1:1", "test.Service")
    with pytest.raises(errors.UnavailableError):
        client.call("Echo", {}, timeout=1)
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


# -- a flood of large requests ----------------------------------------------------------------

# Sends each row's 16 requests of FLOOD_MIB MiB at once; reports each row's status codes.
_FLOOD = """
import json, os
from concurrent import futures
import grpc
from tests.launcher import report

payload = b"\\0" * (int(os.environ["FLOOD_MIB"]) << 20)
codes = []
for address, path, token in json.loads(os.environ["FLOOD_ROWS"]):
    channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", -1)])
    stub = channel.unary_unary(path)
    metadata = () if token is None else (("feedline-token", token),)

    def one(_):
        try:
            stub(payload, timeout=60, metadata=metadata)
            return "OK"
        except grpc.RpcError as error:
            return error.code().name

    with futures.ThreadPoolExecutor(16) as pool:
        codes.append(sorted(set(pool.map(one, range(16)))))
    channel.close()
report(codes)
"""
_FLOOD_MIB = 64


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


@contextlib.contextmanager
def _peak_rss_growth() -> Iterator[Callable[[], int]]:
    """How much this process's RSS grew at its peak within the block, in bytes: the kernel's
    peak counter (reset on entry) where it can be reset, and a 2 ms sampler besides."""
    before = _status_kib("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        exact = True
    except OSError:
        exact = False
    sampled = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.002):
            sampled[0] = max(sampled[0], _status_kib("VmRSS"))

    sampler = threading.Thread(target=sample, name="rss-sampler", daemon=True)
    sampler.start()
    peak = [0]
    try:
        yield lambda: peak[0]
    finally:
        done.set()
        sampler.join(5)
        top = max(sampled[0], _status_kib("VmHWM") if exact else 0)
        peak[0] = (top - before) * 1024


def test_a_flood_of_large_requests_does_not_grow_the_servers(
    make_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 requests of 64 MiB at once, per row, from another process: without the token they
    are refused from their metadata and never read; with it, over the size limit, gRPC refuses
    them from their length prefix. The servers (in this process) stay within a few MiB and
    keep serving."""
    monkeypatch.setenv(_rpc.TOKEN_ENV, TOKEN)  # the workers and this process's reads use it
    cluster = make_cluster(1, token=TOKEN)
    dispatcher = f"/{DISPATCHER}"
    worker = cluster.workers[0].worker_address
    rows = [
        (cluster.address, f"{dispatcher}/RegisterDataset", None),
        (cluster.address, f"{dispatcher}/ClientHeartbeat", "wrong-token"),
        (worker, "/feedline.service.Worker/GetElements", None),
        (cluster.address, f"{dispatcher}/ClientHeartbeat", TOKEN),
        (worker, "/feedline.service.Worker/GetElements", TOKEN),
    ]
    env = {"FLOOD_ROWS": json.dumps(rows), "FLOOD_MIB": str(_FLOOD_MIB)}
    with _peak_rss_growth() as growth:
        results = launcher.run(_FLOOD, [("flood", env)], timeout=240)
    assert results["flood"].result == [["PERMISSION_DENIED"]] * 3 + [["RESOURCE_EXHAUSTED"]] * 2
    # 5 x 16 x 64 MiB were sent; before the token was checked from the metadata and the
    # servers' message size capped by role, the first row alone grew a server by ~1 GiB.
    assert growth() < _FLOOD_MIB << 20, f"the servers grew by {growth() >> 20} MiB"
    dataset = Dataset.range(4).apply(service.distribute("parallel_epochs", cluster.target))
    assert sorted(int(x) for x in dataset) == [0, 1, 2, 3]
