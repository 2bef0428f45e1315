"""A process's connection to the parameter servers of one cluster, and its local copies.

Every process that computes with ps-held parameters (a between-graph worker, a worker running
a coordinator's functions, the coordinator itself) keeps one ``Runtime`` per cluster: a gRPC
client per ps task and, for each variable it knows, the local ``PSParameter`` that holds the
values last pulled. Calls to several ps tasks go out in parallel. Until a ps has answered once,
calls wait for it (up to the cluster's ``connect_timeout``, trying every 0.1 s), so workers may
start before the ps tasks; after that a ps that does not answer is gone, and every error from it
is a ``ParameterServerUnavailableError`` naming it: a ps failure is not recoverable (TensorFlow's
rule); the cluster restarts from its last checkpoint.

Inside ``held_pushes()`` (a worker running a coordinator's functions), a push is checked and
then held instead of sent: the next call to the same ps carries it (a pull applies it first,
then reads; a push joins it), so a step of a function that follows another costs one call per
ps fewer, and ``flush()`` sends what is still held. What a function pushed is then applied
once the next function on the worker reads, or when the worker flushes (``executor``: at the
end of a request unless another one waits); a worker lost in between loses that one push, as
an asynchronous step in flight would be.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent import futures
from typing import TYPE_CHECKING, Any

import torch

from feedline._net import rpc as _rpc
from feedline.distribute.parameter_server import _tensors
from feedline.distribute.parameter_server.protocol import SERVICE_NAME, UPLOADS
from feedline.distribute.parameter_server.updates import check_gradient
from feedline.errors import InvalidArgumentError, NotFoundError, UnavailableError

if TYPE_CHECKING:
    from feedline.distribute.parameter_server.variables import PSParameter

__all__ = [
    "Cluster",
    "ParameterServerUnavailableError",
    "Runtime",
    "failed_ps_task",
    "held_pushes",
]

#: How long one call to a ps that answered before may take.
CALL_TIMEOUT_S = 120.0

# Requests by ps task: (method, header, buffers); what each reply's values are written to.
_Requests = dict[int, tuple[str, dict[str, Any], list[Any]]]
_Targets = dict[int, list[tuple["PSParameter", Any]]]


class ParameterServerUnavailableError(UnavailableError):
    """A parameter server cannot be reached or lost its variables (it restarted).

    Attributes:
      task_id: the ps task's index.
      address: its address.
    """

    def __init__(self, message: str, task_id: int | None = None, address: str | None = None):
        super().__init__(message)
        self.task_id = task_id
        self.address = address


def failed_ps_task(error: BaseException | None) -> int | None:
    """The ps task whose failure caused ``error`` (following its causes), else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ParameterServerUnavailableError):
            return error.task_id
        error = error.__cause__ or error.__context__
    return None


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The ps tasks' addresses, in task order, and how long to wait for one at first."""

    addresses: tuple[str, ...]
    connect_timeout: float = 60.0


_holding = threading.local()


@contextlib.contextmanager
def held_pushes() -> Iterator[None]:
    """Pushes made by this thread inside are held for the next call to their ps (see the
    module docstring); the caller ``flush()``es every runtime when it must."""
    previous = getattr(_holding, "active", False)
    _holding.active = True
    try:
        yield
    finally:
        _holding.active = previous


