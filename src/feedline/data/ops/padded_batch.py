"""``Dataset.padded_batch``: batches of elements padded to a common shape."""

from __future__ import annotations

from collections.abc import Sequence
from types import EllipsisType
from typing import Any

import numpy as np

from feedline import structure
from feedline.data.dataset import Dataset, DatasetIterator, IteratorContext
from feedline.data.ops._checks import check_positive
from feedline.data.ops.batch import batched_cardinality, pull_up_to
from feedline.errors import InvalidArgumentError
from feedline.structure import TensorSpec

Shape = tuple[int | None, ...]


def _parse_shape(spec: TensorSpec, shape: Any, name: str) -> Shape:
    """``shape``: None, an int (a vector's length), or a list/tuple of ints with None or -1
    for "the longest in the batch"."""
    if shape is None:
        if spec.shape is None:
            raise InvalidArgumentError(
                f"padded_batch: {name} has unknown rank ({spec}): give its padded_shapes, as "
                "TensorFlow requires for components of unknown rank, or give the source its "
                "shapes (from_generator's output_shapes or output_signature)"
            )
        return spec.shape
    if isinstance(shape, np.ndarray):
        shape = shape.tolist()
    if hasattr(shape, "__index__") and not isinstance(shape, bool):
        shape = [shape]  # an int is the length of a vector, as in tf.data
    dims = shape if isinstance(shape, Sequence) and not isinstance(shape, str | bytes) else None
    if dims is None or any(
        isinstance(d, bool) or not (d is None or hasattr(d, "__index__")) for d in dims
    ):
        raise InvalidArgumentError(
            f"padded_batch: the padded shape of {name} must be an int or a list of ints (None "
            f"or -1 for the batch's longest), got {shape!r}"
        )
    dims = tuple(None if d is None or d == -1 else int(d) for d in dims)
    if any(p is not None and p < 0 for p in dims):
        raise InvalidArgumentError(
            f"padded_batch: the padded shape {shape!r} of {name} has a negative dimension"
        )
    if spec.shape is not None and (
        len(dims) != spec.rank
        or any(
            p is not None and s is not None and p < s for p, s in zip(dims, spec.shape, strict=True)
        )
    ):
        raise InvalidArgumentError(
            f"padded_batch: the padded shape {shape!r} of {name} is not compatible with its "
            f"shape {spec.shape}: it needs rank {spec.rank} and no dimension smaller than the "
            "input's"
        )
    return dims


def _parse_value(spec: TensorSpec, value: Any, name: str) -> np.ndarray:
    """The padding value of one component: a scalar of its dtype (default 0, False, "" or b"").

    Byte strings pad with a 0-d object array holding ``bytes`` (a ``str`` value is UTF-8
    encoded), unicode strings with a 0-d ``U`` array (a ``bytes`` value is UTF-8 decoded).
    """
    if value is None:
        return (
            np.zeros((), dtype="U1") if spec.dtype.kind == "U" else structure.zeros((), spec.dtype)
        )
    array = np.asarray(value) if isinstance(value, list) else structure.to_array(value)
    if array.shape != ():
        raise InvalidArgumentError(
            f"padded_batch: the padding value of {name} must be a scalar, got shape {array.shape}"
        )
    kind, want = array.dtype.kind, spec.dtype.kind
    if want in "OU" and kind in "OSU":
        if want == "O" and kind == "U":
            return structure.bytes_scalar(array.item().encode("utf-8"))
        if want == "U" and kind != "U":
            try:
                return np.asarray(structure.to_array(array).item().decode("utf-8"))
            except UnicodeDecodeError as error:
                raise InvalidArgumentError(
                    f"padded_batch: the padding value {value!r} of {name} is not UTF-8 text, but "
                    f"{name} holds str: {error}"
                ) from None
        return structure.to_array(array)
    if want in "OU" or kind in "OSU" or not np.can_cast(array.dtype, spec.dtype, "same_kind"):
        raise InvalidArgumentError(
            f"padded_batch: the padding value {value!r} "
            f"({'bytes' if kind in 'OS' else array.dtype}) of {name} does not fit its dtype "
            f"{'bytes' if want == 'O' else spec.dtype}; give a value of that dtype"
        )
    return np.asarray(array, dtype=spec.dtype)


def _per_component(spec: Any, given: Any, parse: Any, what: str) -> list[Any]:
    """``parse(spec, value, name)`` for every component, ``given`` matching ``spec``'s structure.

    A ``given`` that is one value where ``spec`` has several components applies to all of them.
    """
    leaves, treespec = structure.flatten(spec)
    names = ["component " + "/".join(map(str, p)) if p else "the element" for p in treespec.paths()]
    if given is None:
        return [parse(s, None, n) for s, n in zip(leaves, names, strict=True)]
    try:
        values = treespec.flatten_up_to(given)
    except ValueError:
        if what == "padding_values" and len(leaves) > 1:
            return [parse(s, given, n) for s, n in zip(leaves, names, strict=True)]
        raise InvalidArgumentError(
            f"padded_batch: {what} {given!r} does not match the structure of the elements {spec}"
        ) from None
    return [parse(s, v, n) for s, v, n in zip(leaves, values, names, strict=True)]


