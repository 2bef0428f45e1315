"""``SidecarEvaluator``: evaluates each new checkpoint of a training job as it appears.

TensorFlow's ``tf.keras.utils.SidecarEvaluator`` for PyTorch models. It runs in a process of its
own beside the training cluster (the ``evaluator`` task of ``TF_CONFIG``, which is not part of
the training cluster): ``start()`` watches ``checkpoint_dir``, and each time
``feedline.train.latest_checkpoint`` names a checkpoint it has not evaluated, it restores the
model (and the optimizer, if given) from it and runs an evaluation "epoch": ``steps`` batches of
``data``, or all of it. As in TensorFlow, it always takes the latest checkpoint, so it skips
checkpoints that training wrote while it was evaluating.

Training saves checkpoints as it would anyway, with ``Checkpoint(model=model,
optimizer=optimizer)`` and a ``CheckpointManager`` (``ckpt-1``, ``ckpt-2``, ...). The evaluator
stops:

- after it evaluates a checkpoint whose number is ``max_evaluations`` or more (TensorFlow's rule:
  with one checkpoint an epoch, ``max_evaluations`` is the number of epochs);
- when no new checkpoint appears for ``timeout`` seconds (TensorFlow waits for ever; pass
  ``timeout=None`` for that);
- when another thread calls ``stop()``.

Each evaluation resets the metrics, evaluates with the model in ``eval()`` mode under
``torch.no_grad()``, logs ``evaluated ckpt-2 on 4 batches: mae=0.5`` on the logger
``feedline.train.sidecar_evaluator`` and hands an ``Evaluation`` to each callback; ``start()``
returns them all.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import optree
import torch

from feedline import _fs
from feedline.errors import InvalidArgumentError
from feedline.metrics.base import Metric
from feedline.train._checkpoint_files import basename, file_version
from feedline.train.checkpoint import Checkpoint
from feedline.train.checkpoint_management import PathLike, latest_checkpoint

__all__ = ["Evaluation", "SidecarEvaluator"]

logger = logging.getLogger(__name__)

_NUMBERED = re.compile(r".+-(\d+)")


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One evaluation of one checkpoint.

    Attributes:
      checkpoint: the checkpoint's path.
      number: the number that ends its name (``ckpt-3`` is 3), or None if it has none.
      metrics: each metric's ``result()`` by name, as floats.
      steps: the batches evaluated.
    """

    checkpoint: str
    number: int | None
    metrics: dict[str, float]
    steps: int


