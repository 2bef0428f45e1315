"""Which strategy is in scope and which replica is running: cross-replica and replica contexts.

Inside ``strategy.scope()`` and outside ``strategy.run`` the code is in the *cross-replica*
context; inside a function that ``run`` calls, it is in a *replica* context with its replica id.
Outside any scope the default strategy (one replica) is in effect and the code is in its replica
context, as in TensorFlow.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import optree

from feedline.distribute._replica_group import Collective
from feedline.distribute.values import PerReplica, ReduceOp, select_replica
from feedline.errors import FailedPreconditionError, InvalidArgumentError

if TYPE_CHECKING:
    from feedline.distribute._replica_group import ReplicaGroup
    from feedline.distribute.strategy import Strategy

_strategy: contextvars.ContextVar[Strategy | None] = contextvars.ContextVar(
    "feedline_strategy", default=None
)
_replica: contextvars.ContextVar[ReplicaContext | None] = contextvars.ContextVar(
    "feedline_replica", default=None
)


@dataclasses.dataclass(frozen=True)
class ReplicaContext:
    """The replica a function runs as, inside ``strategy.run`` (``tf.distribute.ReplicaContext``).

    Its collectives (``all_reduce``, ``all_gather``, ``merge_call``) combine the values of every
    replica in sync, on every worker. With several local replicas, ``strategy.run`` then hands
    the turn from replica to replica at each collective, and each replica computes on its own
    gradients, buffers and parameter data; every replica must call the same collectives in the
    same order, or every replica gets a ``FailedPreconditionError`` that names the calls.
    """

    strategy: Strategy
    replica_id_in_sync_group: int
    _group: ReplicaGroup | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def num_replicas_in_sync(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def devices(self) -> tuple[str, ...]:
        return (str(self.strategy.extended.local_devices[self.local_replica_id]),)

    @property
    def local_replica_id(self) -> int:
        return self.replica_id_in_sync_group - self.strategy.extended.first_replica_id

    def all_reduce(self, reduce_op: Any, value: Any, options: Any = None) -> Any:
        """``value`` (a tensor or a nested structure of them) reduced over every replica in
        sync, with ``reduce_op`` (``SUM`` or ``MEAN``, a ``ReduceOp`` or its name); every
        replica gets the same result, on its own device, as in TensorFlow. Integer tensors
        become floating point under ``MEAN``. The result does not carry gradients back to the
        other replicas.

        ``options`` (a ``CommunicationOptions``) is accepted as TensorFlow's; the strategy's
        own options apply. Every replica's value must have one shape.

        Used as a gradient (``param.grad = reduced``), an ``all_reduce`` result is already
        summed over the replicas: a mirrored optimizer's deferred step uses it as it is rather
        than summing the replicas' gradients again.

        Example (replica 0 has ``{"a": 1, "b": [40, 1]}``, replica 1 ``{"a": 3, "b": [2, 98]}``):
          >>> import torch, feedline.distribute as fdist
          >>> strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
          >>> values = [{"a": 1, "b": [40, 1]}, {"a": 3, "b": [2, 98]}]
          >>> def step():
          ...     context = fdist.get_replica_context()
          ...     mine = values[context.replica_id_in_sync_group]
          ...     total = context.all_reduce("SUM", mine)
          ...     return {"a": int(total["a"]), "b": [int(b) for b in total["b"]]}
          >>> strategy.experimental_local_results(strategy.run(step))
          ({'a': 4, 'b': [42, 99]}, {'a': 4, 'b': [42, 99]})
        """
        op = ReduceOp.parse(reduce_op)
        combine = functools.partial(self.strategy._replica_all_reduce, op)
        return self._collective(Collective("all_reduce", op, value, combine, reduces=True))

    def all_gather(self, value: Any, axis: int, options: Any = None) -> Any:
        """Every replica's ``value`` (a tensor or a nested structure of them) concatenated along
        ``axis``, in replica order; the same on every replica, on its own device. ``options``
        (a ``CommunicationOptions``) is accepted as TensorFlow's; the strategy's own apply."""
        combine = functools.partial(self.strategy._replica_all_gather, axis)
        return self._collective(Collective("all_gather", axis, value, combine))

    def merge_call(
        self, merge_fn: Callable[..., Any], args: Any = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        """Calls ``merge_fn(strategy, *args, **kwargs)`` once for all local replicas, in the
        cross-replica context; each replica gets the result (its own component where the
        result holds ``PerReplica`` values).

        Each argument is the replicas' values as a ``PerReplica``, or the value itself where
        every replica passed the same object. Replica 0's ``merge_fn`` is called; the others
        must pass the same function (or closures of the same code).

        Example:
          >>> import torch, feedline.distribute as fdist
          >>> strategy = fdist.MirroredStrategy(["cpu:0", "cpu:1"])
          >>> def step():
          ...     context = fdist.get_replica_context()
          ...     mine = torch.tensor(float(context.replica_id_in_sync_group + 1))
          ...     return context.merge_call(lambda s, v: float(s.reduce("SUM", v)), args=(mine,))
          >>> strategy.run(step)  # every replica got the one result: run returns it as it is
          3.0
        """
        strategy = self.strategy

        def combine(values: list[Any]) -> list[Any]:
            merged_args = _merge_values([v[0] for v in values], "args")
            merged_kwargs = _merge_values([v[1] for v in values], "kwargs")
            with cross_replica_scope(strategy):
                result = merge_fn(strategy, *merged_args, **merged_kwargs)
            return [select_replica(result, local) for local in range(len(values))]

        key = getattr(merge_fn, "__code__", merge_fn)
        call_args = (tuple(args), dict(kwargs or {}))
        return self._collective(Collective("merge_call", key, call_args, combine))

    def _collective(self, request: Collective) -> Any:
        if self._group is None:
            local = len(self.strategy.extended.local_devices)
            if local != 1:
                raise FailedPreconditionError(
                    f"ReplicaContext.{request.name} combines the values of this worker's "
                    f"{local} replicas, so it must be called inside the function passed to "
                    "strategy.run, from the ReplicaContext that get_replica_context() returns there"
                )
            return request.combine([request.value])[0]
        return self._group.collective(self.local_replica_id, request)


def _merge_values(values: list[Any], what: str) -> Any:
    """The replicas' ``values`` (one structure each) as one structure whose leaves are the
    leaf itself where every replica passed the same object, else a ``PerReplica``."""
    if len(values) == 1:
        return values[0]
    try:
        return optree.tree_map(
            lambda *vs: vs[0] if all(v is vs[0] for v in vs) else PerReplica(vs),
            *values,
            none_is_leaf=True,
        )
    except ValueError as error:
        raise InvalidArgumentError(
            f"merge_call: the replicas passed {what} of different structures ({error}); pass "
            "the same structure from every replica"
        ) from None


_default_strategy: Callable[[], Strategy] | None = None


def set_default_strategy(factory: Callable[[], Strategy]) -> None:
    """Registers the default strategy (``strategy`` does, on import): this module stays below
    the strategies instead of importing them back."""
    global _default_strategy
    _default_strategy = factory


def get_strategy() -> Strategy:
    """The strategy in scope, or the default strategy."""
    strategy = _strategy.get()
    if strategy is None:
        if _default_strategy is None:
            raise FailedPreconditionError(
                "no default strategy: import feedline.distribute, not its context module alone"
            )
        return _default_strategy()
    return strategy


def strategy_in_scope() -> Strategy | None:
    """The strategy whose scope (or ``run``) the code is in; None outside every scope."""
    return _strategy.get()


def has_strategy() -> bool:
    """Whether a strategy other than the default is in scope."""
    return _strategy.get() is not None


def get_replica_context() -> ReplicaContext | None:
    """The replica context, or None in the cross-replica context of a strategy's scope."""
    replica = _replica.get()
    if replica is not None:
        return replica
    if _strategy.get() is not None:
        return None
    return ReplicaContext(get_strategy(), 0)


