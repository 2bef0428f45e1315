"""The two base classes of feedline.data: ``Dataset`` (a description) and ``DatasetIterator``.

A ``Dataset`` is an immutable, picklable node: its inputs, its parameters and the spec of its
elements. Nothing runs until it is iterated. Each operation is one subclass in ``data/ops`` or
``data/readers`` that implements ``_make_iterator`` (and, where it knows them, ``_cardinality``
and ``_random_access``). The fluent methods (``ds.map``, ``ds.batch``, ...) are declared in
``feedline.data._fluent_api``, which ``Dataset`` inherits, and attached in
``feedline.data._fluent``, in one place.

A ``DatasetIterator`` is the running state of one pass. Subclasses implement ``_next`` (raise
``StopIteration`` at the end), ``_get_state`` and ``_set_state``; the base class owns the public
methods. Restoring goes through the same path as a fresh start: make the iterator, then
``set_state``.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar, Protocol, Self

import numpy as np

from feedline import structure
from feedline.data._fluent_api import FluentAPI
from feedline.data.options import Options
from feedline.errors import InvalidArgumentError, OutOfRangeError

__all__ = [
    "AUTOTUNE",
    "INFINITE_CARDINALITY",
    "UNKNOWN_CARDINALITY",
    "Dataset",
    "DatasetIterator",
    "IteratorContext",
    "ListedVersions",
    "Optional",
    "RandomAccess",
]

AUTOTUNE = -1
INFINITE_CARDINALITY = -1
UNKNOWN_CARDINALITY = -2

_SEED_MASK = (1 << 63) - 1


def mix_seed(*parts: int) -> int:
    """A deterministic 63-bit seed from integers (independent of Python's hash randomisation)."""
    return (
        int(np.random.SeedSequence([p & _SEED_MASK for p in parts]).generate_state(2, np.uint64)[0])
        & _SEED_MASK
    )


class ListedVersions(dict[str, Any]):
    """A listing's versions of the objects it found, by URL (one of the maps that
    ``IteratorContext.listed_versions`` chains), with the size in bytes it gave each of them
    (``sizes``, by URL): a reader that opens one of these objects as that version takes its size
    from here instead of asking the store."""

    def __init__(self, versions: Any = (), sizes: dict[str, int] | None = None) -> None:
        super().__init__(versions)
        self.sizes = {} if sizes is None else sizes

    def only(self, urls: Iterable[str]) -> ListedVersions:
        """The versions and sizes of those of ``urls`` that this listing has."""
        kept = [url for url in urls if url in self]
        sizes = self.sizes
        return ListedVersions(
            {url: self[url] for url in kept}, {url: sizes[url] for url in kept if url in sizes}
        )


@dataclasses.dataclass(frozen=True)
class IteratorContext:
    """What an iterator inherits from the pipeline it runs in.

    Attributes:
      options: the merged options of the dataset being iterated (they apply to the whole pipeline).
      seed: the pipeline seed of this pass. Seeded shuffles mix it into their seed, so that every
        new pass over a dataset (each ``iter`` of it, each ``repeat`` epoch) reshuffles, while the
        sequence of passes stays reproducible.
      listed_versions: the version (ETag, generation) of each object of a store that a listing
        in the pipeline found (``list_files``), by URL, shared by every iterator of the
        pipeline: a reader that opens one of them reads that version or raises
        ``DataLossError``, so that a file read again (a split run again after a worker was
        lost) is never another version. The versions given (those a split run again holds)
        come first; each listing's iterator adds its own as a further map, not a copy (a
        ``ListedVersions``, which has the listed sizes too: ``listed_size``).
      pin_version: where the pipeline runs one split of a fault-tolerant job (a service
        worker's ``SplitRunner``), called as ``pin_version(url, version)`` each time a reader
        opens an object of a store, before any of its elements leaves: it returns the version
        the split is held to (the first run's, where the split runs again), and another one is
        ``DataLossError``.
    """

    options: Options
    seed: int = 0
    listed_versions: collections.ChainMap[str, Any] = dataclasses.field(
        default_factory=collections.ChainMap, compare=False
    )
    pin_version: Callable[[str, Any], Any] | None = dataclasses.field(default=None, compare=False)

    def child(self, index: int) -> IteratorContext:
        """The context of the ``index``-th pass that an iterator makes over its input."""
        return IteratorContext(
            self.options, mix_seed(self.seed, index), self.listed_versions, self.pin_version
        )

    def listed_size(self, url: str, version: Any) -> int | None:
        """The size in bytes that a listing of the pipeline gave ``url`` as ``version``; None
        where none did (or ``version`` is None)."""
        if version is None:
            return None
        for listed in self.listed_versions.maps:
            if isinstance(listed, ListedVersions) and listed.get(url) == version:
                return listed.sizes.get(url)
        return None

    @property
    def deterministic(self) -> bool:
        return self.options.deterministic is not False


class RandomAccess(Protocol):
    """A source whose rows can be read by index: the fast path of shuffle and batch."""

    def __len__(self) -> int: ...

    def gather(self, indices: np.ndarray) -> Any:
        """The rows at ``indices`` stacked along a new leading dimension."""
        ...

    def get(self, index: int) -> Any:
        """The row at ``index``."""
        ...


class RowCursor:
    """Reads the rows of a random-access source in order, one at a time or several gathered
    in one call (what batch's fast path asks for). Used by sources, ``shard`` and ``cache``."""

    def __init__(self, access: RandomAccess, position: int = 0) -> None:
        self.access = access
        self.length = len(access)
        self.position = position

    def next(self) -> Any:
        position = self.position
        if position >= self.length:
            raise StopIteration
        self.position = position + 1
        return self.access.get(position)

    def next_batch(self, n: int) -> Any:
        position = self.position
        if position >= self.length:
            raise StopIteration
        self.position = min(position + n, self.length)
        return self.access.gather(np.arange(position, self.position))

    def state(self) -> dict[str, Any]:
        return {"position": self.position}

    def restore(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


class Dataset(FluentAPI):
    """A lazy, immutable, picklable description of a sequence of elements.

    Example:
      >>> from feedline.data import Dataset
      >>> [b.tolist() for b in Dataset.range(6).batch(4)]
      [[0, 1, 2, 3], [4, 5]]
    """

    #: whether this operation reads files (what FILE auto-sharding looks for).
    _is_file_reader: ClassVar[bool] = False

    def __init__(self, inputs: tuple[Dataset, ...] = ()) -> None:
        for item in inputs:
            if not isinstance(item, Dataset):
                raise InvalidArgumentError(
                    f"{type(self).__name__} expects Dataset inputs, got {type(item).__name__}"
                )
        self._inputs = tuple(inputs)
        self._own_options: Options | None = None
        self._passes = 0
        self._passes_lock = threading.Lock()
        self._base_initialized = True

    # -- pickling: the lock does not travel ---------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_passes_lock", None)
        state.pop("_options_cache", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._passes_lock = threading.Lock()

    # -- introspection ----------------------------------------------------------------------
    @property
    def element_spec(self) -> Any:
        """The ``TensorSpec`` structure of every element; ``None`` marks unknown dimensions.

        An operation sets ``_element_spec`` in its constructor, or leaves it unset and implements
        ``_compute_element_spec`` where learning it means running user code (map's function),
        which then runs on first access.
        """
        spec = self.__dict__.get("_element_spec")
        if spec is None:
            spec = self._element_spec = self._compute_element_spec()
        return spec

    def _compute_element_spec(self) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__} must set _element_spec or implement _compute_element_spec"
        )

    @property
    def inputs(self) -> tuple[Dataset, ...]:
        return self._inputs

    def _with_inputs(self, inputs: tuple[Dataset, ...]) -> Self:
        """A shallow copy of this node over other ``inputs``, with the same parameters.

        What graph rewrites (auto-sharding) use to rebuild the nodes above a replaced source.
        The copy has its own per-object caches: merged options, pass counter and lock. A
        lazily computed element spec (map's, found by running the function) is kept only when
        the new inputs have the same element specs as the old ones, and computed again
        otherwise; a spec an operation derives in its constructor cannot be, so new inputs of
        other specs are an error there. An operation that keeps more than ``_inputs`` and its
        parameters (cache's contents) overrides this method.

        Raises:
          InvalidArgumentError: a different number of inputs, an input that is not a Dataset,
            or inputs of other element specs where this operation fixed its spec when made.
        """
        inputs = tuple(inputs)
        name = type(self).__name__
        if len(inputs) != len(self._inputs):
            raise InvalidArgumentError(
                f"{name} has {len(self._inputs)} inputs; a rewrite must give as many, "
                f"got {len(inputs)}"
            )
        for item in inputs:
            if not isinstance(item, Dataset):
                raise InvalidArgumentError(
                    f"{name} expects Dataset inputs, got {type(item).__name__}"
                )
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.__dict__.pop("_options_cache", None)
        clone._inputs = inputs
        clone._passes = 0
        clone._passes_lock = threading.Lock()
        if "_element_spec" in self.__dict__ and any(
            new is not old and new.element_spec != old.element_spec
            for new, old in zip(inputs, self._inputs, strict=True)
        ):
            if type(self)._compute_element_spec is Dataset._compute_element_spec:
                raise InvalidArgumentError(
                    f"{name} cannot be rewritten over inputs of element specs "
                    f"{[d.element_spec for d in inputs]} instead of "
                    f"{[d.element_spec for d in self._inputs]}: its spec was fixed when it was "
                    "made; rewrites must keep the inputs' element specs"
                )
            del clone.__dict__["_element_spec"]
        return clone

    def _with_files(self, filenames: Any) -> Dataset:
        """The same file reader over other ``filenames`` (names, or a Dataset of names): what
        FILE auto-sharding calls on the operations marked ``_is_file_reader``, which implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} reads no files")

    def cardinality(self) -> int:
        """The number of elements, ``INFINITE_CARDINALITY`` or ``UNKNOWN_CARDINALITY``."""
        return self._cardinality()

    def _cardinality(self) -> int:
        return UNKNOWN_CARDINALITY

    def __len__(self) -> int:
        n = self.cardinality()
        if n == INFINITE_CARDINALITY:
            raise TypeError("the dataset is infinite; len() is defined only for finite datasets")
        if n == UNKNOWN_CARDINALITY:
            raise TypeError(
                "the dataset's length is unknown (it depends on the data, e.g. after filter); "
                "use cardinality() or count the elements"
            )
        return n

    def __bool__(self) -> bool:
        return True

    def options(self) -> Options:
        """The options of this dataset: its inputs' options merged in order, then its own."""
        cached = self.__dict__.get("_options_cache")
        if cached is not None:
            return cached
        merged = Options()
        for item in self._inputs:
            merged = merged.merge(item.options())
        if self._own_options is not None:
            merged = merged.merge(self._own_options)
        self.__dict__["_options_cache"] = merged
        return merged

    def _is_sharded_elsewhere(self) -> bool:
        """Whether this source's data is already split among the workers that read it (a
        data service job shared by name), so that auto-sharding must leave the dataset whole."""
        return False

    def _random_access(self) -> RandomAccess | None:
        """Row access by index where this dataset supports it (sources, caches)."""
        return None

    # -- iteration --------------------------------------------------------------------------
    def __iter__(self) -> DatasetIterator:
        self._require_base_init()
        with self._passes_lock:
            index = self._passes
            self._passes += 1
        return self._iterator(IteratorContext(self.options(), mix_seed(index)))

    def _iterator(self, ctx: IteratorContext) -> DatasetIterator:
        """A new iterator in ``ctx``: what an operation calls to iterate its inputs."""
        self._require_base_init()
        iterator = self._make_iterator(ctx)
        if not getattr(iterator, "_base_initialized", False):
            raise TypeError(
                f"{type(iterator).__name__}.__init__ did not call super().__init__(dataset, ctx); "
                "every DatasetIterator subclass must"
            )
        return iterator

    def _require_base_init(self) -> None:
        if not getattr(self, "_base_initialized", False):
            raise TypeError(
                f"{type(self).__name__}.__init__ did not call super().__init__(inputs); "
                "every Dataset subclass must"
            )

    def _make_iterator(self, ctx: IteratorContext) -> DatasetIterator:
        raise NotImplementedError(f"{type(self).__name__} must implement _make_iterator")

    def as_numpy_iterator(self) -> DatasetIterator:
        """An iterator of NumPy elements (feedline's elements are NumPy already)."""
        return iter(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} element_spec={self.element_spec}>"


# A dataset may be a component of an element (a window): the element model keeps it as it is.
structure.register_dataset_type(Dataset)


def walk(dataset: Dataset) -> Iterator[Dataset]:
    """Every node of a dataset graph, outputs before inputs, each once."""
    seen: set[int] = set()
    stack = [dataset]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(reversed(node.inputs))


def raw_elements(iterator: DatasetIterator) -> Iterator[Any]:
    """The elements of ``iterator`` as operations see them (``_next``: arrays, 0-d ones
    included), for code of feedline that iterates a dataset for itself."""
    pull = iterator._next
    while True:
        try:
            element = pull()
        except StopIteration:
            return
        yield element


def _closed_next() -> Any:
    raise InvalidArgumentError("the iterator is closed")


class DatasetIterator:
    """One pass over a dataset. Its API is single-threaded: call it from one thread at a time.

    Subclasses implement ``_next``, ``_get_state``, ``_set_state`` and, if they hold resources,
    ``_close``. Consumers may keep the bound ``_next`` of their input (a producer thread does), so
    an iterator never rebinds ``_next`` after its constructor. An iterator may also implement
    ``_next_batch(n)``, which returns up to ``n`` rows stacked (or raises StopIteration): batch
    looks it up on every batch and uses it to skip per-element work.

    ``next(iterator)`` hands elements to the user through ``structure.as_output`` (a 0-d leaf as
    a NumPy scalar or ``bytes``); operations read their inputs with ``_next``, which keeps
    arrays.
    """

    _next_batch: Callable[[int], Any] | None = None

    def __init__(self, dataset: Dataset, ctx: IteratorContext) -> None:
        self._dataset = dataset
        self._ctx = ctx
        self._closed = False
        self._base_initialized = True

    @property
    def element_spec(self) -> Any:
        return self._dataset.element_spec

    def __iter__(self) -> DatasetIterator:
        return self

    def __next__(self) -> Any:
        # What the user gets: 0-d leaves as NumPy scalars or bytes, as TensorFlow's .numpy().
        return structure.as_output(self._next())

    def _next(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement _next")

    def get_next(self) -> Any:
        """The next element; raises ``OutOfRangeError`` at the end."""
        try:
            return structure.as_output(self._next())
        except StopIteration:
            raise OutOfRangeError("end of sequence") from None

    def get_next_as_optional(self) -> Optional:
        """The next element as an ``Optional``, empty at the end."""
        try:
            return Optional(self._next(), self.element_spec)
        except StopIteration:
            return Optional.empty(self.element_spec)

    def get_state(self) -> dict[str, Any]:
        """The position of this iterator: a picklable nested dict of the pipeline's shape."""
        return self._get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        """Moves this iterator to the position saved by ``get_state``."""
        if not isinstance(state, dict):
            raise InvalidArgumentError(f"an iterator state is a dict, got {type(state).__name__}")
        try:
            self._set_state(state)
        except (KeyError, TypeError) as error:
            raise InvalidArgumentError(
                f"the state does not belong to a pipeline shaped like this one "
                f"({type(self).__name__}): {error!r}"
            ) from error

    def _get_state(self) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement _get_state")

    def _set_state(self, state: dict[str, Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement _set_state")

    def _restore_seed(self, seed: int) -> None:
        """Puts back the pass seed saved in a state; iterators that open input iterators later
        (repeat, flat_map, interleave) save ``self._ctx.seed`` and call this on restore."""
        self._ctx = dataclasses.replace(self._ctx, seed=int(seed))

    def close(self) -> None:
        """Stops background work and releases resources of the whole pipeline; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._next = _closed_next  # type: ignore[method-assign]
        self._close()

    def _close(self) -> None:
        for value in self.__dict__.values():
            if isinstance(value, DatasetIterator):
                value.close()

    def __enter__(self) -> DatasetIterator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self.close()
        except Exception:
            return


class RandomAccessIterator(DatasetIterator):
    """The iterator of a source with random access (``dataset._random_access()``): a
    ``RowCursor`` over it, whose position is the state. Single-threaded, as every iterator."""

    def __init__(self, dataset: Dataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._cursor = RowCursor(dataset._random_access())  # type: ignore[arg-type]
        self._next = self._cursor.next  # type: ignore[method-assign]
        self._next_batch = self._cursor.next_batch

    def _get_state(self) -> dict[str, Any]:
        return self._cursor.state()

    def _set_state(self, state: dict[str, Any]) -> None:
        self._cursor.restore(state)


class Optional:
    """A value that may be absent, as returned by ``get_next_as_optional``."""

    def __init__(self, value: Any, element_spec: Any, *, _has_value: bool = True) -> None:
        self._value = value
        self._has_value = _has_value
        self.element_spec = element_spec

    @classmethod
    def from_value(cls, value: Any) -> Optional:
        value = structure.normalize(value)
        return cls(value, structure.spec_of(value))

    @classmethod
    def empty(cls, element_spec: Any) -> Optional:
        return cls(None, element_spec, _has_value=False)

    def has_value(self) -> bool:
        return self._has_value

    def get_value(self) -> Any:
        if not self._has_value:
            raise InvalidArgumentError("the Optional has no value; check has_value() first")
        return self._value

    def __repr__(self) -> str:
        return f"Optional({self._value!r})" if self._has_value else "Optional(<empty>)"