class SidecarEvaluator:
    """Evaluates each new checkpoint in ``checkpoint_dir`` (``tf.keras.utils.SidecarEvaluator``).

    By default a batch of ``data`` is ``(x, y)`` or ``(x, y, sample_weight)``: the evaluator calls
    ``model(x)`` and ``metric.update_state(y, prediction[, sample_weight])`` for each metric (the
    form of ``feedline.metrics`` that compare labels and predictions, such as
    ``SparseCategoricalAccuracy`` or ``MeanMetricWrapper``). For other batches or metrics, give
    ``eval_step(batch)``, which runs the model and updates the metrics itself. NumPy arrays in a
    batch become tensors, moved to the device of the model's parameters.

    The API is single-threaded, except ``stop()``, which may be called from any thread.

    Args:
      model: the ``torch.nn.Module`` that training checkpoints, built the same way.
      data: the evaluation data: an iterable of batches (a ``feedline.data.Dataset``, a
        ``DataLoader``, a list), iterated afresh for each evaluation.
      checkpoint_dir: where training saves its checkpoints: a local path or a URL
        (``s3://bucket/run``), looked at every ``poll_interval`` seconds.
      steps: the batches to evaluate per checkpoint, or None for all of ``data`` (then ``data``
        must end: a repeated dataset needs ``steps``).
      max_evaluations: stop after evaluating a checkpoint numbered ``max_evaluations`` or more
        (a checkpoint without a number counts as the number of evaluations so far); None: no
        such limit.
      metrics: a ``feedline.metrics.Metric``, a sequence of them or a dict by name.
      optimizer: restored from each checkpoint too, when given (as TensorFlow restores the
        optimizer's iteration count).
      checkpoint: the ``feedline.train.Checkpoint`` to restore, for a training job that names its
        objects otherwise; by default ``Checkpoint(model=model)`` plus ``optimizer=optimizer``
        when given. Entries of the file that it lacks (an iterator, say) are ignored.
      eval_step: ``eval_step(batch)`` runs one batch in place of the default step.
      callbacks: each is called with every ``Evaluation``, after it is logged.
      poll_interval: seconds between two looks at ``checkpoint_dir``.
      timeout: seconds without a new checkpoint after which ``start()`` returns; None waits
        for ever.
      storage_options: the file system's arguments for ``checkpoint_dir`` (for ``s3://``,
        ``s3fs.S3FileSystem``'s: ``key``, ``secret``, ``client_kwargs``), used to look for and
        restore checkpoints; without them the back-end finds its credentials the standard way.

    Raises:
      InvalidArgumentError: an argument is out of range, or there are no metrics and no
        ``eval_step``.
      TypeError: ``model`` is not a module or a metric is not a ``feedline.metrics.Metric``.

    Example:
      >>> import tempfile, torch
      >>> import feedline.metrics, feedline.train
      >>> model = torch.nn.Linear(1, 1, bias=False)
      >>> directory = tempfile.mkdtemp()
      >>> checkpoint = feedline.train.Checkpoint(model=model)
      >>> manager = feedline.train.CheckpointManager(checkpoint, directory)
      >>> with torch.no_grad():
      ...     _ = model.weight.fill_(2.0)
      >>> _ = manager.save()
      >>> data = [(torch.tensor([[1.0], [2.0]]), torch.tensor([[0.0], [0.0]]))]
      >>> mae = feedline.metrics.MeanMetricWrapper(lambda y, p: (p - y).abs(), name="mae")
      >>> evaluator = SidecarEvaluator(torch.nn.Linear(1, 1, bias=False), data, directory,
      ...                              max_evaluations=1, metrics=[mae])
      >>> evaluator.start()
      [Evaluation(checkpoint='.../ckpt-1', number=1, metrics={'mae': 3.0}, steps=1)]
    """

    def __init__(
        self,
        model: torch.nn.Module,
        data: Iterable[Any],
        checkpoint_dir: PathLike,
        steps: int | None = None,
        max_evaluations: int | None = None,
        *,
        metrics: Metric | Sequence[Metric] | Mapping[str, Metric] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        checkpoint: Checkpoint | None = None,
        eval_step: Callable[[Any], Any] | None = None,
        callbacks: Sequence[Callable[[Evaluation], Any]] = (),
        poll_interval: float = 1.0,
        timeout: float | None = 3600.0,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.data = data
        self.checkpoint_dir = _fs.as_url(checkpoint_dir)
        self.storage_options = _fs.check_storage_options(storage_options, "SidecarEvaluator")
        self.steps = _optional_positive("steps", steps)
        self.max_evaluations = _optional_positive("max_evaluations", max_evaluations)
        self.metrics = _metrics_by_name(metrics)
        if not self.metrics and eval_step is None:
            raise InvalidArgumentError(
                "SidecarEvaluator has nothing to report: give metrics (feedline.metrics "
                "objects) or an eval_step that updates metrics of its own"
            )
        self.optimizer = optimizer
        if checkpoint is None:
            objects: dict[str, Any] = {"model": model}
            if optimizer is not None:
                objects["optimizer"] = optimizer
            checkpoint = Checkpoint(**objects)
        elif not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                f"checkpoint must be a feedline.train.Checkpoint, got {type(checkpoint).__name__}"
            )
        self.checkpoint = checkpoint
        self._eval_step = eval_step
        self.callbacks = list(callbacks)
        if not poll_interval > 0:
            raise InvalidArgumentError(f"poll_interval must be > 0 seconds; got {poll_interval!r}")
        if timeout is not None and not timeout >= 0:
            raise InvalidArgumentError(
                f"timeout must be >= 0 seconds, or None to wait for ever; got {timeout!r}"
            )
        self.poll_interval = float(poll_interval)
        self.timeout = None if timeout is None else float(timeout)
        self._stop = threading.Event()
        self._evaluations: list[Evaluation] = []
        self._seen: tuple[str, Any] | None = None  # (path, version) of the last evaluated

    @property
    def evaluations(self) -> list[Evaluation]:
        """The evaluations made so far, oldest first."""
        return list(self._evaluations)

    def stop(self) -> None:
        """Makes ``start()`` return at its next wait or batch; callable from any thread."""
        self._stop.set()

    def start(self) -> list[Evaluation]:
        """Evaluates each new checkpoint until a stop condition (see the class); returns the
        evaluations of this call, oldest first. A later call goes on with checkpoints newer
        than the last one evaluated.

        Raises:
          InvalidArgumentError: a checkpoint does not fit the model (other parameter names or
            shapes), or a batch is not ``(x, y)`` / ``(x, y, sample_weight)`` and no
            ``eval_step`` was given.
          NotFoundError: a checkpoint has no entry for the model.
        """
        try:
            return self._watch()
        finally:
            self._stop.clear()

    def _watch(self) -> list[Evaluation]:
        made: list[Evaluation] = []
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while not self._stop.is_set():
            with _fs.with_storage_options(self.storage_options):
                path = latest_checkpoint(self.checkpoint_dir)
                key = _file_key(path)
            evaluation = None
            if path is not None and key is not None and key != self._seen:
                # None: the file went away (pruned by training) or stop() came.
                evaluation = self._evaluate_checkpoint(path)
            if evaluation is not None:
                self._seen = key
                made.append(evaluation)
                number = len(made) if evaluation.number is None else evaluation.number
                if self.max_evaluations is not None and number >= self.max_evaluations:
                    logger.info(
                        "%s is checkpoint %d, max_evaluations=%d: SidecarEvaluator stops",
                        path,
                        number,
                        self.max_evaluations,
                    )
                    break
                if self.timeout is not None:
                    deadline = time.monotonic() + self.timeout
                continue
            wait = self.poll_interval
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    logger.info(
                        "no new checkpoint in %s for %.1f s (timeout): SidecarEvaluator stops",
                        self.checkpoint_dir,
                        self.timeout,
                    )
                    break
                wait = min(wait, left)
            self._stop.wait(wait)
        return made

    def _evaluate_checkpoint(self, path: str) -> Evaluation | None:
        """Restores ``path`` and evaluates it; None if the file went away or ``stop()`` came."""
        try:
            with _fs.with_storage_options(self.storage_options):
                status = self.checkpoint.restore(path)
        except FileNotFoundError:  # pruned by the training's CheckpointManager meanwhile
            logger.info("checkpoint %s went away before it was restored; looking again", path)
            return None
        status.expect_partial()
        status.assert_existing_objects_matched()
        match = _NUMBERED.fullmatch(basename(path))
        number = int(match[1]) if match else None
        steps = self._run_evaluation()
        if self._stop.is_set():
            return None
        results = {name: float(metric.result()) for name, metric in self.metrics.items()}
        evaluation = Evaluation(path, number, results, steps)
        self._evaluations.append(evaluation)
        logger.info(
            "evaluated %s on %d batches: %s",
            basename(path),
            steps,
            " ".join(f"{name}={value:.6g}" for name, value in results.items()),
        )
        for callback in self.callbacks:
            callback(evaluation)
        return evaluation

    def _run_evaluation(self) -> int:
        """Resets the metrics and runs up to ``steps`` batches; the number run."""
        for metric in self.metrics.values():
            metric.reset_state()
        device = next((p.device for p in self.model.parameters()), torch.device("cpu"))
        was_training = self.model.training
        self.model.eval()
        count = 0
        try:
            with torch.no_grad():
                for batch in self.data:
                    if self._stop.is_set():
                        break
                    self._run_batch(_to_device(batch, device))
                    count += 1
                    if self.steps is not None and count >= self.steps:
                        break
        finally:
            self.model.train(was_training)
        if self.steps is not None and count < self.steps and not self._stop.is_set():
            logger.warning(
                "the evaluation data ran out after %d of steps=%d batches; evaluated those",
                count,
                self.steps,
            )
        return count

    def _run_batch(self, batch: Any) -> None:
        if self._eval_step is not None:
            self._eval_step(batch)
            return
        if not isinstance(batch, tuple | list) or len(batch) not in (2, 3):
            raise InvalidArgumentError(
                f"SidecarEvaluator's default step takes batches (x, y) or (x, y, sample_weight); "
                f"got a {type(batch).__name__}"
                + (f" of {len(batch)} parts" if isinstance(batch, tuple | list) else "")
                + ": give eval_step(batch) to evaluate other batches"
            )
        x, y, *weight = batch
        prediction = self.model(x)
        for metric in self.metrics.values():
            metric.update_state(y, prediction, *weight)


