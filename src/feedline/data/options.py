"""Dataset options: ``feedline.data.Options``.

As in tf.data, options are plain objects whose fields a user sets one by one
(``options.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA``); every assignment
is validated at once. A field left at ``None`` is *unset* and takes its default where it is used.

Merge rule (the only one): ``a.merge(b)`` starts from ``a`` and copies every field that is set in
``b``, so the later options win field by field and unset fields never erase set ones. A dataset's
``options()`` merges its inputs' options in input order, then its own ``with_options`` calls in
the order they were made.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from typing import Any

from feedline._enums import parse_member
from feedline.errors import InvalidArgumentError

__all__ = [
    "AutoShardPolicy",
    "AutotuneOptions",
    "DistributeOptions",
    "Options",
    "ThreadingOptions",
]


class AutoShardPolicy(enum.IntEnum):
    """How a distributed dataset is split across workers.

    AUTO: by files where a file reader is found upstream, else by data.
    FILE: every worker reads its share of the input files.
    DATA: every worker reads everything and keeps its share of the elements.
    OFF: no sharding; every worker sees the whole dataset.
    HINT: ``shard(SHARD_HINT, SHARD_HINT)`` calls are replaced by the worker count and index.
    """

    OFF = -1
    AUTO = 0
    FILE = 1
    DATA = 2
    HINT = 3


class _OptionGroup:
    """Validates every assignment; ``None`` means unset."""

    _validators: dict[str, Any] = {}

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(getattr(type(self), name, None), property):
            object.__setattr__(self, name, value)
            return
        if name not in {f.name for f in dataclasses.fields(self)}:  # type: ignore[arg-type]
            raise AttributeError(f"{type(self).__name__} has no option {name!r}")
        if value is not None:
            value = self._validate(name, value)
        object.__setattr__(self, name, value)

    def _validate(self, name: str, value: Any) -> Any:
        return value

    def _merge(self, other: _OptionGroup) -> None:
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            theirs = getattr(other, field.name)
            if isinstance(theirs, _OptionGroup):
                getattr(self, field.name)._merge(theirs)
            elif theirs is not None:
                object.__setattr__(self, field.name, theirs)


def _positive_int(owner: str, name: str, value: Any, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        lowest = 0 if allow_zero else 1
        raise InvalidArgumentError(f"{owner}.{name} must be an int >= {lowest}, got {value!r}")
    return value


@dataclasses.dataclass(eq=True)
class AutotuneOptions(_OptionGroup):
    """Autotuning of ``AUTOTUNE`` parallelism and buffer sizes.

    Attributes:
      enabled: tune at run time (default True); when False, AUTOTUNE means the number of cores.
      ram_budget: bytes that autotuned buffers may hold in total (default: half of the memory).
      cpu_budget: the most threads an autotuned operation may use (default: the number of cores).
    """

    enabled: bool | None = None
    ram_budget: int | None = None
    cpu_budget: int | None = None

    def _validate(self, name: str, value: Any) -> Any:
        if name == "enabled":
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"autotune.enabled must be a bool, got {value!r}")
            return value
        return _positive_int("autotune", name, value)


@dataclasses.dataclass(eq=True)
class ThreadingOptions(_OptionGroup):
    """Threads of a pipeline.

    Attributes:
      private_threadpool_size: the most threads that the pipeline's parallel operations start.
      max_intra_op_parallelism: accepted for compatibility; NumPy decides its own threading.
    """

    private_threadpool_size: int | None = None
    max_intra_op_parallelism: int | None = None

    def _validate(self, name: str, value: Any) -> Any:
        return _positive_int("threading", name, value)


@dataclasses.dataclass(eq=True)
class DistributeOptions(_OptionGroup):
    """How a dataset is distributed.

    Attributes:
      auto_shard_policy: an ``AutoShardPolicy`` (default AUTO), or its name (``"DATA"``).
      num_devices: the number of devices the dataset is fed to, where known.
      service_timeout_ms: how long a data service consumer (an iterator of a dataset made by
        ``feedline.service.distribute``) waits for an unreachable dispatcher, or for a job that
        no worker serves, before it raises ``UnavailableError`` (default 300000, 5 minutes).
        Set it on the dataset that is iterated, after ``distribute``.
    """

    auto_shard_policy: AutoShardPolicy | None = None
    num_devices: int | None = None
    service_timeout_ms: int | None = None

    def _validate(self, name: str, value: Any) -> Any:
        if name == "auto_shard_policy":
            return parse_member(AutoShardPolicy, value, "auto_shard_policy")
        return _positive_int("experimental_distribute", name, value)


@dataclasses.dataclass(eq=True)
class Options(_OptionGroup):
    """Options of a dataset, set with ``dataset.with_options(options)``.

    Attributes:
      deterministic: whether parallel operations yield in input order (default True).
      autotune: an ``AutotuneOptions``.
      threading: a ``ThreadingOptions``.
      experimental_distribute: a ``DistributeOptions``.
      experimental_deterministic: the older name of ``deterministic``.

    Example:
      >>> options = Options()
      >>> options.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA
      >>> options.experimental_distribute.auto_shard_policy
      <AutoShardPolicy.DATA: 2>
    """

    deterministic: bool | None = None
    autotune: AutotuneOptions = dataclasses.field(default_factory=AutotuneOptions)
    threading: ThreadingOptions = dataclasses.field(default_factory=ThreadingOptions)
    experimental_distribute: DistributeOptions = dataclasses.field(
        default_factory=DistributeOptions
    )

    def _validate(self, name: str, value: Any) -> Any:
        if name == "deterministic" and not isinstance(value, bool):
            raise InvalidArgumentError(f"deterministic must be a bool, got {value!r}")
        groups = {
            "autotune": AutotuneOptions,
            "threading": ThreadingOptions,
            "experimental_distribute": DistributeOptions,
        }
        if name in groups and not isinstance(value, groups[name]):
            raise InvalidArgumentError(f"{name} must be a {groups[name].__name__}, got {value!r}")
        return value

    @property
    def experimental_deterministic(self) -> bool | None:
        return self.deterministic

    @experimental_deterministic.setter
    def experimental_deterministic(self, value: bool | None) -> None:
        self.deterministic = value

    def merge(self, other: Options) -> Options:
        """A new ``Options`` with every field set in ``other`` overriding this one."""
        if not isinstance(other, Options):
            raise InvalidArgumentError(f"can only merge Options, got {type(other).__name__}")
        merged = copy.deepcopy(self)
        merged._merge(other)
        return merged
