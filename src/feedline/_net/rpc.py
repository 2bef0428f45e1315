"""gRPC plumbing shared by the dispatcher, the workers and the client.

Every RPC carries one frame of ``_wire`` (a JSON header and raw buffers), so the services need
no generated code and the data plane moves NumPy buffers without protobuf copies. Most RPCs are
unary; an *upload* (a server's ``upload_limits``: the dispatcher's ``RegisterDataset``) sends its
frame as a stream of chunks of at most ``UPLOAD_CHUNK_BYTES`` (a frame of one chunk as a single
message, which the server reads as a stream of one). This module owns what every call has in
common:

- addresses: ``"[grpc://]host:port"`` or ``("grpc", "host:port")``;
- the shared secret: sent as the ``feedline-token`` metadata and checked by a server interceptor
  from the call's metadata, before the request's body is read: a call without it is refused
  with PERMISSION_DENIED and its body is never received. A server on loopback without a token
  checks for the user's local secret instead (``local_secret``: other users are refused), and
  a server off loopback needs a token or mutual TLS unless ``insecure`` (``security``);
- TLS: a server given a certificate serves TLS (mutual TLS with a CA); a client uses TLS where
  its process has TLS files (``security.TlsConfig``);
- request limits: a server's transport takes no message longer than about twice the largest it
  expects (``max_request_bytes``, or one upload chunk), so no request, authenticated or not, makes
  it buffer more; gRPC refuses a longer one with RESOURCE_EXHAUSTED (``InvalidArgumentError`` to
  a feedline caller) before reading it. A request over ``max_request_bytes`` (an upload over its
  limit, counted chunk by chunk) or a malformed frame is refused with INVALID_ARGUMENT; the
  server keeps serving;
- errors: a feedline error raised by a handler travels as the matching status code, with its
  type in the ``feedline-error-type`` trailing metadata, and is raised again by the caller as
  the same type (``_ERRORS``); any other exception is reported as UNKNOWN with its type name
  and message (raised again by the caller as that built-in type, else ``UnknownError``) and
  logged with its traceback on the server, which the caller never gets. A call its server
  cannot answer now (unreachable, past its deadline, or cancelled or refused by a server that
  stops) is an ``UnavailableError``, which callers try again (``feedline._net.retry``);
- reconnection: a client whose server went away tries to connect again within
  ``_RECONNECT_MS`` (gRPC's default backoff grows to two minutes), so that a server restarted
  on its port is found again at once.
"""

from __future__ import annotations

import builtins
import hmac
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from typing import Any

import grpc

from feedline import errors
from feedline._net import local_secret
from feedline._net.security import (
    TLS_SERVER_NAME_ENV,
    TlsConfig,
    check_exposure,
    is_loopback,
    normalize_token,
)
from feedline._net.wire import decode_frame, encode_frame

__all__ = [
    "TOKEN_ENV",
    "TOKEN_METADATA_KEY",
    "Handler",
    "RpcClient",
    "Server",
    "TlsConfig",
    "field",
    "is_int64",
    "parse_service",
    "resolve_token",
    "start_server",
]

logger = logging.getLogger(__name__)

TOKEN_ENV = "FEEDLINE_SERVICE_TOKEN"
#: The call metadata that carries the shared secret.
TOKEN_METADATA_KEY = "feedline-token"
_ERROR_TYPE_KEY = "feedline-error-type"
_PROTOCOLS = ("grpc",)
#: The largest unary request a server takes by default: control messages are small.
DEFAULT_MAX_REQUEST_BYTES = 1 << 20
#: Uploads travel in chunks of at most this many bytes (each one gRPC message).
UPLOAD_CHUNK_BYTES = 1 << 20
#: An upload method of several chunks is served as this method: its name with this suffix. A
#: request of one chunk goes to the method itself, served as a unary call: gRPC's server reads a
#: unary request before it calls the handler, where a stream's handler waits on gRPC's thread for
#: each message and for the stream's end (two thread hand-offs more per call).
CHUNKED_SUFFIX = "Chunks"
#: The longest message of an unexpected error that a caller gets.
_MAX_UNEXPECTED_CHARS = 500
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

