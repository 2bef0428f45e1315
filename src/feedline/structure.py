"""Nested element structures and their specs: the element model, on feedline's ground floor.

Every layer stands on this module: ``feedline.data`` builds its elements with it, ``feedline.io``
parses into it, ``feedline._net`` puts it on the wire, ``feedline.service`` and
``feedline.distribute`` carry it. It imports nothing of feedline but ``feedline.errors``.
``feedline.data.structure`` re-exports it under its older name (the same objects), and
``feedline.TensorSpec`` is its ``TensorSpec``.

An element is a nested structure (tuple, list, dict, namedtuple) whose leaves are NumPy arrays.
Python scalars, strings and bytes become 0-d leaves with TensorFlow's dtypes (those of
``tf.constant``): ``int`` → int32 (int64 where the value is past int32's range), ``float`` →
float32, ``bool`` → bool, ``str`` → its UTF-8 bytes (``tf.string``). Lists of Python ints become
int32 arrays as well; NumPy values keep their dtypes (``np.arange(3)`` stays int64, as
``tf.constant`` keeps it). Python scalars become NumPy scalars (``np.int32(1)``), which behave
as 0-d arrays. The nested part is handled by optree; this module is the only place that knows
about it.

Byte strings (``bytes``, ``str``, TFRecord records, text lines, file names) are object arrays
whose items are Python ``bytes``, as TensorFlow's ``.numpy()`` gives them: a 0-d object array for
one string, an n-d one for a batch. NumPy ``S`` arrays are not used, since they drop trailing NUL
bytes (``b"a\\x00"`` would read back as ``b"a"``): ``S`` and ``U`` arrays, ``np.bytes_``,
``np.str_`` and lists of bytes or str given to feedline become object arrays of ``bytes``, and an
object array is a leaf only if it holds ``bytes`` (or ``str``, encoded). ``TensorSpec`` shows
their dtype as ``bytes``.

What a dataset's iterator hands to the user passes through ``as_output``: a numeric 0-d leaf
becomes what TensorFlow's ``.numpy()`` gives for a scalar, a hashable NumPy scalar
(``np.int64(3)``). A string stays a 0-d object array (``.item()`` gives its exact ``bytes``, as
for every row of a batch of strings); arrays of rank 1 and more are handed out as they are.

    >>> spec_of(normalize((1, {"a": 2.0})))
    (TensorSpec(shape=(), dtype=int32), {'a': TensorSpec(shape=(), dtype=float32)})
    >>> leaf = normalize(b"a\\x00")
    >>> leaf.dtype, leaf.item(), spec_of(leaf)
    (dtype('O'), b'a\\x00', TensorSpec(shape=(), dtype=bytes))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import optree

from feedline import _composite
from feedline._composite import RaggedArray, SparseArray
from feedline.errors import InvalidArgumentError

__all__ = [
    "BYTES",
    "DatasetSpec",
    "RaggedArray",
    "RaggedTensorSpec",
    "SparseArray",
    "SparseTensorSpec",
    "TensorSpec",
    "as_output",
    "batch_elements",
    "bytes_array",
    "bytes_scalar",
    "flatten",
    "is_compatible",
    "map_structure",
    "normalize",
    "spec_of",
    "unflatten",
]

Element = Any
_NONE_IS_LEAF = True

#: The dtype of byte-string leaves: object arrays whose items are Python ``bytes``.
BYTES = np.dtype(object)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """The shape and dtype of one leaf of an element; ``None`` marks an unknown dimension, and
    ``shape=None`` an unknown rank (TensorFlow's ``TensorShape(None)``, shown ``<unknown>``):
    arrays of any shape fit it, and batching or unbatching it keeps the rank unknown.

    Byte strings have dtype ``object`` (``BYTES``; ``np.bytes_``, ``np.str_``, ``S`` and ``U``
    dtypes given here become it, as elements hold strings as bytes), shown as ``dtype=bytes``.

        >>> TensorSpec(None, np.int64), TensorSpec(None, np.int64).batched(2).rank
        (TensorSpec(shape=<unknown>, dtype=int64), None)
    """

    shape: tuple[int | None, ...] | None
    dtype: np.dtype
    #: an optional name, as ``tf.TensorSpec(shape, dtype, name)`` takes (part of equality, as
    #: there; kept by ``most_specific_common`` where both names agree).
    name: str | None = None

    def __post_init__(self) -> None:
        if self.shape is not None:
            shape = tuple(None if d is None else int(d) for d in self.shape)
            object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", _spec_dtype(np.dtype(self.dtype)))

    def __repr__(self) -> str:
        dtype = "bytes" if self.dtype == BYTES else self.dtype.name
        name = "" if self.name is None else f", name={self.name!r}"
        shape = "<unknown>" if self.shape is None else self.shape
        return f"TensorSpec(shape={shape}, dtype={dtype}{name})"

    @property
    def rank(self) -> int | None:
        """The number of dimensions; None where the rank is unknown."""
        return None if self.shape is None else len(self.shape)

    def is_compatible_with(self, other: TensorSpec | np.ndarray) -> bool:
        """Whether ``other`` (a spec or an array) fits this spec."""
        if _composite.is_composite(other) or isinstance(other, _COMPOSITE_SPECS):
            return False
        if not isinstance(other, TensorSpec):
            other = TensorSpec(np.shape(other), np.asarray(other).dtype)
        if self.dtype != other.dtype:
            return False
        if self.shape is None or other.shape is None:
            return True
        return _compatible_dims(self.shape, other.shape)

    def most_specific_common(self, other: TensorSpec) -> TensorSpec:
        """The narrowest spec both fit: dimensions that differ become ``None``, and the rank is
        unknown where either rank is or where the ranks differ (TensorFlow's
        ``most_specific_compatible_shape``).

        Example:
          >>> TensorSpec((2, 3), np.int32).most_specific_common(TensorSpec((2, 4), np.int32))
          TensorSpec(shape=(2, None), dtype=int32)
          >>> TensorSpec((2,), np.int32).most_specific_common(TensorSpec((), np.int32))
          TensorSpec(shape=<unknown>, dtype=int32)
        """
        if self.dtype != other.dtype:
            raise InvalidArgumentError(f"specs {self} and {other} have no common spec")
        name = self.name if self.name == other.name else None
        if self.shape is None or other.shape is None or self.rank != other.rank:
            return TensorSpec(None, self.dtype, name)
        return TensorSpec(_common_dims(self.shape, other.shape), self.dtype, name)

    def batched(self, batch_size: int | None) -> TensorSpec:
        if self.shape is None:
            return TensorSpec(None, self.dtype)
        return TensorSpec((batch_size, *self.shape), self.dtype)

    def unbatched(self) -> TensorSpec:
        if self.shape is None:
            return TensorSpec(None, self.dtype)
        if not self.shape:
            raise InvalidArgumentError(f"cannot unbatch a scalar component {self}")
        return TensorSpec(self.shape[1:], self.dtype)


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """The spec of a component that is itself a dataset (a window of ``Dataset.window``, the
    group that ``group_by_window`` hands its ``reduce_func``): the element spec of that dataset.

    Dataset classes register themselves with ``register_dataset_type``, so that ``spec_of`` of
    an element holding a dataset gives a ``DatasetSpec`` and ``normalize`` leaves it as it is.

        >>> DatasetSpec(TensorSpec((), np.int64))
        DatasetSpec(TensorSpec(shape=(), dtype=int64))
    """

    element_spec: Any

    def __repr__(self) -> str:
        return f"DatasetSpec({self.element_spec!r})"

    @staticmethod
    def from_value(value: Any) -> DatasetSpec:
        """The spec of the dataset ``value`` (``tf.data.DatasetSpec.from_value``).

        >>> import feedline.data as fd
        >>> DatasetSpec.from_value(fd.Dataset.range(3))
        DatasetSpec(TensorSpec(shape=(), dtype=int64))
        """
        if not isinstance(value, _DATASET_TYPES):
            raise TypeError(f"DatasetSpec.from_value expects a Dataset, got {type(value)}")
        return DatasetSpec(value.element_spec)  # type: ignore[attr-defined]

    def is_compatible_with(self, other: Any) -> bool:
        """Whether ``other`` (a spec or a dataset) has an element spec this one accepts."""
        other_spec = getattr(other, "element_spec", None)
        if other_spec is None:
            return False
        return bool(same_structure(self.element_spec, other_spec)) and all(
            a.is_compatible_with(b)
            for a, b in zip(spec_leaves(self.element_spec), spec_leaves(other_spec), strict=True)
        )

    def most_specific_common(self, other: Any) -> DatasetSpec:
        if not isinstance(other, DatasetSpec):
            raise InvalidArgumentError(f"specs {self} and {other} have no common spec")
        return DatasetSpec(common_spec(self.element_spec, other.element_spec, "windows"))

    def batched(self, batch_size: int | None) -> TensorSpec:
        raise InvalidArgumentError(
            f"cannot batch a component that is a dataset ({self}); turn each window into a "
            "tensor first, e.g. ds.flat_map(lambda window: window.batch(size))"
        )

    def unbatched(self) -> TensorSpec:
        raise InvalidArgumentError(f"cannot unbatch a component that is a dataset ({self})")


_DATASET_TYPES: tuple[type, ...] = ()


def register_dataset_type(cls: type) -> None:
    """Makes instances of ``cls`` (feedline.data's ``Dataset``) components of an element: kept
    as they are by ``normalize``, described by a ``DatasetSpec`` in ``spec_of``. The ground
    floor cannot import ``feedline.data``; ``feedline.data.dataset`` calls this once."""
    global _DATASET_TYPES
    if cls not in _DATASET_TYPES:
        _DATASET_TYPES = (*_DATASET_TYPES, cls)


_INT64 = np.dtype(np.int64)


def _dtype_name(dtype: np.dtype) -> str:
    return {"O": "bytes", "U": "str"}.get(dtype.kind, dtype.name)


# -- the specs of ragged and sparse arrays --------------------------------------------------------


def _compatible_dims(a: tuple[int | None, ...], b: tuple[int | None, ...]) -> bool:
    return len(a) == len(b) and all(
        x is None or y is None or x == y for x, y in zip(a, b, strict=True)
    )


def _common_dims(a: tuple[int | None, ...], b: tuple[int | None, ...]) -> tuple[int | None, ...]:
    return tuple(x if x == y else None for x, y in zip(a, b, strict=True))


@dataclasses.dataclass(frozen=True)
class RaggedTensorSpec:
    """The spec of a ``RaggedArray`` leaf (``tf.RaggedTensorSpec``).

    ``shape`` has ``None`` for unknown (ragged) dimensions; ``ragged_rank`` (default: rank - 1)
    is how many dimensions after the first are ragged, ``row_splits_dtype`` int64 or int32.
    ``batched`` adds a ragged dimension; ``unbatched`` removes one and is a ``TensorSpec`` of
    the dense rows where ``ragged_rank`` was 1.
    """

    shape: tuple[int | None, ...]
    dtype: np.dtype
    ragged_rank: int | None = None
    row_splits_dtype: np.dtype = _INT64

    def __post_init__(self) -> None:
        shape = tuple(None if d is None else int(d) for d in self.shape)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", _spec_dtype(np.dtype(self.dtype)))
        rank = len(shape) - 1 if self.ragged_rank is None else int(self.ragged_rank)
        if not 1 <= rank < max(len(shape), 2):
            raise InvalidArgumentError(
                f"RaggedTensorSpec: ragged_rank must be in [1, {len(shape) - 1}] for shape "
                f"{shape}, got {self.ragged_rank}"
            )
        object.__setattr__(self, "ragged_rank", rank)
        object.__setattr__(
            self,
            "row_splits_dtype",
            _composite.splits_dtype(self.row_splits_dtype, "RaggedTensorSpec"),
        )

    def __repr__(self) -> str:
        return (
            f"RaggedTensorSpec(shape={self.shape}, dtype={_dtype_name(self.dtype)}, "
            f"ragged_rank={self.ragged_rank}, row_splits_dtype={self.row_splits_dtype.name})"
        )

    @property
    def rank(self) -> int:
        return len(self.shape)

    def is_compatible_with(self, other: Any) -> bool:
        if isinstance(other, RaggedArray):
            other = _leaf_spec(other)
        return (
            isinstance(other, RaggedTensorSpec)
            and self.dtype == other.dtype
            and self.ragged_rank == other.ragged_rank
            and self.row_splits_dtype == other.row_splits_dtype
            and _compatible_dims(self.shape, other.shape)
        )

    def most_specific_common(self, other: Any) -> RaggedTensorSpec:
        if not (
            isinstance(other, RaggedTensorSpec)
            and (self.dtype, self.ragged_rank, self.rank, self.row_splits_dtype)
            == (other.dtype, other.ragged_rank, other.rank, other.row_splits_dtype)
        ):
            raise InvalidArgumentError(f"specs {self} and {other} have no common spec")
        return RaggedTensorSpec(
            _common_dims(self.shape, other.shape),
            self.dtype,
            self.ragged_rank,
            self.row_splits_dtype,
        )

    def batched(self, batch_size: int | None) -> RaggedTensorSpec:
        assert self.ragged_rank is not None
        return RaggedTensorSpec(
            (batch_size, *self.shape), self.dtype, self.ragged_rank + 1, self.row_splits_dtype
        )

    def unbatched(self) -> Any:
        assert self.ragged_rank is not None
        if self.ragged_rank == 1:
            return TensorSpec(self.shape[1:], self.dtype)
        return RaggedTensorSpec(
            self.shape[1:], self.dtype, self.ragged_rank - 1, self.row_splits_dtype
        )

    def empty(self) -> RaggedArray:
        """A ``RaggedArray`` of zero rows of this spec."""
        assert self.ragged_rank is not None
        inner = tuple(d or 0 for d in self.shape[self.ragged_rank + 1 :])
        flat = np.empty((0, *inner), dtype=self.dtype)
        splits = [np.zeros(1, self.row_splits_dtype)] * self.ragged_rank
        return RaggedArray.from_nested_row_splits(flat, splits, validate=False)


@dataclasses.dataclass(frozen=True)
class SparseTensorSpec:
    """The spec of a ``SparseArray`` leaf (``tf.SparseTensorSpec``): its dense shape (``None``
    for dimensions that vary) and dtype."""

    shape: tuple[int | None, ...]
    dtype: np.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(None if d is None else int(d) for d in self.shape))
        object.__setattr__(self, "dtype", _spec_dtype(np.dtype(self.dtype)))

    def __repr__(self) -> str:
        return f"SparseTensorSpec(shape={self.shape}, dtype={_dtype_name(self.dtype)})"

    @property
    def rank(self) -> int:
        return len(self.shape)

    def is_compatible_with(self, other: Any) -> bool:
        if isinstance(other, SparseArray):
            other = _leaf_spec(other)
        return (
            isinstance(other, SparseTensorSpec)
            and self.dtype == other.dtype
            and _compatible_dims(self.shape, other.shape)
        )

    def most_specific_common(self, other: Any) -> SparseTensorSpec:
        if not (
            isinstance(other, SparseTensorSpec)
            and (self.dtype, self.rank) == (other.dtype, other.rank)
        ):
            raise InvalidArgumentError(f"specs {self} and {other} have no common spec")
        return SparseTensorSpec(_common_dims(self.shape, other.shape), self.dtype)

    def batched(self, batch_size: int | None) -> SparseTensorSpec:
        return SparseTensorSpec((batch_size, *self.shape), self.dtype)

    def unbatched(self) -> SparseTensorSpec:
        if not self.shape:
            raise InvalidArgumentError(f"cannot unbatch a scalar component {self}")
        return SparseTensorSpec(self.shape[1:], self.dtype)

    def empty(self) -> SparseArray:
        """A ``SparseArray`` of zero rows of this spec."""
        shape = (0, *(d or 0 for d in self.shape[1:]))
        return SparseArray(
            np.zeros((0, len(shape)), np.int64), np.empty(0, self.dtype), shape, False
        )


def _spec_dtype(dtype: np.dtype) -> np.dtype:
    if dtype.kind in "SOU":
        return BYTES
    return dtype


def bytes_scalar(value: bytes) -> np.ndarray:
    """``value`` as a 0-d object array holding it (exactly, trailing NUL bytes included)."""
    out = np.empty((), dtype=object)
    out[()] = value
    return out


def bytes_array(values: Sequence[bytes]) -> np.ndarray:
    """``values`` as a 1-d object array of ``bytes``."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def as_bytes_leaf(array: np.ndarray, encode_str: bool = False) -> np.ndarray:
    """``array`` if it is an object array of ``bytes``; an ``S`` array as one (its strings as
    ``S`` gives them, without trailing NUL bytes); an object array whose items are ``bytes``-like
    (``np.bytes_``, 0-d byte-string arrays) with them as ``bytes``. With ``encode_str``, ``str``
    items become their UTF-8 bytes.

    Raises:
      InvalidArgumentError: an object array holds something else (the type is named).
    """
    if array.dtype.kind == "S":
        return array.astype(object)
    if array.dtype.kind == "U":
        encode_str = True
    items = array.ravel().tolist() if array.ndim else [array.item()]
    if all(type(x) is bytes for x in items):
        return array
    fixed = [
        x.encode("utf-8") if encode_str and isinstance(x, str) else _as_bytes_item(x) for x in items
    ]
    out = np.empty(array.shape, dtype=object)
    if array.ndim:
        out.ravel()[:] = fixed
    else:
        out[()] = fixed[0]
    return out


def _as_bytes_item(item: Any) -> bytes:
    if isinstance(item, bytes):
        return bytes(item)
    if isinstance(item, np.ndarray) and item.ndim == 0 and item.dtype.kind in "SO":
        return _as_bytes_item(item.item())
    raise InvalidArgumentError(
        f"an object array is a leaf only if it holds bytes (byte strings), but it holds an item "
        f"of type {type(item).__name__} ({item!r}); use a numeric or str dtype, or encode the "
        "values as bytes"
    )


def zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An array of ``shape`` filled with zeros, ``False``, ``""`` or, for ``BYTES``, ``b""``."""
    if dtype == BYTES:
        return full_bytes(shape, b"")
    return np.zeros(shape, dtype=dtype)


def full_bytes(shape: tuple[int, ...], value: bytes) -> np.ndarray:
    """An object array of ``shape`` whose every item is ``value``. (``np.full(shape, value,
    dtype=object)`` goes through an ``S`` array and drops ``value``'s trailing NUL bytes.)"""
    out = np.empty(shape, dtype=object)
    out.fill(value)
    return out


def row(leaf: np.ndarray, index: Any) -> np.ndarray:
    """``leaf[index]``, but a 0-d array (not a bare ``bytes``) for a row of a 1-d object array."""
    return leaf[index, ...] if leaf.dtype == BYTES else leaf[index]


_COMPOSITES = (RaggedArray, SparseArray)
_COMPOSITE_SPECS = (RaggedTensorSpec, SparseTensorSpec)

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _python_int(value: int) -> Any:
    """A Python int as tf.constant types it: int32, or int64 past int32's range."""
    if _INT32_MIN <= value <= _INT32_MAX:
        return np.int32(value)
    return np.int64(value)


def to_array(value: Any) -> np.ndarray:
    """One leaf as a NumPy array (or NumPy scalar, which behaves as a 0-d array); ``bytes`` and
    ``str`` (and ``S``, ``U`` or object arrays of them) as object arrays of ``bytes``; a
    ``RaggedArray`` or ``SparseArray`` as it is."""
    if isinstance(value, np.ndarray | np.generic):
        if value.dtype.kind in "SOU":
            return as_bytes_leaf(np.asarray(value), encode_str=True)
        # A NumPy scalar stays one: it behaves as a 0-d array, without the copy.
        return cast(np.ndarray, value)
    if isinstance(value, _COMPOSITES):
        return cast(np.ndarray, value)
    kind = type(value)
    if kind is int:
        return cast(np.ndarray, _python_int(value))
    if kind is float:
        return cast(np.ndarray, np.float32(value))
    if kind is bool:
        return cast(np.ndarray, np.bool_(value))
    if isinstance(value, _DATASET_TYPES):
        return cast(np.ndarray, value)  # a dataset-valued component (a window) stays a dataset
    if isinstance(value, bytes):
        return bytes_scalar(bytes(value))
    if isinstance(value, str):
        return bytes_scalar(value.encode("utf-8"))
    if hasattr(value, "__array__") or hasattr(value, "numpy"):
        # torch tensors and other array-likes.
        value = (
            value.numpy() if hasattr(value, "numpy") and not hasattr(value, "__array__") else value
        )
        array = np.asarray(value)
        return as_bytes_leaf(array, encode_str=True) if array.dtype.kind in "SOU" else array
    if isinstance(value, list | tuple) or value is None:
        raise InvalidArgumentError(f"cannot convert {value!r} to an array leaf")
    array = np.asarray(value)
    if array.dtype == object:
        raise InvalidArgumentError(
            f"cannot convert {type(value).__name__} value {value!r} to a NumPy array of a "
            "numeric, bool or string dtype"
        )
    if array.dtype.kind == "f" and array.dtype != np.float32 and not isinstance(value, np.ndarray):
        array = array.astype(np.float32)
    return array


def _convert_list_leaf(value: list) -> np.ndarray:
    try:
        array = np.asarray(value)
    except ValueError:
        array = np.empty(0, dtype=object)
    if array.dtype.kind in "SOU" and array.size:
        # Built again from the items: an ``S`` array would drop trailing NUL bytes.
        array = np.array(value, dtype=object)
        try:
            return as_bytes_leaf(array, encode_str=True)
        except InvalidArgumentError as error:
            raise InvalidArgumentError(
                f"mixed list {value!r} cannot become an array: {error}"
            ) from None
    if array.dtype == object:
        raise InvalidArgumentError(f"ragged or mixed list {value!r} cannot become an array")
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    elif (
        array.dtype == np.int64
        and array.size
        and type(_first_item(value)) is int
        and array.min() >= _INT32_MIN
        and array.max() <= _INT32_MAX
    ):
        array = array.astype(np.int32)  # Python ints, as tf.constant types them
    return array


def _first_item(value: Any) -> Any:
    while type(value) in (list, tuple) and value:
        value = value[0]
    return value


def _is_leaf(value: Any) -> bool:
    return isinstance(value, list | np.ndarray | np.generic)


_ARRAY_TYPES = (np.ndarray, np.generic)
#: The NumPy scalar types of numeric and bool dtypes: leaves ``normalize`` keeps as they are.
_PLAIN_SCALARS = frozenset(np.dtype(code).type for code in "?bhilqpBHILQPefdgFDG")


def normalize(value: Element) -> Element:
    """Converts every leaf of ``value`` to a NumPy array.

    Lists are leaves (as in tf.data, ``[1, 2]`` is one tensor, not two); tuples, dicts and
    namedtuples are structure.
    """
    kind = type(value)
    if kind is tuple:
        # The common case, a flat tuple of numeric arrays and NumPy scalars, returns as it is
        # after one set lookup per leaf (a hot path: map calls this on every result).
        for v in value:
            leaf_kind = type(v)
            if leaf_kind not in _PLAIN_SCALARS and (
                leaf_kind is not np.ndarray or v.dtype.kind in "SOU"
            ):
                return tuple(normalize(v) for v in value)
        return value
    if kind in _PLAIN_SCALARS:
        return value
    if isinstance(value, _ARRAY_TYPES):
        return to_array(value)
    return optree.tree_map(_convert_leaf, value, is_leaf=_is_leaf, none_is_leaf=_NONE_IS_LEAF)


def _convert_leaf(value: Any) -> np.ndarray:
    if type(value) is list:
        return _convert_list_leaf(value)
    return to_array(value)


def _output_leaf(leaf: Any) -> Any:
    if type(leaf) is np.ndarray and leaf.ndim == 0 and leaf.dtype != BYTES:
        return leaf[()]
    return leaf


def as_output(element: Element) -> Element:
    """``element`` as an iterator hands it to the user: each numeric 0-d leaf as TensorFlow's
    ``.numpy()`` gives a scalar, a hashable NumPy scalar; strings (0-d object arrays, read with
    ``.item()``) and other leaves as they are (no copy)."""
    if type(element) is np.ndarray:
        return _output_leaf(element) if element.ndim == 0 else element
    if isinstance(element, np.generic):
        return element
    if type(element) is tuple:
        for leaf in element:
            if type(leaf) is not np.ndarray or leaf.ndim == 0:
                return tuple(as_output(leaf) for leaf in element)
        return element
    return optree.tree_map(_output_leaf, element, is_leaf=_is_leaf, none_is_leaf=_NONE_IS_LEAF)


def flatten(value: Element) -> tuple[list[Any], optree.PyTreeSpec]:
    """The leaves of ``value`` in a fixed order and the structure to rebuild it."""
    return optree.tree_flatten(value, is_leaf=_is_leaf, none_is_leaf=_NONE_IS_LEAF)


def unflatten(treespec: optree.PyTreeSpec, leaves: Sequence[Any]) -> Element:
    return optree.tree_unflatten(treespec, list(leaves))


def map_structure(fn: Callable[..., Any], *values: Element) -> Element:
    """Applies ``fn`` leaf-wise over one or more structures of the same shape."""
    if len(values) == 1 and isinstance(values[0], np.ndarray | np.generic):
        return fn(values[0])
    return optree.tree_map(
        fn,
        *values,
        is_leaf=lambda v: isinstance(
            v, (np.ndarray, np.generic, TensorSpec, list, *_COMPOSITES, *_COMPOSITE_SPECS)
        ),
        none_is_leaf=_NONE_IS_LEAF,
    )


def _spec_leaf(v: Any) -> bool:
    return isinstance(
        v, (np.ndarray, np.generic, TensorSpec, DatasetSpec, *_COMPOSITES, *_COMPOSITE_SPECS)
    )


def _leaf_spec(a: Any) -> Any:
    if isinstance(a, TensorSpec | DatasetSpec | RaggedTensorSpec | SparseTensorSpec):
        return a
    if isinstance(a, _DATASET_TYPES):
        return DatasetSpec(a.element_spec)  # type: ignore[attr-defined]
    if isinstance(a, RaggedArray):
        return RaggedTensorSpec(a.shape, a.dtype, a.ragged_rank, a.row_splits_dtype)
    if isinstance(a, SparseArray):
        return SparseTensorSpec(a.shape, a.dtype)
    return TensorSpec(np.shape(a), np.asarray(a).dtype)


def spec_of(element: Element) -> Any:
    """The ``TensorSpec`` structure of one normalised element (``DatasetSpec`` for a component
    that is a dataset)."""
    return optree.tree_map(
        _leaf_spec,
        element,
        is_leaf=_spec_leaf,
        none_is_leaf=_NONE_IS_LEAF,
    )


def spec_leaves(spec: Any) -> list[TensorSpec]:
    return optree.tree_leaves(spec, is_leaf=_spec_leaf, none_is_leaf=_NONE_IS_LEAF)


def map_spec(fn: Callable[..., Any], *specs: Any) -> Any:
    return optree.tree_map(fn, *specs, is_leaf=_spec_leaf, none_is_leaf=_NONE_IS_LEAF)


def same_structure(a: Any, b: Any) -> bool:
    sa = optree.tree_structure(a, is_leaf=_spec_leaf, none_is_leaf=_NONE_IS_LEAF)
    sb = optree.tree_structure(b, is_leaf=_spec_leaf, none_is_leaf=_NONE_IS_LEAF)
    return sa == sb


def is_compatible(spec: Any, element: Element) -> bool:
    """Whether ``element`` has the structure of ``spec`` and every leaf fits its spec."""
    try:
        pairs = optree.tree_map(
            lambda s, a: s.is_compatible_with(a),
            spec,
            element,
            is_leaf=_spec_leaf,
            none_is_leaf=_NONE_IS_LEAF,
        )
    except ValueError:
        return False
    return all(optree.tree_leaves(pairs))


def common_spec(a: Any, b: Any, what: str = "elements") -> Any:
    """The most specific spec that both spec structures fit; a clear error where none exists."""
    if not same_structure(a, b):
        raise InvalidArgumentError(f"{what} have different structures: {a} vs {b}")
    return map_spec(lambda x, y: x.most_specific_common(y), a, b)


def batch_elements(elements: Sequence[Element], operation: str = "batch") -> Element:
    """Stacks equal-shaped elements along a new leading dimension.

    Raises:
      InvalidArgumentError: the elements differ in shape; the message names the component.
    """
    first = elements[0]
    if isinstance(first, np.ndarray | np.generic):
        return _stack(elements, "component 0", operation)
    if type(first) is tuple:
        return tuple(
            _stack(column, f"component {i}", operation)
            if isinstance(column[0], np.ndarray | np.generic)
            else batch_elements(column, operation)
            for i, column in enumerate(zip(*elements, strict=True))
        )
    leaves0, treespec = flatten(first)
    columns: list[list[Any]] = [[] for _ in leaves0]
    for element in elements:
        leaves, spec = flatten(element)
        if spec != treespec:
            raise InvalidArgumentError(
                f"{operation}: elements have different structures: {treespec} vs {spec}"
            )
        for column, leaf in zip(columns, leaves, strict=True):
            column.append(leaf)
    paths = optree.tree_paths(first, is_leaf=_is_leaf, none_is_leaf=_NONE_IS_LEAF)
    return unflatten(
        treespec,
        [
            _stack(c, "component " + "/".join(map(str, p)), operation)
            for c, p in zip(columns, paths, strict=True)
        ],
    )


def _stack(column: Sequence[np.ndarray], name: str, operation: str) -> np.ndarray:
    if isinstance(column[0], _COMPOSITES):
        try:
            return cast(np.ndarray, _composite.stack(column))
        except InvalidArgumentError as error:
            raise InvalidArgumentError(f"{operation}: cannot batch {name}: {error}") from None
    try:
        out = np.asarray(column) if isinstance(column[0], np.generic) else np.stack(column)
    except ValueError:
        shapes = sorted({np.shape(a) for a in column})
        raise InvalidArgumentError(
            f"{operation}: cannot batch {name}: elements have different shapes {shapes}; "
            "use padded_batch to pad them to a common shape, or ragged_batch to keep them ragged"
        ) from None
    if out.dtype == BYTES and not all(
        isinstance(a, np.ndarray) and a.dtype == BYTES for a in column
    ):
        # Byte strings stack into an object array; anything else mixed into them does not.
        raise InvalidArgumentError(f"{operation}: cannot batch {name}: mixed types in {column!r}")
    return out


def slice_element(element: Element, index: int | slice | np.ndarray) -> Element:
    """Row ``index`` of every leaf (used by unbatch, rebatch and sliced sources)."""
    if isinstance(element, np.ndarray):
        return row(element, index)
    if type(element) is tuple:
        return tuple(slice_element(e, index) for e in element)
    return optree.tree_map(
        lambda a: row(a, index), element, is_leaf=_is_leaf, none_is_leaf=_NONE_IS_LEAF
    )


def leading_dim(element: Element) -> int:
    """The size of the leading dimension shared by every leaf of a batched element."""
    leaves, _ = flatten(element)
    if any(np.ndim(a) == 0 for a in leaves):
        raise InvalidArgumentError("cannot unbatch an element with a scalar component")
    sizes = {int(np.shape(a)[0]) for a in leaves}
    if len(sizes) != 1:
        raise InvalidArgumentError(f"components have different leading dimensions {sorted(sizes)}")
    return sizes.pop()


def read_only(leaf: Any) -> Any:
    """A read-only view of an array leaf (other leaves as they are): elements that a dataset hands
    out more than once, or that view a user's arrays, are immutable as tensors are."""
    if isinstance(leaf, np.ndarray):
        leaf = leaf.view()
        leaf.flags.writeable = False
    return leaf


def empty_like_spec(spec: Any) -> Element:
    """A batch of zero rows for ``spec``; unknown dimensions past the first become 0 (a leaf of
    unknown rank: a vector of zero rows)."""
    return map_spec(
        lambda s: (
            s.empty()
            if isinstance(s, _COMPOSITE_SPECS)
            else zeros((0, *(d or 0 for d in (s.shape or (0,))[1:])), s.dtype)
        ),
        spec,
    )


def check_dense(spec: Any, what: str, instead: str) -> None:
    """An InvalidArgumentError naming the first ragged or sparse component of ``spec``, for an
    operation ``what`` that takes dense arrays only; ``instead`` says what to do."""
    leaves, treespec = flatten(spec)
    names = ["component " + "/".join(map(str, p)) if p else "the element" for p in treespec.paths()]
    for name, leaf in zip(names, leaves, strict=True):
        if isinstance(leaf, _COMPOSITE_SPECS):
            kind = "ragged" if isinstance(leaf, RaggedTensorSpec) else "sparse"
            raise InvalidArgumentError(
                f"{what} takes dense arrays, but {name} is {kind} ({leaf}) in element_spec "
                f"{spec}; {instead}"
            )


def concatenate(parts: Sequence[Any]) -> Any:
    """Leaves joined along their first dimension (a ``RaggedArray`` or ``SparseArray`` too)."""
    return _composite.concatenate(parts)


def concatenate_rows(parts: Sequence[Element]) -> Element:
    """Elements of one structure joined along their leaves' first dimension (rows read in
    several blocks, as one); a single part as it is."""
    if len(parts) == 1:
        return parts[0]
    return map_structure(lambda *leaves: concatenate(leaves), *parts)


def spec_structure(spec: Any) -> optree.PyTreeSpec:
    """The structure of a ``TensorSpec`` structure: ``unflatten`` with it rebuilds an element
    from the leaves ``flatten`` gave of an element of that spec."""
    return optree.tree_structure(spec, is_leaf=_spec_leaf, none_is_leaf=_NONE_IS_LEAF)
