"""Tests of feedline/_net/retry.py and of how feedline/_net/rpc.py classifies the failures of
a server that stops: every call a stopping server cannot answer (cancelled as it closes,
refused, cut after its grace period, or sent while it is down) is an ``UnavailableError``,
and ``call_within`` tries it again until the server is back, within its bound.

The servers are real gRPC servers on loopback; the one that cancels stands for a server that
closes while a call reaches it (the status such a call gets).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from feedline import errors
from feedline._net import rpc as _rpc
from feedline._net.retry import call_within, said_if_slow
from tests.launcher import free_port

pytestmark = pytest.mark.timeout(60)

SERVICE = "test.Service"


@pytest.fixture
def cancelling_server() -> Iterator[str]:
    """A plain gRPC server whose method ``Cancelled`` ends every call with CANCELLED and no
    feedline error type, as a server that closes does to a call that reaches it then."""

    def cancelled(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.CANCELLED, "Cancelled")
        return b""  # never reached

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE, {"Cancelled": grpc.unary_unary_rpc_method_handler(cancelled)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0.0)


def test_a_call_its_server_cancels_is_unavailable(cancelling_server: str) -> None:
    client = _rpc.RpcClient(cancelling_server, SERVICE)
    with pytest.raises(errors.UnavailableError, match="CANCELLED"):
        client.call("Cancelled", {}, timeout=5)
    client.close()


def test_a_call_cut_after_the_grace_period_is_unavailable() -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(header: dict[str, Any], buffers: list[memoryview]) -> Any:
        entered.set()
        release.wait(10)
        return {}, ()

    server, port = _rpc.start_server(SERVICE, {"Slow": slow}, bind="127.0.0.1", port=0, token=None)
    client = _rpc.RpcClient(f"127.0.0.1:{port}", SERVICE)
    raised: list[BaseException] = []

    def call() -> None:
        try:
            client.call("Slow", {}, timeout=10)
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    assert entered.wait(10)
    server.stop(0.0)
    thread.join(10)
    release.set()
    assert len(raised) == 1 and isinstance(raised[0], errors.UnavailableError), raised
    client.close()


def test_calls_racing_a_server_stop_are_answered_or_unavailable() -> None:
    """Clients calling without pause while the server stops: each call is answered, or fails
    with ``UnavailableError`` (the calls that reach it as it closes are cancelled), never
    with another error."""
    outcomes: dict[str, int] = {}
    lock = threading.Lock()
    for _ in range(5):
        server, port = _rpc.start_server(
            SERVICE, {"Echo": lambda h, b: (h, ())}, bind="127.0.0.1", port=0, token=None
        )
        clients = [_rpc.RpcClient(f"127.0.0.1:{port}", SERVICE) for _ in range(4)]
        done = threading.Event()

        def hammer(client: _rpc.RpcClient, done: threading.Event) -> None:
            while not done.is_set():
                try:
                    client.call("Echo", {}, timeout=5)
                    outcome = "answered"
                except errors.UnavailableError:
                    outcome = "unavailable"
                    time.sleep(0.005)
                except Exception as error:
                    outcome = repr(error)
                with lock:
                    outcomes[outcome] = outcomes.get(outcome, 0) + 1

        threads = [threading.Thread(target=hammer, args=(c, done), daemon=True) for c in clients]
        for thread in threads:
            thread.start()
        time.sleep(0.1)
        server.stop(0.5)
        time.sleep(0.05)
        done.set()
        for thread in threads:
            thread.join(10)
        for client in clients:
            client.close()
    assert set(outcomes) <= {"answered", "unavailable"}, outcomes
    assert outcomes.get("answered") and outcomes.get("unavailable"), outcomes


def test_call_within_goes_on_once_the_server_is_back_on_its_port() -> None:
    port = free_port()
    client = _rpc.RpcClient(f"127.0.0.1:{port}", SERVICE)
    started: list[_rpc.Server] = []

    def start_later() -> None:
        time.sleep(0.3)
        server, _ = _rpc.start_server(
            SERVICE, {"Echo": lambda h, b: (h, ())}, bind="127.0.0.1", port=port, token=None
        )
        started.append(server)

    thread = threading.Thread(target=start_later, daemon=True)
    thread.start()
    began = time.monotonic()
    header, _ = call_within(
        10.0, lambda timeout: client.call("Echo", {"n": 1}, timeout=min(timeout, 0.1))
    )
    assert header == {"n": 1}
    assert time.monotonic() - began < 5.0  # the reconnection backoff stays short
    thread.join(10)
    client.close()
    started[0].stop(0.0)


def test_call_within_gives_up_after_its_bound_and_raises_other_errors_at_once() -> None:
    attempts: list[float] = []

    def unavailable(timeout: float) -> None:
        attempts.append(timeout)
        raise errors.UnavailableError("down")

    began = time.monotonic()
    with pytest.raises(errors.UnavailableError, match="down"):
        call_within(0.3, unavailable)
    assert 0.3 <= time.monotonic() - began < 2.0
    assert 2 <= len(attempts) < 30  # tried again, after pauses: no busy loop
    assert all(0 < timeout <= 0.3 for timeout in attempts)

    def not_found(timeout: float) -> None:
        attempts.append(timeout)
        raise errors.NotFoundError("no such thing")

    attempts.clear()
    with pytest.raises(errors.NotFoundError):
        call_within(10.0, not_found)
    assert len(attempts) == 1


def test_call_within_stops_trying_when_its_caller_stops() -> None:
    stopped = threading.Event()

    def unavailable(timeout: float) -> None:
        raise errors.UnavailableError("down")

    threading.Timer(0.2, stopped.set).start()
    began = time.monotonic()
    with pytest.raises(errors.UnavailableError):
        call_within(60.0, unavailable, stopped=stopped)
    assert time.monotonic() - began < 5.0


def test_said_if_slow_logs_once_after_its_time_and_not_for_a_block_that_ended(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("tests.retry")
    with caplog.at_level(logging.WARNING, logger="tests.retry"):
        with said_if_slow(log, 0.05, lambda: "still waiting"):
            time.sleep(0.5)
        with said_if_slow(log, 0.2, lambda: "never said"):
            pass
        time.sleep(0.4)  # past the second block's time: its timer was cancelled
    assert [record.getMessage() for record in caplog.records] == ["still waiting"]