# A client's pauses between attempts to connect to a server that went away: the first and the
# longest.
_RECONNECT_MS = (100, 1000)

#: A handler takes the request's header and buffers and returns a reply frame, or a header and
#: buffers to frame.
Handler = Callable[
    [dict[str, Any], list[memoryview]], "bytes | tuple[dict[str, Any], Sequence[Any]]"
]

_STATUS_OF: list[tuple[type[errors.FeedlineError], grpc.StatusCode]] = [
    (errors.InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFoundError, grpc.StatusCode.NOT_FOUND),
    (errors.FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (errors.UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (errors.OutOfRangeError, grpc.StatusCode.OUT_OF_RANGE),
    (errors.DataLossError, grpc.StatusCode.DATA_LOSS),
    (errors.AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
]
_ERRORS: dict[grpc.StatusCode, type[errors.FeedlineError]] = {
    code: error for error, code in _STATUS_OF
}
# Statuses that a call gets without a feedline error from the handler when its server cannot
# answer it now: unreachable, past the deadline, or stopping. A server that stops cancels the
# calls that reach it as it closes (CANCELLED, never a handler's answer: handlers answer with
# the statuses of ``_STATUS_OF``) and those still running after its grace period (UNAVAILABLE).
_SERVER_CANNOT_ANSWER = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
)


def parse_service(service: Any) -> str:
    """The ``host:port`` of a service given as ``"[protocol://]host:port"`` or a
    ``(protocol, address)`` tuple.

    Raises:
      InvalidArgumentError: another type or an empty or malformed address.
      NotFoundError: a protocol other than grpc (``"grp://host:port"``), as in TensorFlow.
    """
    if isinstance(service, tuple):
        if len(service) != 2 or not all(isinstance(part, str) for part in service):
            raise errors.InvalidArgumentError(
                f"service must be a (protocol, address) tuple of strings, got {service!r}"
            )
        protocol, address = service
    elif isinstance(service, str):
        protocol, _, address = service.rpartition("://")
    else:
        raise errors.InvalidArgumentError(
            "service must be a string '[protocol://]host:port' or a (protocol, address) tuple, "
            f"got {type(service).__name__}"
        )
    if protocol and protocol not in _PROTOCOLS:
        # TensorFlow finds no credentials factory for the protocol: a NotFoundError.
        raise errors.NotFoundError(
            f"no transport is registered for protocol {protocol!r} (in {service!r}); the "
            f"available protocols are {list(_PROTOCOLS)}: write 'grpc://host:port' or 'host:port'",
            name=protocol,
        )
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise errors.InvalidArgumentError(
            f"service address must be 'host:port', got {address!r} (from {service!r})"
        )
    return address


def resolve_token(token: str | None) -> str | None:
    """``token``, else ``$FEEDLINE_SERVICE_TOKEN``, else None (no secret), without one trailing
    newline (a mounted secret file's).

    Raises:
      InvalidArgumentError: the token is not printable ASCII (``security.normalize_token``).
    """
    if token is not None:
        return normalize_token(token)
    from_env = os.environ.get(TOKEN_ENV)
    return normalize_token(from_env, f"${TOKEN_ENV}") if from_env else None


# -- server -----------------------------------------------------------------------------------


class Server:
    """A started gRPC server and its thread pool, stopped together (at the latest when the
    process exits)."""

    def __init__(
        self, server: grpc.Server, executor: futures.ThreadPoolExecutor, token: str | None
    ) -> None:
        self._server = server
        self._executor = executor
        #: The secret calls must carry: the token, the local secret, or None (insecure).
        self.token = token
        self._finalizer = weakref.finalize(self, _stop, server, executor, 0.0)

    def stop(self, grace: float) -> None:
        """Stops serving (waiting up to ``grace`` s for calls in flight); idempotent."""
        self._finalizer.detach()
        _stop(self._server, self._executor, grace)

    def wait_for_termination(self) -> None:
        self._server.wait_for_termination()


def _stop(server: grpc.Server, executor: futures.ThreadPoolExecutor, grace: float) -> None:
    server.stop(grace).wait(grace + 5)
    executor.shutdown(wait=False, cancel_futures=True)


def start_server(
    service_name: str,
    handlers: dict[str, Handler],
    *,
    bind: str,
    port: int,
    token: str | None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    upload_limits: Mapping[str, int] | None = None,
    max_workers: int = 32,
    tls: TlsConfig | None = None,
    insecure: bool = False,
) -> tuple[Server, int]:
    """A started gRPC server of ``handlers`` on ``bind:port`` and the port it bound.

    Args:
      service_name: the gRPC service the methods belong to.
      handlers: the handler of each method.
      bind: the interface to listen on.
      port: the port; 0 picks a free one.
      token: the shared secret every call must carry in its metadata, or None.
      max_request_bytes: the largest request of a unary method.
      upload_limits: methods whose request arrives as an upload (``RpcClient.upload``), with
        the largest request each takes.
      max_workers: threads serving calls.
      tls: TLS files: with a certificate the server serves TLS, with a CA too it requires
        client certificates (mutual TLS).
      insecure: serve without any check off loopback (warned once), and on loopback without
        the user's local secret.

    Raises:
      UnavailableError: the address cannot be bound.
      InvalidArgumentError: off loopback without a token or mutual TLS and not ``insecure``,
        or unreadable TLS files.
      PermissionDeniedError: the local secret's directory or file is not private to the user.
    """
    check_exposure(bind, token, tls, insecure, f"the {service_name} server")
    if token is None and not insecure and is_loopback(bind):
        token = local_secret.ensure()
    credentials = tls.server_credentials() if tls is not None and tls.serves else None
    uploads = dict(upload_limits or {})
    methods: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
        name: grpc.unary_unary_rpc_method_handler(
            _unary_handler(service_name, name, handler, uploads.get(name, max_request_bytes))
        )
        for name, handler in handlers.items()
    }
    for name, limit in uploads.items():
        if name + CHUNKED_SUFFIX in methods:
            raise errors.InvalidArgumentError(
                f"{service_name}/{name}{CHUNKED_SUFFIX} is both a method and the chunked form "
                f"of the upload method {name}"
            )
        methods[name + CHUNKED_SUFFIX] = grpc.stream_unary_rpc_method_handler(
            _upload_handler(service_name, name, handlers[name], limit)
        )
    largest = max(max_request_bytes, UPLOAD_CHUNK_BYTES if uploads else 0)
    executor = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=service_name)
    server = grpc.server(
        executor,
        handlers=[grpc.method_handlers_generic_handler(service_name, methods)],
        interceptors=[] if token is None else [_TokenCheck(token)],
        options=[
            # Past our own limit a little, so that our handler sees an oversized request and
            # answers INVALID_ARGUMENT; far past it gRPC refuses it with RESOURCE_EXHAUSTED
            # from the message's length prefix, without receiving the rest.
            ("grpc.max_receive_message_length", 2 * largest + (64 << 10)),
            # No bandwidth-delay probing of what clients send: it grows a stream's receive
            # window to megabytes, which an oversized request then fills before gRPC refuses
            # it. Requests are small (uploads come in chunks); replies are not affected.
            ("grpc.http2.bdp_probe", 0),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
        ],
    )
    try:
        if credentials is None:
            bound = server.add_insecure_port(f"{bind}:{port}")
        else:
            bound = server.add_secure_port(f"{bind}:{port}", credentials)
    except RuntimeError as error:
        raise errors.UnavailableError(f"cannot bind {bind}:{port}: {error}") from error
    if bound == 0:
        raise errors.UnavailableError(f"cannot bind {bind}:{port} for {service_name}")
    server.start()
    return Server(server, executor, token), bound


