"""``feedline.data.experimental``: the names tf.data keeps under ``experimental``.

The option classes (``AutoShardPolicy``, ``DistributeOptions``, ``OptimizationOptions``, ...) are
those of ``feedline.data.Options``;
``service`` is ``feedline.service``, imported on first access.
"""

from typing import TYPE_CHECKING

from feedline import _porting
from feedline.data._fluent import sample_from_datasets
from feedline.data.auto_shard import ShardMode, auto_shard
from feedline.data.committed import CommittedIterator
from feedline.data.dataset import AUTOTUNE, INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Optional
from feedline.data.experimental.functions import (
    at,
    enable_debug_mode,
    get_next_as_optional,
    get_structure,
    pad_to_cardinality,
    parse_example_dataset,
    unbatch,
)
from feedline.data.experimental.transformations import (
    Counter,
    assert_cardinality,
    bucket_by_sequence_length,
    cardinality,
    choose_from_datasets,
    dense_to_ragged_batch,
    dense_to_sparse_batch,
    enumerate_dataset,
    group_by_reducer,
    group_by_window,
    ignore_errors,
    load,
    map_and_batch,
    parallel_interleave,
    rejection_resample,
    save,
    scan,
    shuffle_and_repeat,
    snapshot,
    take_while,
    unique,
)
from feedline.data.ops.from_list import from_list
from feedline.data.ops.get_single_element import get_single_element
from feedline.data.ops.group_by_reducer import Reducer
from feedline.data.ops.prefetch_to_device import copy_to_device, prefetch_to_device
from feedline.data.ops.random import RandomDataset
from feedline.data.ops.shard import SHARD_HINT
from feedline.data.options import (
    AutoShardPolicy,
    AutotuneAlgorithm,
    AutotuneOptions,
    DistributeOptions,
    ExternalStatePolicy,
    OptimizationOptions,
    ServiceOptions,
    ThreadingOptions,
)
from feedline.data.readers.csv import CsvDataset
from feedline.data.readers.make_csv_dataset import make_csv_dataset
from feedline.data.readers.npy import NpyDataset
from feedline.data.readers.sql import SqlDataset

__all__ = [
    "AUTOTUNE",
    "INFINITE_CARDINALITY",
    "SHARD_HINT",
    "UNKNOWN_CARDINALITY",
    "AutoShardPolicy",
    "AutotuneAlgorithm",
    "AutotuneOptions",
    "CommittedIterator",
    "Counter",
    "CsvDataset",
    "DistributeOptions",
    "ExternalStatePolicy",
    "NpyDataset",
    "OptimizationOptions",
    "Optional",
    "ParquetDataset",
    "RandomDataset",
    "Reducer",
    "ServiceOptions",
    "ShardMode",
    "SqlDataset",
    "TFRecordWriter",
    "ThreadingOptions",
    "assert_cardinality",
    "at",
    "auto_shard",
    "bucket_by_sequence_length",
    "cardinality",
    "choose_from_datasets",
    "copy_to_device",
    "dense_to_ragged_batch",
    "dense_to_sparse_batch",
    "distributed_save",
    "enable_debug_mode",
    "enumerate_dataset",
    "from_list",
    "get_next_as_optional",
    "get_single_element",
    "get_structure",
    "group_by_reducer",
    "group_by_window",
    "ignore_errors",
    "load",
    "make_batched_features_dataset",
    "make_csv_dataset",
    "map_and_batch",
    "pad_to_cardinality",
    "parallel_interleave",
    "parse_example_dataset",
    "prefetch_to_device",
    "rejection_resample",
    "sample_from_datasets",
    "save",
    "scan",
    "service",
    "shuffle_and_repeat",
    "snapshot",
    "take_while",
    "unbatch",
    "unique",
]

# ``feedline.data.experimental.service`` is the data service, a layer above feedline.data:
# imported on first use only, as is ``distributed_save``, which the service's workers run.
# ``make_batched_features_dataset`` reads files (feedline.data) and parses Examples (feedline.io),
# and ``TFRecordWriter`` writes a dataset with feedline.io's writer; feedline.data and feedline.io
# do not import each other, so both live above them and are imported on first use.
# ``ParquetDataset`` is imported on first use too, and pyarrow with it.
if TYPE_CHECKING:
    from feedline.data.readers.parquet import ParquetDataset

__getattr__, __dir__ = _porting.lazy_attributes(
    __name__,
    {
        "ParquetDataset": "feedline.data.readers.parquet:ParquetDataset",
        "TFRecordWriter": "feedline._dataset_writer:TFRecordWriter",
        "make_batched_features_dataset": "feedline._batched_features:make_batched_features_dataset",
        "service": "feedline.service",
        "distributed_save": "feedline.service.client.save:distributed_save",
    },
)
