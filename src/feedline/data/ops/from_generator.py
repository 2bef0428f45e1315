"""``Dataset.from_generator``: elements from a Python generator, checked against a signature."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import optree

from feedline import structure
from feedline.data.dataset import Dataset, DatasetIterator, IteratorContext
from feedline.errors import InvalidArgumentError
from feedline.structure import (
    RaggedArray,
    RaggedTensorSpec,
    SparseArray,
    SparseTensorSpec,
    TensorSpec,
)

_SIGNATURE_SPECS = (TensorSpec, RaggedTensorSpec, SparseTensorSpec)


def _is_shape(value: Any) -> bool:
    return (
        value is None
        or isinstance(value, list)
        or (isinstance(value, tuple) and all(d is None or isinstance(d, int) for d in value))
    )


def _is_dtype(value: Any) -> bool:
    return isinstance(value, np.dtype)


def _is_type_leaf(value: Any) -> bool:
    return not isinstance(value, tuple | dict)


def _signature(output_signature: Any, output_types: Any, output_shapes: Any) -> Any:
    """The element spec from ``output_signature``, or from ``output_types``/``output_shapes``:
    where the shapes are not given, every component has unknown rank, as in TensorFlow."""
    if output_signature is not None:
        if output_types is not None or output_shapes is not None:
            raise TypeError(
                "from_generator: give output_signature or output_types/output_shapes, not both"
            )
        leaves = structure.spec_leaves(output_signature)
        bad = [s for s in leaves if not isinstance(s, _SIGNATURE_SPECS)]
        if bad:
            raise TypeError(
                "from_generator: output_signature must hold TensorSpecs, RaggedTensorSpecs or "
                f"SparseTensorSpecs, got {bad[0]!r}"
            )
        return output_signature
    if output_types is None:
        raise TypeError("from_generator needs output_signature (or output_types)")
    types = optree.tree_map(np.dtype, output_types, is_leaf=_is_type_leaf)
    if output_shapes is None:
        return optree.tree_map(lambda t: TensorSpec(None, t), types, is_leaf=_is_dtype)
    return optree.tree_map(
        lambda t, shape: TensorSpec(None if shape is None else tuple(shape), t),
        types,
        output_shapes,
        is_leaf=lambda v: _is_dtype(v) or _is_shape(v),
    )


class GeneratorDataset(Dataset):
    """Elements produced by ``generator(*args)``, a callable returning an iterable.

    Each element is converted to the dtypes of the signature and checked against its shapes;
    given ``output_types`` alone, the components have unknown rank (``TensorSpec(None, dtype)``)
    and elements of any shape, one rank or another, are accepted, as in TensorFlow. The
    iterator's state is the number of elements produced: restoring calls the generator again and
    skips that many, so it restores exactly when the generator is deterministic.
    """

    def __init__(
        self,
        generator: Callable[..., Any],
        output_types: Any = None,
        output_shapes: Any = None,
        args: Sequence[Any] | None = None,
        output_signature: Any = None,
    ) -> None:
        super().__init__()
        if not callable(generator):
            raise TypeError(
                f"from_generator expects a callable that returns an iterable, got {generator!r}"
            )
        self._generator = generator
        self._args = tuple(structure.normalize(a) for a in (args or ()))
        self._element_spec = _signature(output_signature, output_types, output_shapes)

    def _make_iterator(self, ctx: IteratorContext) -> _GeneratorIterator:
        return _GeneratorIterator(self, ctx)

    def convert(self, value: Any) -> Any:
        """``value`` in the signature's dtypes; InvalidArgumentError where it does not fit."""
        spec = self.element_spec
        if isinstance(spec, _SIGNATURE_SPECS):
            return self._convert_leaf(spec, value)
        try:
            return structure.map_spec(self._convert_leaf, spec, value)
        except InvalidArgumentError:
            raise  # a leaf that does not fit says why
        except ValueError as error:
            raise InvalidArgumentError(
                f"from_generator: the generator yielded {value!r}, whose structure does not match "
                f"the signature {self._element_spec}"
            ) from error

    @staticmethod
    def _convert_leaf(spec: Any, value: Any) -> Any:
        if isinstance(spec, RaggedTensorSpec):
            return _ragged_leaf(spec, value)
        if isinstance(spec, SparseTensorSpec):
            return _sparse_leaf(spec, value)
        return GeneratorDataset._convert_dense(spec, value)

    @staticmethod
    def _convert_dense(spec: TensorSpec, value: Any) -> np.ndarray:
        """``value`` as an array of ``spec``'s dtype. For a bytes spec (object dtype), an object
        array of exact ``bytes``: ``bytes`` values as they are, ``str`` values UTF-8 encoded (as
        ``tf.string`` takes them); anything else is an InvalidArgumentError."""
        bytes_spec = spec.dtype == structure.BYTES
        try:
            if bytes_spec:
                array = structure.as_bytes_leaf(np.asarray(value, dtype=object), encode_str=True)
            else:
                array = np.asarray(value, dtype=spec.dtype if spec.dtype.kind != "U" else None)
        except (TypeError, ValueError, InvalidArgumentError) as error:
            raise InvalidArgumentError(
                f"from_generator: cannot convert {value!r} to "
                f"{'bytes' if bytes_spec else spec.dtype}: {error}"
            ) from error
        if not spec.is_compatible_with(TensorSpec(array.shape, spec.dtype)):
            raise InvalidArgumentError(
                f"from_generator: the generator yielded an element of shape {array.shape}, "
                f"which does not fit the declared shape {spec.shape}"
            )
        return array