class _TokenCheck(grpc.ServerInterceptor):
    """Refuses a call without the shared secret from its metadata alone.

    gRPC hands an interceptor the call's metadata before the request is read. A refused call
    gets a handler that never asks for the request (a stream handler that aborts at once), so
    its body is never taken off the wire: an unauthenticated request costs the server at most
    its flow-control window (64 KiB; ``start_server`` turns off the probing that grows it),
    whatever its size.
    """

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        sent = dict(handler_call_details.invocation_metadata or ()).get(TOKEN_METADATA_KEY, "")
        sent = sent if isinstance(sent, bytes) else str(sent).encode()
        if hmac.compare_digest(sent, self._token):
            return continuation(handler_call_details)
        method = handler_call_details.method.lstrip("/")

        def refuse(requests: Iterator[bytes], context: grpc.ServicerContext) -> None:
            # ``requests`` is never iterated: that is what keeps the body off the wire.
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method}: missing or wrong service token (set {TOKEN_ENV} or the config's "
                "token to the cluster's secret; a server on loopback without a token takes "
                "calls of the user that started it only)",
            )

        return grpc.stream_unary_rpc_method_handler(refuse)


def _unary_handler(
    service_name: str, method: str, handler: Handler, max_request_bytes: int
) -> Callable[[bytes, grpc.ServicerContext], bytes]:
    def call(request: bytes, context: grpc.ServicerContext) -> bytes:
        if len(request) > max_request_bytes:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{service_name}/{method}: request of {len(request)} bytes is over the limit of "
                f"{max_request_bytes} bytes",
            )
        return _serve(service_name, method, handler, request, context)

    return call