class PaddedBatchDataset(Dataset):
    """Batches ``batch_size`` consecutive elements, padding every component to one shape.

    ``padded_shapes`` (a shape per component, with the elements' structure) fixes the padded
    size of each dimension; ``None`` or ``-1`` pads it to the longest in the batch, and that is
    what every dimension gets when ``padded_shapes`` is left out. ``padding_values`` (one scalar
    per component, or one for all) defaults to 0, False or the empty string. An element larger
    than its padded shape is an InvalidArgumentError.

    Example:
      >>> import numpy as np
      >>> from feedline.data import Dataset, TensorSpec
      >>> ds = Dataset.from_generator(
      ...     lambda: ([n] * n for n in range(1, 4)), output_signature=TensorSpec([None], np.int64)
      ... )
      >>> [b.tolist() for b in ds.padded_batch(2)]
      [[[1, 0], [2, 2]], [[3, 3, 3]]]
      >>> [b.tolist() for b in ds.padded_batch(3, padded_shapes=[4], padding_values=-1)]
      [[[1, -1, -1, -1], [2, 2, -1, -1], [3, 3, 3, -1]]]
    """

    def __init__(
        self,
        input_dataset: Dataset,
        batch_size: int,
        padded_shapes: Any = None,
        padding_values: Any = None,
        drop_remainder: bool = False,
    ) -> None:
        super().__init__((input_dataset,))
        self._batch_size = check_positive("batch_size", batch_size, "padded_batch")
        self._drop_remainder = bool(drop_remainder)
        spec = input_dataset.element_spec
        structure.check_dense(
            spec,
            "padded_batch",
            "pad a RaggedArray with map(lambda r: r.to_tensor()) or a SparseArray with "
            "map(lambda s: s.to_dense()) first, or batch it with batch or ragged_batch",
        )
        self._shapes = _per_component(spec, padded_shapes, _parse_shape, "padded_shapes")
        self._values = _per_component(spec, padding_values, _parse_value, "padding_values")
        leaves, self._treespec = structure.flatten(spec)
        self._names = [
            "component " + "/".join(map(str, p)) if p else "the element"
            for p in self._treespec.paths()
        ]
        size = self._batch_size if self._drop_remainder else None
        self._element_spec = structure.unflatten(
            self._treespec,
            [
                TensorSpec((size, *shape), s.dtype)
                for s, shape in zip(leaves, self._shapes, strict=True)
            ],
        )

    def _cardinality(self) -> int:
        return batched_cardinality(
            self._inputs[0].cardinality(), self._batch_size, self._drop_remainder
        )

    def _make_iterator(self, ctx: IteratorContext) -> _PaddedBatchIterator:
        return _PaddedBatchIterator(self, ctx)

    def pad(self, elements: list[Any]) -> Any:
        """The elements padded and stacked into one batch."""
        columns = zip(*(structure.flatten(e)[0] for e in elements), strict=True)
        padded = [
            _pad_column(list(column), shape, value, name)
            for column, shape, value, name in zip(
                columns, self._shapes, self._values, self._names, strict=True
            )
        ]
        return structure.unflatten(self._treespec, padded)


def _pad_column(column: list[Any], shape: Shape, value: np.ndarray, name: str) -> np.ndarray:
    shapes = [np.shape(a) for a in column]
    if any(len(s) != len(shape) for s in shapes):
        raise InvalidArgumentError(
            f"padded_batch: {name} has rank {len(shape)} in element_spec, but the elements have "
            f"shapes {sorted(set(shapes))}"
        )
    longest = tuple(max(dims) for dims in zip(*shapes, strict=True)) if shape else ()
    target: tuple[int, ...] = tuple(
        m if p is None else p for p, m in zip(shape, longest, strict=True)
    )
    for i, element_shape in enumerate(shapes):
        if any(d > t for d, t in zip(element_shape, target, strict=True)):
            raise InvalidArgumentError(
                f"padded_batch: {name} of element {i} in the batch has shape {element_shape}, "
                f"larger than its padded shape {target}; raise padded_shapes, or give None for "
                "a dimension to pad it to the batch's longest"
            )
    dtype = column[0].dtype
    if dtype.kind == "U":
        dtype = np.result_type(*[a.dtype for a in column], value.dtype)
    out_shape = (len(column), *target)
    if len(target) == 1 and dtype.kind in "biuf" and len(column) > 1:
        # Vectors: every row's values land through one mask, not a copy per element.
        lengths = np.fromiter((s[0] for s in shapes), np.int64, len(shapes))
        out = np.full(out_shape, value, dtype=dtype)
        out[np.arange(target[0]) < lengths[:, None]] = np.concatenate(column)
        return out
    if dtype == structure.BYTES:
        out = structure.full_bytes(out_shape, value.item())
    else:
        out = np.full(out_shape, value, dtype=dtype)
    for i, array in enumerate(column):
        # ``...`` makes a 0-d object array's item, not the array, what lands in ``out``.
        region: tuple[int | slice | EllipsisType, ...] = (
            i,
            *(slice(0, d) for d in np.shape(array)),
            ...,
        )
        out[region] = array
    return out


class _PaddedBatchIterator(DatasetIterator):
    _dataset: PaddedBatchDataset

    def __init__(self, dataset: PaddedBatchDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)

    def _next(self) -> Any:
        dataset = self._dataset
        return dataset.pad(pull_up_to(self._input, dataset._batch_size, dataset._drop_remainder))

    def _get_state(self) -> dict[str, Any]:
        return {"input": self._input.get_state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._input.set_state(state["input"])
