"""Dataset options: ``feedline.data.Options``.

As in tf.data, options are plain objects whose fields a user sets one by one
(``options.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA``); every assignment
is checked at once: a value of the wrong type is a ``TypeError`` (as in TensorFlow), a value of
the right type out of range an ``InvalidArgumentError``. A field left at ``None`` is *unset* and
takes its default where it is used.

Every field of TensorFlow 2.21's ``tf.data.Options`` and its groups exists here. Each field's
docstring line says whether feedline acts on it; the others are accepted, merged and read back
like the rest, and change nothing (feedline has no graph to rewrite, so most of
``experimental_optimization`` has nothing to switch).

Merge rule (the only one): ``a.merge(b)`` starts from ``a`` and copies every field that is set in
``b``, so the later options win field by field and unset fields never erase set ones. A dataset's
``options()`` merges its inputs' options in input order, then its own ``with_options`` calls in
the order they were made.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import typing
from typing import Any

from feedline._enums import parse_member
from feedline.errors import InvalidArgumentError

__all__ = [
    "AutoShardPolicy",
    "AutotuneAlgorithm",
    "AutotuneOptions",
    "DistributeOptions",
    "ExternalStatePolicy",
    "OptimizationOptions",
    "Options",
    "ServiceOptions",
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


class AutotuneAlgorithm(enum.IntEnum):
    """TensorFlow's autotuning algorithms. feedline has one, a hill climb on measured rates
    (``feedline.data.autotune``); every member selects it."""

    DEFAULT = 0
    HILL_CLIMB = 1
    GRADIENT_DESCENT = 2
    MAX_PARALLELISM = 3
    STAGE_BASED = 4


class ExternalStatePolicy(enum.Enum):
    """What TensorFlow does with state it cannot serialise when it saves an iterator. A feedline
    checkpoint holds the whole state of every iterator, so there is no external state to drop:
    every member behaves the same."""

    WARN = 0
    IGNORE = 1
    FAIL = 2


_KINDS: dict[type, dict[str, type]] = {}


def _kinds(group: type) -> dict[str, type]:
    """What each field of an option group holds, from its annotation (``bool | None``: bool)."""
    if group in _KINDS:
        return _KINDS[group]
    kinds = {}
    for name, hint in typing.get_type_hints(group).items():
        if name.startswith("_"):
            continue
        args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        kind = args[0]
        kinds[name] = typing.get_origin(kind) or kind
    _KINDS[group] = kinds
    return kinds


class _OptionGroup:
    """Checks every assignment against the field's declared kind; ``None`` means unset."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(getattr(type(self), name, None), property):
            object.__setattr__(self, name, value)
            return
        kinds = _kinds(type(self))
        if name not in kinds:
            raise AttributeError(f"{type(self).__name__} has no option {name!r}")
        if value is not None:
            value = self._check(name, kinds[name], value)
        object.__setattr__(self, name, value)

    def _check(self, name: str, kind: type, value: Any) -> Any:
        where = f"{_GROUP_NAMES.get(type(self).__name__, type(self).__name__)}.{name}"
        if issubclass(kind, enum.Enum):
            if isinstance(value, bool) or not isinstance(value, (kind, str, int)):
                raise TypeError(
                    f"{where} must be of type {kind.__name__}, got {value!r} "
                    f"(type: {type(value).__name__})"
                )
            return parse_member(kind, value, name)
        wrong_bool = isinstance(value, bool) and kind is not bool
        if wrong_bool or not isinstance(value, kind):
            raise TypeError(
                f"{where} must be of type {kind.__name__}, got {value!r} "
                f"(type: {type(value).__name__})"
            )
        if isinstance(value, int) and not isinstance(value, bool):
            lowest = self._lowest.get(name, 1)
            if value < lowest:
                raise InvalidArgumentError(f"{where} must be an int >= {lowest}, got {value!r}")
        if isinstance(value, list):
            if not all(isinstance(item, str) for item in value):
                raise TypeError(f"{where} must be a list of str, got {value!r}")
            value = list(value)
        return value

    # The smallest value an int field accepts, where it is not 1.
    _lowest: dict[str, int] = {}

    def _merge(self, other: _OptionGroup) -> None:
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            theirs = getattr(other, field.name)
            if isinstance(theirs, _OptionGroup):
                getattr(self, field.name)._merge(theirs)
            elif theirs is not None:
                object.__setattr__(self, field.name, copy.copy(theirs))