def _upload_handler(
    service_name: str, method: str, handler: Handler, limit: int
) -> Callable[[Iterator[bytes], grpc.ServicerContext], bytes]:
    def call(chunks: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        parts: list[bytes] = []
        size = 0
        for chunk in chunks:
            size += len(chunk)
            if size > limit:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{service_name}/{method}: request of more than {limit} bytes is over the "
                    f"limit of {limit} bytes",
                )
            parts.append(chunk)
        request = parts[0] if len(parts) == 1 else b"".join(parts)
        del parts
        return _serve(service_name, method, handler, request, context)

    return call


def _serve(
    service_name: str,
    method: str,
    handler: Handler,
    request: bytes,
    context: grpc.ServicerContext,
) -> bytes:
    try:
        header, buffers = decode_frame(request)
        reply = handler(header, buffers)
    except Exception as error:
        _abort(context, service_name, method, error)
    if isinstance(reply, bytes):
        return reply
    return encode_frame(*reply)


def _abort(
    context: grpc.ServicerContext, service_name: str, method: str, error: BaseException
) -> None:
    for kind, code in _STATUS_OF:
        if isinstance(error, kind):
            context.set_trailing_metadata(((_ERROR_TYPE_KEY, type(error).__name__),))
            context.abort(code, str(error))
    # Not a feedline error: a bug of the server, or a request no check foresaw. The caller
    # learns the type and message; the traceback (the server's code and paths) stays here.
    logger.exception("%s/%s failed", service_name, method)
    message = str(error)
    if len(message) > _MAX_UNEXPECTED_CHARS:
        message = message[:_MAX_UNEXPECTED_CHARS] + "..."
    context.set_trailing_metadata(((_ERROR_TYPE_KEY, type(error).__name__),))
    context.abort(
        grpc.StatusCode.UNKNOWN,
        f"{type(error).__name__}: {message} (an unexpected error in {service_name}/{method}; "
        "the server's log has its traceback)",
    )


