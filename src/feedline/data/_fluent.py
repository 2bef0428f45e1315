"""The fluent API of ``Dataset``: every method and static constructor, attached in one place.

Operations import only the small base module ``feedline.data.dataset``; this module imports them
all and attaches the methods once, so no operation imports the central class lazily. Each method
is declared, with its signature and docstring, in ``feedline.data._fluent_api`` (which
``Dataset`` inherits, for type checkers and IDEs); here are the bodies, one function per declared
name, attached to ``Dataset`` with the declaration's docstring.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from feedline.data._fluent_api import FluentAPI
from feedline.data.dataset import Dataset
from feedline.data.ops._fingerprint import fingerprint as dataset_fingerprint
from feedline.data.ops.batch import BatchDataset
from feedline.data.ops.bucket_by_sequence_length import (
    bucket_by_sequence_length as bucket_dataset,
)
from feedline.data.ops.cache import CacheDataset
from feedline.data.ops.choose_from_datasets import ChooseFromDatasetsDataset
from feedline.data.ops.concatenate import ConcatenateDataset
from feedline.data.ops.counter import CounterDataset
from feedline.data.ops.dataset_slices import DatasetSliceDataset
from feedline.data.ops.enumerate import EnumerateDataset
from feedline.data.ops.filter import FilterDataset
from feedline.data.ops.flat_map import FlatMapDataset
from feedline.data.ops.from_generator import GeneratorDataset
from feedline.data.ops.from_tensor_slices import TensorSliceDataset
from feedline.data.ops.from_tensors import TensorDataset
from feedline.data.ops.from_torch import from_torch as from_torch_dataset
from feedline.data.ops.get_single_element import get_single_element as single_element
from feedline.data.ops.group_by_window import GroupByWindowDataset
from feedline.data.ops.ignore_errors import IgnoreErrorsDataset
from feedline.data.ops.interleave import InterleaveDataset
from feedline.data.ops.load import LoadDataset
from feedline.data.ops.map import MapDataset
from feedline.data.ops.padded_batch import PaddedBatchDataset
from feedline.data.ops.prefetch import PrefetchDataset
from feedline.data.ops.prefetch_to_device import PrefetchToDeviceDataset
from feedline.data.ops.ragged_batch import RaggedBatchDataset
from feedline.data.ops.random import RandomDataset
from feedline.data.ops.range import RangeDataset
from feedline.data.ops.rebatch import RebatchDataset
from feedline.data.ops.reduce import reduce_dataset
from feedline.data.ops.rejection_resample import RejectionResampleDataset
from feedline.data.ops.repeat import RepeatDataset
from feedline.data.ops.sample_from_datasets import SampleFromDatasetsDataset
from feedline.data.ops.save import save as save_dataset
from feedline.data.ops.scan import ScanDataset
from feedline.data.ops.shard import ShardDataset
from feedline.data.ops.shuffle import ShuffleDataset
from feedline.data.ops.skip import SkipDataset
from feedline.data.ops.snapshot import SnapshotDataset
from feedline.data.ops.sparse_batch import SparseBatchDataset
from feedline.data.ops.take import TakeDataset
from feedline.data.ops.take_while import TakeWhileDataset
from feedline.data.ops.unbatch import UnbatchDataset
from feedline.data.ops.unique import UniqueDataset
from feedline.data.ops.window import WindowDataset
from feedline.data.ops.with_options import OptionsDataset
from feedline.data.ops.zip import ZipDataset
from feedline.data.options import Options
from feedline.data.readers.list_files import ListFilesDataset

if TYPE_CHECKING:
    from feedline.data.torch_loader import FeedlineIterableDataset

# -- sources -----------------------------------------------------------------------------------


def range_(
    *args: int, output_type: Any = None, name: str | None = None, dtype: Any = None
) -> Dataset:
    dtype = output_type if output_type is not None else dtype
    return RangeDataset(*args) if dtype is None else RangeDataset(*args, dtype=dtype)


def from_tensors(tensors: Any) -> Dataset:
    return TensorDataset(tensors)


def from_tensor_slices(tensors: Any) -> Dataset:
    if (
        isinstance(tensors, list | tuple)
        and tensors
        and all(isinstance(t, Dataset) for t in tensors)
    ):
        return DatasetSliceDataset(tensors)
    return TensorSliceDataset(tensors)


def from_generator(
    generator: Callable[..., Any],
    output_types: Any = None,
    output_shapes: Any = None,
    args: Sequence[Any] | None = None,
    output_signature: Any = None,
) -> Dataset:
    return GeneratorDataset(generator, output_types, output_shapes, args, output_signature)


def from_torch(dataset: Any, output_signature: Any = None) -> Dataset:
    return from_torch_dataset(dataset, output_signature)


def list_files(
    file_pattern: str | Sequence[str], shuffle: bool | None = None, seed: int | None = None
) -> Dataset:
    return ListFilesDataset(file_pattern, shuffle=shuffle, seed=seed)


def zip_(*args: Any, datasets: Any = None) -> Dataset:
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
    return SampleFromDatasetsDataset(
        datasets, weights, seed, stop_on_empty_dataset, rerandomize_each_iteration
    )


def choose_from_datasets(
    datasets: Sequence[Dataset], choice_dataset: Dataset, stop_on_empty_dataset: bool = True
) -> Dataset:
    return ChooseFromDatasetsDataset(datasets, choice_dataset, stop_on_empty_dataset)


def counter(
    start: Any = 0, step: Any = 1, dtype: Any = np.int64, name: str | None = None
) -> Dataset:
    return CounterDataset(start, step, dtype)


def random(
    seed: int | None = None,
    rerandomize_each_iteration: bool | None = None,
    name: str | None = None,
) -> Dataset:
    return RandomDataset(seed, rerandomize_each_iteration)


# -- transformations -----------------------------------------------------------------------


def map_(
    self: Dataset,
    map_func: Callable[..., Any],
    num_parallel_calls: int | None = None,
    deterministic: bool | None = None,
    synchronous: bool | None = None,
    use_unbounded_threadpool: bool = False,
    *,
    use_processes: bool = False,
    name: str | None = None,
) -> Dataset:
    if synchronous and num_parallel_calls is not None:
        raise ValueError(
            "`synchronous` is not supported with `num_parallel_calls`, but `num_parallel_calls` "
            f"was set to {num_parallel_calls}"
        )
    return MapDataset(
        self, map_func, num_parallel_calls, deterministic, use_processes=use_processes
    )


def filter_(self: Dataset, predicate: Callable[..., Any]) -> Dataset:
    return FilterDataset(self, predicate)


def flat_map(self: Dataset, map_func: Callable[..., Dataset]) -> Dataset:
    return FlatMapDataset(self, map_func)


def interleave(
    self: Dataset,
    map_func: Callable[..., Dataset],
    cycle_length: int | None = None,
    block_length: int | None = None,
    num_parallel_calls: int | None = None,
    deterministic: bool | None = None,
) -> Dataset:
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
    return BatchDataset(self, batch_size, drop_remainder, num_parallel_calls, deterministic)


def padded_batch(
    self: Dataset,
    batch_size: int,
    padded_shapes: Any = None,
    padding_values: Any = None,
    drop_remainder: bool = False,
) -> Dataset:
    return PaddedBatchDataset(self, batch_size, padded_shapes, padding_values, drop_remainder)


def ragged_batch(
    self: Dataset,
    batch_size: int,
    drop_remainder: bool = False,
    row_splits_dtype: Any = np.int64,
    name: str | None = None,
) -> Dataset:
    return RaggedBatchDataset(self, batch_size, drop_remainder, row_splits_dtype)


def sparse_batch(
    self: Dataset, batch_size: int, row_shape: Any, name: str | None = None
) -> Dataset:
    return SparseBatchDataset(self, batch_size, row_shape)


def unbatch(self: Dataset) -> Dataset:
    return UnbatchDataset(self)


def rebatch(
    self: Dataset, batch_size: int | Sequence[int], drop_remainder: bool = False
) -> Dataset:
    return RebatchDataset(self, batch_size, drop_remainder)


def shuffle(
    self: Dataset,
    buffer_size: int,
    seed: int | None = None,
    reshuffle_each_iteration: bool | None = None,
) -> Dataset:
    return ShuffleDataset(self, buffer_size, seed, reshuffle_each_iteration)


def repeat(self: Dataset, count: int | None = None) -> Dataset:
    return RepeatDataset(self, count)


def take(self: Dataset, count: int) -> Dataset:
    return TakeDataset(self, count)


def take_while(self: Dataset, predicate: Callable[..., Any], name: str | None = None) -> Dataset:
    return TakeWhileDataset(self, predicate)


def skip(self: Dataset, count: int) -> Dataset:
    return SkipDataset(self, count)


def shard(self: Dataset, num_shards: int, index: int) -> Dataset:
    return ShardDataset(self, num_shards, index)


def enumerate_(self: Dataset, start: int = 0) -> Dataset:
    return EnumerateDataset(self, start)


def scan(
    self: Dataset, initial_state: Any, scan_func: Callable[..., Any], name: str | None = None
) -> Dataset:
    return ScanDataset(self, initial_state, scan_func)


def unique(self: Dataset, name: str | None = None) -> Dataset:
    return UniqueDataset(self)


def reduce(
    self: Dataset, initial_state: Any, reduce_func: Callable[..., Any], name: str | None = None
) -> Any:
    return reduce_dataset(self, initial_state, reduce_func)


def get_single_element(self: Dataset, name: str | None = None) -> Any:
    return single_element(self)


def prefetch(self: Dataset, buffer_size: int) -> Dataset:
    return PrefetchDataset(self, buffer_size)


def cache(self: Dataset, filename: str = "") -> Dataset:
    return CacheDataset(self, filename)


def concatenate(self: Dataset, dataset: Dataset) -> Dataset:
    return ConcatenateDataset(self, dataset)


def ignore_errors(self: Dataset, log_warning: bool = False) -> Dataset:
    return IgnoreErrorsDataset(self, log_warning)


def with_options(self: Dataset, options: Options) -> Dataset:
    return OptionsDataset(self, options)


def rejection_resample(
    self: Dataset,
    class_func: Callable[..., Any],
    target_dist: Any,
    initial_dist: Any = None,
    seed: int | None = None,
    name: str | None = None,
) -> Dataset:
    return RejectionResampleDataset(self, class_func, target_dist, initial_dist, seed)


def window(
    self: Dataset,
    size: int,
    shift: int | None = None,
    stride: int = 1,
    drop_remainder: bool = False,
    name: str | None = None,
) -> Dataset:
    return WindowDataset(self, size, shift, stride, drop_remainder)


def group_by_window(
    self: Dataset,
    key_func: Callable[..., Any],
    reduce_func: Callable[..., Dataset],
    window_size: int | None = None,
    window_size_func: Callable[..., Any] | None = None,
    name: str | None = None,
) -> Dataset:
    return GroupByWindowDataset(self, key_func, reduce_func, window_size, window_size_func)


def bucket_by_sequence_length(
    self: Dataset,
    element_length_func: Callable[..., Any],
    bucket_boundaries: Sequence[int],
    bucket_batch_sizes: Sequence[int],
    padded_shapes: Any = None,
    padding_values: Any = None,
    pad_to_bucket_boundary: bool = False,
    no_padding: bool = False,
    drop_remainder: bool = False,
    name: str | None = None,
) -> Dataset:
    return bucket_dataset(
        self,
        element_length_func,
        bucket_boundaries,
        bucket_batch_sizes,
        padded_shapes,
        padding_values,
        pad_to_bucket_boundary,
        no_padding,
        drop_remainder,
    )


def as_torch(self: Dataset, device: Any = None) -> FeedlineIterableDataset:
    # The one way into torch from feedline.data: imported here, when asked for, never at import.
    from feedline.data.torch_loader import FeedlineIterableDataset

    if device is None:
        return FeedlineIterableDataset(self)
    return FeedlineIterableDataset(PrefetchToDeviceDataset(self, device, None))


def apply(self: Dataset, transformation_func: Callable[[Dataset], Dataset]) -> Dataset:
    result = transformation_func(self)
    if not isinstance(result, Dataset):
        raise TypeError(
            f"apply: the transformation returned {type(result).__name__}, not a Dataset"
        )
    return result


def save(
    self: Dataset,
    path: str,
    compression: str | None = None,
    shard_func: Callable[..., Any] | None = None,
    checkpoint_args: dict[str, Any] | None = None,
) -> None:
    save_dataset(self, path, compression, shard_func, checkpoint_args)


def load(
    path: str,
    element_spec: Any = None,
    compression: str | None = None,
    reader_func: Callable[[Dataset], Dataset] | None = None,
    wait: bool = False,
) -> Dataset:
    return LoadDataset(path, element_spec, compression, reader_func, wait)


def snapshot(
    self: Dataset,
    path: str,
    compression: str | None = "AUTO",
    reader_func: Callable[[Dataset], Dataset] | None = None,
    shard_func: Callable[..., Any] | None = None,
    name: str | None = None,
) -> Dataset:
    return SnapshotDataset(self, path, compression, reader_func, shard_func)


def fingerprint(self: Dataset) -> Any:
    return dataset_fingerprint(self)


_STATIC: dict[str, Callable[..., Dataset]] = {
    "range": range_,
    "from_tensors": from_tensors,
    "from_tensor_slices": from_tensor_slices,
    "from_generator": from_generator,
    "from_torch": from_torch,
    "list_files": list_files,
    "zip": zip_,
    "sample_from_datasets": sample_from_datasets,
    "choose_from_datasets": choose_from_datasets,
    "counter": counter,
    "random": random,
    "load": load,
}

_METHODS: dict[str, Callable[..., Any]] = {
    "map": map_,
    "filter": filter_,
    "flat_map": flat_map,
    "interleave": interleave,
    "batch": batch,
    "padded_batch": padded_batch,
    "ragged_batch": ragged_batch,
    "sparse_batch": sparse_batch,
    "unbatch": unbatch,
    "rebatch": rebatch,
    "shuffle": shuffle,
    "repeat": repeat,
    "take": take,
    "take_while": take_while,
    "skip": skip,
    "shard": shard,
    "enumerate": enumerate_,
    "scan": scan,
    "unique": unique,
    "reduce": reduce,
    "get_single_element": get_single_element,
    "prefetch": prefetch,
    "cache": cache,
    "concatenate": concatenate,
    "ignore_errors": ignore_errors,
    "with_options": with_options,
    "apply": apply,
    "as_torch": as_torch,
    "rejection_resample": rejection_resample,
    "save": save,
    "snapshot": snapshot,
    "fingerprint": fingerprint,
    "window": window,
    "group_by_window": group_by_window,
    "bucket_by_sequence_length": bucket_by_sequence_length,
}


def _declared() -> dict[str, Any]:
    """The names ``FluentAPI`` declares, each with its function."""
    return {name: getattr(FluentAPI, name) for name in vars(FluentAPI) if not name.startswith("_")}


def _taking_name(fn: Callable[..., Any], declared: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` that also takes (and drops) TensorFlow's ``name=`` where its declaration has it
    and the body does not, with the declared signature."""
    signature = inspect.signature(declared)
    own = inspect.signature(fn).parameters
    if "name" not in signature.parameters or "name" in own:
        return fn

    def with_name(*args: Any, name: str | None = None, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    if "self" in own:  # the body's ``self: Dataset``, for help()
        signature = signature.replace(
            parameters=[own["self"], *list(signature.parameters.values())[1:]]
        )
    with_name.__signature__ = signature  # type: ignore[attr-defined]
    return with_name


def attach() -> None:
    """Sets every implementation on ``Dataset`` under its declared name, with its docstring;
    a ``name=`` that TensorFlow's op takes is accepted and unused."""
    declared = _declared()
    if declared.keys() != _STATIC.keys() | _METHODS.keys():
        raise ImportError(
            "feedline.data._fluent and _fluent_api disagree: declared but not implemented "
            f"{sorted(declared.keys() - _STATIC.keys() - _METHODS.keys())}, implemented but not "
            f"declared {sorted((_STATIC.keys() | _METHODS.keys()) - declared.keys())}"
        )
    for name, body in _STATIC.items():
        fn = _taking_name(body, declared[name])
        fn.__name__ = fn.__qualname__ = name
        fn.__doc__ = declared[name].__doc__
        setattr(Dataset, name, staticmethod(fn))
    for name, body in _METHODS.items():
        fn = _taking_name(body, declared[name])
        fn.__name__ = name
        fn.__qualname__ = f"Dataset.{name}"
        fn.__doc__ = declared[name].__doc__
        setattr(Dataset, name, fn)


attach()