@dataclasses.dataclass(eq=True)
class AutotuneOptions(_OptionGroup):
    """Autotuning of ``AUTOTUNE`` parallelism and buffer sizes.

    Attributes:
      enabled: tune at run time (default True); when False, AUTOTUNE means the number of cores.
        Acted on.
      cpu_budget: the most threads an autotuned operation may use (default: the number of
        cores). Acted on.
      ram_budget: bytes that autotuned buffers may hold in total (default: half of the memory).
        Acted on.
      initial_parallelism: the parallelism an autotuned ``map`` or ``interleave`` starts from
        before the tuner has measured anything (default: ``map`` 0, i.e. inline, or 1 with
        ``use_processes``; ``interleave`` 1). Acted on.
      min_parallelism: the least parallelism an autotuned ``map`` or ``interleave`` runs
        with: the tuner starts there and never goes below. Acted on.
      autotune_algorithm: an ``AutotuneAlgorithm``; accepted, and feedline's hill climb runs
        whichever is chosen.
    """

    enabled: bool | None = None
    cpu_budget: int | None = None
    ram_budget: int | None = None
    initial_parallelism: int | None = None
    min_parallelism: int | None = None
    autotune_algorithm: AutotuneAlgorithm | None = None


@dataclasses.dataclass(eq=True)
class ThreadingOptions(_OptionGroup):
    """Threads of a pipeline.

    Attributes:
      private_threadpool_size: the most threads that the pipeline's parallel operations start;
        0 means the number of cores, as in TensorFlow. Acted on.
      max_intra_op_parallelism: accepted; NumPy and the user's functions decide their own
        threading, so feedline changes nothing.
    """

    private_threadpool_size: int | None = None
    max_intra_op_parallelism: int | None = None

    _lowest = {"private_threadpool_size": 0}


@dataclasses.dataclass(eq=True)
class DistributeOptions(_OptionGroup):
    """How a dataset is distributed.

    Attributes:
      auto_shard_policy: an ``AutoShardPolicy`` (default AUTO), or its name (``"DATA"``).
        Acted on.
      num_devices: the number of devices the dataset is fed to, where known. Acted on by
        distributed datasets, which set it.
      service_timeout_ms: how long a data service consumer (an iterator of a dataset made by
        ``feedline.service.distribute``) waits for an unreachable dispatcher, or for a job that
        no worker serves, before it raises ``UnavailableError`` (default 300000, 5 minutes).
        Set it on the dataset that is iterated, after ``distribute``. feedline's own.
      pinned_buffer_count: page-locked host buffers in each CUDA device's ring, through which
        elements are copied to the device (a distributed dataset's replicas,
        ``prefetch_to_device``, ``as_torch(device=...)``). A buffer is reused once the copy
        that read it has finished. Default: the elements kept ahead on the device plus 2,
        which keeps the host from waiting on a copy; more only costs pinned memory. Each
        buffer holds one element (sized from the element spec, or the largest element seen).
        feedline's own.
    """

    auto_shard_policy: AutoShardPolicy | None = None
    num_devices: int | None = None
    service_timeout_ms: int | None = None
    pinned_buffer_count: int | None = None


@dataclasses.dataclass(eq=True)
class ServiceOptions(_OptionGroup):
    """Options of a dataset read from the data service.

    Attributes:
      pinned: TensorFlow's consumer then allocates elements in page-locked memory; accepted,
        no effect (feedline consumers receive elements in shared memory on the worker's host,
        or over gRPC; distributed datasets copy them to devices).
    """

    pinned: bool | None = None


