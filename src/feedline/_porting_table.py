"""The table of docs/porting.md that lists every public name of TensorFlow 2.21's ``tf.data``,
``tf.data.Dataset``, ``tf.data.experimental`` and ``tf.data.experimental.service`` with its
status in feedline, computed from the code so that it cannot go stale.

A name's status is found by reaching it the way ported code does, ``import feedline as tf`` then
``tf.data.experimental.<name>``: a name that resolves is **same**, or **different** where
``DIFFERENCES`` says how and why; a name that does not resolve is **not available**, with what to
use instead from ``feedline._porting.REPLACEMENTS`` (which the error message of the missing name
gives too). ``tests/test_porting_table.py`` checks that docs/porting.md holds exactly this table
and that no name lacks a status.

The same module writes the table of every TensorFlow name feedline lacks (``REPLACEMENTS``).
Regenerate both tables in docs/porting.md with::

    python -m feedline._porting_table --write docs/porting.md
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
from typing import Any

from feedline._porting import REPLACEMENTS

__all__ = ["DIFFERENCES", "TABLES", "TENSORFLOW_NAMES", "markdown", "rewrite", "rows"]

#: ``dir()`` of each TensorFlow 2.21 module or class, without private names.
TENSORFLOW_NAMES: dict[str, tuple[str, ...]] = {
    "data": (
        "AUTOTUNE", "Dataset", "DatasetSpec", "FixedLengthRecordDataset", "INFINITE_CARDINALITY",
        "Iterator", "IteratorSpec", "NumpyIterator", "Options", "TFRecordDataset",
        "TextLineDataset", "ThreadingOptions", "UNKNOWN_CARDINALITY", "experimental",
    ),
    "data.Dataset": (
        "apply", "as_numpy_iterator", "batch", "bucket_by_sequence_length", "cache",
        "cardinality", "choose_from_datasets", "concatenate", "counter", "element_spec",
        "enumerate", "filter", "fingerprint", "flat_map", "from_generator", "from_tensor_slices",
        "from_tensors", "get_single_element", "group_by_window", "ignore_errors", "interleave",
        "list_files", "load", "map", "options", "padded_batch", "prefetch", "ragged_batch",
        "random", "range", "rebatch", "reduce", "rejection_resample", "repeat",
        "sample_from_datasets", "save", "scan", "shard", "shuffle", "skip", "snapshot",
        "sparse_batch", "take", "take_while", "unbatch", "unique", "window", "with_options", "zip",
    ),
    "data.experimental": (
        "AUTOTUNE", "AutoShardPolicy", "AutotuneAlgorithm", "AutotuneOptions", "Counter",
        "CsvDataset", "DatasetInitializer", "DistributeOptions", "ExternalStatePolicy",
        "INFINITE_CARDINALITY", "OptimizationOptions", "Optional", "RandomDataset", "Reducer",
        "SHARD_HINT", "ServiceOptions", "SqlDataset", "TFRecordWriter", "ThreadingOptions",
        "UNKNOWN_CARDINALITY", "assert_cardinality", "at", "bucket_by_sequence_length",
        "cardinality", "choose_from_datasets", "copy_to_device", "dense_to_ragged_batch",
        "dense_to_sparse_batch", "distributed_save", "enable_debug_mode", "enumerate_dataset",
        "from_list", "from_variant", "get_model_proto", "get_next_as_optional",
        "get_single_element", "get_structure", "group_by_reducer", "group_by_window",
        "ignore_errors", "index_table_from_dataset", "load", "make_batched_features_dataset",
        "make_csv_dataset", "make_saveable_from_iterator", "map_and_batch", "pad_to_cardinality",
        "parallel_interleave", "parse_example_dataset", "prefetch_to_device",
        "rejection_resample", "sample_from_datasets", "save", "scan", "service",
        "shuffle_and_repeat", "snapshot", "table_from_dataset", "take_while", "to_variant",
        "unbatch", "unique",
    ),
    "data.experimental.service": (
        "CrossTrainerCache", "DispatchServer", "DispatcherConfig", "ShardingPolicy",
        "WorkerConfig", "WorkerServer", "distribute", "from_dataset_id", "register_dataset",
    ),
}  # fmt: skip

#: Names that exist in feedline but behave otherwise than in TensorFlow, and why. What holds for
#: every name (elements are NumPy arrays, functions run eagerly as Python) is said once in
#: docs/porting.md, not here.
DIFFERENCES: dict[str, str] = {
    "data.Iterator": (
        "one iterator class for every dataset (feedline.data.DatasetIterator); it yields NumPy "
        "elements and saves its position with get_state()/set_state()"
    ),
    "data.NumpyIterator": "the same class as data.Iterator: feedline elements are NumPy already",
    "data.Dataset.as_numpy_iterator": "the same as iter(dataset): elements are NumPy already",
    "data.Dataset.fingerprint": (
        "a hash of the pipeline's description (operations, arguments, the bytecode and captured "
        "values of its functions), stable across processes of one Python version; not "
        "TensorFlow's graph fingerprint"
    ),
    "data.Dataset.save": (
        "feedline's own checksummed format (docs/snapshot_format.md), not readable by "
        "TensorFlow; compression GZIP, LZ4, or SNAPPY with python-snappy installed"
    ),
    "data.Dataset.load": "reads feedline's format only; wait=True needs a finished save",
    "data.Dataset.snapshot": (
        "feedline's format, keyed by Dataset.fingerprint(); an interrupted pass leaves no snapshot"
    ),
    "data.Dataset.random": (
        "uniform over int64 like TensorFlow's, from NumPy's PCG64: not TensorFlow's numbers for "
        "the same seed"
    ),
    "data.Dataset.rejection_resample": (
        "the initial distribution is estimated from the elements as they are read, not from "
        "extra passes over the input"
    ),
    "data.Dataset.ragged_batch": (
        "batches are feedline.data.RaggedArray (values + row_splits, NumPy has no ragged "
        "arrays); as_torch() turns them into torch nested tensors"
    ),
    "data.Dataset.sparse_batch": (
        "batches are feedline.data.SparseArray (COO indices, values, dense_shape); as_torch() "
        "turns them into torch.sparse_coo_tensor"
    ),
    "data.Dataset.unbatch": (
        "the rows of a ragged batch are dense arrays: batch them again with ragged_batch, not batch"
    ),
    "data.experimental.copy_to_device": (
        "elements become torch tensors on the device (strings stay NumPy); source_device must be "
        "the host, where feedline pipelines run; the last transformation of the pipeline"
    ),
    "data.experimental.prefetch_to_device": (
        "elements become torch tensors on the device (strings stay NumPy), copied through "
        "reusable pinned buffers on a copy stream per device; buffer_size None means 1; the "
        "last transformation of the pipeline"
    ),
    "data.experimental.dense_to_ragged_batch": "as Dataset.ragged_batch",
    "data.experimental.distributed_save": (
        "the snapshot is in feedline's format (docs/snapshot_format.md), one stream per split of "
        "the source; the dataset must yield the same elements each time a split runs"
    ),
    "data.experimental.dense_to_sparse_batch": "as Dataset.sparse_batch",
    "data.experimental.service.CrossTrainerCache": (
        "also reads finite epochs under distributed_epoch: every trainer gets every element "
        "once (a slow trainer reads what the others passed from memory, then the worker's "
        "disk); a trainer's get_state() is its position, restored into the same job; the "
        "sliding window is WorkerConfig.cross_trainer_cache_size_bytes per task (64 MiB)"
    ),
    "data.experimental.service.distribute": (
        "DYNAMIC sharding splits a pipeline of one source; zip, sample_from_datasets, "
        "choose_from_datasets or a source read twice are an InvalidArgumentError naming the "
        "rule (TensorFlow splits each source on its own, so zipped pairs would differ by worker)"
    ),
    "data.experimental.at": (
        "answers for every dataset by reading up to the element (TensorFlow: only datasets "
        "with random access)"
    ),
    "data.experimental.enable_debug_mode": (
        "does nothing: feedline always runs user functions eagerly, one element at a time"
    ),
    "data.experimental.OptimizationOptions": (
        "every field is accepted and read back; feedline builds no graph, so none rewrites anything"
    ),
    "data.experimental.ExternalStatePolicy": (
        "accepted; feedline checkpoints hold every iterator's whole state, so nothing is dropped"
    ),
    "data.experimental.AutotuneAlgorithm": "accepted; feedline's one tuner, a hill climb, runs",
    "data.experimental.ServiceOptions": "pinned is accepted and has no effect",
    "data.experimental.save": "as Dataset.save",
    "data.experimental.load": "as Dataset.load",
    "data.experimental.snapshot": "as Dataset.snapshot",
    "data.experimental.RandomDataset": "as Dataset.random",
}

_STATUS = {"same": "same", "different": "different", "missing": "not available"}


def _resolve(path: str) -> Any:
    """The object ``tf.<path>`` gives with ``import feedline as tf``, or raises AttributeError."""
    value: Any = importlib.import_module("feedline")
    for part in path.split("."):
        value = getattr(value, part)
    return value


def rows() -> list[tuple[str, str, str]]:
    """``(TensorFlow name, status, note)`` for every name of ``TENSORFLOW_NAMES``, in order.

    Raises:
      LookupError: a name that feedline lacks has no entry in ``REPLACEMENTS`` (every missing
        name must say what to use instead).
    """
    table = []
    for owner, names in TENSORFLOW_NAMES.items():
        for name in names:
            key = f"{owner}.{name}"
            try:
                _resolve(key)
            except AttributeError:
                if key not in REPLACEMENTS:
                    raise LookupError(
                        f"tf.{key} is neither in feedline nor in feedline._porting.REPLACEMENTS"
                    ) from None
                table.append((key, _STATUS["missing"], REPLACEMENTS[key]))
                continue
            if key in DIFFERENCES:
                table.append((key, _STATUS["different"], DIFFERENCES[key]))
            else:
                table.append((key, _STATUS["same"], ""))
    return table


TABLES = {
    "tf.data": (
        "<!-- the tf.data table: generated by `python -m feedline._porting_table`; do not edit -->",
        "<!-- end of the tf.data table -->",
    ),
    "replacements": (
        "<!-- the replacements table: generated by `python -m feedline._porting_table`; do not "
        "edit -->",
        "<!-- end of the replacements table -->",
    ),
}


def markdown(table: str = "tf.data") -> str:
    """A table as the Markdown between its markers in docs/porting.md: ``"tf.data"`` (every
    name of tf.data with its status) or ``"replacements"`` (every TensorFlow name feedline
    lacks, with what to use instead)."""
    begin, end = TABLES[table]
    if table == "tf.data":
        lines = ["| TensorFlow | feedline | notes |", "|---|---|---|"]
        lines += [f"| `tf.{key}` | {status} | {note} |" for key, status, note in rows()]
    else:
        lines = ["| TensorFlow | Use instead |", "|---|---|"]
        lines += [f"| `tf.{key}` | {hint} |" for key, hint in REPLACEMENTS.items()]
    return "\n".join([begin, "", *lines, "", end])


def rewrite(text: str) -> str:
    """``text`` (docs/porting.md) with every generated table replaced by its current form."""
    for name, (begin, end) in TABLES.items():
        start, stop = text.index(begin), text.index(end) + len(end)
        text = text[:start] + markdown(name) + text[stop:]
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m feedline._porting_table")
    parser.add_argument("--write", metavar="PORTING_MD", help="replace the tables in this file")
    args = parser.parse_args(argv)
    if args.write:
        path = pathlib.Path(args.write)
        path.write_text(rewrite(path.read_text()))
    else:
        print(markdown("tf.data"), markdown("replacements"), sep="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
