"""Auto-sharding: one worker's share of a dataset, by the dataset's ``AutoShardPolicy``.

``auto_shard(dataset, num_workers, worker_index)`` returns the dataset that worker
``worker_index`` iterates and a ``ShardMode`` that tells the distributed iterator what to do
with the slices of each global batch once it has rebatched them:

======  ===============================================  ==========================================
mode    the dataset                                      the worker keeps
======  ===============================================  ==========================================
FILES   rewritten to read this worker's share of files   every slice of each global batch
DATA    unchanged                                        only its own slices of each global batch
OFF     unchanged                                        every slice (every worker sees everything)
HINT    ``shard(SHARD_HINT, SHARD_HINT)`` filled in      every slice
======  ===============================================  ==========================================

Policies (``options().experimental_distribute.auto_shard_policy``, AUTO by default):

- FILE: as TensorFlow, the graph is walked up from the output (through ``inputs``, every input
  of a zip or concatenate) to the file sources, which every path must reach:

  =====================================================  ======================================
  file source                                            this worker's share
  =====================================================  ======================================
  ``Dataset.list_files``, a reader given names           ``sorted(names)[worker_index::
                                                         num_workers]``, in the source's order
  a reader over a Dataset of names, an ``interleave`` /  the ``list_files`` upstream of the
  ``flat_map`` whose function builds readers             names shared out as above, else the
  (``list_files(p).interleave(TFRecordDataset)``,        names ``.shard(num_workers,
  ``from_tensor_slices(paths).interleave(lambda p:       worker_index)``
  TextLineDataset(p))``)
  =====================================================  ======================================

  Whether a function builds readers is learned without reading anything: a reader class given
  as the function answers at once, any other function is traced once on a sample name
  (``feedline.data.ops.flat_map.DatasetFunction.makes_file_readers``). The sources are
  replaced and every node between them and the output is rebuilt over the new inputs with
  ``Dataset._with_inputs``; several file sources (a zip of two readers) are each sharded. A
  path that ends at another source (``range``, ``from_tensor_slices`` that feeds no reader,
  ``from_generator``) is unshardable: FILE raises NotFoundError, AUTO shards by DATA. Two files
  over two workers, 1 replica each, global batch 4::

      file 0: [0, 1, 2, 3, 4, 5]        worker 0: [0, 1], [2, 3], [4], [5]
      file 1: [6, 7, 8, 9, 10, 11]      worker 1: [6, 7], [8, 9], [10], [11]

- DATA: every worker reads everything and keeps its slices; one file, two workers::

      worker 0: [0, 1], [4, 5], [8, 9]
      worker 1: [2, 3], [6, 7], [10, 11]

- AUTO: FILE where a file source is found, else DATA; the choice is logged once per dataset.
- OFF: no sharding. HINT: every ``shard(SHARD_HINT, SHARD_HINT)`` becomes
  ``shard(num_workers, worker_index)``; a dataset without a hint is not sharded (mode OFF).

With one worker nothing is sharded (mode OFF), whatever the policy, and neither is a dataset that
reads a data service job shared by name (``distribute(..., job_name=...)``): the job already
splits the data among its consumers.

Example:
  >>> from feedline.data import Dataset
  >>> ds, mode = auto_shard(Dataset.range(8).batch(4), num_workers=2, worker_index=1)
  >>> mode
  <ShardMode.DATA: 'data'>
"""

from __future__ import annotations

import enum
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from feedline.data.dataset import Dataset, walk
from feedline.data.ops.flat_map import makes_file_readers
from feedline.data.ops.shard import ShardDataset
from feedline.data.options import AutoShardPolicy
from feedline.data.readers.list_files import ListFilesDataset
from feedline.errors import InvalidArgumentError, NotFoundError

__all__ = ["ShardMode", "auto_shard"]

logger = logging.getLogger(__name__)


class ShardMode(enum.Enum):
    """What the distributed iterator does with the rebatched slices of each global batch.

    FILES: the dataset reads this worker's share of the files; keep every slice.
    DATA: the dataset is unchanged; keep only this worker's own slices.
    OFF: the dataset is unchanged; keep every slice.
    HINT: the dataset's shard hints were filled in; keep every slice.
    """

    FILES = "files"
    DATA = "data"
    OFF = "off"
    HINT = "hint"