@dataclasses.dataclass(eq=True)
class OptimizationOptions(_OptionGroup):
    """TensorFlow's static graph rewrites. feedline builds no graph to rewrite: each field is
    accepted, merged and read back, and changes nothing; where feedline already does what the
    rewrite would, the line says so.

    Attributes:
      apply_default_optimizations: accepted; no effect.
      filter_fusion: accepted; no effect.
      filter_parallelization: accepted; no effect (``filter`` runs in the consumer's thread).
      inject_prefetch: accepted; no effect (distributed datasets and the data service
        prefetch already).
      map_and_batch_fusion: accepted; no effect (``batch`` after a parallel ``map`` already
        stacks whole chunks).
      map_and_filter_fusion: accepted; no effect.
      map_fusion: accepted; no effect.
      map_parallelization: accepted; no effect (set ``num_parallel_calls``).
      noop_elimination: accepted; no effect.
      parallel_batch: accepted; no effect.
      seq_interleave_prefetch: accepted; no effect.
      shuffle_and_repeat_fusion: accepted; no effect.
    """

    apply_default_optimizations: bool | None = None
    filter_fusion: bool | None = None
    filter_parallelization: bool | None = None
    inject_prefetch: bool | None = None
    map_and_batch_fusion: bool | None = None
    map_and_filter_fusion: bool | None = None
    map_fusion: bool | None = None
    map_parallelization: bool | None = None
    noop_elimination: bool | None = None
    parallel_batch: bool | None = None
    seq_interleave_prefetch: bool | None = None
    shuffle_and_repeat_fusion: bool | None = None


@dataclasses.dataclass(eq=True)
class Options(_OptionGroup):
    """Options of a dataset, set with ``dataset.with_options(options)``.

    Attributes:
      deterministic: whether parallel operations yield in input order (default True). Acted on.
      autotune: an ``AutotuneOptions``.
      threading: a ``ThreadingOptions`` (also reachable as ``experimental_threading``).
      experimental_distribute: a ``DistributeOptions``.
      experimental_optimization: an ``OptimizationOptions``.
      experimental_service: a ``ServiceOptions``.
      dataset_name: a name for the dataset, to help in debugging; accepted and read back.
      experimental_external_state_policy: an ``ExternalStatePolicy``; accepted, no effect
        (feedline checkpoints hold every iterator's whole state).
      experimental_slack: accepted; no effect.
      experimental_symbolic_checkpoint: accepted; no effect (every feedline iterator saves
        its exact position).
      experimental_warm_start: accepted; no effect (background operations start on the first
        element).
      framework_type: a list of framework names; accepted and read back.
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
    experimental_optimization: OptimizationOptions = dataclasses.field(
        default_factory=OptimizationOptions
    )
    experimental_service: ServiceOptions = dataclasses.field(default_factory=ServiceOptions)
    dataset_name: str | None = None
    experimental_external_state_policy: ExternalStatePolicy | None = None
    experimental_slack: bool | None = None
    experimental_symbolic_checkpoint: bool | None = None
    experimental_warm_start: bool | None = None
    framework_type: list[str] | None = None

    @property
    def experimental_deterministic(self) -> bool | None:
        return self.deterministic

    @experimental_deterministic.setter
    def experimental_deterministic(self, value: bool | None) -> None:
        self.deterministic = value

    @property
    def experimental_threading(self) -> ThreadingOptions:
        return self.threading

    @experimental_threading.setter
    def experimental_threading(self, value: ThreadingOptions) -> None:
        self.threading = value

    def merge(self, other: Options) -> Options:
        """A new ``Options`` with every field set in ``other`` overriding this one."""
        if not isinstance(other, Options):
            raise TypeError(f"can only merge Options, got {type(other).__name__}")
        merged = copy.deepcopy(self)
        merged._merge(other)
        return merged


# How error messages name each group: the attribute a user reaches it through.
_GROUP_NAMES = {
    "Options": "Options",
    "AutotuneOptions": "autotune",
    "ThreadingOptions": "threading",
    "DistributeOptions": "experimental_distribute",
    "OptimizationOptions": "experimental_optimization",
    "ServiceOptions": "experimental_service",
}
