"""Everything feedline changes in torch, installed by this module and by no other.

Importing feedline changes nothing in torch. A strategy that needs torch to tell it about new
modules and optimizers installs a ``HookSet`` here, once per process: installing a set whose
``name`` is installed already does nothing, so callers install where they need the hooks, as
often as they like. Two sets exist:

- ``"mirroring"`` (``feedline.distribute.mirroring.install_hooks``), installed at the first
  ``scope()``, ``run`` or ``mirror`` of a strategy with several local replicas;
- ``"parameter servers"`` (``feedline.distribute.parameter_server.variables.install_hooks``),
  installed when a ``ParameterServerStrategy`` is made and when a process unpickles a
  ps-held parameter (a worker receiving a model).

What they change in torch, and nothing else:

``torch.nn.modules.module.register_module_parameter_registration_hook``
    mirroring: a module given a parameter under the scope of a multi-replica strategy is
    mirrored; parameter servers: a parameter made under a ``ParameterServerStrategy`` scope is
    replaced by its ``PSParameter``.
``torch.nn.modules.module.register_module_buffer_registration_hook``
    mirroring: a buffer, as a parameter.
``torch.nn.modules.module.register_module_forward_pre_hook``
    mirroring: a module whose parameters were made outside the scope, called in ``run``, is an
    error; parameter servers: pulls the values a forward needs from the ps (and the same error
    in a step).
``torch.optim.Optimizer.__init__``
    replaced once by a wrapper that calls torch's own ``__init__`` (the wrapper's
    ``__wrapped__``; ``torch_optimizer_init`` calls it without the hooks) and then each
    installed set's optimizer hook, in the order the sets were installed. Mirroring: the
    optimizer is mirrored; parameter servers: an optimizer over ps-held parameters takes its
    ps form. Inside ``without_optimizer_hooks()`` (a scratch optimizer that checks
    hyperparameters) the thread's new optimizers are torch's alone.

Each hook returns at once when no feedline strategy asks for it (no scope, no replica, no
ps-held parameter), so code that does not use those strategies sees torch unchanged. Torch's
global hooks run in the order they were registered: a set registers its hooks in the order of
the table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["HookSet", "install", "installed", "torch_optimizer_init", "without_optimizer_hooks"]

ParameterHook = Callable[[torch.nn.Module, str, Any], Any]
ForwardHook = Callable[[torch.nn.Module, tuple[Any, ...]], Any]
OptimizerHook = Callable[[torch.optim.Optimizer], None]


@dataclasses.dataclass(frozen=True)
class HookSet:
    """The hooks one part of feedline needs in torch; ``None`` leaves a place alone.

    Attributes:
      name: what installs it; a set of an installed name is not installed again.
      on_parameter: torch's module parameter registration hook (may return a replacement).
      on_buffer: torch's module buffer registration hook.
      before_forward: torch's module forward pre-hook.
      on_optimizer: called with every optimizer after torch's ``Optimizer.__init__``.
    """

    name: str
    on_parameter: ParameterHook | None = None
    on_buffer: ParameterHook | None = None
    before_forward: ForwardHook | None = None
    on_optimizer: OptimizerHook | None = None


_lock = threading.Lock()
_installed: dict[str, HookSet] = {}
_optimizer_hooks: list[OptimizerHook] = []
# ``Optimizer.__init__`` as feedline found it when it wrapped it; None before.
_torch_init: Callable[..., None] | None = None
# ``skip``: this thread is inside ``without_optimizer_hooks``.
_local = threading.local()


def install(hooks: HookSet) -> None:
    """Installs ``hooks`` in torch, unless a set of that name is installed already."""
    with _lock:
        if hooks.name in _installed:
            return
        module_hooks = torch.nn.modules.module
        if hooks.on_parameter is not None:
            module_hooks.register_module_parameter_registration_hook(hooks.on_parameter)
        if hooks.on_buffer is not None:
            module_hooks.register_module_buffer_registration_hook(hooks.on_buffer)
        if hooks.before_forward is not None:
            module_hooks.register_module_forward_pre_hook(hooks.before_forward)
        if hooks.on_optimizer is not None:
            if not _optimizer_hooks:
                _wrap_optimizer_init()
            _optimizer_hooks.append(hooks.on_optimizer)
        _installed[hooks.name] = hooks


def installed() -> tuple[str, ...]:
    """The names of the installed sets, in the order they were installed."""
    with _lock:
        return tuple(_installed)


def torch_optimizer_init(optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
    """torch's own ``Optimizer.__init__``, without feedline's optimizer hooks."""
    init = torch.optim.Optimizer.__init__ if _torch_init is None else _torch_init
    init(optimizer, *args, **kwargs)


@contextlib.contextmanager
def without_optimizer_hooks() -> Iterator[None]:
    """Optimizers this thread makes meanwhile get no hook (torch's own, however made)."""
    before = getattr(_local, "skip", False)
    _local.skip = True
    try:
        yield
    finally:
        _local.skip = before


def _wrap_optimizer_init() -> None:
    global _torch_init
    original = torch.optim.Optimizer.__init__
    _torch_init = original

    def __init__(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if getattr(_local, "skip", False):
            return
        for hook in tuple(_optimizer_hooks):
            hook(self)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    torch.optim.Optimizer.__init__ = __init__  # type: ignore[method-assign]
