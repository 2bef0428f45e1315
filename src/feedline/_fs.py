"""The one file-system layer: every path feedline reads or writes is a URL served by fsspec.

A path is a plain local path, ``file://...``, or any URL fsspec has a back-end for: ``s3://``
(``s3fs``), ``gs://`` (``gcsfs``), ``az://`` / ``abfs://`` (``adlfs``), ``hdfs://`` (pyarrow),
``memory://`` (in-process, for tests), ... Credentials and endpoints come the way each back-end
reads them (environment, config files), or through ``storage_options``: given to
``filesystem`` directly, or to every file-system call made inside ``with_storage_options(...)``
(what a call that takes ``storage_options=`` and reaches its files through several helpers does).

``filesystem(path)`` gives the fsspec file system and the path on it; ``translate_errors`` turns
what the back-ends raise into feedline's errors, naming the URL: ``NotFoundError``,
``PermissionDeniedError``, ``AlreadyExistsError``. A scheme whose back-end is not installed is an
``InvalidArgumentError`` that names the package to install; a scheme nothing serves is an
``UnimplementedError``.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import io
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, BinaryIO

from feedline._s3_session import use_fast_session
from feedline.errors import (
    AlreadyExistsError,
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    UnimplementedError,
)

if TYPE_CHECKING:
    import fsspec

__all__ = [
    "RemoteReader",
    "as_url",
    "filesystem",
    "is_local",
    "is_transient",
    "join",
    "object_tag",
    "object_version",
    "opening_listed",
    "recording_versions",
    "translate_errors",
    "unstrip",
    "with_storage_options",
]

# The package to install for a scheme whose fsspec back-end is missing, and feedline's extra.
_PACKAGES = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "az": ("adlfs", "azure"),
    "abfs": ("adlfs", "azure"),
    "abfss": ("adlfs", "azure"),
    "adl": ("adlfs", "azure"),
}


def split_protocol(url: str) -> tuple[str | None, str]:
    """``fsspec.core.split_protocol(url)``: the scheme (None for a plain path) and the rest.
    fsspec is imported only for a path that may have a scheme, so that local paths, and
    importing feedline.data, do not load it."""
    if "://" not in url and not url.startswith("data:"):
        return None, url
    from fsspec.core import split_protocol as split

    protocol, rest = split(url)
    return protocol, rest


def as_url(path: Any) -> str:
    """``path`` (a str, bytes or path-like) as a str URL or path."""
    if isinstance(path, bytes):
        return os.fsdecode(path)
    return os.fspath(path)


def is_local(path: Any) -> bool:
    """Whether ``path`` names the local file system (a plain path or ``file://``)."""
    protocol, _ = split_protocol(as_url(path))
    return protocol in (None, "file", "local")


# The storage options of the ``with_storage_options`` block being run (None outside any): what a
# ``filesystem`` call without options of its own uses for a remote URL.
_SCOPED_OPTIONS: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "feedline_storage_options", default=None
)


def check_storage_options(storage_options: Any, operation: str) -> dict[str, Any] | None:
    """``storage_options`` as a dict (None for None or an empty mapping).

    Raises:
      InvalidArgumentError: it is not a mapping with str keys.
    """
    if storage_options is None:
        return None
    if not isinstance(storage_options, Mapping) or not all(
        isinstance(key, str) for key in storage_options
    ):
        raise InvalidArgumentError(
            f"{operation}: storage_options must be a dict of the file system's arguments "
            f"(for s3://, s3fs.S3FileSystem's: key, secret, client_kwargs, ...), got "
            f"{type(storage_options).__name__} {storage_options!r}"
        )
    return dict(storage_options) or None


@contextlib.contextmanager
def with_storage_options(storage_options: Mapping[str, Any] | None) -> Iterator[None]:
    """Every remote URL that ``filesystem`` opens in this block, in this thread (or context),
    without options of its own, is opened with ``storage_options`` (None or empty: the
    options of an enclosing block stay). Local paths take no options.

    Example:
      >>> with with_storage_options({"skip_instance_cache": True}):
      ...     fs, _ = filesystem("memory://scoped/x")
      >>> type(fs).__name__
      'MemoryFileSystem'
    """
    if not storage_options:
        yield
        return
    token = _SCOPED_OPTIONS.set(dict(storage_options))
    try:
        yield
    finally:
        _SCOPED_OPTIONS.reset(token)


