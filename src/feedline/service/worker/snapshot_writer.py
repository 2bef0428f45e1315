"""A worker's part of ``distributed_save``: it writes the streams the dispatcher hands it.

One thread per worker asks the dispatcher for a stream (``GetSnapshotStream``), runs the
save's dataset over the stream's source units (``split_source``; the whole dataset where its
source does not split), writes the elements as chunks (``_snapshot_streams.StreamWriter``:
each committed within a few MB or seconds), asking the dispatcher to commit each chunk and
the stream's end (``SnapshotProgress``). A stream that a worker takes over from a dead one
starts after the chunks already committed, which the dispatcher hands over with it. A worker
refused a chunk (the dispatcher dropped it and handed its stream to another) leaves the
stream and asks for another. A stream whose files cannot be written is logged and tried again
after a pause, so a passing failure (a store that is briefly unreachable) does not end the
save; a dataset that raises fails the save (the dispatcher writes its ``ERROR`` file).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import cloudpickle

from feedline.data.dataset import Dataset
from feedline.data.ops import _snapshot_fs as fs
from feedline.data.ops._snapshot_format import shard_dir
from feedline.data.ops._snapshot_streams import StreamWriter
from feedline.errors import UnavailableError
from feedline.service.protocol import (
    GetDatasetDefRequest,
    GetSnapshotStreamRequest,
    SnapshotProgressRequest,
    SnapshotStreamReply,
)
from feedline.service.worker.split_source import with_split_source

__all__ = ["SnapshotHost", "SnapshotWriterLoop"]

logger = logging.getLogger(__name__)

#: The longest error message a worker reports.
_MAX_ERROR_CHARS = 4000
#: How long a worker without a stream to write waits before it asks again.
POLL_S = 1.0


class SnapshotHost(Protocol):
    """What the writer needs of its worker."""

    @property
    def worker_address(self) -> str:
        """The worker's address, as the dispatcher knows it."""
        ...

    def call_dispatcher(
        self, method: str, header: dict[str, Any], what: str
    ) -> tuple[dict[str, Any], list[memoryview]]:
        """One call to the dispatcher, tried again while it cannot be reached."""
        ...


class _DatasetError(Exception):
    """The save's dataset raised while a stream was written (not the writing of files)."""


def _elements(iterator: Iterator[Any]) -> Iterator[Any]:
    """The elements of ``iterator``; what it raises comes as a ``_DatasetError``."""
    while True:
        try:
            element = next(iterator)
        except StopIteration:
            return
        except Exception as error:
            raise _DatasetError(f"{type(error).__name__}: {error}") from error
        yield element


class _OneSplit:
    """A split provider that hands out ``units`` once per repetition: a stream's part of the
    source."""

    def __init__(self, units: Sequence[int]) -> None:
        self._units = list(units)
        self._given: set[int] = set()

    def next_split(self, repetition: int) -> list[int] | None:
        if repetition in self._given:
            return None
        self._given.add(repetition)
        return self._units


class SnapshotWriterLoop:
    """Asks for streams and writes them until ``stopped`` is set (``run`` is its thread).

    Args:
      host: the worker (its address and its calls to the dispatcher).
      stopped: set when the worker stops; a stream being written is left as it is, its
        committed chunks kept for whoever takes it over.
      poll_s: the pause between two asks when there is nothing to write.
    """

    def __init__(self, host: SnapshotHost, stopped: threading.Event, poll_s: float = POLL_S):
        self._host = host
        self._stopped = stopped
        self._poll_s = poll_s
        self._datasets: dict[str, Dataset] = {}

    def run(self) -> None:
        pause = 0.0
        while not self._stopped.wait(pause):
            pause = self._poll_s
            try:
                reply, _ = self._host.call_dispatcher(
                    "GetSnapshotStream",
                    GetSnapshotStreamRequest(self._host.worker_address).to_header(),
                    "asking for a snapshot stream to write",
                )
                stream = SnapshotStreamReply.from_header(reply)
                if stream is not None and self.write(stream):
                    pause = 0.0
            except UnavailableError as error:  # the heartbeat says so already
                logger.debug("worker %s: %s", self._host.worker_address, error)
            except Exception:
                if self._stopped.is_set():
                    return
                logger.exception(
                    "worker %s: writing a snapshot stream failed; trying again",
                    self._host.worker_address,
                )

    def write(self, stream: SnapshotStreamReply) -> bool:
        """Writes ``stream`` to its end and reports it; False where the worker stopped first."""
        dataset = self._dataset(stream)
        if stream.units is not None:
            dataset = with_split_source(dataset, _OneSplit(stream.units))
        directory = shard_dir(fs.join(stream.path, stream.run), stream.stream)

        def ask(chunks: int, elements: int, nbytes: int, chunk: tuple[str, int] | None) -> bool:
            request = SnapshotProgressRequest(
                self._host.worker_address,
                stream.path,
                stream.stream,
                chunks,
                elements,
                nbytes,
                chunk is None,
                generation=stream.generation,
                chunk=None if chunk is None else chunk[0],
                count=0 if chunk is None else chunk[1],
            )
            reply, _ = self._host.call_dispatcher(
                "SnapshotProgress",
                request.to_header(),
                f"committing to stream {stream.stream} of the save to {stream.path}",
            )
            return reply.get("accepted") is True

        writer = StreamWriter(
            directory,
            dataset.element_spec,
            stream.codec,
            generation=stream.generation,
            chunks=stream.chunks,
            accept=ask,
        )
        iterator = iter(dataset)
        try:
            complete = writer.write(_elements(iterator), self._stopped.is_set)
        except _DatasetError as error:  # the save fails: running the stream again cannot help
            logger.error(
                "worker %s: the dataset of the save to %s raised in stream %d: %s",
                self._host.worker_address,
                stream.path,
                stream.stream,
                error,
            )
            request = SnapshotProgressRequest(
                self._host.worker_address,
                stream.path,
                stream.stream,
                len(writer.chunks),
                writer.committed,
                writer.nbytes,
                False,
                str(error)[:_MAX_ERROR_CHARS],
                generation=stream.generation,
            )
            self._host.call_dispatcher(
                "SnapshotProgress", request.to_header(), f"reporting the failure of {stream.path}"
            )
            return False
        finally:
            iterator.close()
        if writer.revoked:
            logger.warning(
                "worker %s: stream %d of the save to %s was handed to another worker; what this "
                "one wrote since is not committed",
                self._host.worker_address,
                stream.stream,
                stream.path,
            )
        return complete

    def _dataset(self, stream: SnapshotStreamReply) -> Dataset:
        cached = self._datasets.get(stream.fingerprint)
        if cached is None:
            _, buffers = self._host.call_dispatcher(
                "GetDatasetDef",
                GetDatasetDefRequest(stream.dataset_id).to_header(),
                f"fetching dataset {stream.dataset_id} for a snapshot stream",
            )
            cached = cloudpickle.loads(buffers[0])
            self._datasets = {stream.fingerprint: cached}  # one save at a time, mostly
        return cached