class Runtime:
    """The ps clients and local variables of one cluster in this process. Thread-safe."""

    _instances: dict[Cluster, Runtime] = {}
    _instances_lock = threading.Lock()

    @classmethod
    def of(cls, cluster: Cluster) -> Runtime:
        with cls._instances_lock:
            runtime = cls._instances.get(cluster)
            if runtime is None:
                runtime = cls._instances[cluster] = Runtime(cluster)
            return runtime

    @classmethod
    def every(cls) -> list[Runtime]:
        with cls._instances_lock:
            return list(cls._instances.values())

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._token = _rpc.resolve_token(None)
        self._clients = [_rpc.RpcClient(a, SERVICE_NAME, self._token) for a in cluster.addresses]
        self._answered = [False] * len(self._clients)
        self._pool = futures.ThreadPoolExecutor(
            max_workers=max(1, len(self._clients)), thread_name_prefix="feedline-ps-client"
        )
        self._lock = threading.RLock()
        self.params: dict[str, PSParameter] = {}
        self._uncreated: dict[str, PSParameter] = {}
        self._fresh: set[str] = set()
        self._touched: dict[str, list[torch.Tensor]] = {}
        # Dense variables that modules read in this step and in the step before it.
        self._read_now: set[str] = set()
        self._read_before: set[str] = set()
        # Pushes held for the next call to their ps (``held_pushes``): items and buffers.
        self._held: dict[int, tuple[list[dict[str, Any]], list[Any]]] = {}

    # -- calls -----------------------------------------------------------------------------
    def call(
        self, ps: int, method: str, header: dict[str, Any], buffers: Sequence[Any] = ()
    ) -> tuple[dict[str, Any], list[memoryview]]:
        """One RPC to ps task ``ps``; its failures are ``ParameterServerUnavailableError``."""
        first = not self._answered[ps]
        if first:
            self._await(ps)
        client = self._clients[ps]
        timeout = CALL_TIMEOUT_S
        send = client.upload if method in UPLOADS else client.call
        try:
            reply = send(method, header, buffers, timeout=timeout)
        except UnavailableError as error:
            # A fresh channel, which waits for the task again: a ps restarted with the cluster
            # is reached at once, free of gRPC's reconnect backoff.
            self._clients[ps] = _rpc.RpcClient(client.address, SERVICE_NAME, self._token)
            self._answered[ps] = False
            client.close()
            raise self._unavailable(ps, f" ({error})") from error
        except NotFoundError as error:
            raise ParameterServerUnavailableError(
                f"parameter server /job:ps/task:{ps} at {client.address} lost its variables: "
                f"{error}",
                ps,
                client.address,
            ) from error
        self._answered[ps] = True
        return reply

    def _unavailable(self, ps: int, why: str) -> ParameterServerUnavailableError:
        address = self.cluster.addresses[ps]
        return ParameterServerUnavailableError(
            f"parameter server /job:ps/task:{ps} at {address} is unavailable{why}; a ps failure "
            "is not recoverable: restart the cluster and restore the last checkpoint",
            ps,
            address,
        )

    def _await(self, ps: int) -> None:
        """Waits up to ``connect_timeout`` for ps task ``ps`` to answer a first time, trying
        every 0.1 s on a fresh channel (free of gRPC's reconnect backoff)."""
        deadline = time.monotonic() + self.cluster.connect_timeout
        while True:
            client = self._clients[ps]
            try:
                client.call("Ping", {}, timeout=max(0.05, min(1.0, deadline - time.monotonic())))
                return
            except UnavailableError as error:
                if time.monotonic() >= deadline:
                    raise self._unavailable(
                        ps, f" within {self.cluster.connect_timeout:g} s ({error})"
                    ) from error
            self._clients[ps] = _rpc.RpcClient(client.address, SERVICE_NAME, self._token)
            client.close()
            time.sleep(0.1)

    def fanout(
        self, requests: dict[int, tuple[str, dict[str, Any], list[Any]]]
    ) -> dict[int, tuple[dict[str, Any], list[memoryview]]]:
        """Sends one request per ps task, in parallel; their replies by task. A push held for
        a ps travels with its Pull or Push (or alone first, before another method)."""
        with self._lock:
            held, self._held = self._held, {}
        if not held:
            return self._send(requests)
        requests = dict(requests)
        first: _Requests = {}  # before a method that carries no push
        extra = set()  # sent alone, beside the requests
        for ps, (entries, buffers) in held.items():
            method, header, rest = requests.get(ps, ("Push", {"variables": []}, []))
            if ps not in requests:
                extra.add(ps)
            if method == "Pull":
                requests[ps] = (method, {**header, "push": entries}, [*buffers, *rest])
            elif method == "Push":
                variables = [*entries, *header["variables"]]
                requests[ps] = (method, {**header, "variables": variables}, [*buffers, *rest])
            else:
                first[ps] = ("Push", {"variables": entries}, buffers)
        self._send(first)
        replies = self._send(requests)
        for ps in extra:
            del replies[ps]
        return replies

    def flush(self) -> None:
        """Sends the pushes held for the ps tasks (``held_pushes``), if any."""
        self.fanout({})

    def _send(
        self, requests: dict[int, tuple[str, dict[str, Any], list[Any]]]
    ) -> dict[int, tuple[dict[str, Any], list[memoryview]]]:
        items = list(requests.items())
        if not items:
            return {}
        # The first request is sent from this thread, the others from the pool meanwhile.
        pending = [(ps, self._pool.submit(self.call, ps, *request)) for ps, request in items[1:]]
        first, request = items[0]
        replies = {first: self.call(first, *request)}
        replies.update((ps, future.result()) for ps, future in pending)
        return replies

    def ping(self, ps: int, timeout: float) -> None:
        """Raises ``UnavailableError`` unless ps task ``ps`` answers within ``timeout``."""
        self._clients[ps].call("Ping", {}, timeout=timeout)

    # -- local variables ---------------------------------------------------------------------
    def register(self, param: PSParameter, created: bool) -> None:
        with self._lock:
            self.params[param.spec.name] = param
            if not created:
                self._uncreated[param.spec.name] = param

    def begin_step(self, clear_grads: bool) -> None:
        """A new step: every local value is stale; touched rows and (optionally) gradients are
        forgotten."""
        with self._lock:
            self._fresh.clear()
            self._touched.clear()
            self._read_before, self._read_now = self._read_now, set()
            params = list(self.params.values()) if clear_grads else []
        for param in params:
            param.grad = None

    def mark_stale(self, params: Iterable[PSParameter]) -> None:
        with self._lock:
            for param in params:
                self._fresh.discard(param.spec.name)
                self._touched.pop(param.spec.name, None)

    def touched_rows(self, param: PSParameter) -> torch.Tensor | None:
        with self._lock:
            parts = self._touched.get(param.spec.name)
        return torch.unique(torch.cat(parts)) if parts else None

    def ensure_created(self) -> None:
        """Creates on the ps every variable of this process not known to be there (with its
        local value; a variable that exists keeps its value)."""
        with self._lock:
            pending = dict(self._uncreated)
        if not pending:
            return
        self._create(list(pending.values()), overwrite=False)
        with self._lock:
            for name in pending:
                self._uncreated.pop(name, None)

    def assign(self, params: Sequence[PSParameter]) -> None:
        """Writes the local values of ``params`` to the ps (a restored checkpoint)."""
        self._create(params, overwrite=True)
        with self._lock:
            for param in params:
                self._uncreated.pop(param.spec.name, None)
                self._fresh.add(param.spec.name)

    def _create(self, params: Sequence[PSParameter], overwrite: bool) -> None:
        requests: _Requests = {}
        for param in params:
            for ps, name, part in param.spec.parts(param.detach()):
                meta, array = _tensors.pack(part)
                _, header, buffers = requests.setdefault(ps, ("Create", {"variables": []}, []))
                header["variables"].append({"name": name, "value": meta, "overwrite": overwrite})
                buffers.append(array)
        self.fanout(requests)

    # -- pulls and pushes --------------------------------------------------------------------
    def _stale_dense(self) -> list[PSParameter]:
        with self._lock:
            return [p for n, p in self.params.items() if n not in self._fresh and not p.spec.rows]

    def note_read(self, params: Iterable[PSParameter]) -> None:
        """Records that a module's forward reads ``params`` (dense variables) in this step."""
        with self._lock:
            self._read_now.update(p.spec.name for p in params)

    def pull_stale(self) -> None:
        """Pulls every dense variable of this process not pulled since it became stale."""
        stale = self._stale_dense()
        if stale:
            self.pull(stale)

    def pull(self, params: Sequence[PSParameter]) -> None:
        """Pulls the whole of each of ``params`` into its local copy."""
        self.ensure_created()
        requests: _Requests = {}
        targets: _Targets = {}
        self._add_whole(params, requests, targets)
        self._write(self.fanout(requests), targets)
        with self._lock:
            self._fresh.update(p.spec.name for p in params)

    @staticmethod
    def _add_whole(params: Sequence[PSParameter], requests: _Requests, targets: _Targets) -> None:
        for param in params:
            for ps, name, where in param.spec.shard_slices():
                requests.setdefault(ps, ("Pull", {"variables": []}, []))[1]["variables"].append(
                    {"name": name, "rows": False}
                )
                targets.setdefault(ps, []).append((param, where))

    def pull_rows(self, param: PSParameter, ids: torch.Tensor, with_stale: bool = False) -> None:
        """Pulls rows ``ids`` (unique, int64) of ``param`` into its local copy, and remembers
        them as touched (their gradient is what a push sends). With ``with_stale``, the same
        calls also pull the stale dense variables that modules read in the step before this one
        (``note_read``): a step like it reads them next, and finds them pulled."""
        self.ensure_created()
        requests: _Requests = {}
        targets: _Targets = {}
        for ps, name, first, count in param.spec.shards():
            mask = (ids >= first) & (ids < first + count)
            if not bool(mask.any()):
                continue
            rows = ids[mask]
            _, header, buffers = requests.setdefault(ps, ("Pull", {"variables": []}, []))
            header["variables"].append({"name": name, "rows": True})
            buffers.append((rows - first).numpy())
            targets.setdefault(ps, []).append((param, rows))
        stale = []
        if with_stale:
            with self._lock:
                before = self._read_before
            stale = [p for p in self._stale_dense() if p.spec.name in before]
        self._add_whole(stale, requests, targets)
        self._write(self.fanout(requests), targets)
        with self._lock:
            self._touched.setdefault(param.spec.name, []).append(ids)
            self._fresh.update(p.spec.name for p in stale)

    @staticmethod
    def _write(replies: dict[int, Any], targets: dict[int, list[tuple[Any, Any]]]) -> None:
        with torch.no_grad():
            for ps, (header, buffers) in replies.items():
                for (param, where), meta, buffer in zip(
                    targets[ps], header["values"], buffers, strict=True
                ):
                    value = _tensors.unpack(meta, buffer)
                    if where is None:
                        param.data.copy_(value)
                    elif isinstance(where, slice):
                        param.data[where].copy_(value)
                    else:
                        device = param.device
                        param.data.index_copy_(0, where.to(device), value.to(device, param.dtype))

    def push(self, items: Sequence[tuple[PSParameter, torch.Tensor, str, dict[str, Any]]]) -> None:
        """Sends each ``(param, grad, optimizer name, hyperparameters)``: the touched rows of
        a row-wise variable (or of a sparse gradient), else the whole gradient.

        A push is applied by every ps task it goes to or by none: each gradient is first
        checked here as its ps checks it (``updates.check_gradient``: dtype, shape,
        optimizer and hyperparameters; and, for a variable without ``allow_nonfinite``, no NaN
        or infinity). Where one is refused, only the ps tasks that refuse their part get the
        push, and refuse it (and count it): the other ps tasks get nothing of the step, so
        that a refused step changes no variable anywhere.

        Raises:
          InvalidArgumentError: a ps refused the push (a non-finite gradient, another dtype,
            a negative learning rate, ...).
        """
        requests: dict[int, tuple[str, dict[str, Any], list[Any]]] = {}
        refused: dict[int, str] = {}  # by ps: why (the first part it refuses)

        def add(ps: int, entry: dict[str, Any], part: torch.Tensor, arrays: list[Any]) -> None:
            meta, array = _tensors.pack(part)
            _, header, buffers = requests.setdefault(ps, ("Push", {"variables": []}, []))
            header["variables"].append({**entry, "grad": meta})
            buffers.extend([*arrays, array])

        for param, grad, kind, hyper in items:
            touched = _rows_of(self, param, grad)
            for ps, name, first, count in param.spec.shards():
                entry: dict[str, Any] = {
                    "name": name,
                    "optimizer": kind,
                    "hyper": hyper,
                    "rows": touched is not None,
                }
                if param.spec.allow_nonfinite:
                    entry["allow_nonfinite"] = True
                shape = list(param.shape) if param.spec.single else [count, *param.shape[1:]]
                if touched is None:
                    part = grad if param.spec.single else grad[first : first + count]
                    arrays: list[Any] = []
                else:
                    rows, values = touched
                    mask = (rows >= first) & (rows < first + count)
                    if not bool(mask.any()):
                        continue
                    part, arrays = values[mask], [(rows[mask] - first).numpy()]
                why = _refusal(entry, param.dtype, shape, part, None if not arrays else len(part))
                if why is not None:
                    refused.setdefault(ps, why)
                add(ps, entry, part, arrays)
        if refused:
            try:  # refused there (and counted), applied nowhere else
                self._send({ps: requests[ps] for ps in sorted(refused)})
            except InvalidArgumentError as error:
                raise InvalidArgumentError(
                    f"{error}; no parameter server applied any of this step"
                ) from None
            raise InvalidArgumentError(
                f"{'; '.join(refused.values())}; no parameter server applied any of this step"
            )
        if getattr(_holding, "active", False):
            with self._lock:
                for ps, (_, header, buffers) in requests.items():
                    entries, held = self._held.setdefault(ps, ([], []))
                    entries += header["variables"]
                    held += buffers
        else:
            self.fanout(requests)
        self.mark_stale([item[0] for item in items])

    def get_state(self, params: Sequence[PSParameter]) -> list[list[dict[str, Any]]]:
        """Each variable's shards as the ps holds them: value, optimizer, hyper and state."""
        from feedline.distribute.parameter_server.storage import unpack_state

        self.ensure_created()
        order: dict[int, list[tuple[int, int]]] = {}
        requests: dict[int, tuple[str, dict[str, Any], list[Any]]] = {}
        for i, param in enumerate(params):
            for k, (ps, name, _, _) in enumerate(param.spec.shards()):
                requests.setdefault(ps, ("GetState", {"names": []}, []))[1]["names"].append(name)
                order.setdefault(ps, []).append((i, k))
        result: list[list[dict[str, Any]]] = [
            [{} for _ in range(len(p.spec.shard_list))] for p in params
        ]
        for ps, (header, buffers) in self.fanout(requests).items():
            parts = iter(buffers)
            for (i, k), item in zip(order[ps], header["variables"], strict=True):
                value = _tensors.unpack(item["value"], next(parts))
                state = unpack_state(item["state"], parts)
                result[i][k] = {**item, "value": value, "state": state}
        return result

    def set_state(self, entries: Sequence[tuple[PSParameter, list[dict[str, Any]]]]) -> None:
        """Writes shards (``value``, ``optimizer``, ``hyper``, ``state``) of each variable."""
        from feedline.distribute.parameter_server.storage import pack_state

        requests: dict[int, tuple[str, dict[str, Any], list[Any]]] = {}
        for param, shards in entries:
            for (ps, name, _, _), shard in zip(param.spec.shards(), shards, strict=True):
                meta, array = _tensors.pack(shard["value"])
                state_meta, state_buffers = pack_state(shard["state"])
                _, header, buffers = requests.setdefault(ps, ("SetState", {"variables": []}, []))
                header["variables"].append({"name": name, "value": meta, "state": state_meta,
                    "optimizer": shard["optimizer"], "hyper": shard["hyper"]})  # fmt: skip
                buffers.extend([array, *state_buffers])
        self.fanout(requests)


def _refusal(
    entry: dict[str, Any],
    dtype: torch.dtype,
    shape: list[int],
    part: torch.Tensor,
    rows: int | None,
) -> str | None:
    """Why the ps would refuse the push item ``entry`` with gradient ``part`` (of ``rows``
    rows, None: the whole shard of ``dtype`` and ``shape``), or None."""
    name = entry["name"]
    try:
        check_gradient(name, dtype, shape, part, rows, entry["optimizer"], entry["hyper"])
    except InvalidArgumentError as error:
        return str(error)
    if not entry.get("allow_nonfinite") and not _tensors.all_finite(part):
        return f"the gradient of {name!r} is not finite (NaN or infinity)"
    return None


def _rows_of(
    runtime: Runtime, param: PSParameter, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The rows of ``grad`` to push and their values, or None to push the whole."""
    if grad.is_sparse:
        grad = grad.coalesce()
        return grad.indices()[0].to("cpu", torch.int64), grad.values().cpu()
    if param.spec.rows:
        rows = runtime.touched_rows(param)
        if rows is not None:
            return rows, grad.index_select(0, rows.to(grad.device)).cpu()
    return None
