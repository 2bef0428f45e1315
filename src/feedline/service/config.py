"""Configuration of the data service: ``ShardingPolicy``, ``DispatcherConfig``, ``WorkerConfig``.

Both configs are frozen dataclasses validated when made, with TensorFlow's field names; fields
left ``None`` take the documented defaults. feedline adds ``bind`` (servers listen on loopback
unless told otherwise), ``token`` (a shared secret; ``$FEEDLINE_SERVICE_TOKEN`` when None),
``tls_cert``, ``tls_key``, ``tls_ca`` (TLS, ``$FEEDLINE_TLS_*`` when None) and ``insecure``
(off loopback without a token or mutual TLS); ``docs/security.md`` says what each protects.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

from feedline._enums import parse_member
from feedline._net import local_secret
from feedline._net.security import TlsConfig, normalize_token
from feedline.errors import InvalidArgumentError

__all__ = ["DispatcherConfig", "ShardingPolicy", "WorkerConfig", "local_token"]


class ShardingPolicy(enum.IntEnum):
    """How a job's work is split across the service's workers.

    ============  ===========================================================================
    OFF           every worker runs the whole dataset (``"parallel_epochs"``)
    DYNAMIC       the dispatcher hands out splits of the source; each element once per epoch
                  (``"distributed_epoch"``)
    FILE          worker ``i`` of the ``worker_addresses`` list reads its share of the files
    DATA          worker ``i`` keeps every ``n``-th element, starting at ``i``
    FILE_OR_DATA  FILE where the dataset reads files, DATA otherwise
    HINT          ``shard(SHARD_HINT, SHARD_HINT)`` becomes ``shard(n, i)``
    ============  ===========================================================================
    """

    OFF = 0
    DYNAMIC = 1
    FILE = 2
    DATA = 3
    FILE_OR_DATA = 4
    HINT = 5

    @property
    def is_static(self) -> bool:
        """Whether the policy shards by worker index over a fixed list of workers."""
        return self not in (ShardingPolicy.OFF, ShardingPolicy.DYNAMIC)

    @classmethod
    def parse(cls, mode: Any) -> ShardingPolicy:
        """A policy from a ``ShardingPolicy``, its name (``"DATA"``, any case) or value, or the
        strings ``"parallel_epochs"`` (OFF) and ``"distributed_epoch"`` (DYNAMIC).

        Raises:
          InvalidArgumentError: ``mode`` names no policy; the message lists them.
        """
        aliases = {"parallel_epochs": cls.OFF, "distributed_epoch": cls.DYNAMIC}
        return parse_member(cls, mode, "processing_mode", aliases)


_PROTOCOLS = ("grpc",)


def _check_port(port: Any, what: str) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidArgumentError(f"{what}.port must be an int in [0, 65535], got {port!r}")


def _check_protocol(protocol: Any, what: str, field: str = "protocol") -> None:
    if protocol not in _PROTOCOLS:
        raise InvalidArgumentError(f"{what}.{field} must be one of {_PROTOCOLS}, got {protocol!r}")


def _check_ms(value: Any, what: str, field: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(
            f"{what}.{field} must be an int >= 0 (ms; None: the default), got {value!r}"
        )


def _seconds(ms: int | None, default_ms: int) -> float:
    """A time field in seconds: ``default_ms`` for None, and 1 ms for 0 (as TensorFlow reads
    an explicit 0: a very small time, not the default)."""
    if ms is None:
        return default_ms / 1000
    return max(ms, 1) / 1000


def _check_status_port(port: Any, service_port: int, what: str) -> None:
    if port is None:
        return
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidArgumentError(
            f"{what}.status_port must be None (no status page) or an int in [0, 65535] "
            f"(0 picks a free port), got {port!r}"
        )
    if port and port == service_port:
        raise InvalidArgumentError(
            f"{what}.status_port {port} is also its port: the status page needs a port of its own"
        )


def _check_security(config: Any, what: str) -> None:
    """Checks ``token`` (printable ASCII, one trailing newline stripped), the TLS paths and
    ``insecure`` of a config, in place."""
    token = config.token
    if token is not None:
        if not isinstance(token, str) or not token:
            raise InvalidArgumentError(f"{what}.token must be a non-empty string or None")
        object.__setattr__(config, "token", normalize_token(token, f"{what}.token"))
    for name in ("tls_cert", "tls_key", "tls_ca"):
        value = getattr(config, name)
        if value is not None and (not isinstance(value, str) or not value):
            raise InvalidArgumentError(f"{what}.{name} must be a file path or None, got {value!r}")
    if not isinstance(config.insecure, bool):
        raise InvalidArgumentError(f"{what}.insecure must be a bool, got {config.insecure!r}")


def _tls(config: Any, what: str) -> TlsConfig | None:
    return TlsConfig.resolve(config.tls_cert, config.tls_key, config.tls_ca, what)


#: ``DispatcherConfig.journal_sync``'s values.
JOURNAL_SYNC = ("full", "normal")


@dataclasses.dataclass(frozen=True)
class DispatcherConfig:
    """Configuration of a ``DispatchServer``. TensorFlow's fields come first, in its order; from
    ``journal_sync`` on they are keyword-only. A time in ms that is None takes its default; 0
    is 1 ms, as in TensorFlow.

    Attributes:
      port: the port to listen on; 0 picks a free one.
      protocol: the transport, ``"grpc"``.
      work_dir: a folder for the dispatcher's journal (needed by ``fault_tolerant_mode``;
        without it the dispatcher keeps nothing there).
      fault_tolerant_mode: journal every state change in SQLite under ``work_dir``, durable
        before the reply that depends on it, so that a dispatcher started again on the same
        ``work_dir`` (and port) resumes its datasets, jobs, tasks, split cursors and consumers.
      worker_addresses: the fixed list of worker addresses that static sharding (FILE, DATA,
        FILE_OR_DATA, HINT) needs; worker ``i`` is ``worker_addresses[i]``.
      job_gc_check_interval_ms: how often the dispatcher looks for jobs and datasets to
        collect, and for workers and consumers that stopped heartbeating (default 1000).
      job_gc_timeout_ms: how long a job (with a ``job_name``) stays without consumers before it
        is ended if it runs, and collected, and how long a dataset that no job reads stays
        registered after its last use (default 300000); -1: never. A job without a name is
        collected as soon as its consumer is done with it.
      worker_timeout_ms: a worker without a heartbeat for this long is dropped (default 10000).
      journal_sync: how durable a journaled change is before its reply: ``"full"`` (the
        default: each commit is fsynced before the reply, outside the dispatcher's lock and
        shared by the requests that commit meanwhile, so it survives a crash of the machine) or
        ``"normal"`` (SQLite's ``synchronous=NORMAL`` in WAL mode: it survives the
        dispatcher's own crash, kill -9 included, but a power cut or a kernel crash may lose
        the last commits; a commit costs tens of microseconds instead of an fsync).
      client_timeout_ms: a consumer without a heartbeat for this long is released (default 10000).
      bind: the interface to listen on; loopback unless told otherwise.
      token: the shared secret every request must carry; ``$FEEDLINE_SERVICE_TOKEN`` when None.
      status_port: serve an HTML status page at ``http://<bind>:<status_port>/`` and Prometheus
        metrics at ``/metrics`` (both need the token, when there is one; HTTPS with
        ``tls_cert``); 0 picks a free port; None (the default): no status server, and no
        metrics are collected.
      tls_cert: a PEM certificate (chain) to serve TLS with; ``$FEEDLINE_TLS_CERT`` when None.
      tls_key: the PEM key of ``tls_cert``; ``$FEEDLINE_TLS_KEY`` when None.
      tls_ca: PEM CA certificates: peers are verified with them, and with a ``tls_cert`` the
        server requires client certificates they sign (mutual TLS); ``$FEEDLINE_TLS_CA`` when
        None.
      insecure: serve off loopback without a token or mutual TLS (warned once), and on
        loopback without the user's local secret (``docs/security.md``).
    """

    port: int = 0
    protocol: str = "grpc"
    work_dir: str | None = None
    fault_tolerant_mode: bool = False
    worker_addresses: tuple[str, ...] | None = None
    job_gc_check_interval_ms: int | None = None
    job_gc_timeout_ms: int | None = None
    worker_timeout_ms: int | None = None
    # TensorFlow's fields above, in its order (positional calls mean the same); feedline's own
    # below, by keyword only.
    _: dataclasses.KW_ONLY
    journal_sync: str = "full"
    client_timeout_ms: int | None = None
    bind: str = "127.0.0.1"
    token: str | None = None
    status_port: int | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    insecure: bool = False

    def __post_init__(self) -> None:
        _check_port(self.port, "DispatcherConfig")
        _check_status_port(self.status_port, self.port, "DispatcherConfig")
        _check_protocol(self.protocol, "DispatcherConfig")
        for name in (
            "job_gc_check_interval_ms",
            "job_gc_timeout_ms",
            "worker_timeout_ms",
            "client_timeout_ms",
        ):
            value = getattr(self, name)
            if name == "job_gc_timeout_ms" and value == -1:
                continue  # TensorFlow's value for "never collect"
            _check_ms(value, "DispatcherConfig", name)
        if self.work_dir is not None and not isinstance(self.work_dir, str):
            raise InvalidArgumentError(
                f"DispatcherConfig.work_dir must be a path string, got {self.work_dir!r}"
            )
        if not isinstance(self.fault_tolerant_mode, bool):
            raise InvalidArgumentError(
                "DispatcherConfig.fault_tolerant_mode must be a bool, got "
                f"{self.fault_tolerant_mode!r}"
            )
        if self.journal_sync not in JOURNAL_SYNC:
            raise InvalidArgumentError(
                f"DispatcherConfig.journal_sync must be one of {', '.join(JOURNAL_SYNC)}, got "
                f"{self.journal_sync!r}"
            )
        if self.fault_tolerant_mode and not self.work_dir:
            # TensorFlow's message, with what the folder is for.
            raise InvalidArgumentError(
                "fault_tolerant_mode is True, but no work_dir is configured (DispatcherConfig."
                "work_dir: the folder the dispatcher keeps its journal in)"
            )
        if self.worker_addresses is not None:
            addresses = self.worker_addresses
            if isinstance(addresses, str) or not all(isinstance(a, str) for a in addresses):
                raise InvalidArgumentError(
                    "DispatcherConfig.worker_addresses must be a list of 'host:port' strings, "
                    f"got {addresses!r}"
                )
            if len(set(addresses)) != len(addresses) or not addresses:
                raise InvalidArgumentError(
                    "DispatcherConfig.worker_addresses must be non-empty and without duplicates, "
                    f"got {addresses!r}"
                )
            object.__setattr__(self, "worker_addresses", tuple(addresses))
        if not isinstance(self.bind, str) or not self.bind:
            raise InvalidArgumentError(f"DispatcherConfig.bind must be a host, got {self.bind!r}")
        _check_security(self, "DispatcherConfig")

    @property
    def tls(self) -> TlsConfig | None:
        """The TLS files (the config's, else ``$FEEDLINE_TLS_*``), None without any."""
        return _tls(self, "DispatcherConfig")

    @property
    def gc_check_interval_s(self) -> float:
        return _seconds(self.job_gc_check_interval_ms, 1000)

    @property
    def gc_timeout_s(self) -> float:
        """``job_gc_timeout_ms`` in seconds (``inf`` for -1)."""
        if self.job_gc_timeout_ms == -1:
            return math.inf
        return _seconds(self.job_gc_timeout_ms, 300_000)

    @property
    def worker_timeout_s(self) -> float:
        return _seconds(self.worker_timeout_ms, 10_000)

    @property
    def client_timeout_s(self) -> float:
        return _seconds(self.client_timeout_ms, 10_000)


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """Configuration of a ``WorkerServer``. TensorFlow's fields come first, in its order; from
    ``worker_tags`` on they are keyword-only. A time in ms that is None takes its default; 0 is
    1 ms, as in TensorFlow.

    Attributes:
      dispatcher_address: the dispatcher's ``host:port`` (a ``grpc://`` prefix is accepted).
      worker_address: the address consumers reach this worker at; ``%port%`` is replaced by
        the bound port. Default ``"<bind>:%port%"`` (``localhost:%port%`` for a wildcard bind).
      port: the port to listen on; 0 picks a free one.
      protocol: the transport to the dispatcher, ``"grpc"``.
      heartbeat_interval_ms: the longest time between heartbeats (default 1000). A heartbeat
        waits at the dispatcher for new tasks, so new jobs start at once regardless.
      dispatcher_timeout_ms: how long to keep trying to reach the dispatcher (default 60000):
        when starting, and whenever it becomes unreachable later; after that long the worker
        stops on its own (``WorkerServer.error`` says why; ``feedline worker`` exits with code
        2), or does not start (``UnavailableError``), unless ``wait_forever``.
      wait_forever: keep trying an unreachable dispatcher for as long as it takes: a worker
        started before its dispatcher registers whenever it comes up.
      data_transfer_protocol: the protocol consumers read elements with: ``None`` (through
        shared memory for consumers on this host that offer it, gRPC for the others) or
        ``"grpc"`` (every element over gRPC; offers of shared memory are refused).
      data_transfer_address: TensorFlow's address of a separate data transfer server; a
        feedline worker serves elements on its own port, so it is None or ``worker_address``.
      worker_tags: tags reported to the dispatcher.
      bind: the interface to listen on; loopback unless told otherwise.
      token: the shared secret; ``$FEEDLINE_SERVICE_TOKEN`` when None.
      status_port: serve an HTML status page at ``http://<bind>:<status_port>/`` and Prometheus
        metrics at ``/metrics`` (which needs the token, when there is one; HTTPS with
        ``tls_cert``); 0 picks a free port; None (the default): no status server, and no
        metrics are collected.
      buffer_memory_bytes: the most bytes the buffers of all of the worker's tasks hold
        together (256 MiB by default), beyond one element per task; each task's buffer is
        also bounded on its own (64 MiB and 4096 elements). Stalled jobs cost the worker no
        more than this.
      cross_trainer_cache_size_bytes: the bytes each task of a cross-trainer job
        (``CrossTrainerCache``) keeps in memory for its trainers (64 MiB by default): the
        sliding window of an infinite dataset; past it, a finite epoch spills to local disk.
      tls_cert: a PEM certificate (chain) to serve TLS with, also presented to the
        dispatcher for mutual TLS; ``$FEEDLINE_TLS_CERT`` when None.
      tls_key: the PEM key of ``tls_cert``; ``$FEEDLINE_TLS_KEY`` when None.
      tls_ca: PEM CA certificates: peers are verified with them, and with a ``tls_cert`` the
        server requires client certificates they sign (mutual TLS); ``$FEEDLINE_TLS_CA`` when
        None.
      insecure: serve off loopback without a token or mutual TLS (warned once), and on
        loopback without the user's local secret (``docs/security.md``).
    """

    dispatcher_address: str
    worker_address: str | None = None
    port: int = 0
    protocol: str = "grpc"
    heartbeat_interval_ms: int | None = None
    dispatcher_timeout_ms: int | None = None
    data_transfer_protocol: str | None = None
    data_transfer_address: str | None = None
    # TensorFlow's fields above, in its order; feedline's own below, by keyword only.
    _: dataclasses.KW_ONLY
    worker_tags: tuple[str, ...] = ()
    bind: str = "127.0.0.1"
    token: str | None = None
    wait_forever: bool = False
    status_port: int | None = None
    buffer_memory_bytes: int = 256 << 20
    cross_trainer_cache_size_bytes: int = 64 << 20
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    insecure: bool = False

    def __post_init__(self) -> None:
        _check_status_port(self.status_port, self.port, "WorkerConfig")
        memory = self.buffer_memory_bytes
        if type(memory) is not int or memory < 1:
            raise InvalidArgumentError(
                f"WorkerConfig.buffer_memory_bytes must be an int >= 1, got {memory!r}"
            )
        cache = self.cross_trainer_cache_size_bytes
        if type(cache) is not int or cache < 1:
            raise InvalidArgumentError(
                f"WorkerConfig.cross_trainer_cache_size_bytes must be an int >= 1, got {cache!r}"
            )
        if not isinstance(self.wait_forever, bool):
            raise InvalidArgumentError(
                f"WorkerConfig.wait_forever must be a bool, got {self.wait_forever!r}"
            )
        if not isinstance(self.dispatcher_address, str) or not self.dispatcher_address:
            raise InvalidArgumentError(
                "WorkerConfig.dispatcher_address must be 'host:port', got "
                f"{self.dispatcher_address!r}"
            )
        _check_port(self.port, "WorkerConfig")
        _check_protocol(self.protocol, "WorkerConfig")
        if self.data_transfer_protocol is not None:
            _check_protocol(self.data_transfer_protocol, "WorkerConfig", "data_transfer_protocol")
        transfer = self.data_transfer_address
        if transfer is not None and transfer != self.worker_address:
            raise InvalidArgumentError(
                f"WorkerConfig.data_transfer_address {transfer!r}: a feedline worker serves "
                "elements on its own port, at worker_address; leave data_transfer_address None "
                "(or equal to worker_address)"
            )
        _check_ms(self.heartbeat_interval_ms, "WorkerConfig", "heartbeat_interval_ms")
        _check_ms(self.dispatcher_timeout_ms, "WorkerConfig", "dispatcher_timeout_ms")
        tags = self.worker_tags
        if isinstance(tags, str) or not all(
            isinstance(tag, str) and tag.isprintable() for tag in tags
        ):
            raise InvalidArgumentError(
                "WorkerConfig.worker_tags must be a list of printable strings (no control "
                f"characters), got {tags!r}"
            )
        object.__setattr__(self, "worker_tags", tuple(tags))
        if self.worker_address is not None and not isinstance(self.worker_address, str):
            raise InvalidArgumentError(
                f"WorkerConfig.worker_address must be a string, got {self.worker_address!r}"
            )
        if not isinstance(self.bind, str) or not self.bind:
            raise InvalidArgumentError(f"WorkerConfig.bind must be a host, got {self.bind!r}")
        _check_security(self, "WorkerConfig")

    @property
    def tls(self) -> TlsConfig | None:
        """The TLS files (the config's, else ``$FEEDLINE_TLS_*``), None without any."""
        return _tls(self, "WorkerConfig")

    @property
    def heartbeat_interval_s(self) -> float:
        return _seconds(self.heartbeat_interval_ms, 1000)

    @property
    def dispatcher_timeout_s(self) -> float:
        return _seconds(self.dispatcher_timeout_ms, 60_000)


def local_token() -> str | None:
    """The secret that this user's servers on loopback without a token check (the local
    cluster's secret, ``docs/security.md``), or None where no server made one yet.

    Clients of this user send it by themselves; it is what a status page of such a server
    takes: ``status_url + "?token=" + local_token()`` in a browser, or the header
    ``Authorization: Bearer <token>``.

    Raises:
      PermissionDeniedError: its file or folder is not private to this user.
    """
    return local_secret.read()
