"""Parameters held on parameter servers: where each goes, and how a step pulls and pushes them.

Under ``ParameterServerStrategy.scope()``, every parameter a module registers becomes a
``PSParameter``: a ``torch.nn.Parameter`` whose values live on the ps tasks and whose local
tensor is a copy of them. Placement is TensorFlow's: variables go to the ps tasks round-robin in
creation order; with a ``variable_partitioner``, a parameter is split by rows into shards
(``partitioners.shard_rows``: the first shards get one more row), each shard taking the next ps.

==========================  =====================================================================
creation                    the variable exists on the ps from its first use: its local initial
                            value is sent then, unless it exists already (between-graph workers
                            make the same variables; the first one's values win)
forward of a module         pulls the values not pulled since they went stale: every dense
                            variable of the process at once (one call per ps), and for
                            ``nn.Embedding``/``nn.EmbeddingBag`` only the rows that the input
                            ids touch (in the same calls as the stale dense variables that
                            modules read in the step before); under ``torch.no_grad()`` the
                            module's own, always
``optimizer.step()``        pushes the gradients (touched rows only for an embedding or a sparse
                            gradient); the ps applies the optimizer
stale                       at the start of each scheduled function and of ``strategy.run``,
                            at ``optimizer.zero_grad()``, and once pushed
pickled                     as the variable's name and place (``VariableSpec``), never its value
``state_dict()``            pulls the module's variables whole first; ``load_state_dict`` writes
                            them to the ps
==========================  =====================================================================

A module with parameters made outside the scope, called inside a step (a scheduled function or
``strategy.run``), is an error: its values would train on the worker alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from feedline.distribute import _torch_hooks, context
from feedline.distribute.experimental.partitioners import shard_rows
from feedline.distribute.parameter_server import optimizer as ps_optimizer
from feedline.distribute.parameter_server._tensors import dtype_name, parse_dtype
from feedline.distribute.parameter_server.runtime import Cluster, Runtime
from feedline.errors import FailedPreconditionError, InvalidArgumentError

__all__ = ["PSParameter", "Placer", "VariableSpec", "install_hooks", "step"]

_ROW_MODULES = (torch.nn.Embedding, torch.nn.EmbeddingBag)


@dataclasses.dataclass(frozen=True)
class VariableSpec:
    """A ps-held variable: its name, shape, dtype, shards ``(ps, first row, rows)``, whether
    it is read and written by rows (an embedding table), its cluster, and whether its ps
    applies gradients that are not finite (``ParameterServerStrategy(allow_nonfinite=...)``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    shard_list: tuple[tuple[int, int, int], ...]
    rows: bool
    cluster: Cluster
    allow_nonfinite: bool = False

    @property
    def single(self) -> bool:
        return len(self.shard_list) == 1

    def shard_name(self, k: int) -> str:
        return self.name if self.single else f"{self.name}/part_{k}"

    def shards(self) -> Iterator[tuple[int, str, int, int]]:
        """``(ps, name on the ps, first row, rows)`` of each shard."""
        for k, (ps, first, count) in enumerate(self.shard_list):
            yield ps, self.shard_name(k), first, count

    def shard_slices(self) -> Iterator[tuple[int, str, slice | None]]:
        for ps, name, first, count in self.shards():
            yield ps, name, None if self.single else slice(first, first + count)

    def parts(self, value: torch.Tensor) -> Iterator[tuple[int, str, torch.Tensor]]:
        for ps, name, where in self.shard_slices():
            yield ps, name, value if where is None else value[where]


class PSParameter(torch.nn.Parameter):
    """A parameter whose values live on parameter servers (see the module docstring).

    Pickles as its ``VariableSpec``: unpickled in another process of the cluster, it is that
    process's local copy of the same variable.
    """

    spec: VariableSpec

    def __reduce_ex__(self, protocol: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return _rebuild, (self.spec, self.requires_grad)

    def __deepcopy__(self, memo: dict[int, Any]) -> PSParameter:
        copy = _make(self.data.clone(), self.requires_grad, self.spec)
        memo[id(self)] = copy
        return copy

    @property
    def runtime(self) -> Runtime:
        return Runtime.of(self.spec.cluster)


def _make(data: torch.Tensor, requires_grad: bool, spec: VariableSpec) -> PSParameter:
    param = PSParameter(data, requires_grad)
    param.spec = spec
    return param


def _rebuild(spec: VariableSpec, requires_grad: bool) -> PSParameter:
    """The local copy of ``spec`` in this process: the one it has, else a new one (its values
    come from the ps at first use)."""
    install_hooks()
    runtime = Runtime.of(spec.cluster)
    existing = runtime.params.get(spec.name)
    if existing is not None and existing.spec == spec:
        return existing
    param = _make(torch.empty(spec.shape, dtype=parse_dtype(spec.dtype)), requires_grad, spec)
    runtime.register(param, created=True)
    return param


class Placer:
    """Places the variables one strategy creates: round-robin over the ps tasks, split by
    ``partitioner`` where it says so."""

    def __init__(
        self,
        cluster: Cluster,
        partitioner: Callable[..., Any] | None,
        allow_nonfinite: bool = False,
    ) -> None:
        self.cluster = cluster
        self._partitioner = partitioner
        self._allow_nonfinite = allow_nonfinite
        self._created = 0
        self._next_ps = 0
        self._lock = threading.Lock()

    @property
    def runtime(self) -> Runtime:
        return Runtime.of(self.cluster)

    def place(self, module: torch.nn.Module, name: str, param: torch.Tensor) -> PSParameter:
        shape = tuple(param.shape)
        counts = [shape[0]] if shape else [1]
        if self._partitioner is not None and shape and shape[0] > 1:
            counts = shard_rows(shape[0], self._num_shards(shape, param.dtype))
        with self._lock:
            shards = []
            first = 0
            for count in counts:
                shards.append((self._next_ps, first, count))
                self._next_ps = (self._next_ps + 1) % len(self.cluster.addresses)
                first += count
            spec = VariableSpec(
                name=f"{self._created}/{type(module).__name__}.{name}",
                shape=shape,
                dtype=dtype_name(param.dtype),
                shard_list=tuple(shards),
                rows=isinstance(module, _ROW_MODULES) and name == "weight",
                cluster=self.cluster,
                allow_nonfinite=self._allow_nonfinite,
            )
            self._created += 1
        ps_param = _make(param.data, param.requires_grad, spec)
        self.runtime.register(ps_param, created=False)
        return ps_param

    def _num_shards(self, shape: tuple[int, ...], dtype: torch.dtype) -> int:
        parts = list(self._partitioner(torch.Size(shape), dtype))  # type: ignore[misc]
        if not parts or any(int(p) != 1 for p in parts[1:]) or int(parts[0]) < 1:
            raise InvalidArgumentError(
                f"variable_partitioner returned {parts} for shape {list(shape)}: feedline splits "
                "along axis 0 only, so it must return [n, 1, ...] with n >= 1"
            )
        return min(int(parts[0]), shape[0])


# -- hooks ---------------------------------------------------------------------------------------
_local = threading.local()


def install_hooks() -> None:
    """Installs the hooks (the ``"parameter servers"`` set of ``_torch_hooks``, once per
    process): parameter registration under a ``ParameterServerStrategy`` scope, pulls before
    forward, optimizers over ps variables."""
    _torch_hooks.install(_HOOKS)


def _placer() -> Placer | None:
    if not context.has_strategy():
        return None
    return getattr(context.get_strategy(), "_ps_placer", None)


def _on_parameter(module: torch.nn.Module, name: str, param: Any) -> PSParameter | None:
    if param is None or isinstance(param, PSParameter):
        return None
    placer = _placer()
    if placer is None:
        return None
    if not getattr(module, "_feedline_ps_hooks", False):
        module.register_state_dict_pre_hook(_before_state_dict)
        module.register_load_state_dict_post_hook(_after_load_state_dict)
        module._feedline_ps_hooks = True  # type: ignore[assignment]
    return placer.place(module, name, param)


def _in_step() -> bool:
    return getattr(_local, "steps", 0) > 0


@contextlib.contextmanager
def step(clear_grads: bool = True) -> Iterator[None]:
    """One step (a scheduled function, ``strategy.run``): local values start stale, and a
    module with parameters made outside the scope may not be called."""
    for runtime in Runtime.every():
        runtime.begin_step(clear_grads)
    _local.steps = getattr(_local, "steps", 0) + 1
    try:
        yield
    finally:
        _local.steps -= 1


def _before_forward(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
    own = [p for p in module._parameters.values() if p is not None]
    if not own:
        return
    ps = [p for p in own if isinstance(p, PSParameter)]
    if len(ps) != len(own) and _in_step():
        names = [
            n
            for n, p in module._parameters.items()
            if p is not None and p.requires_grad and not isinstance(p, PSParameter)
        ]
    else:
        names = []
    if names:
        raise FailedPreconditionError(
            f"{type(module).__name__} has parameters {names} made outside the scope of the "
            "ParameterServerStrategy, used in a step: they would train on this worker alone. "
            "Create the model (and its optimizer) inside `with strategy.scope():`"
        )
    if not ps:
        return
    runtime = ps[0].runtime
    weight = module._parameters.get("weight")
    if _in_step():
        runtime.note_read(p for p in ps if not p.spec.rows)
    if isinstance(weight, PSParameter) and weight.spec.rows:
        if not module.sparse and torch.is_grad_enabled() and _sparse_backward_works(module):
            _backward_sparse_once(module, weight)
        if args and isinstance(args[0], torch.Tensor):
            ids = torch.unique(args[0].detach().reshape(-1).to("cpu", torch.int64))
            runtime.pull_rows(weight, ids[ids >= 0], with_stale=torch.is_grad_enabled())
        else:
            runtime.pull([weight])
        ps = [p for p in ps if p is not weight]
        if not ps:
            return
    if torch.is_grad_enabled():
        runtime.pull_stale()
    else:
        runtime.pull(ps)


# -- the gradient of a table held on the ps, dense as its module says, built from its rows ------
#
# A row module (``nn.Embedding``, ``nn.EmbeddingBag``) made with ``sparse=False`` (torch's
# default) gets a dense gradient: torch's backward fills a new table-sized tensor of zeros each
# step (25.6 MB for 200,000 x 32) to write the few rows a batch touched, and only those rows
# are pushed. Its forward in a step runs as if ``sparse=True`` (a gradient of the touched rows
# only); once torch has accumulated that sparse gradient, it becomes the dense ``.grad`` the
# module promises, in a table of the parameter's kept from its last gradient with only the rows
# written then cleared again, where nothing else holds or changed it (else a new one). So
# ``.grad`` is what it was, values included, for a few rows' work.


def _sparse_backward_works(module: torch.nn.Module) -> bool:
    """Whether torch's backward of ``module`` can give a sparse gradient (not for ``max``)."""
    return getattr(module, "mode", "sum") != "max"


def _backward_sparse_once(module: torch.nn.Module, weight: PSParameter) -> None:
    """This forward of ``module`` gives ``weight`` a sparse gradient, made dense once
    accumulated (``_densify``)."""
    if not getattr(weight, "_feedline_densifies", False):
        weight.register_post_accumulate_grad_hook(_densify)
        weight._feedline_densifies = True  # type: ignore[attr-defined]
    if not getattr(module, "_feedline_sparse_forward", False):
        module.register_forward_hook(_dense_again, always_call=True)
        module._feedline_sparse_forward = True  # type: ignore[assignment]
    module.sparse = True  # type: ignore[assignment]
    module._feedline_was_dense = True  # type: ignore[assignment]


def _dense_again(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
    """After the forward: the module is ``sparse=False`` again, as its user made it."""
    if getattr(module, "_feedline_was_dense", False):
        module.sparse = False  # type: ignore[assignment]
        module._feedline_was_dense = False  # type: ignore[assignment]


def _densify(param: torch.Tensor) -> None:
    """``param.grad``, if torch accumulated a sparse one into none, as the dense gradient: the
    table kept from the parameter's last one (its written rows cleared) where nothing else holds
    it and no one changed it since, else new zeros; the sparse gradient's rows added."""
    grad = param.grad
    if grad is None or not grad.is_sparse:
        return
    grad = grad.coalesce()
    rows, values = grad.indices()[0], grad.values()
    table = None
    kept = getattr(param, "_feedline_grad_table", None)
    if kept is not None:
        old, old_rows, version = kept
        if old._version == version and _held_only_here(old):
            table = old.index_fill_(0, old_rows, 0)
        del old, kept
    if table is None:
        table = torch.zeros(grad.shape, dtype=grad.dtype, device=grad.device)
    table.index_copy_(0, rows, values.to(table.dtype))
    param._feedline_grad_table = (table, rows, table._version)  # type: ignore[attr-defined]
    param.grad = table


def _held_only_here(table: torch.Tensor) -> bool:
    """Whether nothing but the parameter's kept entry holds ``table``: no other Python
    reference (the entry, the caller's local, this function's argument and getrefcount's are
    four), and no view or alias of its memory (torch's count of the storage's holders: the
    tensor and the storage object asked for here)."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:  # a torch without it: never written again
        return False
    return sys.getrefcount(table) <= 4 and use_count(table.untyped_storage()._cdata) <= 2


def _own_ps(module: torch.nn.Module) -> list[PSParameter]:
    return [p for p in module._parameters.values() if isinstance(p, PSParameter)]


def _before_state_dict(module: torch.nn.Module, prefix: str, keep_vars: bool) -> None:
    params = _own_ps(module)
    if params:
        params[0].runtime.pull(params)


def _after_load_state_dict(module: torch.nn.Module, incompatible_keys: Any) -> None:
    params = _own_ps(module)
    if params:
        params[0].runtime.assign(params)


def _on_optimizer(optimizer: torch.optim.Optimizer) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    local = [p for p in params if not isinstance(p, PSParameter)]
    if local and _placer() is not None:
        # In TensorFlow every variable made under the scope lives on a ps; a bare Parameter
        # (no module's) is not placed, and training it here would update each worker's copy.
        raise FailedPreconditionError(
            f"{type(optimizer).__name__} under the ParameterServerStrategy scope is given "
            f"{len(local)} parameter(s) not held on a parameter server (a bare "
            "torch.nn.Parameter, or one made outside the scope): each worker would train its "
            "own copy. Make trainable values attributes of a torch.nn.Module created inside "
            "`with strategy.scope():` (the module's parameters are placed on parameter servers)"
        )
    ps_optimizer.convert(optimizer, [p for p in params if isinstance(p, PSParameter)])


_HOOKS = _torch_hooks.HookSet(
    "parameter servers",
    on_parameter=_on_parameter,
    before_forward=_before_forward,
    on_optimizer=_on_optimizer,
)
