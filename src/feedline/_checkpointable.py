"""``Checkpointable``: how an object of one package saves itself in ``feedline.train.Checkpoint``.

``Checkpoint`` saves most objects through methods that their own library defines:
``state_dict``/``load_state_dict`` (torch modules, optimizers, LR schedulers) or
``get_state``/``set_state`` (``feedline.data`` iterators, ``torch.Generator``). An object whose
checkpoint is more than its own state (a distributed iterator saves every worker's position, a
metric its value over every worker) says so by implementing this protocol, on this floor so that
the packages that implement it (``feedline.distribute``, ``feedline.metrics``) and the one that
uses it (``feedline.train``) need not import each other.

Example:
  >>> class Counter:
  ...     def __init__(self) -> None:
  ...         self.count = 0
  ...     def get_state(self) -> int:
  ...         return self.count
  ...     def set_state(self, state: int) -> None:
  ...         self.count = state
  ...     def checkpoint_state(self) -> int:
  ...         return self.get_state()
  ...     def restore_checkpoint_state(self, state: int) -> None:
  ...         self.set_state(state)
  ...     def check_restorable(self, state: object) -> str | None:
  ...         return None if isinstance(state, int) else f"a count is an int, got {state!r}"
  >>> isinstance(Counter(), Checkpointable)
  True
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["Checkpointable"]


@runtime_checkable
class Checkpointable(Protocol):
    """An object that ``feedline.train.Checkpoint`` saves and restores in its own way.

    ``Checkpoint.save`` (``write``) stores ``checkpoint_state()``; ``Checkpoint.restore``
    (``read``) first asks every object's ``check_restorable(state)``, so that a state that
    cannot be restored raises before anything changes, then calls
    ``restore_checkpoint_state(state)``. Under a multi-worker strategy every worker saves and
    restores, so ``checkpoint_state`` may be a collective.
    """

    def get_state(self) -> Any:
        """This object's own state (this worker's alone)."""
        ...

    def set_state(self, state: Any) -> None:
        """Restores a state that ``get_state`` gave."""
        ...

    def checkpoint_state(self) -> Any:
        """What a checkpoint saves; every worker calls it."""
        ...

    def restore_checkpoint_state(self, state: Any) -> None:
        """Restores what ``checkpoint_state`` gave (on every worker)."""
        ...

    def check_restorable(self, state: Any) -> str | None:
        """Why ``state`` cannot be restored into this object, or None."""
        ...