def _ragged_leaf(spec: RaggedTensorSpec, value: Any) -> RaggedArray:
    """``value`` (a ``RaggedArray``, or nested lists as ``tf.ragged.constant`` takes them) as a
    ``RaggedArray`` of ``spec``'s dtypes; InvalidArgumentError where it does not fit."""
    try:
        if isinstance(value, RaggedArray):
            flat = np.asarray(value.flat_values, dtype=spec.dtype)
            ragged = RaggedArray.from_nested_row_splits(
                flat, value.nested_row_splits, validate=False
            ).with_row_splits_dtype(spec.row_splits_dtype)
        else:
            ragged = RaggedArray.from_list(
                value, spec.dtype, spec.ragged_rank, spec.row_splits_dtype
            )
    except (TypeError, ValueError, InvalidArgumentError) as error:
        raise InvalidArgumentError(
            f"from_generator: cannot convert {value!r} to a ragged value of {spec}: {error}"
        ) from error
    if not spec.is_compatible_with(ragged):
        raise InvalidArgumentError(
            f"from_generator: the generator yielded {ragged!r}, which does not fit the declared "
            f"{spec}"
        )
    return ragged


def _sparse_leaf(spec: SparseTensorSpec, value: Any) -> SparseArray:
    """``value`` (a ``SparseArray``) with ``spec``'s dtype; InvalidArgumentError where it is not
    one or does not fit."""
    if not isinstance(value, SparseArray):
        raise InvalidArgumentError(
            f"from_generator: the generator yielded {value!r} where the signature declares "
            f"{spec}: yield a feedline.data.SparseArray (SparseArray.from_dense(array) makes one)"
        )
    try:
        values = np.asarray(value.values, dtype=spec.dtype)
    except (TypeError, ValueError) as error:
        raise InvalidArgumentError(
            f"from_generator: cannot convert the values of {value!r} to {spec.dtype}: {error}"
        ) from error
    sparse = SparseArray(value.indices, values, value.dense_shape, validate=False)
    if not spec.is_compatible_with(sparse):
        raise InvalidArgumentError(
            f"from_generator: the generator yielded {sparse!r}, which does not fit the declared "
            f"{spec}"
        )
    return sparse


class _GeneratorIterator(DatasetIterator):
    _dataset: GeneratorDataset

    def __init__(self, dataset: GeneratorDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._iterator: Iterator[Any] | None = None
        self._produced = 0

    def _start(self) -> Iterator[Any]:
        iterable = self._dataset._generator(*self._dataset._args)
        try:
            return iter(iterable)
        except TypeError:
            raise TypeError(
                f"from_generator: the generator callable returned {type(iterable).__name__}, "
                "which is not iterable"
            ) from None

    def _next(self) -> Any:
        if self._iterator is None:
            self._iterator = self._start()
        value = next(self._iterator)
        self._produced += 1
        return self._dataset.convert(value)

    def _get_state(self) -> dict[str, Any]:
        return {"produced": self._produced}

    def _set_state(self, state: dict[str, Any]) -> None:
        produced = int(state["produced"])
        self._iterator = self._start()
        for _ in range(produced):
            next(self._iterator)
        self._produced = produced