_logged: weakref.WeakSet[Dataset] = weakref.WeakSet()
_logged_lock = threading.Lock()


def auto_shard(
    dataset: Dataset,
    num_workers: int,
    worker_index: int,
    policy: AutoShardPolicy | None = None,
) -> tuple[Dataset, ShardMode]:
    """Worker ``worker_index``'s dataset among ``num_workers``, and what to keep of it.

    Args:
      dataset: the dataset every worker builds.
      num_workers: the number of workers (input pipelines) that share it, >= 1.
      worker_index: this worker, in ``[0, num_workers)``.
      policy: an ``AutoShardPolicy``; None takes the dataset's
        ``options().experimental_distribute.auto_shard_policy`` (AUTO when unset).

    Returns:
      ``(dataset, mode)``: the dataset to iterate on this worker and the ``ShardMode``.

    Raises:
      InvalidArgumentError: ``num_workers`` or ``worker_index`` out of range, or FILE (or AUTO
        over files) with fewer files than workers.
      NotFoundError: FILE over a dataset that has a path to a source that reads no files.
    """
    num_workers = _check_int("num_workers", num_workers)
    worker_index = _check_int("worker_index", worker_index)
    if num_workers < 1:
        raise InvalidArgumentError(f"auto_shard: num_workers must be >= 1, got {num_workers}")
    if not 0 <= worker_index < num_workers:
        raise InvalidArgumentError(
            f"auto_shard: worker_index {worker_index} is out of range [0, {num_workers}) for "
            f"num_workers={num_workers}"
        )
    if not isinstance(dataset, Dataset):
        raise InvalidArgumentError(f"auto_shard expects a Dataset, got {type(dataset).__name__}")
    policy = _resolve_policy(dataset, policy)
    if any(node._is_sharded_elsewhere() for node in walk(dataset)):
        return dataset, ShardMode.OFF  # a shared data service job splits the data already
    if num_workers == 1 or policy == AutoShardPolicy.OFF:
        return dataset, ShardMode.OFF
    if policy == AutoShardPolicy.DATA:
        return dataset, ShardMode.DATA
    if policy == AutoShardPolicy.HINT:
        return _fill_hints(dataset, num_workers, worker_index)
    unshardable = _unshardable_source(dataset)
    if policy == AutoShardPolicy.AUTO:
        _log_choice(dataset, unshardable is None, num_workers)
        if unshardable is not None:
            return dataset, ShardMode.DATA
    elif unshardable is not None:
        raise NotFoundError(
            "auto_shard: the policy is FILE, but no file-based dataset (list_files, a file "
            "reader, or an interleave or flat_map whose function builds readers) was found "
            f"upstream of the dataset: found an unshardable source dataset, {unshardable}; use "
            "AutoShardPolicy.DATA to shard its elements instead",
            name=unshardable,
        )
    return _shard_files(dataset, num_workers, worker_index), ShardMode.FILES


def _check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidArgumentError(f"auto_shard: {name} must be an int, got {value!r}")
    return int(value)


def _resolve_policy(dataset: Dataset, policy: Any) -> AutoShardPolicy:
    if policy is None:
        policy = dataset.options().experimental_distribute.auto_shard_policy
        return AutoShardPolicy.AUTO if policy is None else policy
    try:
        return AutoShardPolicy(policy)
    except ValueError:
        allowed = ", ".join(p.name for p in AutoShardPolicy)
        raise InvalidArgumentError(
            f"auto_shard: policy must be one of {allowed}, got {policy!r}"
        ) from None


def _log_choice(dataset: Dataset, has_files: bool, num_workers: int) -> None:
    with _logged_lock:
        if dataset in _logged:
            return
        _logged.add(dataset)
    if has_files:
        logger.info(
            "auto_shard: AUTO policy found a file-based source; sharding %s by FILE across %d "
            "workers",
            type(dataset).__name__,
            num_workers,
        )
    else:
        logger.info(
            "auto_shard: AUTO policy found no file-based source; sharding %s by DATA across %d "
            "workers (every worker reads all the data and keeps its share)",
            type(dataset).__name__,
            num_workers,
        )


# -- rewriting ----------------------------------------------------------------------------------