def _optional_positive(name: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive int or None; got {value!r}")
    return int(value)


def _metrics_by_name(
    metrics: Metric | Sequence[Metric] | Mapping[str, Metric] | None,
) -> dict[str, Metric]:
    if metrics is None:
        return {}
    if isinstance(metrics, Metric):
        metrics = [metrics]
    if isinstance(metrics, Mapping):
        named = dict(metrics)
    else:
        named = {}
        for metric in metrics:
            name: Any = getattr(metric, "name", None)  # any object until checked below
            if name in named:
                raise InvalidArgumentError(
                    f"two metrics are named {name!r}; give them distinct names, or pass a dict "
                    f"of metrics by name"
                )
            named[name] = metric
    for name, metric in named.items():
        if not isinstance(metric, Metric):
            raise TypeError(
                f"metric {name!r} is a {type(metric).__name__}, not a feedline.metrics.Metric"
            )
    return named


def _file_key(path: str | None) -> tuple[str, Any] | None:
    """``(path, version)`` (its modification time, or its ETag on a store): a checkpoint
    rewritten at the same path is new again."""
    if path is None:
        return None
    version = file_version(path)
    return None if version is None else (path, version)


def _to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with NumPy arrays as tensors and every tensor on ``device``."""

    def convert(leaf: Any) -> Any:
        if isinstance(leaf, np.ndarray | np.generic) and leaf.dtype.kind not in "USO":
            leaf = torch.as_tensor(np.asarray(leaf))
        if isinstance(leaf, torch.Tensor) and leaf.device != device:
            leaf = leaf.to(device)
        return leaf

    return optree.tree_map(convert, batch, none_is_leaf=True)