def field(
    header: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = ...
) -> Any:
    """``header[name]`` checked to be of ``kind``; a missing or mistyped field of a request is
    an ``InvalidArgumentError`` (what a malformed request gets), and so is an integer outside
    the signed 64-bit range (ids, counts and times are 64-bit on the wire) or a ``header`` that
    is no JSON object."""
    if not isinstance(header, dict):
        raise errors.InvalidArgumentError(
            f"malformed request: field {name!r} is read from an object, got "
            f"{type(header).__name__} {header!r:.100}"
        )
    if name not in header:
        if default is ...:
            raise errors.InvalidArgumentError(f"malformed request: field {name!r} is missing")
        return default
    value = header[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise errors.InvalidArgumentError(
            f"malformed request: field {name!r} must be {kind}, got {type(value).__name__}"
        )
    if isinstance(value, int) and not is_int64(value):
        raise errors.InvalidArgumentError(
            f"malformed request: field {name!r} is outside the 64-bit integer range: {value!r:.40}"
        )
    return value


def is_int64(value: int) -> bool:
    """Whether ``value`` fits a signed 64-bit integer."""
    return _INT64_MIN <= value <= _INT64_MAX


# -- client -----------------------------------------------------------------------------------


class RpcClient:
    """Calls the methods of one service at one address. Thread-safe (gRPC channels are).

    Args:
      address: ``host:port``.
      service_name: the gRPC service.
      token: the secret to send; None: none, or, to a loopback address, this user's local
        secret (``local_secret``) once a server made one, after checking that the port's
        listener belongs to this user.
      tls: TLS files (a CA to verify the server, a certificate to present); None: those of
        ``$FEEDLINE_TLS_CA``, ``$FEEDLINE_TLS_CERT`` and ``$FEEDLINE_TLS_KEY``, plain gRPC
        where none is set.
    """

    def __init__(
        self,
        address: str,
        service_name: str,
        token: str | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        self.address = address
        self._service_name = service_name
        self._metadata: tuple[tuple[str, str], ...] | None = (
            ((TOKEN_METADATA_KEY, token),) if token else ()
        )
        host, _, port = address.rpartition(":")
        # Local mode: the local secret, looked up at the call (a server may make it later).
        self._local_port = int(port) if not token and port.isdigit() and is_loopback(host) else 0
        if self._local_port:
            self._metadata = None
        self._local_lock = threading.Lock()
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            ("grpc.enable_retries", 0),
            ("grpc.initial_reconnect_backoff_ms", _RECONNECT_MS[0]),
            ("grpc.min_reconnect_backoff_ms", _RECONNECT_MS[0]),
            ("grpc.max_reconnect_backoff_ms", _RECONNECT_MS[1]),
        ]
        tls = TlsConfig.resolve(what=f"the client of {address}") if tls is None else tls
        if tls is None:
            self._channel = grpc.insecure_channel(address, options=options)
        else:
            name = os.environ.get(TLS_SERVER_NAME_ENV)
            if name:
                options.append(("grpc.ssl_target_name_override", name))
            self._channel = grpc.secure_channel(address, tls.channel_credentials(), options=options)
        self._stubs: dict[str, Any] = {}

    def _call_metadata(self) -> tuple[tuple[str, str], ...]:
        metadata = self._metadata
        if metadata is not None:
            return metadata
        with self._local_lock:
            if self._metadata is not None:
                return self._metadata
            secret = local_secret.read()
            if secret is None:
                return ()  # no server of this user made one: a server of nobody's, or none yet
            uids = local_secret.listener_uids(self._local_port)
            if uids and uids - {os.getuid()}:
                raise errors.PermissionDeniedError(
                    f"the server listening at {self.address} belongs to another user (uid "
                    f"{sorted(uids - {os.getuid()})}), not to this one (uid {os.getuid()}): "
                    f"this user's local secret is not sent to it. Set {TOKEN_ENV} to the "
                    "secret of that server's cluster to call it"
                )
            metadata = ((TOKEN_METADATA_KEY, secret),)
            if uids is None or uids:  # the listener is ours (or the system does not tell):
                self._metadata = metadata  # keep the secret until the connection fails
            return metadata

    def _forget_listener(self) -> None:
        """After a failed connection: check the port's owner again at the next call."""
        if self._local_port:
            self._metadata = None

    def call(
        self,
        method: str,
        header: dict[str, Any],
        buffers: Sequence[Any] = (),
        *,
        timeout: float,
        wait_for_ready: bool = False,
    ) -> tuple[dict[str, Any], list[memoryview]]:
        """Sends one request and returns the reply's header and buffers.

        Raises:
          the feedline error matching the status (``UnavailableError`` when the server cannot
          be reached within ``timeout``).
        """
        return decode_frame(
            self.call_frame(
                method,
                encode_frame(header, buffers),
                timeout=timeout,
                wait_for_ready=wait_for_ready,
            )
        )

    def call_frame(
        self, method: str, frame: bytes, *, timeout: float, wait_for_ready: bool = False
    ) -> bytes:
        try:
            return self._stub(method)(
                frame,
                timeout=timeout,
                metadata=self._call_metadata(),
                wait_for_ready=wait_for_ready,
            )
        except grpc.RpcError as error:
            raise self._failed(error, method) from None

    def start_frame(self, method: str, frame: bytes, *, timeout: float) -> Callable[[], bytes]:
        """Sends ``frame`` as ``call_frame`` does, without waiting: the function returned waits
        for the reply frame (and raises what ``call_frame`` would). Several calls may be in
        flight at once; gRPC serves them in no particular order."""
        future = self._stub(method).future(frame, timeout=timeout, metadata=self._call_metadata())

        def result() -> bytes:
            try:
                return future.result()
            except grpc.RpcError as error:
                raise self._failed(error, method) from None

        return result

    def _stub(self, method: str) -> Any:
        stub = self._stubs.get(method)
        if stub is None:
            stub = self._stubs[method] = self._channel.unary_unary(
                f"/{self._service_name}/{method}"
            )
        return stub

    def upload(
        self,
        method: str,
        header: dict[str, Any],
        buffers: Sequence[Any] = (),
        *,
        timeout: float,
        wait_for_ready: bool = False,
    ) -> tuple[dict[str, Any], list[memoryview]]:
        """``call`` for a method the server takes as an upload (its ``upload_limits``): the
        request travels in chunks of ``UPLOAD_CHUNK_BYTES`` (to the method's chunked form,
        ``CHUNKED_SUFFIX``). A request of one chunk is a unary call of the method itself: the
        client then needs no thread to feed a stream, nor the server one to read it, which
        halves the call's cost for small requests."""
        encoded = encode_frame(header, buffers)
        if len(encoded) <= UPLOAD_CHUNK_BYTES:
            return decode_frame(
                self.call_frame(method, encoded, timeout=timeout, wait_for_ready=wait_for_ready)
            )
        frame = memoryview(encoded)
        chunks = (
            bytes(frame[start : start + UPLOAD_CHUNK_BYTES])
            for start in range(0, len(frame), UPLOAD_CHUNK_BYTES)
        )
        stub: grpc.StreamUnaryMultiCallable[bytes, bytes] = self._channel.stream_unary(
            f"/{self._service_name}/{method}{CHUNKED_SUFFIX}"
        )
        try:
            reply = stub(
                chunks,
                timeout=timeout,
                metadata=self._call_metadata(),
                wait_for_ready=wait_for_ready,
            )
        except grpc.RpcError as error:
            raise self._failed(error, method) from None
        return decode_frame(reply)

    def _failed(self, error: grpc.RpcError, method: str) -> Exception:
        failure = _error_of(error, f"{self._service_name}/{method} at {self.address}")
        if isinstance(failure, errors.UnavailableError):
            self._forget_listener()
        return failure

    def close(self) -> None:
        self._channel.close()


def _error_of(error: grpc.RpcError, where: str) -> Exception:
    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (error.details() if isinstance(error, grpc.Call) else None) or str(error)
    trailing: dict[str, str | bytes] = (
        dict(error.trailing_metadata() or ()) if isinstance(error, grpc.Call) else {}
    )
    name = trailing.get(_ERROR_TYPE_KEY)
    kind = getattr(errors, name, None) if isinstance(name, str) else None
    if isinstance(kind, type) and issubclass(kind, errors.FeedlineError):
        return kind(details)
    if code in _SERVER_CANNOT_ANSWER:
        # The server cannot answer now: it is unreachable, or it stops (a call it cancelled
        # or refused, a GOAWAY, a reset connection). Callers try it again (``retry``).
        return errors.UnavailableError(f"{where}: {code.name}: {details}")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        # No feedline handler answers so: another gRPC server (or a feedline without this
        # method) listens at the address, as where the server called is gone and another
        # process took its port. For the caller the server it wanted is not there.
        return errors.UnavailableError(
            f"{where}: {code.name}: {details}; the server there does not serve this call "
            "(another server, or another version of feedline, listens at this address)"
        )
    if code in _ERRORS:
        return _ERRORS[code](details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.InvalidArgumentError(f"{where}: {details}")
    builtin = getattr(builtins, name, None) if isinstance(name, str) else None
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        try:
            return builtin(details)
        except TypeError:
            pass
    return errors.UnknownError(f"{where}: {details}")