def _rebuild(
    root: Dataset,
    replace: Callable[[Dataset], Dataset | None],
    finish: Callable[[Dataset, tuple[Dataset, ...]], Dataset] | None = None,
) -> Dataset:
    """``root`` with every node for which ``replace`` returns a dataset replaced by it, and
    every node above a replaced one rebuilt over its new inputs (``finish``, by default
    ``_over``). A node shared by several paths is rewritten once and stays shared."""
    done: dict[int, Dataset] = {}
    stack: list[tuple[Dataset, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in done:
            continue
        if not expanded:
            replacement = replace(node)
            if replacement is not None:
                done[id(node)] = replacement
                continue
            stack.append((node, True))
            stack.extend((item, False) for item in node.inputs if id(item) not in done)
            continue
        inputs = tuple(done[id(item)] for item in node.inputs)
        done[id(node)] = (finish or _over)(node, inputs)
    return done[id(root)]


#: ``_rebuild`` under a public name, for graph rewrites made outside this module (the data
#: service's dynamic sharding replaces a dataset's source with it).
rebuild_graph = _rebuild


def _over(node: Dataset, inputs: tuple[Dataset, ...]) -> Dataset:
    """``node`` over ``inputs``: itself where they are its inputs, else a rewritten copy."""
    if all(new is old for new, old in zip(inputs, node.inputs, strict=True)):
        return node
    return node._with_inputs(inputs)


def _fill_hints(dataset: Dataset, num_workers: int, worker_index: int) -> tuple[Dataset, ShardMode]:
    if not any(isinstance(node, ShardDataset) and node.is_hint for node in walk(dataset)):
        return dataset, ShardMode.OFF

    def finish(node: Dataset, inputs: tuple[Dataset, ...]) -> Dataset:
        if isinstance(node, ShardDataset) and node.is_hint:
            return ShardDataset(inputs[0], num_workers, worker_index)
        return _over(node, inputs)

    return _rebuild(dataset, lambda node: None, finish), ShardMode.HINT


def _is_file_source(node: Dataset) -> bool:
    """A node where FILE sharding stops: a reader or ``list_files``, or an interleave or
    flat_map whose function builds readers."""
    return node._is_file_reader or makes_file_readers(node)


def _unshardable_source(dataset: Dataset) -> str | None:
    """The first source (a node without inputs) that a path from the output reaches without
    passing a file source, as ``"RangeDataset"``; None where every path reaches one."""
    seen: set[int] = set()
    stack = [dataset]
    while stack:
        node = stack.pop()
        if id(node) in seen or _is_file_source(node):
            continue
        seen.add(id(node))
        if not node.inputs:
            return type(node).__name__
        stack.extend(reversed(node.inputs))
    return None


def _shard_files(dataset: Dataset, num_workers: int, worker_index: int) -> Dataset:
    def replace(node: Dataset) -> Dataset | None:
        if not _is_file_source(node):
            return None
        names = getattr(node, "_filenames", None)
        if node._is_file_reader and names is not None:
            return node._with_files(_share(names, num_workers, worker_index))
        # A reader over a Dataset of names, or an interleave / flat_map making readers from
        # the names it reads: the names are its only input.
        (source,) = node.inputs
        if any(isinstance(item, ListFilesDataset) for item in walk(source)):
            return None  # the names come from list_files upstream: shard its sorted names
        count = source.cardinality()
        if 0 <= count < num_workers:  # neither infinite nor unknown
            raise _too_few_files(count, num_workers)
        shard = ShardDataset(source, num_workers, worker_index)
        return node._with_files(shard) if node._is_file_reader else node._with_inputs((shard,))

    return _rebuild(dataset, replace)


def _share(names: Sequence[str], num_workers: int, worker_index: int) -> list[str]:
    """Worker ``worker_index``'s names: every ``num_workers``-th of the sorted names, in the
    order the source has them."""
    if len(names) < num_workers:
        raise _too_few_files(len(names), num_workers)
    by_name = sorted(range(len(names)), key=lambda k: names[k])
    return [names[k] for k in sorted(by_name[worker_index::num_workers])]


def _too_few_files(count: int, num_workers: int) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"auto_shard: the dataset reads {count} file(s), fewer than the {num_workers} workers, "
        "so FILE sharding would leave a worker without data; set "
        "options.experimental_distribute.auto_shard_policy to AutoShardPolicy.DATA (every worker "
        "reads everything and keeps its share) or AutoShardPolicy.OFF, or split the input into "
        "at least as many files as workers"
    )
