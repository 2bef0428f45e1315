"""The iterator that every file reader uses: files one after another, or several at once.

A reader opens one file at a position (``dataset._open_file(name, position)``) and gets a
``FileReader``, whose ``read_block`` returns the next ``Block`` of items, or None at the end of
the file. A block knows the file position after each of its items, so the iterator's state is
exact without ever pausing a reading thread: for each open file, its name and the position
after the last item handed out.

With ``cycle_length`` > 1 the iterator reads that many files at once, each on its own thread,
and hands out their items in the order of ``interleave(cycle_length=n, block_length=1)``:
one item from each open file in turn; a finished file's slot takes the next file when the cycle
comes back to it. With 3 files of 2, 3 and 4 records and ``cycle_length=2``::

    f0r0 f1r0 f0r1 f1r1 f1r2 f2r0 f2r1 f2r2 f2r3

An error while reading a file (a corrupted record) ends that file: the items before it are
handed out, then the error is raised, and the next call goes on with the next file (as in
tf.data, so that ``ignore_errors`` skips the rest of a damaged file). A reader that can go on
after a bad record (a malformed CSV line) raises ``RecordError`` instead: the error reaches the
user and the next call goes on with the record after it, as TensorFlow's CSV reader does.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

import numpy as np

from feedline import _fs, structure
from feedline.data.dataset import Dataset, DatasetIterator, IteratorContext
from feedline.data.ops._background import END, ERROR, Producer
from feedline.data.readers._blocks import Block, RecordError
from feedline.data.readers._files import decode_name
from feedline.errors import DataLossError

_BLOCKS_AHEAD = 2


class FileReader(Protocol):
    def read_block(self) -> Block | None: ...

    def close(self) -> None: ...


class _Slot:
    """One file being read: its reader (on a thread when ``threaded``) and the current block.

    ``version`` is the version of the object being read (``_fs.object_version``; None for a
    local file): the one a listing of the pipeline found (``IteratorContext.listed_versions``),
    the one a saved state or a reopening names, or else the one first read. The pipeline's
    ``pin_version`` (a split of a fault-tolerant job) is told about it before any item of the
    file is handed out. The iterator's state saves it, so that a file read again from a
    position is that version or a ``DataLossError``, never a mix of two."""

    __slots__ = (
        "block",
        "ctx",
        "dataset",
        "index",
        "name",
        "position",
        "producer",
        "reader",
        "size",
        "threaded",
        "version",
    )

    def __init__(self, ctx: IteratorContext) -> None:
        self.ctx = ctx
        self.name: str | None = None
        self.version: Any = None
        self.position = 0
        self.reader: FileReader | None = None
        self.producer: Producer | None = None
        self.block: Block | None = None
        self.index = 0
        self.size = 0
        self.dataset: Any = None
        self.threaded = False

    def open(
        self,
        dataset: Any,
        name: str,
        position: int,
        threaded: bool,
        early: _EarlyOpen | None = None,
        version: Any = None,
    ) -> None:
        """Opens ``name`` at ``position`` (taking the reader ``early`` opened, where it did), as
        ``version`` where given, else as the version the pipeline listed, if any."""
        if version is None:
            version = self.ctx.listed_versions.get(name)
        opened = early.take(name, position, version) if early is not None else None
        if opened is None:
            size = self.ctx.listed_size(name, version)
            opened = _open_versioned(dataset, name, position, version, size)
        reader, self.version = opened
        if self.version is not None and self.ctx.pin_version is not None:
            self._pin(reader, name, position)
        self.reader = reader
        self.dataset, self.threaded = dataset, threaded
        self.name = name
        self.position = position
        self.block = None
        self.index = self.size = 0
        if threaded:
            self.producer = Producer(
                lambda: _pull_block(reader), lambda: _BLOCKS_AHEAD, name="feedline-file-reader"
            )

    def _pin(self, reader: FileReader, name: str, position: int) -> None:
        """Tells ``pin_version`` the version opened; another one held is a DataLossError."""
        try:
            held = self.ctx.pin_version(name, self.version)  # type: ignore[misc]
        except BaseException:
            reader.close()
            raise
        if held != self.version:
            reader.close()
            raise DataLossError(
                f"{name!r} changed since this split was first read (version {held!r} then, "
                f"now {self.version!r}); a split run again reads the objects as its first run "
                "did: the job cannot deliver the rest of this split",
                filename=name,
                offset=position,
            )

    def consumed_position(self) -> int:
        if self.block is None:
            return self.position
        return self.block.end(self.index - 1) if self.index else self.block.start

    def fetch(self) -> bool:
        """Moves to the next block; False (and the slot closed) at the end of the file."""
        if self.block is not None:
            self.position = self.consumed_position()
        try:
            if self.producer is not None:
                (kind, value), _ = self.producer.get()
                if kind == ERROR:
                    raise value.with_traceback(value.__traceback__)
                block = None if kind == END else value
            else:
                block = self.reader.read_block()  # type: ignore[union-attr]
        except RecordError as bad:
            # One bad record: the file goes on after it, read afresh from there.
            name, version = self.name, self.version
            self.close()
            self.open(
                self.dataset,
                name,  # type: ignore[arg-type]
                bad.position,
                self.threaded,
                version=version,
            )
            raise bad.error from None
        except BaseException:
            self.close()
            raise
        if block is None:
            self.close()
            return False
        self.block, self.index, self.size = block, 0, len(block)
        return True

    def close(self) -> None:
        if self.producer is not None:
            self.producer.stop()
            self.producer = None
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        self.name = self.version = None
        self.block = None
        self.index = self.size = 0


def _open_versioned(
    dataset: Any, name: str, position: int, version: Any, size: int | None = None
) -> tuple[FileReader, Any]:
    """``dataset._open_file(name, position, version)`` and the version it opened: ``version``
    where given, else the one first read (None for a local file). ``size`` is the object's size
    as ``version`` where a listing gave it (``_fs.opening_listed``)."""
    if version is not None or _fs.is_local(name):
        with _fs.opening_listed(name, version, size):
            return dataset._open_file(name, position, version), version
    with _fs.recording_versions() as seen:
        reader = dataset._open_file(name, position, None)
    return reader, seen.get(name)


def _pull_block(reader: FileReader) -> Block:
    block = reader.read_block()
    if block is None:
        raise StopIteration
    return block


class _EarlyOpen:
    """Opens a remote file on a daemon thread as soon as the iterator exists, so that its first
    requests (and its read-ahead) start before the first element is asked for: the datasets an
    ``interleave`` opens for its cycle all start fetching at once, whatever its parallelism.
    A file whose opening makes no request (a reader that reads nothing to open it, of a file
    whose listing gave its size and version: ``_fs.opens_without_request``) is opened at once
    instead, on the caller's thread: only its read-ahead's thread starts. ``take`` hands over
    the reader (or raises the error of opening it) when the file is opened at position 0; a
    reader never taken is closed."""

    _WAIT = 1.0

    def __init__(
        self, dataset: Any, name: str, listed_version: Any, size: int | None = None
    ) -> None:
        self.name = name
        self._dataset = dataset
        self._listed_version = listed_version
        self._size = size
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._reader: FileReader | None = None
        self._version: Any = None
        self._error: BaseException | None = None
        self._abandoned = False
        if dataset._opens_without_reading and _fs.opens_without_request(name, listed_version, size):
            self._run()  # nothing to wait for: a thread of its own would only cost its start
        else:
            threading.Thread(target=self._run, name="feedline-early-open", daemon=True).start()

    def _run(self) -> None:
        try:
            reader, version = _open_versioned(
                self._dataset, self.name, 0, self._listed_version, self._size
            )
        except BaseException as error:  # raised by ``take``, where the file is opened
            self._error = error
            self._done.set()
            return
        with self._lock:
            self._reader, self._version = reader, version
            abandoned = self._abandoned
            self._done.set()
        if abandoned:
            reader.close()

    def take(self, name: str, position: int, version: Any) -> tuple[FileReader, Any] | None:
        """The reader opened early and its version, if it is of ``name`` at ``position`` and
        ``version`` (where given); None otherwise (and whatever was opened early is closed)."""
        if name != self.name or position != 0 or version != self._listed_version:
            self.close()
            return None
        while not self._done.wait(self._WAIT):  # bounded by the open's retries and timeouts
            pass
        if self._error is not None:
            error, self._error = self._error, None
            raise error.with_traceback(error.__traceback__)
        reader, self._reader = self._reader, None
        return reader, self._version  # type: ignore[return-value]

    def close(self) -> None:
        with self._lock:
            self._abandoned = True
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()


class _Names:
    """The file names to read: a list, or the elements of an input Dataset of names."""

    def __init__(self, dataset: Any, ctx: IteratorContext) -> None:
        self._names: tuple[str, ...] | None = dataset._filenames
        self._index = 0
        self._input: DatasetIterator | None = None
        if self._names is None:
            source: Dataset = dataset._inputs[0]
            self._input = source._iterator(ctx)

    def next(self) -> str | None:
        if self._input is None:
            if self._index >= len(self._names):  # type: ignore[arg-type]
                return None
            self._index += 1
            return self._names[self._index - 1]  # type: ignore[index]
        try:
            value = self._input._next()
        except StopIteration:
            return None
        return decode_name(np.asarray(value))

    def get_state(self) -> dict[str, Any]:
        if self._input is None:
            return {"index": self._index}
        return {"input": self._input.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        if self._input is None:
            self._index = int(state["index"])
        else:
            self._input.set_state(state["input"])

    def close(self) -> None:
        if self._input is not None:
            self._input.close()


class FilesIterator(DatasetIterator):
    """Items of a reader's files, one file at a time or ``cycle_length`` files round-robin.

    Its API is single-threaded; with ``cycle_length`` > 1 each open file is read on a daemon
    thread a few blocks ahead. ``batchable`` readers (one row per item) also get ``_next_batch``;
    with several files at once, only readers of ``RecordBlock``s (``records=True``).
    """

    def __init__(
        self,
        dataset: Dataset,
        ctx: IteratorContext,
        cycle_length: int = 1,
        batchable: bool = True,
        records: bool = False,
    ) -> None:
        super().__init__(dataset, ctx)
        self._names = _Names(dataset, ctx)
        self._names_done = False
        self._slots = [_Slot(ctx) for _ in range(cycle_length)]
        self._threaded = cycle_length > 1
        self._cycle = 0
        self._early: _EarlyOpen | None = None
        names = getattr(dataset, "_filenames", None)
        if names and not _fs.is_local(names[0]):
            version = ctx.listed_versions.get(names[0])
            self._early = _EarlyOpen(dataset, names[0], version, ctx.listed_size(names[0], version))
        if self._threaded:
            self._next = self._next_round_robin  # type: ignore[method-assign]
            if records:
                self._next_batch = self._next_batch_records
        elif batchable:
            self._next_batch = self._next_batch_sequential

    def _next(self) -> Any:
        slot = self._slots[0]
        while True:
            i = slot.index
            if i < slot.size:
                slot.index = i + 1
                return slot.block.element(i)  # type: ignore[union-attr]
            if not self._advance(slot):
                raise StopIteration

    def _advance(self, slot: _Slot) -> bool:
        """Moves ``slot`` to its next block, or to the next file; False when none is left."""
        while True:
            if slot.name is not None:
                if slot.fetch():
                    return True
                continue
            name = None if self._names_done else self._names.next()
            if name is None:
                self._names_done = True
                return False
            slot.open(self._dataset, name, 0, self._threaded, self._take_early())

    def _next_batch_sequential(self, n: int) -> Any:
        slot = self._slots[0]
        pieces = []
        got = 0
        while got < n:
            lo = slot.index
            if lo < slot.size:
                hi = min(slot.size, lo + n - got)
                slot.index = hi
                pieces.append(slot.block.batch(lo, hi))  # type: ignore[union-attr]
                got += hi - lo
            elif not self._advance(slot):
                break
        if not pieces:
            raise StopIteration
        if len(pieces) == 1:
            return pieces[0]
        return structure.map_structure(lambda *parts: np.concatenate(parts), *pieces)

    def _next_round_robin(self) -> Any:
        block, i = self._take_round_robin()
        return block.element(i)

    def _next_batch_records(self, n: int) -> np.ndarray:
        """Up to ``n`` records in round-robin order, stacked once (``RecordBlock`` readers)."""
        records: list[bytes] = []
        try:
            while len(records) < n:
                block, i = self._take_round_robin()
                records.append(block.records[i])  # type: ignore[attr-defined]
        except StopIteration:
            if not records:
                raise
        return structure.bytes_array(records)

    def _take_round_robin(self) -> tuple[Block, int]:
        """The block and index of the next item in round-robin order."""
        slots = self._slots
        while True:
            cycle = self._cycle
            slot = slots[cycle]
            if slot.name is not None:
                if slot.index < slot.size or self._fetch(slot):
                    i = slot.index
                    slot.index = i + 1
                    self._cycle = (cycle + 1) % len(slots)
                    return slot.block, i  # type: ignore[return-value]
                self._cycle = (cycle + 1) % len(slots)
                continue
            name = None if self._names_done else self._names.next()
            if name is not None:
                slot.open(self._dataset, name, 0, True, self._take_early())
                continue
            self._names_done = True
            if all(s.name is None for s in slots):
                raise StopIteration
            self._cycle = (cycle + 1) % len(slots)

    def _fetch(self, slot: _Slot) -> bool:
        try:
            return slot.fetch()
        except BaseException:
            self._cycle = (self._cycle + 1) % len(self._slots)
            raise

    def _get_state(self) -> dict[str, Any]:
        return {
            "names": self._names.get_state(),
            "names_done": self._names_done,
            "cycle": self._cycle,
            "files": [slot.name or "" for slot in self._slots],
            "positions": [slot.consumed_position() if slot.name else 0 for slot in self._slots],
            "versions": [slot.version if slot.name else None for slot in self._slots],
        }

    def _take_early(self) -> _EarlyOpen | None:
        """The early opener, once: only the first file opened may be what it opened."""
        early, self._early = self._early, None
        return early

    def _set_state(self, state: dict[str, Any]) -> None:
        early = self._take_early()
        if early is not None:
            early.close()
        for slot in self._slots:
            slot.close()
        self._names.set_state(state["names"])
        self._names_done = bool(state["names_done"])
        self._cycle = int(state["cycle"])
        files, positions = list(state["files"]), list(state["positions"])
        # A state saved before versions were kept holds no file to one.
        versions = list(state.get("versions") or [None] * len(files))
        if len(files) != len(self._slots):
            raise TypeError(
                f"the state reads {len(files)} files at once, this iterator reads "
                f"{len(self._slots)}"
            )
        for slot, name, position, version in zip(
            self._slots, files, positions, versions, strict=True
        ):
            if name:
                slot.open(self._dataset, name, int(position), self._threaded, version=version)

    def _close(self) -> None:
        early = self._take_early()
        if early is not None:
            early.close()
        for slot in self._slots:
            slot.close()
        self._names.close()
