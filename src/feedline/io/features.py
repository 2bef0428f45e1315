"""Feature specs of ``parse_example``: ``FixedLenFeature``, ``FixedLenSequenceFeature`` and
``VarLenFeature``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from feedline.errors import InvalidArgumentError
from feedline.io._example_fast import BYTES, FLOAT, INT64
from feedline.structure import as_bytes_leaf

__all__ = [
    "FixedLenFeature",
    "FixedLenSequenceFeature",
    "Spec",
    "VarLenFeature",
    "check_features",
    "kind_of",
]

# Byte strings are object arrays of Python ``bytes`` (``feedline.string``), as in tf .numpy().
DTYPES = {BYTES: np.dtype(object), FLOAT: np.dtype(np.float32), INT64: np.dtype(np.int64)}
NAMES = {BYTES: "string", FLOAT: "float", INT64: "int64"}


def _feature_dtype(dtype: Any, spec: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.kind in "SUO":
        return DTYPES[BYTES]
    if dtype in (np.float32, np.int64):
        return dtype
    raise InvalidArgumentError(
        f"{spec}: dtype must be float32, int64 or a string dtype (feedline.string), got {dtype}"
    )


def _feature_shape(shape: Any, spec: str) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(not isinstance(d, int | np.integer) or d < 0 for d in dims):
        raise InvalidArgumentError(f"{spec}: shape must be a list of ints >= 0, got {shape!r}")
    return tuple(int(d) for d in dims)


def kind_of(dtype: np.dtype) -> str:
    return BYTES if dtype == DTYPES[BYTES] else FLOAT if dtype == np.float32 else INT64


@dataclasses.dataclass(frozen=True)
class FixedLenFeature:
    """A feature with exactly ``prod(shape)`` values, parsed into an array of ``shape``.

    Attributes:
      shape: the shape of the parsed value (``[]`` for a scalar).
      dtype: float32, int64 or a string dtype (``feedline.string``, ``bytes``, ``str``): byte
        strings, parsed into object arrays of ``bytes``.
      default_value: used where a record lacks the feature (broadcast to ``shape``); without one
        the feature is required.
    """

    shape: Sequence[int]
    dtype: Any
    default_value: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _feature_shape(self.shape, "FixedLenFeature"))
        dtype = _feature_dtype(self.dtype, "FixedLenFeature")
        object.__setattr__(self, "dtype", dtype)
        if self.default_value is not None:
            value = self.default_value
            try:
                if dtype == DTYPES[BYTES]:  # bytes as they are, str as UTF-8
                    array = as_bytes_leaf(np.asarray(value, dtype=object), encode_str=True)
                else:
                    array = np.asarray(value, dtype=dtype)
                default = np.broadcast_to(array, self.shape)
            except (ValueError, TypeError, InvalidArgumentError) as error:
                raise InvalidArgumentError(
                    f"FixedLenFeature: default_value {self.default_value!r} does not fit shape "
                    f"{list(self.shape)} and dtype {dtype}: {error}"
                ) from None
            object.__setattr__(self, "default_value", default)


@dataclasses.dataclass(frozen=True)
class VarLenFeature:
    """A feature with any number of values, parsed into a ``SparseArray`` as TensorFlow parses
    it into a ``SparseTensor``: ``dense_shape [n]`` for one record, ``[batch, longest]`` for a
    batch; ``.values`` holds the values themselves."""

    dtype: Any

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _feature_dtype(self.dtype, "VarLenFeature"))


@dataclasses.dataclass(frozen=True)
class FixedLenSequenceFeature:
    """A feature holding any number of items of ``shape`` (``tf.io.FixedLenSequenceFeature``),
    parsed into an array of ``[n, *shape]`` for one record and ``[batch, longest, *shape]`` for
    a batch, the shorter records padded with ``default_value``.

    Attributes:
      shape: the shape of one item; a record's values must be a whole number of items.
      dtype: float32, int64 or a string dtype, as ``FixedLenFeature``'s.
      allow_missing: must be True for ``Example`` records (a record without the feature has
        no items), as in TensorFlow.
      default_value: the scalar that pads shorter records (0, or ``b""`` for strings).
    """

    shape: Sequence[int]
    dtype: Any
    allow_missing: bool = False
    default_value: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _feature_shape(self.shape, "FixedLenSequenceFeature"))
        dtype = _feature_dtype(self.dtype, "FixedLenSequenceFeature")
        object.__setattr__(self, "dtype", dtype)
        if not self.allow_missing:
            raise InvalidArgumentError(
                "Unsupported: FixedLenSequenceFeature requires allow_missing to be True"
            )
        value = self.default_value
        if value is None:
            value = b"" if dtype == DTYPES[BYTES] else 0
        try:
            if dtype == DTYPES[BYTES]:
                pad = as_bytes_leaf(np.asarray(value, dtype=object), encode_str=True)
            else:
                pad = np.asarray(value, dtype=dtype)
        except (ValueError, TypeError, InvalidArgumentError) as error:
            raise InvalidArgumentError(
                f"FixedLenSequenceFeature: default_value {self.default_value!r} is not a "
                f"{dtype} scalar: {error}"
            ) from None
        if pad.shape != ():
            raise InvalidArgumentError(
                f"FixedLenSequenceFeature: default_value must be a scalar, got shape {pad.shape}"
            )
        object.__setattr__(self, "default_value", pad)


Spec = FixedLenFeature | FixedLenSequenceFeature | VarLenFeature


def check_features(features: Mapping[str, Spec]) -> None:
    if not isinstance(features, Mapping):
        raise InvalidArgumentError(
            f"features must be a dict of name -> FixedLenFeature/VarLenFeature, got {features!r}"
        )
    for key, spec in features.items():
        if not isinstance(spec, FixedLenFeature | FixedLenSequenceFeature | VarLenFeature):
            raise InvalidArgumentError(
                f"features[{key!r}] must be a FixedLenFeature, FixedLenSequenceFeature or "
                f"VarLenFeature, got {spec!r}"
            )
