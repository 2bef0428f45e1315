"""The consumers' connections: one channel per address and service in this process, and the
dispatcher call that waits for the dispatcher to be reachable."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from feedline._net import exit as _exit
from feedline._net import rpc as _rpc
from feedline._net.retry import call_within, said_if_slow
from feedline.errors import UnavailableError
from feedline.service.protocol import DISPATCHER_SERVICE

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How long a call that waits for the dispatcher to be reachable (registering a dataset,
#: joining a job) goes on before a warning says that it waits, and for how long it may.
SLOW_CALL_S = 10.0


class _Channels:
    """The consumers' channels: one per address and service in this process (channels are
    thread-safe), closed when the process exits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, str, str], _rpc.RpcClient] = {}
        _exit.register(self, "close", _exit.CHANNELS)

    def get(self, address: str, service_name: str) -> _rpc.RpcClient:
        token = _rpc.resolve_token(None)
        key = (address, service_name, token or "")
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = _rpc.RpcClient(address, service_name, token)
            return client

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


_channels = _Channels()


def _client(address: str, service_name: str) -> _rpc.RpcClient:
    """The channel to ``service_name`` at ``address``."""
    return _channels.get(address, service_name)


def _dispatcher(address: str) -> _rpc.RpcClient:
    return _client(address, DISPATCHER_SERVICE)


def _patiently(address: str, what: str, timeout_s: float, attempt: Callable[[float], T]) -> T:
    """``attempt(timeout)``, a call to the dispatcher at ``address`` that waits for it to be
    reachable, tried again meanwhile if it stops or restarts (``call_within``: only for calls
    it answers the same way twice), for up to ``timeout_s``; a warning says so once it has
    waited ``SLOW_CALL_S``.

    Raises:
      UnavailableError: it was not reachable, naming the dispatcher and ``what`` the call was
        for.
    """

    def waiting() -> str:
        return (
            f"the dispatcher at {address} has not answered for {SLOW_CALL_S:g} s while {what}; "
            f"waiting up to {timeout_s:g} s in all "
            "(options.experimental_distribute.service_timeout_ms)"
        )

    try:
        with said_if_slow(logger, SLOW_CALL_S, waiting):
            return call_within(timeout_s, attempt)
    except UnavailableError as error:
        raise UnavailableError(
            f"the dispatcher at {address} could not be reached for {timeout_s:.0f} s while "
            f"{what} (options.experimental_distribute.service_timeout_ms sets how long to wait): "
            f"{error}"
        ) from None


def _bounded_call(
    dispatcher: _rpc.RpcClient, method: str, header: dict[str, Any], timeout_s: float, what: str
) -> tuple[dict[str, Any], list[memoryview]]:
    """One call to the dispatcher, made ``_patiently``."""
    return _patiently(
        dispatcher.address,
        what,
        timeout_s,
        lambda timeout: dispatcher.call(method, header, timeout=timeout, wait_for_ready=True),
    )
