"""The status server of a dispatcher or worker: an HTML page and Prometheus metrics over HTTP.

A server with a ``status_port`` (``DispatcherConfig``/``WorkerConfig``, ``--status-port``)
runs a ``StatusServer``: the standard library's ``ThreadingHTTPServer`` on a daemon thread, bound
to the service's ``bind`` address (loopback unless told otherwise). It serves

=============  ==================================================================================
``/``          the status page: plain HTML, every value escaped, no scripts (its
               Content-Security-Policy allows none, and inline styles only)
``/metrics``   the metrics in the Prometheus text format (``metrics``); when the service has a
               token, only with ``Authorization: Bearer <token>``
anything else  404
=============  ==================================================================================

Both read a snapshot (``page``) that the server copies under its lock and renders
outside it, so a slow page or scrape never holds up the service.
"""

from __future__ import annotations

import errno
import hmac
import logging
import socket
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from feedline.errors import UnavailableError

__all__ = ["StatusServer"]

logger = logging.getLogger(__name__)

_SECURITY_HEADERS = (
    (
        "Content-Security-Policy",
        "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    status: StatusServer


class _IPv6HTTPServer(_HTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    server_version = "feedline-status"
    timeout = 10.0  # a client that sends nothing for this long is dropped (its socket's timeout)

    def do_GET(self) -> None:
        self._respond(body=True)

    def do_HEAD(self) -> None:
        self._respond(body=False)

    def _respond(self, body: bool) -> None:
        status = self.server.status
        path = urllib.parse.urlsplit(self.path).path
        try:
            if path in ("/", "/index.html"):
                self._send(200, "text/html; charset=utf-8", status.page().encode(), body)
            elif path == "/metrics":
                if not status.authorized(self.headers.get("Authorization")):
                    self._send(
                        401,
                        "text/plain; charset=utf-8",
                        b"/metrics needs the service token: send 'Authorization: Bearer TOKEN'\n",
                        body,
                        (("WWW-Authenticate", 'Bearer realm="feedline"'),),
                    )
                else:
                    self._send(200, CONTENT_TYPE_LATEST, status.metrics(), body)
            else:
                self._send(
                    404,
                    "text/plain; charset=utf-8",
                    b"not found: this server serves / (the status page) and /metrics\n",
                    body,
                )
        except Exception:
            logger.exception("%s status server: %s failed", status.owner, path)
            self._send(500, "text/plain; charset=utf-8", b"the status page failed\n", body)

    def _send(
        self,
        code: int,
        content_type: str,
        payload: bytes,
        body: bool,
        extra: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (*_SECURITY_HEADERS, *extra):
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s status server: " + format, self.server.status.owner, *args)


class StatusServer:
    """An HTTP server of a status page and metrics on a daemon thread, started when made.

    Args:
      owner: ``"dispatcher"`` or ``"worker"`` (for messages).
      bind: the interface to listen on.
      port: the port; 0 picks a free one.
      page: renders the status page (HTML).
      metrics: the metrics in the Prometheus text format.
      token: the service token that ``/metrics`` requires, or None.
      setting: what sets the port, for the error message (``"DispatcherConfig.status_port,
        feedline dispatcher --status-port"``).

    Raises:
      UnavailableError: the port cannot be bound (in use, say); the message names the port
        and ``setting``.
    """

    def __init__(
        self,
        *,
        owner: str,
        bind: str,
        port: int,
        page: Callable[[], str],
        metrics: Callable[[], bytes],
        token: str | None,
        setting: str,
    ) -> None:
        self.owner = owner
        self.page = page
        self.metrics = metrics
        self._token = None if token is None else token.encode()
        host = bind.strip("[]")
        kind = _IPv6HTTPServer if ":" in host else _HTTPServer
        try:
            self._httpd = kind((host, port), _Handler)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise UnavailableError(
                    f"the {owner}'s status port {port} on {host} is already in use; choose "
                    f"another with {setting} (0 picks a free port), or leave it unset for no "
                    "status page"
                ) from error
            raise UnavailableError(
                f"cannot serve the {owner}'s status page on {host}:{port} ({setting}): {error}"
            ) from error
        self._httpd.status = self
        self.port: int = self._httpd.server_address[1]
        display = f"[{host}]" if ":" in host else host
        if host in ("0.0.0.0", "::"):
            display = "localhost"
        self.url = f"http://{display}:{self.port}/"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"feedline-{owner}-status-{self.port}",
            daemon=True,
        )
        self._thread.start()
        self._stopped = False
        logger.info("%s status page at %s, metrics at %smetrics", owner, self.url, self.url)

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries the token (always, without a token)."""
        if self._token is None:
            return True
        scheme, _, credentials = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            credentials.strip().encode(), self._token
        )

    def stop(self) -> None:
        """Stops serving and closes the port; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
