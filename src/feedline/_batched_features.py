"""``data.experimental.make_batched_features_dataset``: batches of ``Example`` records parsed
into dicts of features.

It stands above ``feedline.data`` (which reads the files) and ``feedline.io`` (which parses the
records), which do not import each other; ``feedline.data.experimental`` imports it on first
access."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from feedline.data.dataset import AUTOTUNE, Dataset
from feedline.data.experimental.functions import parse_batches
from feedline.data.readers.make_csv_dataset import file_names, shuffle_and_repeat
from feedline.data.readers.tfrecord import TFRecordDataset
from feedline.errors import InvalidArgumentError
from feedline.io.features import check_features

_WHAT = "make_batched_features_dataset"


def make_batched_features_dataset(
    file_pattern: str | Sequence[str],
    batch_size: int,
    features: Mapping[str, Any],
    reader: Callable[..., Dataset] = TFRecordDataset,
    label_key: str | None = None,
    reader_args: Sequence[Any] | None = None,
    num_epochs: int | None = None,
    shuffle: bool = True,
    shuffle_buffer_size: int = 10000,
    shuffle_seed: int | None = None,
    prefetch_buffer_size: int | None = None,
    reader_num_threads: int | None = None,
    parser_num_threads: int | None = None,
    sloppy_ordering: bool = False,
    drop_final_batch: bool = False,
) -> Dataset:
    """Batches of ``Example`` records read from files and parsed with
    ``feedline.io.parse_example`` (tf.data's ``make_batched_features_dataset``).

    Each element is a dict of feature name -> a batch of its values (``features`` maps names
    to ``FixedLenFeature`` / ``VarLenFeature``; a ``VarLenFeature`` gives a ``SparseArray`` of
    dense shape ``[batch, longest]``), or ``(features, label)`` where ``label_key`` names the
    label feature. The files matching ``file_pattern`` are shuffled, read
    ``reader_num_threads`` at a time by ``reader(filename, *reader_args)``; records are
    shuffled in a buffer of ``shuffle_buffer_size``, repeated ``num_epochs`` times (forever
    where None, and then every batch is full), batched and parsed on ``parser_num_threads``.

    Example:
      >>> import os, tempfile
      >>> import numpy as np
      >>> from feedline.io import FixedLenFeature, TFRecordWriter
      >>> from feedline.train import Example, Feature, Features, Int64List
      >>> path = os.path.join(tempfile.mkdtemp(), "a.tfrecord")
      >>> with TFRecordWriter(path) as writer:
      ...     for v in range(3):
      ...         writer.write(Example(features=Features(feature={
      ...             "v": Feature(int64_list=Int64List(value=[v]))})).SerializeToString())
      >>> ds = make_batched_features_dataset(
      ...     path, 2, {"v": FixedLenFeature([], np.int64)}, num_epochs=1, shuffle=False)
      >>> [batch["v"].tolist() for batch in ds]
      [[0, 1], [2]]
    """
    check_features(features)
    if label_key is not None and label_key not in features:
        raise InvalidArgumentError(
            f"{_WHAT}: label_key {label_key!r} is not one of the features {sorted(features)}"
        )
    names = file_names(file_pattern, _WHAT)
    args = tuple(reader_args or ())
    threads = 1 if reader_num_threads is None else reader_num_threads
    parsers = 2 if parser_num_threads is None else parser_num_threads

    def read(filename: Any) -> Dataset:
        return reader(filename, *args)

    files = Dataset.from_tensor_slices(names)
    if shuffle:
        files = files.shuffle(len(names), seed=shuffle_seed)
    dataset = files.interleave(
        read,
        cycle_length=threads if threads != AUTOTUNE else None,
        num_parallel_calls=None if threads == 1 else threads,
        deterministic=None if threads == 1 else not sloppy_ordering,
    )
    spec = dataset.element_spec
    if isinstance(spec, tuple) and len(spec) == 2:
        dataset = dataset.map(lambda _key, value: value)  # (key, value) readers: the values
    dataset = shuffle_and_repeat(dataset, num_epochs, shuffle, shuffle_buffer_size, shuffle_seed)
    dataset = dataset.batch(batch_size, drop_remainder=drop_final_batch or num_epochs is None)
    dataset = parse_batches(dataset, features, parsers, label_key=label_key)
    return dataset.prefetch(AUTOTUNE if prefetch_buffer_size is None else prefetch_buffer_size)
