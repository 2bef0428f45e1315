"""``ParameterServerStrategy``: parameters on ``ps`` tasks, asynchronous workers.

One strategy, two ways to train (both on the parameter-server core of this package):

=================  ================================================================================
between-graph      the seed page's form (``tf.compat.v1.distribute.experimental``): every ``worker``
(``task_type ==    process runs the same program; each step, ``strategy.run`` computes one update
"worker"``)        over the worker's replicas and pushes it; workers do not wait for each other
coordinator        TensorFlow 2's form: the ``chief`` (or a process without a task) makes the model
(``"chief"`` or    and a ``ClusterCoordinator``, which runs scheduled functions on the ``worker``
no task)           tasks (``feedline server``); workers and ps only serve
=================  ================================================================================

Parameters of modules made under ``scope()`` live on the ``ps`` tasks (``variables``); optimizers
over them keep their state there (``optimizer``). ``num_replicas_in_sync`` is the replicas of one
worker (one here): the group that computes one update together.

Example (between-graph; ``TF_CONFIG`` names 2 workers and 1 ps, the ps runs ``feedline server``)::

    strategy = ParameterServerStrategy()
    with strategy.scope():
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    def step(x, y):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()          # pushed to the ps; applied there
    for x, y in batches:
        strategy.run(step, args=(x, y))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from feedline.distribute import cluster_resolver as resolvers
from feedline.distribute._devices import ReplicaDevice
from feedline.distribute.parameter_server import executor, variables
from feedline.distribute.parameter_server.runtime import Cluster
from feedline.distribute.strategy import RunOptions, Strategy, StrategyExtended
from feedline.errors import InvalidArgumentError

__all__ = ["ParameterServerStrategy"]


class _Extended(StrategyExtended):
    def __init__(self, num_workers: int, worker_index: int, is_chief: bool) -> None:
        super().__init__((ReplicaDevice("cpu", 0),), num_workers, worker_index)
        self._is_chief = is_chief

    @property
    def is_chief(self) -> bool:
        """The chief (coordinator form), else worker 0 (between-graph form)."""
        return self._is_chief

    @property
    def should_init(self) -> bool:
        """Whether this process's initial values may create the variables: every worker's
        may, and the first to arrive wins (the others pull them)."""
        return True


class ParameterServerStrategy(Strategy):
    """Trains with parameters held on parameter servers (``tf.distribute.ParameterServerStrategy``).

    Args:
      cluster_resolver: where the cluster is described; None reads ``TF_CONFIG``. The cluster
        needs ``ps`` tasks; this process is a ``worker`` (between-graph form), the ``chief``
        or no task (coordinator form).
      variable_partitioner: splits large parameters by rows over the ps tasks, e.g.
        ``feedline.distribute.experimental.partitioners.MinSizePartitioner()``; None keeps each
        whole (round-robin over the ps tasks).
      connect_timeout: seconds to wait for a ps task that has not answered yet.
      allow_nonfinite: apply gradients that hold a NaN or an infinity. By default a push with
        one is refused whole (``optimizer.step()`` raises ``InvalidArgumentError`` naming the
        variable; no ps applies any of that step) and counted by the ps
        (``Server.metrics()["pushes_refused_nonfinite"]``), since one such gradient would make
        a variable non-finite for every worker.

    Raises:
      InvalidArgumentError: the cluster has no ps tasks, or this process's task is one the
        strategy cannot play (``ps``: run ``feedline server``; ``evaluator``).
    """

    #: The strategy's ``ClusterCoordinator`` once one is made (one per strategy).
    _cluster_coordinator: Any = None

    def __init__(
        self,
        cluster_resolver: resolvers.ClusterResolver | None = None,
        variable_partitioner: Callable[..., Any] | None = None,
        *,
        connect_timeout: float = 60.0,
        allow_nonfinite: bool = False,
    ) -> None:
        if not isinstance(allow_nonfinite, bool):
            raise InvalidArgumentError(f"allow_nonfinite must be a bool, got {allow_nonfinite!r}")
        self._resolver = resolvers.resolve(cluster_resolver)
        spec = self._resolver.cluster_spec()
        if "ps" not in spec.jobs or not spec.num_tasks("ps"):
            raise InvalidArgumentError(
                f"ParameterServerStrategy needs 'ps' tasks in the cluster, which has jobs "
                f"{spec.jobs or 'none'} (TF_CONFIG or the cluster resolver): add "
                "'ps': ['host:port', ...] and run `feedline server` on each, or use "
                "MultiWorkerMirroredStrategy for synchronous training without ps"
            )
        task_type, task_id = self._resolver.task_type, self._resolver.task_id
        if task_type not in (None, "", "chief", "worker"):
            hint = (
                "a ps task runs feedline.distribute.Server (or `feedline server`), not a strategy"
                if task_type == "ps"
                else "an evaluator evaluates checkpoints (feedline.train.SidecarEvaluator)"
            )
            raise InvalidArgumentError(
                f"ParameterServerStrategy runs on a worker or the chief, not on task "
                f"{task_type}:{task_id}; {hint}"
            )
        if connect_timeout <= 0:
            raise InvalidArgumentError(f"connect_timeout must be > 0, got {connect_timeout!r}")
        workers = spec.num_tasks("worker") if "worker" in spec.jobs else 0
        between_graph = task_type == "worker"
        self._partitioner = variable_partitioner
        self._connect_timeout = float(connect_timeout)
        self._allow_nonfinite = allow_nonfinite
        addresses = tuple(spec.task_address("ps", i) for i in spec.task_indices("ps"))
        self._ps_placer = variables.Placer(
            Cluster(addresses, connect_timeout), variable_partitioner, allow_nonfinite
        )
        variables.install_hooks()
        super().__init__(
            _Extended(
                num_workers=max(workers, 1) if between_graph else 1,
                worker_index=(task_id or 0) if between_graph else 0,
                is_chief=task_type == "chief"
                or not task_type
                or ("chief" not in spec.jobs and task_id == 0),
            )
        )
        self.extended.variable_partitioner = variable_partitioner  # type: ignore[attr-defined]
        self.extended.parameter_devices = tuple(
            f"/job:ps/replica:0/task:{i}" for i in range(len(addresses))
        )

    @property
    def cluster_resolver(self) -> resolvers.ClusterResolver:
        """The cluster: ``task_type``, ``task_id`` and ``cluster_spec()`` of this process."""
        return self._resolver

    @property
    def num_replicas_in_sync(self) -> int:
        """The replicas that compute one update together: this worker's."""
        return self._num_local

    @property
    def mirrors_replicas(self) -> bool:
        return False

    @property
    def _ps_cluster(self) -> Cluster:
        return self._ps_placer.cluster

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict | None = None,
        options: RunOptions | None = None,
    ) -> Any:
        """Calls ``fn`` on this worker's replica as one step: the values it reads are pulled
        fresh, and ``optimizer.step()`` inside pushes its update (no other worker waits)."""
        with variables.step(clear_grads=False):
            return super().run(fn, args, kwargs, options)

    call_for_each_replica = run

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        spec = self._resolver.cluster_spec().as_dict()
        return _on_worker, (repr(sorted(spec.items())), spec, self._partitioner,
                            self._connect_timeout, self._allow_nonfinite)  # fmt: skip

    def __repr__(self) -> str:
        resolver = self._resolver
        return (
            f"<ParameterServerStrategy task {resolver.task_type}:{resolver.task_id}, "
            f"{len(self._ps_cluster.addresses)} ps>"
        )


_strategies: dict[tuple[str, int, bool], ParameterServerStrategy] = {}


def _on_worker(
    key: str,
    spec: dict[str, Any],
    partitioner: Any,
    connect_timeout: float,
    allow_nonfinite: bool = False,
) -> ParameterServerStrategy:
    """The strategy as a coordinator's function sees it on worker ``i``: worker ``i`` of the
    same cluster (so ``distribute_datasets_from_function`` gives it input pipeline ``i``)."""
    worker = executor.current_worker()
    index = worker[0] if worker is not None else 0
    cached = _strategies.get((key, index, allow_nonfinite))
    if cached is None:
        resolver = resolvers.SimpleClusterResolver(
            resolvers.ClusterSpec(spec), task_type="worker", task_id=index
        )
        cached = ParameterServerStrategy(
            resolver,
            partitioner,
            connect_timeout=connect_timeout,
            allow_nonfinite=allow_nonfinite,
        )
        _strategies[(key, index, allow_nonfinite)] = cached
    return cached
