"""``PreemptionCheckpointHandler``: save at one agreed step when a worker is told to stop.

``tf.distribute.experimental.PreemptionCheckpointHandler`` for PyTorch training loops, at that
path as ``feedline.distribute.experimental.PreemptionCheckpointHandler`` (resolved on first
access, so that ``feedline.distribute`` does not import ``feedline.train``). It lives with the
checkpoints it saves, a floor above ``feedline.distribute``. Made on
every worker, it restores the latest checkpoint of its directory (``total_run_calls`` with it)
and watches for SIGTERM, the notice that platforms give before they stop a process. Each
``run(fn, ...)`` runs one training step and then learns whether any worker got the notice;
when one did, every worker saves at that same step (the chief writes, the others leave nothing)
and exits with ``exit_fn``: exit code 42 by default, for the platform to restart the job. The
notices are all-reduced once a step (two integers), in the background: the all-reduce started
after step k is waited for after step k + 1, so no step waits for it, and every worker acts on
a notice at the same step, one or two steps after it came. The loop of TensorFlow's guide
ports as written::

    handler = PreemptionCheckpointHandler(strategy.cluster_resolver, checkpoint, "/shared/ckpt")
    for step in range(handler.total_run_calls, STEPS):
        handler.run(train_step, next(iterator))

The check comes after the step, so the step whose batch ``next(iterator)`` took is in the
checkpoint: with the iterator in the checkpoint, a restarted run sees exactly the batches the
uninterrupted one would have, and ends with the same parameters, bit for bit on CPU.

``TerminationConfig`` adapts it to a platform: ``termination_watcher_fn`` (polled every second
instead of watching SIGTERM), ``exit_fn``, ``grace_period`` (seconds between the notice and the
kill: the workers save at once, go on training, and save and exit when the grace period, less
twice the time the first save took, has run out) and ``save_fn`` (called instead of saving the
checkpoint).
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from feedline.data.dataset import DatasetIterator
from feedline.distribute import cluster_resolver as resolvers
from feedline.distribute import elastic as _elastic
from feedline.distribute.distributed_dataset import DistributedIterator
from feedline.errors import FailedPreconditionError, InvalidArgumentError
from feedline.train import _cluster
from feedline.train._run_checkpoint import RunCheckpoint
from feedline.train.checkpoint import Checkpoint
from feedline.train.checkpoint_management import CheckpointManager, PathLike

RESTART_EXIT_CODE = 42
"""The exit code of a worker that saved after a preemption notice (TensorFlow's): configure the
platform to restart the job on it (``torchrun --max-restarts``, a Kubernetes pod failure policy)."""

_POLL_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class TerminationConfig:
    """How a ``PreemptionCheckpointHandler`` learns of and reacts to a termination notice.

    Args:
      termination_watcher_fn: a cheap, non-blocking function that returns True once a notice
        has come; polled every second. None watches SIGTERM.
      exit_fn: called after the checkpoint is saved; None exits with code 42.
      grace_period: seconds from the notice to the kill; None or 0 saves and exits at once.
      save_fn: called instead of saving the checkpoint; None saves it.
    """

    termination_watcher_fn: Callable[[], bool] | None = None
    exit_fn: Callable[[], Any] | None = None
    grace_period: float | None = None
    save_fn: Callable[[], Any] | None = None

    def __post_init__(self) -> None:
        for name in ("termination_watcher_fn", "exit_fn", "save_fn"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise InvalidArgumentError(f"{name} must be callable or None, got {value!r}")
        grace = self.grace_period
        if grace is not None and (isinstance(grace, bool) or not grace >= 0):
            raise InvalidArgumentError(
                f"grace_period must be a number of seconds >= 0 or None, got {grace!r}"
            )


class PreemptionCheckpointHandler:
    """Saves every worker's state at one agreed step when any worker gets a termination notice.

    Args:
      cluster_resolver: the cluster's resolver (``strategy.cluster_resolver``); its strategy
        must exist already when it names several workers.
      checkpoint_or_checkpoint_manager: a ``feedline.train.Checkpoint`` (saved in
        ``checkpoint_dir``, the latest file kept) or a ``CheckpointManager``.
      checkpoint_dir: the directory for a ``Checkpoint``; every worker must see it. Keep other
        checkpoints (for evaluation, say) elsewhere.
      termination_config: a ``TerminationConfig``.
      storage_options: the file system's arguments for ``checkpoint_dir`` (a
        ``CheckpointManager`` takes its own), as ``BackupAndRestore`` takes them.

    Raises:
      FailedPreconditionError: the resolver names several workers but this process has not
        joined them (make the ``MultiWorkerMirroredStrategy`` first), a worker cannot see
        ``checkpoint_dir``, or SIGTERM is to be watched from a thread other than the main one.
    """

    def __init__(
        self,
        cluster_resolver: resolvers.ClusterResolver,
        checkpoint_or_checkpoint_manager: Checkpoint | CheckpointManager,
        checkpoint_dir: PathLike | None = None,
        termination_config: TerminationConfig | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._cluster_resolver = cluster_resolver
        _check_cluster(cluster_resolver)
        config = termination_config or TerminationConfig()
        if not isinstance(config, TerminationConfig):
            raise TypeError(
                f"termination_config must be a TerminationConfig, got {type(config).__name__}"
            )
        self._config = config
        self._exit_fn = config.exit_fn or self._exit_for_restart
        self._grace = float(config.grace_period or 0)
        self._state = RunCheckpoint(
            checkpoint_or_checkpoint_manager,
            checkpoint_dir,
            argument="checkpoint_dir",
            owner="PreemptionCheckpointHandler",
            storage_options=storage_options,
        )
        self._noticed = threading.Event()
        self._deadline: float | None = None
        self._agreement_generation = self._generation()
        self._agreement = self._new_agreement()
        self._stop_polling = threading.Event()
        self._poller: threading.Thread | None = None
        if config.termination_watcher_fn is not None:
            self._poller = threading.Thread(
                target=self._poll,
                args=(config.termination_watcher_fn,),
                name=f"feedline-termination-watcher-{self._state.cluster.rank}",
                daemon=True,
            )
            self._poller.start()
        else:
            self._watch_sigterm()

    @property
    def total_run_calls(self) -> int:
        """The ``run`` calls made so far, those of runs before a restart included."""
        return self._state.total_run_calls

    def run(self, distributed_train_function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Runs one training step, then saves and exits if any worker got a notice.

        Every worker calls ``run`` once per step; ``distributed_train_function`` is one step
        (a function that calls ``strategy.run``), and its result is returned.
        """
        result = self._state.run(distributed_train_function, args, kwargs)
        if self._generation() != self._agreement_generation:
            # the group re-formed: the old group's all-reduces are gone
            self._agreement_generation = self._generation()
            self._agreement = self._new_agreement()
        self._after_step()
        return result

    def _generation(self) -> int:
        elastic = _elastic.active()
        return 0 if elastic is None else elastic.generation.number

    def _new_agreement(self) -> _cluster.StepAgreement:
        return self._state.cluster.any_each_step(
            _Flags(self._noticed, self), 2, "the preemption agreement"
        )

    @contextlib.contextmanager
    def watch_preemption_scope(self) -> Iterator[None]:
        """Wraps the training loop: an exception raised on this worker inside it is left where
        the other workers' errors will name it (they fail as soon as their next collective
        finds this worker gone), then raised."""
        try:
            yield
        except Exception as error:
            self._state.cluster.report_error(f"{type(error).__name__}: {error}")
            raise

    # -- the notice --------------------------------------------------------------------------
    def _watch_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise FailedPreconditionError(
                "PreemptionCheckpointHandler watches SIGTERM, which only the main thread can "
                "do: make it in the main thread, or pass "
                "TerminationConfig(termination_watcher_fn=...)"
            )
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._noticed.set()

    def _poll(self, watcher: Callable[[], bool]) -> None:
        while not self._stop_polling.wait(_POLL_SECONDS):
            if watcher():
                self._noticed.set()
                return

    def _after_step(self) -> None:
        noticed, deadline_passed = self._agreement()
        if not noticed:
            return
        if self._grace > 0 and self._deadline is None:
            started = time.monotonic()
            self._agreement.settle()
            self._save()
            self._deadline = started + self._grace - 2 * (time.monotonic() - started)
            return
        if self._grace > 0 and not deadline_passed:
            return
        self._agreement.settle()
        self._save()
        self._stop_polling.set()
        self._exit_fn()

    def _save(self) -> None:
        if self._config.save_fn is not None:
            self._config.save_fn()
        else:
            self._state.save()

    def _exit_for_restart(self) -> None:
        """The default ``exit_fn``: stops the checkpoint's input pipelines, whose threads must
        not be running while the interpreter shuts down, and exits with code 42."""
        for iterator in _iterators(self._state.checkpoint):
            iterator.close()
        sys.exit(RESTART_EXIT_CODE)


