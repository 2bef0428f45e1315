"""File readers: datasets whose elements come from files.

Every reader, and ``Dataset.list_files``, sets the class attribute ``_is_file_reader = True``;
FILE auto-sharding looks for it. A reader exposes the files it reads in one of two ways:

- given names (a str, a list, a string array), ``reader._filenames`` is the tuple of names, in
  the order they are read, and ``reader.inputs`` is empty;
- given a Dataset of scalar file names (``TFRecordDataset(Dataset.list_files(pattern))``),
  ``reader._filenames`` is None and ``reader.inputs[0]`` is that Dataset.

``ListFilesDataset`` is a source of names: its ``_filenames`` are the sorted matches (before
the per-pass shuffle). ``reader._with_files(names)`` returns the same reader (same arguments)
over other files, a list of names or a Dataset of names: FILE auto-sharding gives each worker
its share that way, e.g. ``names[worker_index::num_workers]`` of the sorted list. Sharding the
sorted names of ``list_files``, rather than its shuffled output, gives disjoint shares even
without a seed. Where readers are made inside an ``interleave`` or ``flat_map`` function
(``list_files(p).interleave(TFRecordDataset)``, ``from_tensor_slices(paths).interleave(lambda
p: TextLineDataset(p))``), FILE auto-sharding shards the names feeding that function: the
``ListFilesDataset`` upstream, or else the names themselves (``feedline.data.auto_shard``).

Reader iterators save, per open file, its name and the position after the last element handed
out (a byte offset for TFRecord, text and CSV files, a row for Parquet and NumPy files), and
restore by opening the file there.
"""

from typing import TYPE_CHECKING

from feedline import _porting
from feedline.data.readers.csv import CsvDataset
from feedline.data.readers.fixed_length_record import FixedLengthRecordDataset
from feedline.data.readers.list_files import ListFilesDataset
from feedline.data.readers.npy import NpyDataset
from feedline.data.readers.text_line import TextLineDataset
from feedline.data.readers.tfrecord import TFRecordDataset

__all__ = [
    "CsvDataset",
    "FixedLengthRecordDataset",
    "ListFilesDataset",
    "NpyDataset",
    "ParquetDataset",
    "TFRecordDataset",
    "TextLineDataset",
]

# ``ParquetDataset`` (and pyarrow) is imported on first use: most programs read no Parquet, and
# every process that imports feedline.data would pay for pyarrow.
if TYPE_CHECKING:
    from feedline.data.readers.parquet import ParquetDataset

__getattr__, __dir__ = _porting.lazy_attributes(
    __name__, {"ParquetDataset": "feedline.data.readers.parquet:ParquetDataset"}
)