def current_replica() -> ReplicaContext | None:
    """The replica context of ``strategy.run``, or None outside it (even for the default
    strategy)."""
    return _replica.get()


def in_cross_replica_context() -> bool:
    """Whether the code runs in a strategy's scope but outside ``strategy.run``."""
    return _strategy.get() is not None and _replica.get() is None


@contextmanager
def strategy_scope(strategy: Strategy) -> Iterator[Strategy]:
    current = _strategy.get()
    if current is not None and current is not strategy:
        raise InvalidArgumentError(
            f"a {type(strategy).__name__} scope cannot be entered inside the scope of another "
            f"strategy ({type(current).__name__}); leave that scope first"
        )
    token = _strategy.set(strategy)
    try:
        yield strategy
    finally:
        _strategy.reset(token)


@contextmanager
def cross_replica_scope(strategy: Strategy) -> Iterator[Strategy]:
    """The cross-replica context of ``strategy`` (where ``merge_call`` runs its function)."""
    strategy_token = _strategy.set(strategy)
    replica_token = _replica.set(None)
    try:
        yield strategy
    finally:
        _replica.reset(replica_token)
        _strategy.reset(strategy_token)


@contextmanager
def replica_scope(
    strategy: Strategy, replica_id: int, group: ReplicaGroup | None = None
) -> Iterator[ReplicaContext]:
    context = ReplicaContext(strategy, replica_id, group)
    strategy_token = _strategy.set(strategy)
    replica_token = _replica.set(context)
    try:
        yield context
    finally:
        _replica.reset(replica_token)
        _strategy.reset(strategy_token)
