"""The fluent API of ``Dataset``: every method and static constructor, attached in one place.

Operations import only the small base module ``feedline.data.dataset``; this module imports them
all and attaches the methods once, so no operation imports the central class lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from feedline.data.dataset import Dataset
from feedline.data.ops.batch import BatchDataset
from feedline.data.ops.cache import CacheDataset
from feedline.data.ops.choose_from_datasets import ChooseFromDatasetsDataset
from feedline.data.ops.concatenate import ConcatenateDataset
from feedline.data.ops.enumerate import EnumerateDataset
from feedline.data.ops.filter import FilterDataset
from feedline.data.ops.flat_map import FlatMapDataset
from feedline.data.ops.from_generator import GeneratorDataset
from feedline.data.ops.from_tensor_slices import TensorSliceDataset
from feedline.data.ops.from_tensors import TensorDataset
from feedline.data.ops.from_torch import from_torch as from_torch_dataset
from feedline.data.ops.ignore_errors import IgnoreErrorsDataset
from feedline.data.ops.interleave import InterleaveDataset
from feedline.data.ops.map import MapDataset
from feedline.data.ops.padded_batch import PaddedBatchDataset
from feedline.data.ops.prefetch import PrefetchDataset
from feedline.data.ops.range import RangeDataset
from feedline.data.ops.rebatch import RebatchDataset
from feedline.data.ops.repeat import RepeatDataset
from feedline.data.ops.sample_from_datasets import SampleFromDatasetsDataset
from feedline.data.ops.shard import ShardDataset
from feedline.data.ops.shuffle import ShuffleDataset
from feedline.data.ops.skip import SkipDataset
from feedline.data.ops.take import TakeDataset
from feedline.data.ops.unbatch import UnbatchDataset
from feedline.data.ops.with_options import OptionsDataset
from feedline.data.ops.zip import ZipDataset
from feedline.data.options import Options
from feedline.data.readers.list_files import ListFilesDataset

# -- sources -----------------------------------------------------------------------------------


def range_(*args: int, dtype: Any = None) -> Dataset:
    """``range(start, stop, step)`` as int64 scalars: ``Dataset.range(3)`` gives 0, 1, 2."""
    return RangeDataset(*args) if dtype is None else RangeDataset(*args, dtype=dtype)


def from_tensors(tensors: Any) -> Dataset:
    """A dataset of one element, ``tensors``."""
    return TensorDataset(tensors)


def from_tensor_slices(tensors: Any) -> Dataset:
    """The rows of ``tensors`` (a nested structure of arrays) along their first dimension."""
    return TensorSliceDataset(tensors)


def from_generator(
    generator: Callable[..., Any],
    output_types: Any = None,
    output_shapes: Any = None,
    args: Sequence[Any] | None = None,
    output_signature: Any = None,
) -> Dataset:
    """Elements of ``generator(*args)``, converted to ``output_signature``."""
    return GeneratorDataset(generator, output_types, output_shapes, args, output_signature)


def from_torch(dataset: Any, output_signature: Any = None) -> Dataset:
    """The items of a PyTorch dataset: a map-style one (``__len__``, ``__getitem__``) as a
    random-access source, an ``IterableDataset`` as a stream; see ``ops/from_torch.py``."""
    return from_torch_dataset(dataset, output_signature)


def list_files(
    file_pattern: str | Sequence[str], shuffle: bool | None = None, seed: int | None = None
) -> Dataset:
    """The files matching ``file_pattern`` (shuffled by default, reproducibly with ``seed``)."""
    return ListFilesDataset(file_pattern, shuffle=shuffle, seed=seed)


def zip_(*args: Any, datasets: Any = None) -> Dataset:
    """Elements of several datasets side by side, until the shortest ends.

    ``Dataset.zip(a, b)``, ``Dataset.zip((a, b))`` and ``Dataset.zip(datasets={"x": a})`` all
    work; the elements have the structure of the datasets given.
    """
    if datasets is not None:
        if args:
            raise TypeError("zip: give the datasets positionally or as datasets=, not both")
        return ZipDataset(datasets)
    if len(args) == 1:
        return ZipDataset(args[0])
    return ZipDataset(tuple(args))


def sample_from_datasets(
    datasets: Sequence[Dataset],
    weights: Sequence[float] | Dataset | None = None,
    seed: int | None = None,
    stop_on_empty_dataset: bool = False,
    rerandomize_each_iteration: bool | None = None,
) -> Dataset:
    """Elements drawn at random from ``datasets`` with probabilities ``weights``."""
    return SampleFromDatasetsDataset(
        datasets, weights, seed, stop_on_empty_dataset, rerandomize_each_iteration
    )


def choose_from_datasets(
    datasets: Sequence[Dataset], choice_dataset: Dataset, stop_on_empty_dataset: bool = True
) -> Dataset:
    """Elements taken from ``datasets[i]`` for each ``i`` that ``choice_dataset`` yields."""
    return ChooseFromDatasetsDataset(datasets, choice_dataset, stop_on_empty_dataset)


# -- transformations -----------------------------------------------------------------------


def map_(
    self: Dataset,
    map_func: Callable[..., Any],
    num_parallel_calls: int | None = None,
    deterministic: bool | None = None,
    *,
    use_processes: bool = False,
) -> Dataset:
    """``map_func`` applied to every element; see ``MapDataset``."""
    return MapDataset(
        self, map_func, num_parallel_calls, deterministic, use_processes=use_processes
    )


def filter_(self: Dataset, predicate: Callable[..., Any]) -> Dataset:
    """The elements for which ``predicate`` returns True."""
    return FilterDataset(self, predicate)


def flat_map(self: Dataset, map_func: Callable[..., Dataset]) -> Dataset:
    """The elements of the datasets that ``map_func`` returns, one dataset after another."""
    return FlatMapDataset(self, map_func)


def interleave(
    self: Dataset,
    map_func: Callable[..., Dataset],
    cycle_length: int | None = None,
    block_length: int | None = None,
    num_parallel_calls: int | None = None,
    deterministic: bool | None = None,
) -> Dataset:
    """The datasets of ``map_func`` read ``cycle_length`` at a time, ``block_length`` each turn."""
    return InterleaveDataset(
        self, map_func, cycle_length, block_length, num_parallel_calls, deterministic
    )


def batch(
    self: Dataset,
    batch_size: int,
    drop_remainder: bool = False,
    num_parallel_calls: int | None = None,
    deterministic: bool | None = None,
) -> Dataset:
    """Consecutive elements stacked in batches of ``batch_size``."""
    return BatchDataset(self, batch_size, drop_remainder, num_parallel_calls, deterministic)


def padded_batch(
    self: Dataset,
    batch_size: int,
    padded_shapes: Any = None,
    padding_values: Any = None,
    drop_remainder: bool = False,
) -> Dataset:
    """Batches of elements padded to a common shape."""
    return PaddedBatchDataset(self, batch_size, padded_shapes, padding_values, drop_remainder)


def unbatch(self: Dataset) -> Dataset:
    """Splits every element along its first dimension."""
    return UnbatchDataset(self)


def rebatch(
    self: Dataset, batch_size: int | Sequence[int], drop_remainder: bool = False
) -> Dataset:
    """The same rows regrouped into batches of ``batch_size``."""
    return RebatchDataset(self, batch_size, drop_remainder)


def shuffle(
    self: Dataset,
    buffer_size: int,
    seed: int | None = None,
    reshuffle_each_iteration: bool | None = None,
) -> Dataset:
    """The elements in random order, through a buffer of ``buffer_size``."""
    return ShuffleDataset(self, buffer_size, seed, reshuffle_each_iteration)


def repeat(self: Dataset, count: int | None = None) -> Dataset:
    """The dataset ``count`` times (forever with None or -1)."""
    return RepeatDataset(self, count)


def take(self: Dataset, count: int) -> Dataset:
    """At most the first ``count`` elements (-1: all)."""
    return TakeDataset(self, count)


def skip(self: Dataset, count: int) -> Dataset:
    """All but the first ``count`` elements (-1: none)."""
    return SkipDataset(self, count)


def shard(self: Dataset, num_shards: int, index: int) -> Dataset:
    """Elements ``index``, ``index + num_shards``, ..."""
    return ShardDataset(self, num_shards, index)


def enumerate_(self: Dataset, start: int = 0) -> Dataset:
    """``(i, element)`` pairs, ``i`` counting from ``start``."""
    return EnumerateDataset(self, start)


def prefetch(self: Dataset, buffer_size: int) -> Dataset:
    """Elements produced ahead on a background thread (``AUTOTUNE`` sizes the buffer)."""
    return PrefetchDataset(self, buffer_size)


def cache(self: Dataset, filename: str = "") -> Dataset:
    """The elements of the first pass kept in memory (or in ``filename``) for later passes."""
    return CacheDataset(self, filename)


def concatenate(self: Dataset, dataset: Dataset) -> Dataset:
    """This dataset's elements, then ``dataset``'s."""
    return ConcatenateDataset(self, dataset)


def ignore_errors(self: Dataset, log_warning: bool = False) -> Dataset:
    """The elements whose production raised no error; the others are dropped."""
    return IgnoreErrorsDataset(self, log_warning)


def with_options(self: Dataset, options: Options) -> Dataset:
    """The same dataset with ``options`` merged over its current ones."""
    return OptionsDataset(self, options)


def as_torch(self: Dataset) -> Any:
    """This dataset as a ``torch.utils.data.IterableDataset`` whose elements are torch tensors
    (zero-copy from NumPy), with ``state_dict``/``load_state_dict``; for a plain loop or
    ``DataLoader(dataset.as_torch(), batch_size=None)``. See ``feedline.data.torch_loader``."""
    # The one way into torch from feedline.data: imported here, when asked for, never at import.
    from feedline.data.torch_loader import FeedlineIterableDataset

    return FeedlineIterableDataset(self)


def apply(self: Dataset, transformation_func: Callable[[Dataset], Dataset]) -> Dataset:
    """``transformation_func(self)``: for transformations packaged as functions."""
    result = transformation_func(self)
    if not isinstance(result, Dataset):
        raise TypeError(
            f"apply: the transformation returned {type(result).__name__}, not a Dataset"
        )
    return result


_STATIC = {
    "range": range_,
    "from_tensors": from_tensors,
    "from_tensor_slices": from_tensor_slices,
    "from_generator": from_generator,
    "from_torch": from_torch,
    "list_files": list_files,
    "zip": zip_,
    "sample_from_datasets": sample_from_datasets,
    "choose_from_datasets": choose_from_datasets,
}

_METHODS = {
    "map": map_,
    "filter": filter_,
    "flat_map": flat_map,
    "interleave": interleave,
    "batch": batch,
    "padded_batch": padded_batch,
    "unbatch": unbatch,
    "rebatch": rebatch,
    "shuffle": shuffle,
    "repeat": repeat,
    "take": take,
    "skip": skip,
    "shard": shard,
    "enumerate": enumerate_,
    "prefetch": prefetch,
    "cache": cache,
    "concatenate": concatenate,
    "ignore_errors": ignore_errors,
    "with_options": with_options,
    "apply": apply,
    "as_torch": as_torch,
}


def attach() -> None:
    for name, fn in _STATIC.items():
        fn.__name__ = fn.__qualname__ = name
        setattr(Dataset, name, staticmethod(fn))
    for name, fn in _METHODS.items():
        fn.__name__ = name
        fn.__qualname__ = f"Dataset.{name}"
        setattr(Dataset, name, fn)


attach()