def filesystem(
    path: Any, storage_options: Mapping[str, Any] | None = None
) -> tuple[fsspec.AbstractFileSystem, str]:
    """The file system that serves ``path`` and the path on it, made with ``storage_options``
    (the back-end's arguments: for ``s3://``, ``s3fs.S3FileSystem``'s ``key``, ``secret``,
    ``client_kwargs={"endpoint_url": ...}``, ...), or else those of the enclosing
    ``with_storage_options`` block where ``path`` is remote.

    Raises:
      InvalidArgumentError: the scheme's back-end package is not installed (the message names
        it: ``pip install s3fs``).
      UnimplementedError: no fsspec back-end serves the scheme.
    """
    import fsspec
    from fsspec.registry import known_implementations

    url = as_url(path)
    protocol, _ = split_protocol(url)
    if (
        protocol is not None
        and protocol not in known_implementations
        and protocol
        not in (
            "file",
            "local",
        )
    ):
        raise UnimplementedError(
            f"file-system scheme {protocol!r} is not implemented (path {url!r}); fsspec knows "
            f"{', '.join(sorted(p for p in known_implementations if len(p) > 1)[:12])}, ..."
        )
    if storage_options is None and protocol not in (None, "file", "local"):
        storage_options = _SCOPED_OPTIONS.get()
    try:
        fs, inner = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    except ImportError as error:
        package, extra = _PACKAGES.get(protocol or "", (str(error.name or "its back-end"), ""))
        hint = f" (or pip install feedline[{extra}])" if extra else ""
        raise InvalidArgumentError(
            f"reading {protocol}:// paths ({url!r}) needs the package {package}: "
            f"pip install {package}{hint}"
        ) from None
    if protocol in ("s3", "s3a"):
        use_fast_session(fs)
    return fs, inner


def unstrip(fs: fsspec.AbstractFileSystem, inner: str, like: str) -> str:
    """``inner`` (a path on ``fs``) as a URL of the same kind as ``like``: a plain path stays
    plain, a ``s3://bucket/...`` URL gets its scheme back, spelt as ``like`` spells it."""
    protocol, rest = split_protocol(as_url(like))
    if protocol is None:
        return inner
    text = fs.unstrip_protocol(inner)
    if not rest.startswith("/") and text.startswith(f"{protocol}:///"):
        text = f"{protocol}://" + text[len(protocol) + 4 :]
    return text


def join(path: Any, *paths: Any) -> str:
    """``path`` and ``paths`` joined with ``/`` (``os.path.join`` for a plain local path)."""
    url = as_url(path)
    parts = [as_url(p) for p in paths]
    if is_local(url) and "://" not in url:
        return os.path.join(url, *parts)
    for part in parts:
        url = part if "://" in part else url.rstrip("/") + "/" + part.lstrip("/")
    return url


@contextlib.contextmanager
def translate_errors(url: Any, operation: str) -> Iterator[None]:
    """Turns the back-ends' errors into feedline's, naming ``operation`` and ``url``."""
    name = as_url(url)
    try:
        yield
    except (NotFoundError, AlreadyExistsError, PermissionDeniedError, InvalidArgumentError):
        raise
    except FileNotFoundError:
        raise NotFoundError(f"{operation}: {name!r} does not exist", name=name) from None
    except FileExistsError:
        raise AlreadyExistsError(f"{operation}: {name!r} already exists", name=name) from None
    except PermissionError as error:
        raise PermissionDeniedError(f"{operation}: {name!r}: permission denied ({error})") from None
    except IsADirectoryError:
        raise FailedPreconditionError(f"{operation}: {name!r} is a directory") from None
    except NotADirectoryError:
        raise FailedPreconditionError(f"{operation}: {name!r} is not a directory") from None


