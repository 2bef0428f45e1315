"""Functions of ``tf.data.experimental`` that read a dataset or build one from another:
``at``, ``get_structure``, ``get_next_as_optional``, ``enable_debug_mode``, and the
transformations ``unbatch``, ``parse_example_dataset`` and ``pad_to_cardinality`` (for
``Dataset.apply``), each made of the operations of ``feedline.data``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from feedline import structure
from feedline.data.dataset import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Dataset,
    DatasetIterator,
    Optional,
)
from feedline.errors import InvalidArgumentError, OutOfRangeError

if TYPE_CHECKING:
    from feedline.io.features import FixedLenFeature, VarLenFeature

__all__ = [
    "at",
    "enable_debug_mode",
    "get_next_as_optional",
    "get_structure",
    "pad_to_cardinality",
    "parse_example_dataset",
    "unbatch",
]


def at(dataset: Dataset, index: int) -> Any:
    """The element of ``dataset`` at ``index`` (``tf.data.experimental.at``).

    TensorFlow answers only for datasets with random access; feedline answers for every finite
    or infinite dataset by reading up to the element (``skip(index).take(1)``), so it costs
    ``index`` elements of work.

    Raises:
      OutOfRangeError: ``index`` is negative or not below the number of elements.

    Example:
      >>> at(Dataset.range(5).map(lambda x: x * 10), 2).tolist()
      20
    """
    if isinstance(index, bool) or not isinstance(index, int | np.integer):
        raise InvalidArgumentError(f"at: index must be an int, got {index!r}")
    cardinality = dataset.cardinality()
    if index < 0 or (cardinality >= 0 and index >= cardinality):
        known = f"[0, {cardinality})" if cardinality >= 0 else "[0, ...)"
        raise OutOfRangeError(f"at: index {index} is out of range {known}")
    for element in dataset.skip(int(index)).take(1):
        return element
    raise OutOfRangeError(f"at: index {index} is out of range: the dataset ended before it")


def get_structure(dataset_or_iterator: Dataset | DatasetIterator) -> Any:
    """The element spec of a dataset or an iterator (``tf.data.experimental.get_structure``).

    Example:
      >>> get_structure(Dataset.range(3))
      TensorSpec(shape=(), dtype=int64)
    """
    if isinstance(dataset_or_iterator, Dataset | DatasetIterator):
        return dataset_or_iterator.element_spec
    raise InvalidArgumentError(
        "get_structure: expected a Dataset or an iterator of one, got "
        f"{type(dataset_or_iterator).__name__}"
    )


def get_next_as_optional(iterator: DatasetIterator) -> Optional:
    """``iterator.get_next_as_optional()``, TensorFlow's older spelling.

    Example:
      >>> it = iter(Dataset.range(1))
      >>> get_next_as_optional(it).has_value(), get_next_as_optional(it).has_value()
      (True, False)
    """
    return iterator.get_next_as_optional()


def enable_debug_mode() -> None:
    """TensorFlow's switch to run ``map`` functions eagerly, one element at a time. feedline
    always calls user functions as plain Python on each element, so there is nothing to switch:
    this does nothing and is safe to call."""


def unbatch() -> Callable[[Dataset], Dataset]:
    """``ds.apply(unbatch())`` is ``ds.unbatch()``.

    Example:
      >>> [x.tolist() for x in Dataset.range(4).batch(2).apply(unbatch())]
      [0, 1, 2, 3]
    """

    def _apply_fn(dataset: Dataset) -> Dataset:
        return dataset.unbatch()

    return _apply_fn


def parse_example_dataset(
    features: Mapping[str, FixedLenFeature | VarLenFeature],
    num_parallel_calls: int = 1,
    deterministic: bool | None = None,
) -> Callable[[Dataset], Dataset]:
    """Parses a dataset of batches of serialized ``tf.train.Example`` records into dicts of
    arrays: ``ds.apply(parse_example_dataset(f))`` is
    ``ds.map(lambda s: feedline.io.parse_example(s, f))``, whose element spec is TensorFlow's:
    ``TensorSpec((batch, *shape))`` for a ``FixedLenFeature``, ``SparseTensorSpec((batch,
    None))`` for a ``VarLenFeature`` (its elements are ``SparseArray``).

    Args:
      features: ``{name: FixedLenFeature | VarLenFeature}``, as for ``parse_example``.
      num_parallel_calls: how many batches are parsed at once (or ``AUTOTUNE``).
      deterministic: as for ``map``.

    Raises:
      InvalidArgumentError: the dataset's elements are not vectors of strings (batch the
        records first: ``TFRecordDataset(...).batch(n)``).
    """
    if not isinstance(features, Mapping) or not features:
        raise InvalidArgumentError(
            f"parse_example_dataset: features must be a non-empty dict, got {features!r}"
        )

    def _apply_fn(dataset: Dataset) -> Dataset:
        spec = dataset.element_spec
        if not (
            isinstance(spec, structure.TensorSpec)
            and spec.shape is not None
            and len(spec.shape) == 1
            and spec.dtype.kind in "SUO"
        ):
            raise InvalidArgumentError(
                "parse_example_dataset: the input must be a dataset of vectors of serialized "
                f"records (batch them first, e.g. TFRecordDataset(files).batch(32)); got "
                f"element_spec {spec}"
            )
        return parse_batches(dataset, features, num_parallel_calls, deterministic)

    return _apply_fn


def parse_batches(
    dataset: Dataset,
    features: Mapping[str, FixedLenFeature | VarLenFeature],
    num_parallel_calls: int | None = None,
    deterministic: bool | None = None,
    label_key: str | None = None,
) -> Dataset:
    """``dataset`` (of vectors of serialized ``Example`` records) mapped through
    ``parse_example``, with the element spec TensorFlow's ``parse_example_dataset`` declares
    (``parsed_spec``: ``SparseTensorSpec((batch, None))`` for a ``VarLenFeature``), where
    learning it from the function would see one batch's sizes. With ``label_key``, elements
    are ``(features, label)``."""
    # Loaded here: feedline.data itself stays free of the protobuf-based feedline.io.
    from feedline.io.parsing import parse_example, parsed_spec

    specs = dict(features)
    batch = dataset.element_spec.shape[0]

    def parse(records: Any) -> Any:
        parsed = parse_example(records, specs)
        if label_key is None:
            return parsed
        label = parsed.pop(label_key)
        return parsed, label

    out = dataset.map(parse, num_parallel_calls=num_parallel_calls, deterministic=deterministic)
    spec: Any = parsed_spec(specs, batch)
    if label_key is not None:
        spec = (spec, spec.pop(label_key))
    out._element_spec = spec  # declared, as TensorFlow's parsing op declares it
    return out


def pad_to_cardinality(cardinality: int, mask_key: str = "valid") -> Callable[[Dataset], Dataset]:
    """Pads a finite dataset of dicts with zero-filled elements up to ``cardinality`` elements;
    every element gains ``mask_key``: True for the dataset's own, False for the padding.

    Raises:
      InvalidArgumentError: the elements are not dicts, a component's shape is not fully known,
        the dataset's cardinality is unknown or infinite, or more than ``cardinality``.

    Example:
      >>> ds = Dataset.from_tensor_slices({"a": np.array([1, 2])})
      >>> [(int(e["a"]), bool(e["valid"])) for e in ds.apply(pad_to_cardinality(3))]
      [(1, True), (2, True), (0, False)]
    """

    def _apply_fn(dataset: Dataset) -> Dataset:
        spec = dataset.element_spec
        if not isinstance(spec, dict):
            raise InvalidArgumentError(
                f"pad_to_cardinality requires a dataset of dicts, got element_spec {spec}"
            )
        if mask_key in spec:
            raise InvalidArgumentError(
                f"pad_to_cardinality: the elements already have the key {mask_key!r}; choose "
                "another mask_key"
            )
        current = dataset.cardinality()
        if current in (UNKNOWN_CARDINALITY, INFINITE_CARDINALITY):
            which = "unknown" if current == UNKNOWN_CARDINALITY else "infinite"
            raise InvalidArgumentError(
                f"pad_to_cardinality needs a dataset of known, finite cardinality; this one's is "
                f"{which} (apply assert_cardinality(n) first if you know it)"
            )
        if current > cardinality:
            raise InvalidArgumentError(
                "The dataset passed into `pad_to_cardinality` must have a cardinality less than "
                f"the target cardinality ({cardinality}), but has cardinality {current}"
            )
        padding: dict[str, Any] = {key: _zeros(key, s) for key, s in spec.items()}
        padding[mask_key] = np.False_
        marked = dataset.map(lambda element: {**element, mask_key: np.True_})
        return marked.concatenate(Dataset.from_tensors(padding).repeat(cardinality - current))

    return _apply_fn


def _zeros(key: str, spec: Any) -> np.ndarray:
    if not isinstance(spec, structure.TensorSpec) or spec.shape is None or None in spec.shape:
        raise InvalidArgumentError(
            f"pad_to_cardinality: component {key!r} must have a fully known shape to be padded, "
            f"got {spec}"
        )
    shape = tuple(int(d) for d in spec.shape if d is not None)
    if spec.dtype.kind in "SUO":
        return np.full(shape, b"", dtype=spec.dtype)
    return np.zeros(shape, dtype=spec.dtype)
