"""What readers of byte streams (TFRecord files, text lines) share: their arguments and iterator."""

from __future__ import annotations

from feedline._tfrecord import check_compression
from feedline.data.dataset import DatasetIterator, IteratorContext
from feedline.data.readers._files import (
    FileNames,
    FileReaderMixin,
    check_buffer_size,
    check_parallel_reads,
)
from feedline.data.readers._iterator import FilesIterator
from feedline.structure import BYTES, TensorSpec


class ByteStreamReaderMixin(FileReaderMixin):
    """A reader of byte records from (possibly compressed) files, read ``num_parallel_reads`` at
    a time; each element is one record as a 0-d object array of ``bytes``."""

    _opens_without_reading = True  # a header, if any, is skipped by the first read

    def __init__(
        self,
        filenames: FileNames,
        compression_type: str | None = None,
        buffer_size: int | None = None,
        num_parallel_reads: int | None = None,
        name: str | None = None,  # TensorFlow's op name: accepted and unused
    ) -> None:
        name = type(self).__name__
        self._init_files(filenames)
        self._compression = check_compression(compression_type, name)
        self._buffer_size = check_buffer_size(buffer_size, name)
        self._cycle_length = check_parallel_reads(num_parallel_reads, name)
        self._reader_args = {
            "compression_type": compression_type,
            "buffer_size": buffer_size,
            "num_parallel_reads": num_parallel_reads,
        }
        self._element_spec = TensorSpec((), BYTES)

    def _make_iterator(self, ctx: IteratorContext) -> DatasetIterator:
        return FilesIterator(self, ctx, self._cycle_length, records=True)  # type: ignore[arg-type]
