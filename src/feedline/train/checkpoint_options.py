"""``CheckpointOptions``: TensorFlow's ``tf.train.CheckpointOptions``, for the ``options=`` of
``Checkpoint.save``, ``write``, ``restore`` and ``read`` and ``CheckpointManager.save``.

feedline writes one file per checkpoint from the host, synchronously, so the options that place
TensorFlow's I/O on a device, shard its variables or run its saves in the background are
accepted and change nothing (``sync()`` returns at once). ``experimental_write_callbacks`` run
as TensorFlow runs them: in order, once a ``save`` or ``write`` has written its file, each
given the path when it takes an argument.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["CheckpointOptions", "run_write_callbacks"]


@dataclasses.dataclass
class CheckpointOptions:
    """Options of a checkpoint's save or restore (``tf.train.CheckpointOptions``).

    Example:
      >>> written = []
      >>> options = CheckpointOptions(experimental_write_callbacks=[written.append])
      >>> run_write_callbacks(options, "/tmp/run/ckpt-1")
      >>> written
      ['/tmp/run/ckpt-1']
    """

    experimental_io_device: str | None = None
    experimental_enable_async_checkpoint: bool = False
    experimental_write_callbacks: Sequence[Callable[..., Any]] | None = None
    enable_async: bool = False
    experimental_sharding_callback: Any = None
    experimental_skip_slot_variables: bool = False

    def __post_init__(self) -> None:
        callbacks = self.experimental_write_callbacks or ()
        for callback in callbacks:
            if not callable(callback):
                raise TypeError(
                    f"experimental_write_callbacks holds {callback!r}, which is not callable"
                )


def run_write_callbacks(options: CheckpointOptions | None, path: str) -> None:
    """Calls ``options``' write callbacks in order, with ``path`` where one takes an argument
    (the caller checked ``options`` with ``check_options`` before it wrote)."""
    if options is None:
        return
    for callback in options.experimental_write_callbacks or ():
        try:
            takes_path = bool(inspect.signature(callback).parameters)
        except (TypeError, ValueError):  # a builtin without a signature: give it the path
            takes_path = True
        if takes_path:
            callback(path)
        else:
            callback()


def check_options(options: Any) -> None:
    """TypeError unless ``options`` is a ``CheckpointOptions`` or None."""
    if options is not None and not isinstance(options, CheckpointOptions):
        raise TypeError(
            f"options must be a feedline.train.CheckpointOptions or None, got "
            f"{type(options).__name__}"
        )
