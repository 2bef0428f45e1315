"""``feedline.io``: TFRecord files and ``Example`` parsing (the ``tf.io`` names feedline offers).

Example:
  >>> import os, tempfile
  >>> import numpy as np
  >>> from feedline.train import Example, Feature, Features, Int64List
  >>> path = os.path.join(tempfile.mkdtemp(), "data.tfrecord")
  >>> with TFRecordWriter(path) as writer:
  ...     for label in (3, 4):
  ...         ex = Example(features=Features(feature={
  ...             "label": Feature(int64_list=Int64List(value=[label]))}))
  ...         writer.write(ex.SerializeToString())
  >>> from feedline.data import TFRecordDataset
  >>> batch = next(iter(TFRecordDataset(path).batch(2)))
  >>> parse_example(batch, {"label": FixedLenFeature([], np.int64)})["label"].tolist()
  [3, 4]
"""

from feedline.io import gfile
from feedline.io.csv_decode import decode_csv
from feedline.io.decode import decode_raw
from feedline.io.features import FixedLenFeature, FixedLenSequenceFeature, VarLenFeature
from feedline.io.parsing import parse_example, parse_single_example
from feedline.io.tfrecord import TFRecordOptions, TFRecordWriter

__all__ = [
    "FixedLenFeature",
    "FixedLenSequenceFeature",
    "TFRecordOptions",
    "TFRecordWriter",
    "VarLenFeature",
    "decode_csv",
    "decode_raw",
    "gfile",
    "parse_example",
    "parse_single_example",
]
