"""``Checkpoint``: saves and restores models, optimizers, iterators and metrics together.

TensorFlow's ``tf.train.Checkpoint``, ``tf.train.CheckpointManager`` and
``tf.train.latest_checkpoint`` for PyTorch objects. A checkpoint is one file that holds a dict
``{"format": "feedline.train.Checkpoint", "version": 2, "save_counter": n, "objects": {name:
state}}``, in the format of ``feedline.train._checkpoint_format``: the pickled dict apart from its
tensors, then each tensor's bytes, each part with a CRC-32C checksum and one for the whole file,
all verified before anything is restored, so that a damaged file is a ``DataLossError`` naming the
file and the damaged tensor, never a value. Files of version 1 (``torch.save`` archives, without
checksums) are still read. ``load_state(path)`` gives the verified dict. Each object's state is
what it gives:

- ``state_dict()``, restored with ``load_state_dict`` (``nn.Module``, ``torch.optim.Optimizer``,
  LR schedulers);
- ``get_state()``, restored with ``set_state`` (``feedline.data`` and ``feedline.distribute``
  iterators, ``feedline.metrics`` metrics, ``torch.Generator``); an object that is a
  ``feedline._checkpointable.Checkpointable`` saves ``checkpoint_state()`` instead (which may
  involve every worker), restores it with ``restore_checkpoint_state(state)`` and says with
  ``check_restorable(state)`` why a saved state cannot be restored, checked before anything
  changes, as distributed iterators and metrics do (a metric made under a multi-worker strategy
  saves its value over every worker);
- a ``torch.Tensor`` (TensorFlow's ``tf.Variable``): its value, copied back in place;
- a nested ``Checkpoint``: a dict of the same form.

``save`` numbers the files ``{prefix}-1``, ``{prefix}-2``, ... and lists the latest in the
directory's text file ``checkpoint``, as TensorFlow does (``model_checkpoint_path`` and
``all_model_checkpoint_paths``, relative to the directory)::

    model_checkpoint_path: "ckpt-3"
    all_model_checkpoint_paths: "ckpt-3"

Every path may be a local path or a URL (``s3://bucket/run/ckpt``, ``gs://...``, ``memory://...``,
``file://...``), through feedline's file-system layer (fsspec; credentials and endpoints come
from the environment, as for feedline's readers). Every file is published whole: locally it is
written to a temporary file in the same directory, flushed and renamed into place; object stores
have no atomic rename: on S3 it is one multipart upload, completed after its last byte, and on
other stores it is uploaded under a hidden temporary key and copied to its name on the server.
The index is written after the checkpoint it names. So a reader never sees a
partial checkpoint, a failed save leaves nothing behind, and a process killed while it writes
(``kill -9``) leaves the previous checkpoint the latest one, whole: at most a hidden
``.ckpt-3.*.tmp`` file (or an unfinished upload, which the store does not show) is left, which
nothing restores.

In a cluster (``MultiWorkerMirroredStrategy`` with several workers) ``save``, ``write`` and
``CheckpointManager.save`` are collectives, as in TensorFlow: every worker calls them, the chief
writes the checkpoint, and every other worker writes to a temporary ``workertemp_<worker>``
folder beside it that is removed at once; every worker returns the chief's path, and every
worker raises if any worker's write failed. A distributed iterator saves every worker's position
(gathered to the chief), so a restored cluster continues every worker's input; where its input
is read whole or sharded by DATA, it also saves the global pipeline's position, which resumes on
any number of workers (``feedline.distribute.DistributedIterator``). Every worker restores from
the same file, so it must be on storage that all of them see.

Checkpoints hold pickles: restoring one runs code that the file names. Restore only checkpoints
from a trusted source. Before unpickling, ``restore`` reads the file's header (or, for version 1,
its first bytes) without running them and refuses files that lack feedline's marker, so
restoring a wrong file (a ``torch.save``'d state dict, another program's pickle) fails with a
clear error rather than running it; the marker is no defence against a file crafted to carry it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import pickletools
import warnings
import zipfile
from collections.abc import Callable, Mapping
from typing import Any

import torch

from feedline import _fs
from feedline._checkpointable import Checkpointable
from feedline.errors import InvalidArgumentError, NotFoundError
from feedline.train import _checkpoint_format, _cluster
from feedline.train._checkpoint_files import (
    PathLike,
    atomic_write,
    dirname,
    highest_number,
    is_dir,
    is_file,
    latest_checkpoint,
    write_index,
)
from feedline.train.checkpoint_options import CheckpointOptions, check_options, run_write_callbacks

__all__ = [
    "Checkpoint",
    "CheckpointLoadStatus",
    "CheckpointMismatchError",
    "latest_checkpoint",
    "load_state",
]

FORMAT = "feedline.train.Checkpoint"
VERSION = _checkpoint_format.VERSION


class Checkpoint:
    """Groups objects to save and restore together (``tf.train.Checkpoint``).

    Each keyword names one object; the object stays readable as an attribute
    (``checkpoint.model``), and assigning a new public attribute adds an object, as in
    TensorFlow. Objects that cannot be saved are refused here, not at the first save. The API
    is single-threaded: save and restore from one thread, with no step running.

    Args:
      root: an object saved under the name ``"root"`` (TensorFlow's ``Checkpoint(model)``).
      **objects: modules, optimizers, LR schedulers, iterators, metrics, tensors and nested
        ``Checkpoint`` objects, by name; lists, tuples and dicts (with str keys) of them are
        nested ``Checkpoint`` objects of their items (``models=[a, b]``: ``models.0``,
        ``models.1``).

    Raises:
      TypeError: an object has no state to save (see the module docstring for what has).
      InvalidArgumentError: a name is private (``_x``) or one of Checkpoint's own attributes.

    Example:
      >>> import os, tempfile, torch
      >>> model = torch.nn.Linear(2, 1)
      >>> checkpoint = Checkpoint(model=model)
      >>> prefix = os.path.join(tempfile.mkdtemp(), "ckpt")
      >>> os.path.basename(checkpoint.save(prefix))
      'ckpt-1'
      >>> fresh = torch.nn.Linear(2, 1)
      >>> Checkpoint(model=fresh).restore(latest_checkpoint(os.path.dirname(prefix)))
      CheckpointLoadStatus(matched=('model',), unmatched_objects=(), unused_entries=())
      >>> torch.equal(fresh.weight, model.weight)
      True
    """

    def __init__(self, root: Any = None, **objects: Any) -> None:
        self._objects: dict[str, Any] = {}
        self._save_counter = 0
        if root is not None:
            objects = {"root": root, **objects}
        for name, obj in objects.items():
            self._track(name, obj)

    def _track(self, name: str, obj: Any) -> None:
        if name.startswith("_") or hasattr(Checkpoint, name):
            raise InvalidArgumentError(
                f"{name!r} cannot name a checkpoint object: names may not start with '_' or be "
                f"an attribute of Checkpoint ({', '.join(_PUBLIC_ATTRIBUTES)}); use another name"
            )
        if isinstance(obj, list | tuple | dict):
            obj = _nested(name, obj)
        if not isinstance(obj, Checkpoint | torch.Tensor) and _accessors(obj) is None:
            raise TypeError(
                f"Checkpoint cannot save {name!r}: a {type(obj).__name__} has neither "
                f"state_dict()/load_state_dict() (modules, optimizers, LR schedulers) nor "
                f"get_state()/set_state() (feedline iterators, metrics) and is not a tensor or "
                f"a Checkpoint"
            )
        deferred = self.__dict__.get("_deferred")
        if deferred and name in deferred:
            self._restore_deferred(name, obj, deferred)
        self._objects[name] = obj

    def _restore_deferred(self, name: str, obj: Any, deferred: dict[str, Any]) -> None:
        """Restores ``obj``, attached under ``name`` after a restore whose file held an entry
        of that name (TensorFlow's delayed restoration)."""
        path, state = deferred[name]
        if isinstance(obj, Checkpoint) != _is_checkpoint_state(state):
            return  # another kind of object: the entry stays unused, as at the restore
        if isinstance(obj, Checkpoint):
            plan: list[tuple[str, Callable[[], None]]] = []
            obj._plan_restore(state, path, name + ".", plan, ([], [], []))
        else:
            _check_compatible(obj, state, name, path, {})
            plan = [(name, functools.partial(_set_state, obj, state))]
        for dotted, apply in plan:
            try:
                apply()
            except Exception as error:
                error.add_note(f"while restoring checkpoint object {dotted!r} from {path}")
                raise
        del deferred[name]

    def __getattr__(self, name: str) -> Any:
        objects = self.__dict__.get("_objects", {})
        if name in objects:
            return objects[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self._track(name, value)

    def __repr__(self) -> str:
        parts = ", ".join(f"{name}={type(obj).__name__}" for name, obj in self._objects.items())
        return f"Checkpoint({parts})"

    @property
    def save_counter(self) -> int:
        """The number of the last checkpoint that ``save`` wrote (0 before any); saved and
        restored with the objects."""
        return self._save_counter

    # -- saving --------------------------------------------------------------------------------
    def save(
        self,
        file_prefix: PathLike,
        options: CheckpointOptions | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> str:
        """Writes ``{file_prefix}-{n}`` and makes it the directory's latest checkpoint.

        ``n`` is one more than both ``save_counter`` and the highest number already on a
        ``{file_prefix}-*`` file, so a new ``Checkpoint`` never overwrites an earlier run's
        files. The index file lists only this checkpoint, as TensorFlow's ``save`` does; use a
        ``CheckpointManager`` to keep and list several. ``file_prefix`` may be a URL
        (``s3://bucket/run/ckpt``); the file appears there only once it is complete.
        ``storage_options`` are the file system's arguments (for ``s3://``,
        ``s3fs.S3FileSystem``'s: ``key``, ``secret``, ``client_kwargs={"endpoint_url": ...}``);
        without them the back-end finds its credentials the standard way (environment, config
        files). ``write``, ``restore`` and ``read`` take them too, and TensorFlow's
        ``options`` (a ``CheckpointOptions``: its write callbacks run once the file is written).

        Returns:
          The path written, ``{file_prefix}-{n}``.
        """
        check_options(options)
        with _storage_scope(storage_options, "Checkpoint.save"):
            path = self._save(_fs.as_url(file_prefix))
        run_write_callbacks(options, path)
        return path

    def _save(self, prefix: str) -> str:
        cluster = _cluster.current()
        number = cluster.decide(
            lambda: max(self._save_counter, highest_number(prefix)) + 1,
            f"numbering checkpoint {prefix} (every worker calls save)",
        )
        path = f"{prefix}-{number}"
        directory = dirname(path)
        self._write(cluster, path, number, lambda: write_index(directory, path, [path]))
        return path

    def write(
        self,
        file_path: PathLike,
        options: CheckpointOptions | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> str:
        """Writes a checkpoint to exactly ``file_path``: no numbering, no index file, and
        ``save_counter`` unchanged. Creates the directory if needed. Returns the path."""
        check_options(options)
        path = _fs.as_url(file_path)
        with _storage_scope(storage_options, "Checkpoint.write"):
            self._write(_cluster.current(), path, None, lambda: None)
        run_write_callbacks(options, path)
        return path

    def sync(self) -> None:
        """Waits for saves in flight: none, as feedline saves synchronously (TensorFlow's
        ``sync`` for asynchronous checkpoints)."""

    def _write(
        self,
        cluster: _cluster.Cluster,
        path: str,
        counter: int | None,
        then: Callable[[], None],
    ) -> None:
        """Writes the objects (with ``save_counter`` set to ``counter``) as ``cluster`` writes:
        the chief to ``path``, then ``then()``; the counter is put back if anything fails."""
        previous = self._save_counter
        if counter is not None:
            self._save_counter = counter
        try:
            state = self._state()
            cluster.write(path, lambda target: self._dump(state, target), then)
        except BaseException:
            self._save_counter = previous
            raise

    def _dump(self, state: dict[str, Any], path: str) -> None:
        try:
            atomic_write(path, lambda file: _checkpoint_format.dump(state, file))
        except Exception as error:
            for name in _unpicklable(state["objects"], self._objects):
                error.add_note(
                    f"the state of checkpoint object {name!r} does not pickle; nothing was "
                    f"written to {path}"
                )
            raise

    def _state(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "save_counter": self._save_counter,
            "objects": {name: _get_state(obj) for name, obj in self._objects.items()},
        }

    # -- restoring -----------------------------------------------------------------------------
    def restore(
        self,
        save_path: PathLike | None,
        options: CheckpointOptions | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> CheckpointLoadStatus:
        """Restores every object that the checkpoint at ``save_path`` holds under its name.

        Objects without an entry in the file, and entries without an object, are left alone
        and reported by the returned status: ``status.assert_consumed()`` raises if there are
        any; ``status.expect_partial()`` silences the warning given otherwise when the status
        is discarded. ``save_path=None`` (``latest_checkpoint`` of an empty directory) restores
        nothing, as in TensorFlow, so that one line both starts and resumes a run. As in
        TensorFlow, an object attached later under the name of an unused entry
        (``checkpoint.model = model`` after the restore) is restored from it then.

        Modules, optimizers and tensors are restored in place, so the values land on the device
        of the object's current parameters whatever device they were saved from (optimizers
        follow their own rules: Adam's ``step`` stays on the CPU). Every module's parameter
        names and shapes are checked before any object changes.

        Checkpoints are pickles (``torch.load(weights_only=False)``) and run code when loaded:
        restore only files from a trusted source. Files without feedline's marker are refused
        before they are unpickled.

        Raises:
          NotFoundError: no file at ``save_path`` (or a directory there).
          InvalidArgumentError: the file is not a feedline checkpoint, is of a newer format, or
            holds a module whose parameter names or shapes differ from the object's.
          DataLossError: the file is damaged (truncated, or a part fails its checksum); it
            names the file and the damaged tensor, and nothing was restored.
        """
        check_options(options)
        if save_path is None:
            return CheckpointLoadStatus(None, (), tuple(self._objects), ())
        return self.read(save_path, storage_options=storage_options)

    def read(
        self,
        save_path: PathLike,
        options: CheckpointOptions | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> CheckpointLoadStatus:
        """Restores from ``save_path`` as ``restore`` does (a path is required)."""
        check_options(options)
        path = _fs.as_url(save_path)
        with _storage_scope(storage_options, "Checkpoint.read"):
            saved = load_state(path)
        plan: list[tuple[str, Callable[[], None]]] = []
        matched: list[str] = []
        unmatched: list[str] = []
        unused: list[str] = []
        self._plan_restore(saved, path, "", plan, (matched, unmatched, unused))
        for name, apply in plan:
            try:
                apply()
            except Exception as error:
                error.add_note(f"while restoring checkpoint object {name!r} from {path}")
                raise
        return CheckpointLoadStatus(path, tuple(matched), tuple(unmatched), tuple(unused))

    def _plan_restore(
        self,
        saved: Mapping[str, Any],
        path: str,
        prefix: str,
        plan: list[tuple[str, Callable[[], None]]],
        report: tuple[list[str], list[str], list[str]],
    ) -> None:
        """Checks ``saved`` against the objects and adds one restoring step per match."""
        matched, unmatched, unused = report
        entries = saved["objects"]
        parameter_names = {
            id(parameter): f"{name}.{parameter_name}"
            for name, obj in self._objects.items()
            if isinstance(obj, torch.nn.Module)
            for parameter_name, parameter in obj.named_parameters()
        }
        for name, obj in self._objects.items():
            dotted = prefix + name
            if name not in entries:
                unmatched.append(dotted)
                continue
            state = entries[name]
            if isinstance(obj, Checkpoint) != _is_checkpoint_state(state):
                saved_as = "a nested Checkpoint" if _is_checkpoint_state(state) else "an object"
                raise InvalidArgumentError(
                    f"cannot restore {dotted!r} ({type(obj).__name__}) from {path}: the "
                    f"checkpoint saved {saved_as} under that name"
                )
            if isinstance(obj, Checkpoint):
                obj._plan_restore(state, path, dotted + ".", plan, report)
                continue
            _check_compatible(obj, state, dotted, path, parameter_names)
            matched.append(dotted)
            plan.append((dotted, functools.partial(_set_state, obj, state)))
        unused.extend(prefix + name for name in entries if name not in self._objects)
        later = {
            name: (path, state) for name, state in entries.items() if name not in self._objects
        }
        plan.append(
            (
                prefix + "(entries for objects attached later)",
                lambda: setattr(self, "_deferred", later),
            )
        )
        counter = int(saved["save_counter"])
        plan.append((prefix + "save_counter", lambda: setattr(self, "_save_counter", counter)))


_PUBLIC_ATTRIBUTES = sorted(name for name in vars(Checkpoint) if not name.startswith("_"))


def _nested(name: str, container: list[Any] | tuple[Any, ...] | dict[Any, Any]) -> Checkpoint:
    """A list, tuple or dict of objects (TensorFlow's nested structures of trackables) as a
    nested ``Checkpoint``: items by their index (``models.0``) or their key."""
    if isinstance(container, dict):
        keys = [key for key in container if not isinstance(key, str)]
        if keys:
            raise TypeError(
                f"Checkpoint cannot save {name!r}: a dict of objects needs str keys, got "
                f"{keys[0]!r}"
            )
        items = dict(container)
    else:
        items = {str(index): value for index, value in enumerate(container)}
    try:
        return Checkpoint(**items)
    except (TypeError, InvalidArgumentError) as error:
        raise type(error)(f"in {name!r}: {error}") from None


class CheckpointMismatchError(NotFoundError, AssertionError):
    """A restore status's assertion failed: a ``NotFoundError`` (what is missing is named) and,
    as TensorFlow raises it, an ``AssertionError``."""


class CheckpointLoadStatus:
    """What ``Checkpoint.restore`` matched (``tf.train.Checkpoint``'s load status).

    Attributes:
      save_path: the file restored from; None for ``restore(None)``.
      matched: the objects restored, by name (``"inner.model"`` inside nested checkpoints).
      unmatched_objects: objects that the file has no entry for, left as they were.
      unused_entries: entries of the file that no object took.
    """

    def __init__(
        self,
        save_path: str | None,
        matched: tuple[str, ...],
        unmatched_objects: tuple[str, ...],
        unused_entries: tuple[str, ...],
    ) -> None:
        self.save_path = save_path
        self.matched = matched
        self.unmatched_objects = unmatched_objects
        self.unused_entries = unused_entries
        self._quiet = save_path is None or not (unmatched_objects or unused_entries)

    def assert_consumed(self) -> CheckpointLoadStatus:
        """Raises ``CheckpointMismatchError`` (an ``AssertionError``) unless every object and
        every entry of the file matched."""
        if self.unmatched_objects or self.unused_entries:
            self._raise(self.unmatched_objects, self.unused_entries)
        return self

    def assert_existing_objects_matched(self) -> CheckpointLoadStatus:
        """Raises ``CheckpointMismatchError`` (an ``AssertionError``) unless every object had
        an entry (extra entries are fine)."""
        if self.unmatched_objects:
            self._raise(self.unmatched_objects, ())
        return self

    def assert_nontrivial_match(self) -> CheckpointLoadStatus:
        """Raises ``CheckpointMismatchError`` (an ``AssertionError``) unless at least one
        object was restored."""
        if not self.matched:
            self._raise(self.unmatched_objects, self.unused_entries)
        return self

    def expect_partial(self) -> CheckpointLoadStatus:
        """Says that a partial match is intended: no warning when the status is discarded."""
        self._quiet = True
        return self

    def _raise(self, objects: tuple[str, ...], entries: tuple[str, ...]) -> None:
        if self.save_path is None:
            problem = "nothing was restored: save_path was None (no checkpoint to restore)"
        else:
            problem = f"checkpoint {self.save_path} did not match"
        details = [f"objects without an entry in the file: {list(objects)}"] if objects else []
        if entries:
            details.append(f"entries of the file without an object: {list(entries)}")
        raise CheckpointMismatchError(
            f"{problem}: {'; '.join(details)}; call expect_partial() if a partial restore is "
            f"intended",
            name=(objects or entries or (None,))[0],
        )

    def __del__(self) -> None:
        if not getattr(self, "_quiet", True):
            warnings.warn(
                f"checkpoint {self.save_path} was restored partially (objects without an "
                f"entry: {list(self.unmatched_objects)}; unused entries: "
                f"{list(self.unused_entries)}); call .expect_partial() on the status of "
                f"restore() if that is intended",
                stacklevel=2,
            )

    def __repr__(self) -> str:
        return (
            f"CheckpointLoadStatus(matched={self.matched}, unmatched_objects="
            f"{self.unmatched_objects}, unused_entries={self.unused_entries})"
        )


def _accessors(obj: Any) -> tuple[str, str] | None:
    """The (get, set) method names through which ``obj`` saves its state, if any."""
    for pair in (("state_dict", "load_state_dict"), ("get_state", "set_state")):
        if all(callable(getattr(obj, method, None)) for method in pair):
            return pair
    return None


def _get_state(obj: Any) -> Any:
    if isinstance(obj, Checkpoint):
        return obj._state()
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, Checkpointable):
        return obj.checkpoint_state()
    getter, _ = _accessors(obj)  # type: ignore[misc]  # checked when tracked
    return getattr(obj, getter)()


def _set_state(obj: Any, state: Any) -> None:
    if isinstance(obj, torch.Tensor):
        with torch.no_grad():
            obj.copy_(state)
        return
    getter, setter = _accessors(obj)  # type: ignore[misc]
    if getter == "get_state" and isinstance(state, torch.Tensor):
        current = obj.get_state()  # metrics: keep the state on the device it is on
        if isinstance(current, torch.Tensor):
            state = state.to(current.device)
    if isinstance(obj, Checkpointable):
        obj.restore_checkpoint_state(state)
    else:
        getattr(obj, setter)(state)


def _check_compatible(
    obj: Any, state: Any, name: str, path: str, parameter_names: Mapping[int, str]
) -> None:
    """Raises before anything is restored if ``state`` cannot fit a module or a tensor."""
    where = f"cannot restore {name!r} ({type(obj).__name__}) from {path}"
    if isinstance(obj, Checkpointable):
        problem = obj.check_restorable(state)
        if problem is not None:
            raise InvalidArgumentError(f"{where}: {problem}")
        return
    if isinstance(obj, torch.optim.Optimizer):
        problem = _optimizer_mismatch(obj, state, parameter_names)
        if problem is not None:
            raise InvalidArgumentError(
                f"{where}: {problem}; build the optimizer over the same parameters, in the same "
                "order and groups, as the saved one"
            )
        return
    if isinstance(obj, torch.Tensor):
        if not isinstance(state, torch.Tensor):
            raise InvalidArgumentError(f"{where}: the checkpoint holds a {type(state).__name__}")
        expected = {"": obj}
        state = {"": state}
    elif isinstance(obj, torch.nn.Module):
        expected = obj.state_dict()
        if not isinstance(state, Mapping):
            raise InvalidArgumentError(f"{where}: the checkpoint holds a {type(state).__name__}")
        missing = [key for key in expected if key not in state]
        extra = [key for key in state if key not in expected]
        if missing or extra:
            raise InvalidArgumentError(
                f"{where}: the module has {missing} that the checkpoint lacks and the checkpoint "
                f"has {extra} that the module lacks; build the module as the saved one was"
            )
    else:
        return
    mismatched = [
        f"{key or 'the tensor'!r} has shape {tuple(state[key].shape)} in the checkpoint and "
        f"{tuple(tensor.shape)} here"
        for key, tensor in expected.items()
        if isinstance(tensor, torch.Tensor)
        and not torch.nn.parameter.is_lazy(tensor)
        and isinstance(state[key], torch.Tensor)
        and state[key].shape != tensor.shape
    ]
    if mismatched:
        raise InvalidArgumentError(
            f"{where}: {'; '.join(mismatched)}; build it with the sizes of the saved one"
        )


def _optimizer_mismatch(
    optimizer: torch.optim.Optimizer, state: Any, parameter_names: Mapping[int, str]
) -> str | None:
    """Where an optimizer's saved state does not fit it: groups, parameter counts, and the
    shapes of per-parameter state (Adam's ``exp_avg``) against the parameters'."""
    if not isinstance(state, Mapping) or not {"state", "param_groups"} <= state.keys():
        return f"the checkpoint holds a {type(state).__name__}, not an optimizer's state_dict"
    saved_groups, groups = state["param_groups"], optimizer.param_groups
    if len(saved_groups) != len(groups):
        return (
            f"the optimizer has {len(groups)} parameter groups and the checkpoint's has "
            f"{len(saved_groups)}"
        )
    index = 0
    for number, (saved, group) in enumerate(zip(saved_groups, groups, strict=True)):
        if len(saved["params"]) != len(group["params"]):
            return (
                f"parameter group {number} has {len(group['params'])} parameters here and "
                f"{len(saved['params'])} in the checkpoint"
            )
        for saved_id, parameter in zip(saved["params"], group["params"], strict=True):
            for key, value in state["state"].get(saved_id, {}).items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.dim() > 0
                    and not torch.nn.parameter.is_lazy(parameter)
                    and value.shape != parameter.shape
                ):
                    label = parameter_names.get(id(parameter))
                    which = f"parameter {index}" + (f" ({label})" if label else "")
                    return (
                        f"{which} has shape {tuple(parameter.shape)} here, but its {key!r} in "
                        f"the checkpoint has shape {tuple(value.shape)}"
                    )
            index += 1
    return None


def _is_checkpoint_state(state: Any) -> bool:
    return isinstance(state, Mapping) and state.get("format") == FORMAT


def _unpicklable(states: Mapping[str, Any], objects: Mapping[str, Any]) -> list[str]:
    """The names (dotted) whose state does not pickle; modules and optimizers are not tried."""
    found: list[str] = []
    for name, obj in objects.items():
        if isinstance(obj, Checkpoint):
            inner = _unpicklable(states[name]["objects"], obj._objects)
            found.extend(f"{name}.{inner_name}" for inner_name in inner)
        elif not isinstance(obj, torch.nn.Module | torch.optim.Optimizer):
            try:
                torch.save(states[name], io.BytesIO())
            except Exception:
                found.append(name)
    return found


# -- files ---------------------------------------------------------------------------------------
_NON_VALUE_OPS = frozenset(
    {"PROTO", "FRAME", "MARK", "EMPTY_DICT", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"}
)


def _storage_scope(
    storage_options: Mapping[str, Any] | None, operation: str
) -> contextlib.AbstractContextManager[None]:
    """A block in which file-system calls use ``storage_options`` (checked)."""
    return _fs.with_storage_options(_fs.check_storage_options(storage_options, operation))


def load_state(save_path: PathLike) -> dict[str, Any]:
    """The dict a checkpoint file holds (``{"format", "version", "save_counter", "objects"}``),
    its checksums verified; what ``Checkpoint.restore`` reads.

    Raises:
      NotFoundError, InvalidArgumentError, DataLossError: as ``Checkpoint.restore``.
    """
    path = _fs.as_url(save_path)
    if not is_file(path):
        if is_dir(path):
            raise NotFoundError(
                f"{path} is a directory, not a checkpoint; restore a checkpoint file in it, for "
                f"example feedline.train.latest_checkpoint({path!r})",
                name=path,
            )
        raise NotFoundError(f"no checkpoint file at {path}", name=path)
    version = _checkpoint_format.read_version(path)
    archive = version is None  # version 1: a torch.save archive, without checksums
    if version is None:
        version = _format_version(path)
    if version > VERSION:
        raise InvalidArgumentError(
            f"{path} is a feedline checkpoint of format version {version}; this feedline reads "
            f"versions up to {VERSION}: upgrade feedline to restore it"
        )
    if archive:
        saved = torch.load(_archive(path), map_location="cpu", weights_only=False)
    else:
        saved = _checkpoint_format.load(path)
    if not _is_checkpoint_state(saved):
        raise InvalidArgumentError(f"{path} is not a feedline checkpoint: it holds no marker")
    return saved


def _format_version(path: str) -> int:
    """The format version in ``path``'s marker, read from the pickle's opcodes without
    running them. Raises InvalidArgumentError if the file has no marker."""
    reason = "it has no feedline checkpoint header and is not an archive written by torch.save"
    values: list[Any] = []
    try:
        with zipfile.ZipFile(_archive(path)) as archive:
            records = [name for name in archive.namelist() if _is_root_pickle(name)]
            if len(records) == 1:
                with archive.open(records[0]) as record:
                    values = _leading_values(record.read(4096), 4)
                reason = "it has no feedline marker (was it written by torch.save directly?)"
    except zipfile.BadZipFile:
        pass
    if len(values) == 4 and values[:3] == ["format", FORMAT, "version"] and type(values[3]) is int:
        return values[3]
    raise InvalidArgumentError(
        f"{path} is not a feedline checkpoint: {reason}; Checkpoint.restore reads files "
        f"written by Checkpoint.save, Checkpoint.write or CheckpointManager.save"
    )


def _archive(path: str) -> str | io.BytesIO:
    """A version-1 file as ``torch.load`` and ``zipfile`` read it: its path where it is local,
    else its bytes, read whole from the store."""
    local = _fs.local_path(path)
    return local if local is not None else io.BytesIO(_fs.read_bytes(path, "restoring"))


def _is_root_pickle(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and parts[1] == "data.pkl"


def _leading_values(head: bytes, count: int) -> list[Any]:
    """The first ``count`` constants (strings, ints) that the pickle ``head`` pushes."""
    values: list[Any] = []
    try:
        for opcode, arg, _ in pickletools.genops(io.BytesIO(head)):
            if opcode.name in _NON_VALUE_OPS:
                continue
            if not isinstance(arg, str | int) or len(values) == count:
                break
            values.append(arg)
    except ValueError:  # not a pickle, or the head ends inside an opcode
        pass
    return values