# What a store's transient failures look like: connection resets, timeouts, 5xx answers and
# throttling reach fsspec's callers as OSError (not these, which are answers, not failures) or
# as the HTTP client's own errors.
_ANSWERS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
_CLIENT_MODULES = ("aiohttp", "botocore", "aiobotocore", "urllib3", "requests", "google")


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` (raised by a store's client) may pass if the request is made again."""
    if isinstance(error, _ANSWERS):
        return False
    if isinstance(error, OSError):
        return True
    return type(error).__module__.split(".")[0] in _CLIENT_MODULES


_TAGS = ("ETag", "etag", "generation", "version_id", "VersionId")


def object_tag(info: Mapping[str, Any]) -> str | int | None:
    """The object's ETag or generation in its ``info`` (a listing's entry, or ``fs.info``),
    which a listing and a read of one version give alike; None where the store has none. Text
    or an int (anything else as text), so that it travels in a checkpoint and a journal and
    reads back equal."""
    for key in _TAGS:
        tag = info.get(key)
        if tag:
            return tag if isinstance(tag, str) or type(tag) is int else str(tag)
    return None


def object_version(info: Mapping[str, Any]) -> str | int:
    """What tells two versions of an object apart, from its ``fs.info``: its ETag or
    generation, else its size and time (as one string, so that a version written in a
    checkpoint's state or a journal reads back equal)."""
    tag = object_tag(info)
    if tag is not None:
        return tag
    when = info.get("mtime") or info.get("LastModified") or info.get("created")
    return f"{info.get('size')}@{when}"


# While ``recording_versions`` runs, the version of each object a ``RemoteReader`` opens.
_OPENED: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "feedline_opened_versions", default=None
)


@contextlib.contextmanager
def recording_versions() -> Iterator[dict[str, Any]]:
    """Inside the block (in this thread), each ``RemoteReader`` opened records the version it
    reads (``object_version``) in the dict given, under its URL: what a reader that opens a
    file holds it to when the file is read again (a checkpoint's position, a split run again)."""
    seen: dict[str, Any] = {}
    token = _OPENED.set(seen)
    try:
        yield seen
    finally:
        _OPENED.reset(token)


# While ``opening_listed`` runs, the object that a ``RemoteReader`` may open as a listing found it.
_LISTED: contextvars.ContextVar[tuple[str, Any, int] | None] = contextvars.ContextVar(
    "feedline_listed_object", default=None
)


@contextlib.contextmanager
def opening_listed(url: str, version: Any, size: int | None) -> Iterator[None]:
    """Inside the block (in this thread), a ``RemoteReader`` of ``url`` held to ``version`` (its
    ``listed_version``) takes ``size`` (bytes, what the listing that found that version gave)
    as the object's size instead of asking the store, where the store's reads can carry the
    version they expect (``_opens_as_listed``): no request before the first read. Nothing
    changes where ``version`` or ``size`` is None."""
    token = _LISTED.set(None if version is None or size is None else (url, version, size))
    try:
        yield
    finally:
        _LISTED.reset(token)


def opens_without_request(url: str, version: Any, size: int | None) -> bool:
    """Whether a ``RemoteReader`` of ``url`` opened inside ``opening_listed(url, version,
    size)`` makes no request before its first read (the listing gave all it needs)."""
    if version is None or size is None or is_local(url):
        return False
    try:
        fs = filesystem(url)[0]
    except Exception:  # (raised where the file is opened)
        return False
    return _opens_as_listed(fs)


def _opens_as_listed(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether ``fs``'s files can be opened from a listing's size and ETag: s3fs's, whose ranged
    reads then carry ``If-Match`` with the ETag (the store refuses them once the object is
    another version). A version-aware s3fs reads by version id, which a listing lacks."""
    return type(fs).__module__.split(".")[0] == "s3fs" and not getattr(fs, "version_aware", True)


class _RangedFile:
    """One open object read from a byte position by the back-end's file object (ranged GETs of
    ``block_size`` bytes; ``cache_type="none"``, so a read of n bytes asks for n bytes), made
    again at the offset reached after a transient failure, with the object's first version
    checked before it is opened again."""

    def __init__(self, source: RemoteReader, position: int) -> None:
        self._source = source
        self.position = position
        self._file: Any = None
        self._open()

    def _open(self) -> None:
        source = self._source

        def open_at() -> Any:
            from fsspec.implementations.memory import MemoryFileSystem

            if isinstance(source._fs, MemoryFileSystem):
                # memory:// hands every reader of an object the same file (one position for
                # all): each reader gets a copy of its own.
                file: Any = io.BytesIO(source._fs.cat_file(source._inner))
            else:
                listed = source._listed_size
                file = source._fs.open(
                    source._inner,
                    "rb",
                    block_size=source._block_size,
                    cache_type="none",
                    **({} if listed is None else {"size": listed}),
                )
                if listed is not None:  # what s3fs's file would learn with a HEAD
                    tag = source._version
                    file.details = {"name": source._inner, "size": listed, "ETag": tag}
                    file.read_kw = {**file.read_kw, "IfMatch": tag}
            file.seek(self.position)
            return file

        self._file = source._call(open_at)

    def _reopen(self) -> None:
        """Opens the object again at the current position, if it is still the same version."""
        self.close()
        self._source.check_version(self.position)
        self._open()

    def read(self, n: int) -> bytes:
        source = self._source
        for attempt in range(source._attempts):
            try:
                with translate_errors(source.url, source._operation):
                    data = self._file.read(n)
                self.position += len(data)
                return bytes(data)
            except Exception as error:
                if not is_transient(error) or attempt == source._attempts - 1:
                    raise
                time.sleep(source._backoff * 2**attempt)
                self._reopen()
        raise AssertionError("unreachable")

    def seek(self, position: int) -> None:
        self._source._call(lambda: self._file.seek(position))
        self.position = position

    def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.close()
            except Exception as error:  # a broken connection may fail to close: it is dropped
                if not is_transient(error):
                    raise


class _ReadAhead:
    """Reads an object ahead of its consumer on named daemon threads, holding at most
    ``window`` bytes that the consumer has not taken (``buffered``; ``peak`` is the most it
    ever held), in ranged requests of ``block`` bytes.

    With ``parallel`` > 1, a back-end file that fetches byte ranges (``_fetch_range``: s3fs,
    gcsfs, adlfs), a window of at least two blocks and more than one block left,
    ``min(parallel, window // block)`` threads each fetch the next block not yet asked for: as
    many requests of one object are in flight at once (the same requests as one after
    another, so no more of them), the blocks are handed out in order, and what is held plus
    what is asked for stays within ``window``. Otherwise one thread reads the blocks one after
    another. A thread's error (after the retries) is raised
    to the consumer at the position it happened, with its traceback; ``close`` stops the
    threads after their requests in flight."""

    _WAIT = 0.5  # seconds between the checks of a waiting side

    def __init__(
        self,
        source: RemoteReader,
        position: int,
        file: _RangedFile | None,
        block: int,
        window: int,
        parallel: int = 1,
    ) -> None:
        self.position = position  # the consumer's
        self._source = source
        self._block = block
        self._window = window
        self._chunks: collections.deque[memoryview] = collections.deque()
        self.buffered = 0
        self.peak = 0
        self._end = False
        self._error: BaseException | None = None
        self._closed = False
        self._cond = threading.Condition()
        # The parallel reading's state: the back-end's ranged fetch, the first byte not yet
        # asked for, the first not yet handed to the consumer, the bytes asked for and not yet
        # received, the blocks received out of order (or their errors), the threads running.
        self._file = file
        self._fetch_range: Callable[[int, int], bytes] | None = (
            getattr(file._file, "_fetch_range", None) if file else None
        )
        self._next = self._handed = position
        self._asked = 0
        self._ready: dict[int, bytes | BaseException] = {}
        self._running = 0
        threads = min(parallel, window // block)
        if threads > 1 and self._fetch_range is not None and source.size - position > block:
            self._running = threads
            self._threads = [
                threading.Thread(target=self._run_parallel, name="feedline-read-ahead", daemon=True)
                for _ in range(threads)
            ]
        else:
            self._threads = [
                threading.Thread(
                    target=self._run, args=(position, file), name="feedline-read-ahead", daemon=True
                )
            ]
        for thread in self._threads:
            thread.start()

    def _run(self, position: int, file: _RangedFile | None) -> None:
        try:
            if file is None:
                file = _RangedFile(self._source, position)
            while True:
                with self._cond:
                    while not self._closed and self.buffered + self._block > self._window:
                        self._cond.wait(self._WAIT)
                    if self._closed:
                        return
                data = file.read(self._block)
                with self._cond:
                    if self._closed:
                        return
                    if data:
                        self._hold(data)
                    else:
                        self._end = True
                    self._cond.notify_all()
                if not data:
                    return
        except BaseException as error:  # handed to the consumer, who raises it
            with self._cond:
                self._error = error
                self._cond.notify_all()
        finally:
            if file is not None:
                self._close_file(file)

    def _hold(self, data: bytes) -> None:
        """Adds ``data`` to what the consumer takes next (the lock held)."""
        self._chunks.append(memoryview(data))
        self.buffered += len(data)
        self.peak = max(self.peak, self.buffered)

    def _run_parallel(self) -> None:
        """One of the threads of a parallel read-ahead: fetches the next block not yet asked
        for while the window has room, until the end of the object."""
        size = self._source.size
        try:
            while True:
                with self._cond:
                    while not self._closed and self._error is None and self._next < size:
                        held = self.buffered + self._asked
                        if held == 0 or held + self._block <= self._window:
                            break
                        self._cond.wait(self._WAIT)
                    if self._closed or self._error is not None or self._next >= size:
                        return
                    start, end = self._next, min(self._next + self._block, size)
                    self._next = end
                    self._asked += end - start
                try:
                    data: bytes | BaseException = self._fetch(start, end)
                except BaseException as error:  # raised when the consumer reaches ``start``
                    data = error
                with self._cond:
                    self._asked -= end - start
                    if self._closed:
                        return
                    self._ready[start] = data
                    if not isinstance(data, BaseException):
                        self.buffered += len(data)
                        self.peak = max(self.peak, self.buffered)
                    self._hand_over(size)
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._running -= 1
                last = self._running == 0
                self._cond.notify_all()
            if last and self._file is not None:
                self._close_file(self._file)

    def _hand_over(self, size: int) -> None:
        """Moves the blocks that follow what was handed out from ``_ready`` to the consumer's
        queue, in order (the lock held); an error there stops the read-ahead at its offset."""
        while self._handed in self._ready:
            data = self._ready.pop(self._handed)
            if isinstance(data, BaseException):
                self._error = data
                return
            self._chunks.append(memoryview(data))
            self._handed += len(data)
        if self._handed >= size:
            self._end = True

    def _fetch(self, start: int, end: int) -> bytes:
        """Bytes ``start:end`` of the object in one ranged request, made again after transient
        failures once the object is known to be the version first read."""
        source = self._source
        for attempt in range(source._attempts):
            try:
                fetch = self._fetch_range
                assert fetch is not None  # the parallel reading runs only with one
                with translate_errors(source.url, source._operation):
                    data = bytes(fetch(start, end))
                if len(data) != end - start:
                    raise DataLossError(
                        f"{source._operation}: {source.url!r} answered {len(data)} bytes for "
                        f"bytes {start}-{end} of its {source.size}; it changed while it was read",
                        filename=source.url,
                        offset=start,
                    )
                return data
            except Exception as error:
                if not is_transient(error) or attempt == source._attempts - 1:
                    raise
                time.sleep(source._backoff * 2**attempt)
                source.check_version(start)
        raise AssertionError("unreachable")

    def _close_file(self, file: _RangedFile) -> None:
        try:
            file.close()
        except Exception as error:  # handed over like a read's, unless an error came first
            with self._cond:
                if self._error is None and not self._closed:
                    self._error = error
                self._cond.notify_all()

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (all that is left for ``n < 0``), fewer only at the end. A read
        that reaches the error which stopped the reading raises it (never a short read, which
        would look like the end of the object)."""
        pieces: list[memoryview] = []
        want = n if n >= 0 else float("inf")
        have = 0
        with self._cond:
            while have < want:
                if self._chunks:
                    chunk = self._chunks[0]
                    take = int(min(len(chunk), want - have))
                    pieces.append(chunk[:take])
                    if take == len(chunk):
                        self._chunks.popleft()
                    else:
                        self._chunks[0] = chunk[take:]
                    have += take
                    self.buffered -= take
                    self._cond.notify_all()
                elif self._end:
                    break
                elif self._error is not None:  # never a short read that looks like the end
                    error = self._error
                    raise error.with_traceback(error.__traceback__)
                elif not any(thread.is_alive() for thread in self._threads):
                    raise RuntimeError("the read-ahead threads stopped without an answer")
                else:
                    self._cond.wait(self._WAIT)
        self.position += have
        return b"".join(pieces)

    def skip(self, n: int) -> bool:
        """Drops the next ``n`` bytes if they are buffered already; whether they were."""
        with self._cond:
            if n > sum(len(chunk) for chunk in self._chunks):
                return False
        self.read(n)
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._chunks.clear()
            self._ready.clear()
            self.buffered = 0
            self._cond.notify_all()


class RemoteReader:
    """An object of a store read from a byte position, in ranged requests of ``block_size``,
    that survives transient failures: a failed read is made again at the offset already reached
    (so no byte is read twice or skipped), after a backoff, at most ``attempts`` times. An object
    that changes between requests (another ETag) is a ``DataLossError``: never a mix of
    versions. ``size`` is the object's size when it was opened.

    With ``read_ahead`` > 0 (bytes), a background thread reads the object ahead of the consumer
    from the first ``read`` on, in requests of ``min(block_size, read_ahead)`` bytes, and holds
    at most ``read_ahead`` bytes not yet read (``buffered``, ``peak_buffered``): memory bounded
    by the window, not the object's size. A seek within what is buffered drops bytes; another
    seek starts a new read-ahead there. With ``parallel_reads`` > 1 (and a back-end that fetches
    byte ranges), up to that many of these requests are in flight at once, as many as the
    window holds (``_ReadAhead``). Its API (``read``,
    ``seek``, ``tell``, ``close``) is single-threaded, like a file's.

    With ``listed_version`` (the object's version when it was listed, ``object_tag``), an
    object that is another version by the time it is opened is a ``DataLossError`` too: a file
    read again later (a split run again after a worker was lost) is the version first read.
    Opened inside ``opening_listed`` with the listing's size of that version, on a store whose
    reads carry the version they expect (s3fs: ``If-Match``), it makes no request before its
    first read; the store's refusal of a read is then how a changed object is found.
    """

    def __init__(
        self,
        url: str,
        position: int,
        operation: str,
        block_size: int = 8 << 20,
        attempts: int = 6,
        backoff: float = 0.05,
        read_ahead: int = 0,
        listed_version: Any = None,
        parallel_reads: int = 1,
    ) -> None:
        self.url = url
        self._parallel_reads = max(1, int(parallel_reads))
        self._fs, self._inner = filesystem(url)
        self._operation = operation
        self._block_size = block_size
        self._attempts = attempts
        self._backoff = backoff
        self._read_ahead = max(0, int(read_ahead))
        self._position = position
        self._ranged: _RangedFile | None = None
        self._ahead: _ReadAhead | None = None
        self._peak = 0
        self.closed = False
        listed = _LISTED.get()
        self._listed_size: int | None = None
        if (
            listed is not None
            and listed[:2] == (url, listed_version)
            and _opens_as_listed(self._fs)
        ):
            self._listed_size = self.size = listed[2]
            self._version = listed_version
        self._ranged = _RangedFile(self, position)
        if self._listed_size is None:
            # The back-end's file knows the object's size and version (s3fs asks once, and its
            # reads then carry the ETag they expect); elsewhere the file system is asked.
            info = getattr(self._ranged._file, "details", None) or self._call(
                lambda: self._fs.info(self._inner)
            )
            if info.get("type") == "directory":
                raise NotFoundError(f"{operation}: {url!r} is a directory, not a file", name=url)
            self.size = int(info.get("size") or 0)
            self._version = object_version(info)
            if listed_version is not None and self._version != listed_version:
                self.close()
                raise self._changed(listed_version, self._version, position)
        opened = _OPENED.get()
        if opened is not None:
            opened.setdefault(url, self._version)

    def _call(self, fn: Any) -> Any:
        """``fn()``, made again after transient failures; errors translated."""
        return _retried(fn, self.url, self._operation, self._attempts, self._backoff)

    def check_version(self, position: int) -> None:
        """Raises ``DataLossError`` if the object is no longer the version first read."""
        self._fs.invalidate_cache(self._inner)
        info = self._call(lambda: self._fs.info(self._inner))
        if object_version(info) == self._version:
            return
        if self._listed_size is not None:  # the version is the listing's, not one read
            raise self._changed(self._version, object_version(info), position)
        raise DataLossError(
            f"{self._operation}: {self.url!r} changed while it was read (version "
            f"{self._version!r}, now {object_version(info)!r}); read it again from the start",
            filename=self.url,
            offset=position,
        )

    def _changed(self, held: Any, now: Any, position: int) -> DataLossError:
        """The error for an object that is no longer ``held``, the version that a listing found
        (or a first read, where a file is read again)."""
        return DataLossError(
            f"{self._operation}: {self.url!r} changed since it was listed or first read (version "
            f"{held!r} then, now {now!r}); a pipeline holds each object to the version its "
            "listing found or it first read (a checkpoint's position, a split run again): list "
            "the objects again, or read from the start",
            filename=self.url,
            offset=position,
        )

    @property
    def _file(self) -> Any:
        """The back-end's file object (without read-ahead)."""
        return None if self._ranged is None else self._ranged._file

    @_file.setter
    def _file(self, file: Any) -> None:
        if self._ranged is not None:
            self._ranged._file = file

    @property
    def buffered(self) -> int:
        """Bytes read ahead and not yet taken by ``read``."""
        return 0 if self._ahead is None else self._ahead.buffered

    @property
    def peak_buffered(self) -> int:
        """The most bytes read ahead and not yet taken at any moment (0 without read-ahead)."""
        return max(self._peak, 0 if self._ahead is None else self._ahead.peak)

    def read(self, n: int = -1) -> bytes:
        if not self._read_ahead:
            if self._ranged is None:
                raise ValueError(f"read of {self.url!r} after it was closed")
            data = self._ranged.read(n)
        else:
            data = self.start_read_ahead().read(n)
        self._position += len(data)
        return data

    def start_read_ahead(self) -> _ReadAhead:
        """Starts reading ahead from the current position now, not at the first ``read``
        (a reader opened before it is read starts its first request early)."""
        if self._ahead is None:
            if not self._read_ahead or self.closed:
                raise ValueError(f"{self.url!r} is not read ahead (read_ahead=0) or is closed")
            # The thread takes over the open file, if there is one.
            block = max(1, min(self._block_size, self._read_ahead))
            file, self._ranged = self._ranged, None
            self._ahead = _ReadAhead(
                self, self._position, file, block, self._read_ahead, self._parallel_reads
            )
        return self._ahead

    def seek(self, position: int, whence: int = 0) -> int:
        if whence == 1:
            position += self._position
        elif whence == 2:
            position += self.size
        if self._ahead is None:
            if self._ranged is not None:
                self._ranged.seek(position)
        elif position != self._position:
            ahead = position - self._position
            if not (ahead > 0 and self._ahead.skip(ahead)):
                self._stop_ahead()
                self.check_version(position)
        self._position = position
        return position

    def _stop_ahead(self) -> None:
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            self._peak = max(self._peak, ahead.peak)
            ahead.close()

    def tell(self) -> int:
        return self._position

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True
        self._stop_ahead()
        if self._ranged is not None:
            ranged, self._ranged = self._ranged, None
            ranged.close()

    def __enter__(self) -> RemoteReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- Writes visible only when complete, and the small calls that checkpoints make ---------------
# A local file is written under a hidden temporary name in its directory, flushed to disk and
# renamed into place (the rename is atomic). Object stores have no atomic rename, and their file
# objects publish what was written when they are closed, even after an error. On S3 the file is
# one multipart upload that is completed only once everything was written, and aborted
# otherwise; the store shows an object only once its upload is completed. On other stores the
# data is uploaded to a hidden temporary key, then copied to its key on the server (a copy is
# visible whole or not at all) and the temporary key deleted. A writer killed before the end
# leaves an unfinished upload (which the store never shows) or, on a store that shows partial
# files, a hidden ``.{name}.{random}.tmp`` object: never a partial object under the real name.

# The stores whose writable files complete an upload only on ``commit()`` when opened with
# ``autocommit=False``, and abort it on ``discard()``.
_COMMITTING_PROTOCOLS = frozenset({"s3", "s3a"})


def local_path(path: Any) -> str | None:
    """The operating system's path for a plain local path or a ``file://`` URL; else None."""
    url = as_url(path)
    if not is_local(url):
        return None
    if "://" not in url:
        return url
    return str(filesystem(url)[1])


def temporary_name(name: str) -> str:
    """A hidden temporary name beside ``name`` (a base name): ``.{name}.{random}.tmp``."""
    return f".{name}.{uuid.uuid4().hex[:12]}.tmp"


def write_whole(path: Any, write: Callable[[BinaryIO], object], operation: str) -> None:
    """Calls ``write(file)`` and publishes what it wrote at ``path`` only once it is complete,
    replacing what was there; if ``write`` raises, nothing changes at ``path``.

    Raises:
      NotFoundError, PermissionDeniedError: as the store answers, naming ``path``.
    """
    url = as_url(path)
    local = local_path(url)
    if local is not None:
        _write_local(local, write)
        return
    fs, inner = filesystem(url)
    if split_protocol(url)[0] in _COMMITTING_PROTOCOLS:
        with translate_errors(url, operation):
            _upload_once(fs, inner, write)
        return
    parent, _, name = inner.rstrip("/").rpartition("/")
    temporary = f"{parent}/{temporary_name(name)}" if parent else temporary_name(name)
    try:
        with translate_errors(url, operation):
            with fs.open(temporary, "wb") as file:
                write(file)
            fs.copy(temporary, inner)
    finally:
        with contextlib.suppress(Exception):  # best effort: the object is hidden either way
            fs.rm_file(temporary)
        fs.invalidate_cache(parent or inner)


def _upload_once(
    fs: fsspec.AbstractFileSystem, inner: str, write: Callable[[BinaryIO], object]
) -> None:
    """One upload that the store shows only once ``commit()`` completes it."""
    file = fs.open(inner, "wb", autocommit=False)
    try:
        write(file)
        file.close()  # uploads the last part; nothing is visible yet
        file.commit()  # completes the upload: the object appears, whole
    except BaseException:
        with contextlib.suppress(Exception):  # an upload left unfinished is never shown
            file.discard()  # aborts the multipart upload
        file.closed = True  # a discarded file has nothing left to flush
        raise


def _write_local(path: str, write: Callable[[BinaryIO], object]) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, temporary_name(os.path.basename(path)))
    try:
        with open(temporary, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise


def read_bytes(path: Any, operation: str) -> bytes:
    """The whole file or object at ``path``, read again after transient failures (a store's
    object in ranged requests, going on at the byte reached: ``RemoteReader``).

    Raises:
      NotFoundError: it does not exist (naming ``path``).
      DataLossError: the object changed while it was read.
    """
    url = as_url(path)
    local = local_path(url)
    if local is not None:
        with translate_errors(url, operation), open(local, "rb") as file:
            return file.read()
    reader = RemoteReader(url, 0, operation)
    try:
        return reader.read()
    finally:
        reader.close()


def read_small(path: Any, operation: str, attempts: int = 6, backoff: float = 0.05) -> bytes:
    """The whole of a small file or object at ``path`` (an index, a token), a store's in one
    request made again after transient failures: one GET of a whole object gives one version
    of it, so an object that writers keep replacing is read whole, old or new, where
    ``read_bytes`` (a size and version first, then the bytes) may find it changed between its
    requests. A failure starts the read again from the start: ``read_bytes`` for large objects.

    Raises:
      NotFoundError: it does not exist (naming ``path``).
    """
    url = as_url(path)
    local = local_path(url)
    if local is not None:
        with translate_errors(url, operation), open(local, "rb") as file:
            return file.read()
    fs, inner = filesystem(url)
    # s3fs asks an object's size first, then reads a large one in parallel ranged requests.
    one_get = {"max_concurrency": 1} if getattr(fs, "max_concurrency", None) else {}
    return bytes(_retried(lambda: fs.cat_file(inner, **one_get), url, operation, attempts, backoff))


def _retried(fn: Callable[[], Any], url: str, operation: str, attempts: int, backoff: float) -> Any:
    """``fn()``, made again after transient failures (at most ``attempts`` times, after a
    backoff doubling from ``backoff`` seconds); errors translated, naming ``url``."""
    with translate_errors(url, operation):
        for attempt in range(attempts):
            try:
                return fn()
            except Exception as error:
                if not is_transient(error) or attempt == attempts - 1:
                    raise
                time.sleep(backoff * 2**attempt)
    raise AssertionError("unreachable")


def list_names(path: Any, operation: str) -> list[str]:
    """The names (not paths) in directory ``path``, sorted; empty where it does not exist."""
    url = as_url(path)
    local = local_path(url)
    if local is not None:
        try:
            return sorted(os.listdir(local or "."))
        except (FileNotFoundError, NotADirectoryError):
            return []
    fs, inner = filesystem(url)
    try:
        with translate_errors(url, operation):
            entries = fs.ls(inner, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    return sorted({str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in entries} - {""})


def file_info(path: Any, operation: str) -> dict[str, Any] | None:
    """``{"size", "version"}`` of the file at ``path`` (its modification time locally, its ETag
    or generation on a store); None where there is no file (nothing, or a directory)."""
    url = as_url(path)
    local = local_path(url)
    if local is not None:
        try:
            status = os.stat(local)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(status.st_mode):
            return None
        return {"size": status.st_size, "version": status.st_mtime_ns}
    fs, inner = filesystem(url)
    try:
        with translate_errors(url, operation):
            fs.invalidate_cache(inner)
            info = fs.info(inner)
    except FileNotFoundError:
        return None
    if info.get("type") != "file":
        return None
    return {"size": int(info.get("size") or 0), "version": object_version(info)}


def remove_file(path: Any, operation: str) -> None:
    """Deletes the file at ``path``; nothing where there is none."""
    url = as_url(path)
    local = local_path(url)
    try:
        if local is not None:
            os.remove(local)
            return
        fs, inner = filesystem(url)
        with translate_errors(url, operation):
            fs.rm_file(inner)
    except FileNotFoundError:
        return


def make_dirs(path: Any, operation: str) -> None:
    """Makes the directory ``path`` and its parents where they are missing (on an object store
    a directory is a key prefix: nothing needs to be made, but a missing bucket is)."""
    url = as_url(path)
    local = local_path(url)
    if local is not None:
        os.makedirs(local or ".", exist_ok=True)
        return
    fs, inner = filesystem(url)
    with translate_errors(url, operation):
        fs.makedirs(inner, exist_ok=True)


def remove_tree(path: Any, operation: str) -> None:
    """Deletes the directory ``path`` and everything under it; nothing where it is missing."""
    url = as_url(path)
    local = local_path(url)
    if local is not None:
        shutil.rmtree(local, ignore_errors=True)
        return
    fs, inner = filesystem(url)
    try:
        with translate_errors(url, operation):
            fs.rm(inner, recursive=True)
    except FileNotFoundError:
        return