def _iterators(checkpoint: Checkpoint) -> list[Any]:
    """The feedline iterators that ``checkpoint`` (and its nested checkpoints) hold."""
    found: list[Any] = []
    for obj in checkpoint._objects.values():
        if isinstance(obj, Checkpoint):
            found.extend(_iterators(obj))
        elif isinstance(obj, DatasetIterator | DistributedIterator):
            found.append(obj)
    return found


class _Flags:
    """This worker's preemption flags: a notice came; the grace period is over. The collective
    keeps this small object (not the handler, nor its checkpoint) for as long as it lives."""

    def __init__(self, noticed: threading.Event, handler: PreemptionCheckpointHandler) -> None:
        self._noticed = noticed
        self._handler = weakref.ref(handler)

    def __call__(self) -> tuple[bool, bool]:
        handler = self._handler()
        deadline = None if handler is None else handler._deadline
        return self._noticed.is_set(), deadline is not None and time.monotonic() >= deadline


def _check_cluster(resolver: resolvers.ClusterResolver) -> None:
    """Refuses a resolver whose cluster this process has not joined."""
    if not isinstance(resolver, resolvers.ClusterResolver):
        raise TypeError(
            f"cluster_resolver must be a feedline.distribute.cluster_resolver.ClusterResolver "
            f"(strategy.cluster_resolver), got {type(resolver).__name__}"
        )
    group = resolvers.sync_group(resolver)
    cluster = _cluster.current()
    if group.world_size > 1 and cluster.world_size == 1:
        raise FailedPreconditionError(
            f"the cluster resolver names {group.world_size} workers, but this process has not "
            "joined them: make the MultiWorkerMirroredStrategy(cluster_resolver) before the "
            "PreemptionCheckpointHandler"
        )
    if (group.world_size, group.rank) != (cluster.world_size, cluster.rank):
        raise InvalidArgumentError(
            f"the cluster resolver names worker {group.rank} of {group.world_size}, but this "
            f"process is worker {cluster.rank} of {cluster.world_size}: pass the resolver of "
            "the strategy in use (strategy.cluster_resolver)"
        )
