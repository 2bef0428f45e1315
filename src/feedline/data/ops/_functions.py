"""Calling user functions on elements: unpacking, output conversion, spec inference, error notes,
and chunks of calls as the parallel map's threads and worker processes make them."""

from __future__ import annotations

import contextlib
import dataclasses
import dis
import functools
import itertools
import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from feedline import structure
from feedline.data.dataset import raw_elements
from feedline.data.ops.elements import ElementsDataset
from feedline.errors import InvalidArgumentError
from feedline.structure import DatasetSpec, TensorSpec

if TYPE_CHECKING:
    from feedline.data.dataset import Dataset

Outcome = tuple[bool, Any]  # (True, element) or (False, exception)


def function_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def capture_closure(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with the variables it closes over bound to their values now.

    TensorFlow traces a dataset's function when the transformation is built, so a lambda made
    in a loop (``[ds.map(lambda x: x + i) for i in range(3)]``) keeps the ``i`` of its own turn.
    A Python closure reads its variables when called; this gives a plain function (and a
    function in a ``functools.partial``) fresh closure cells holding the values the variables
    have when the dataset is built. The objects are not copied: a list, dict or array that the
    function uses is shared, so writing into it later is seen (as a ``tf.Variable`` captured by
    a traced function is read when it runs). Global names are looked up when the function runs.
    A cell the function assigns (``nonlocal count; count += 1``: state it means to share with its
    enclosing scope), a cell not yet assigned (a function defined before a variable of its
    enclosing scope) and a cell holding the function itself (recursion) are left as they are.
    Anything else callable (a bound method, an object with ``__call__``) is returned unchanged.
    """
    if isinstance(fn, functools.partial):
        inner = capture_closure(fn.func)
        return fn if inner is fn.func else functools.partial(inner, *fn.args, **fn.keywords)
    if type(fn) is not types.FunctionType or not fn.__closure__:
        return fn
    assigned = _assigned_free_variables(fn.__code__)
    cells = []
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__, strict=True):
        if name in assigned:
            cells.append(cell)
            continue
        try:
            value = cell.cell_contents
        except ValueError:  # not assigned yet: keep the live cell
            cells.append(cell)
            continue
        cells.append(cell if value is fn else types.CellType(value))
    captured = types.FunctionType(
        fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, tuple(cells)
    )
    captured.__kwdefaults__ = fn.__kwdefaults__
    captured.__qualname__ = fn.__qualname__
    captured.__module__ = fn.__module__
    captured.__doc__ = fn.__doc__
    captured.__dict__.update(fn.__dict__)
    return captured


def _assigned_free_variables(code: types.CodeType) -> set[str]:
    """The free variables that ``code`` assigns or deletes (declared ``nonlocal`` in it)."""
    return {
        str(instruction.argval)
        for instruction in dis.get_instructions(code)
        if instruction.opname in ("STORE_DEREF", "DELETE_DEREF")
        and instruction.argval in code.co_freevars
    }


class UserFunction:
    """A user function applied to elements as tf.data does.

    A plain tuple element is unpacked into positional arguments; any other element (dict,
    namedtuple, array) is passed as one argument. The result is normalised to NumPy leaves. An
    exception from the function keeps its traceback and gains a note naming the operation. The
    function's closure is captured when the operation is built (``capture_closure``).
    """

    def __init__(self, fn: Callable[..., Any], operation: str) -> None:
        if not callable(fn):
            raise TypeError(f"{operation} expects a callable, got {type(fn).__name__}")
        self.fn = capture_closure(fn)
        self.operation = operation

    @property
    def description(self) -> str:
        return f"{self.operation}({function_name(self.fn)})"

    def call_raw(self, element: Any) -> Any:
        """Calls the function without converting its result (flat_map and interleave)."""
        try:
            if type(element) is tuple:
                return self.fn(*element)
            return self.fn(element)
        except Exception as error:
            error.add_note(f"raised by the function of {self.description}")
            raise

    def __call__(self, element: Any) -> Any:
        fn = self.fn
        try:
            out = fn(*element) if type(element) is tuple else fn(element)
            return structure.normalize(out)
        except Exception as error:
            if not any("raised by the function of" in n for n in getattr(error, "__notes__", ())):
                error.add_note(f"raised by the function of {self.description}")
            raise


def as_scalar_bool(fn: UserFunction, result: Any) -> bool:
    """``result`` of ``fn`` as a Python bool; InvalidArgumentError if it is no scalar bool.

    A Python ``bool``, ``np.bool_`` or 0-d bool array is accepted (what filter's and
    take_while's predicates must return); the error names the function and what it returned.
    """
    if result is True or result is False or isinstance(result, np.bool_):
        return bool(result)
    array = structure.to_array(result) if not isinstance(result, list | tuple) else None
    if array is not None and array.shape == () and array.dtype == np.bool_:
        return bool(array)
    shape = np.shape(array) if array is not None else None
    dtype = array.dtype if array is not None else type(result).__name__
    raise InvalidArgumentError(
        f"{fn.operation}: the predicate {fn.description} must return a scalar bool, "
        f"but returned {result!r} (dtype {dtype}, shape {shape}); compare explicitly "
        "(e.g. `x > 0`) and reduce arrays with .all() or .any()"
    )


def apply_chunk(fn: UserFunction, elements: list[Any]) -> tuple[list[Outcome], float]:
    """Applies ``fn`` to each element; returns the outcomes and the seconds it took.

    What a parallel map's thread pool runs, and what a ``map(..., use_processes=True)`` worker
    process runs (``_process_wire``), so that both report a chunk the same way.
    """
    start = time.perf_counter()
    outcomes: list[Outcome] = []
    for element in elements:
        try:
            outcomes.append((True, fn(element)))
        except Exception as error:
            outcomes.append((False, error))
    return outcomes, time.perf_counter() - start


def dummy_element(spec: Any, unknown: int, fill: int = 0) -> Any:
    """An element of ``spec`` filled with ``fill``, ``unknown`` in place of unknown dimensions;
    a component that is a dataset (``DatasetSpec``) gets ``unknown`` such elements."""

    def make(s: Any) -> Any:
        if isinstance(s, DatasetSpec):
            return ElementsDataset(
                [dummy_element(s.element_spec, unknown, fill)] * unknown, s.element_spec
            )
        if s.shape is None:  # unknown rank: a rank that differs between the samples
            shape: tuple[int, ...] = (unknown,) * unknown
        else:
            shape = tuple(unknown if d is None else d for d in s.shape)
        if isinstance(s, structure.SparseTensorSpec | structure.RaggedTensorSpec):
            dense = make(TensorSpec(shape, s.dtype))
            if isinstance(s, structure.SparseTensorSpec):  # every position holds ``fill``
                where = np.argwhere(np.ones(shape, bool))
                return structure.SparseArray(where, dense.ravel(), shape)
            return structure.RaggedArray.from_tensor(dense, s.ragged_rank or 1, s.row_splits_dtype)
        if s.dtype.kind == "U":
            return np.full(shape, str(fill))
        if s.dtype == structure.BYTES:  # byte strings: an object array of bytes such as b"0"
            return np.full(shape, str(fill).encode(), dtype=object)
        return np.full(shape, fill, dtype=s.dtype)

    return structure.map_spec(make, spec)


def _merge_leaf(a: Any, b: Any) -> Any:
    if isinstance(a, DatasetSpec) or isinstance(b, DatasetSpec):
        return a.most_specific_common(b)
    if a.dtype != b.dtype:
        # An empty output (``[n] * n`` at n = 0) has no dtype of its own: the other one decides.
        if 0 in a.shape and len(a.shape) == len(b.shape):
            a = TensorSpec(a.shape, b.dtype)
        elif 0 in b.shape and len(a.shape) == len(b.shape):
            b = TensorSpec(b.shape, a.dtype)
    return a.most_specific_common(b)


def _merge_ranks(a: Any, b: Any) -> Any:
    """As ``_merge_leaf``, but outputs of different ranks have unknown rank (for an input of
    unknown rank, whose samples differ in rank)."""
    if isinstance(a, TensorSpec) and isinstance(b, TensorSpec) and a.rank != b.rank:
        if a.dtype != b.dtype:
            raise InvalidArgumentError(f"outputs of dtypes {a.dtype} and {b.dtype}")
        return TensorSpec(None, a.dtype)
    return _merge_leaf(a, b)


def _merge_samples(a: Any, b: Any, merge: Callable[[Any, Any], Any] = _merge_leaf) -> Any:
    if not structure.same_structure(a, b):
        raise InvalidArgumentError("outputs have different structures")
    return structure.map_spec(merge, a, b)


def _relax_batch_dim(spec: Any, input_dataset: Dataset, element: Any) -> Any:
    """Where the input is batched with an unknown batch size, an output dimension 0 of that
    size is the batch dimension too, and unknown."""
    leaves = structure.spec_leaves(input_dataset.element_spec)
    if not leaves or any(
        not isinstance(s, TensorSpec) or not s.shape or s.shape[0] is not None for s in leaves
    ):
        return spec
    size = structure.leading_dim(element)
    return structure.map_spec(
        lambda s: (
            dataclasses.replace(s, shape=(None, *s.shape[1:]))  # a sparse or ragged spec too
            if getattr(s, "shape", ())[:1] == (size,)
            else s
        ),
        spec,
    )


# Samples the function is traced on: (fill value, size of unknown dimensions).
_SAMPLES = ((0, 1), (0, 2), (1, 1), (1, 2))
_MAX_REAL_SAMPLES = 100


def infer_output_spec(fn: Callable[[Any], Any], input_dataset: Dataset) -> Any:
    """The output spec of ``fn``, found the way tf.data traces a function: by running it.

    It runs on inputs filled with zeros and with ones, with unknown dimensions of size 1 and 2
    (and components of unknown rank of rank 1 and 2); output dimensions that differ between the
    runs are unknown (so shapes that depend on values or on unknown input sizes come out as
    ``None``, and ranks that follow an input of unknown rank come out unknown). Where the
    function cannot run on such samples, the spec is that of its first output on a real input
    element that it accepts.
    """
    specs = []
    for fill, unknown in _SAMPLES:
        try:
            specs.append(
                structure.spec_of(fn(dummy_element(input_dataset.element_spec, unknown, fill)))
            )
        except Exception:
            continue
    try:
        if specs:
            unknown_rank = any(
                isinstance(s, TensorSpec) and s.shape is None
                for s in structure.spec_leaves(input_dataset.element_spec)
            )
            merge = _merge_ranks if unknown_rank else _merge_leaf
            return functools.reduce(functools.partial(_merge_samples, merge=merge), specs)
    except (InvalidArgumentError, ValueError):
        pass  # outputs of different dtypes or structures on samples: real elements decide
    failure: Exception | None = None
    with contextlib.closing(iter(input_dataset)) as elements:
        for element in itertools.islice(raw_elements(elements), _MAX_REAL_SAMPLES):
            try:
                return _relax_batch_dim(structure.spec_of(fn(element)), input_dataset, element)
            except Exception as error:
                failure = error
    name = function_name(getattr(fn, "fn", fn))
    if failure is not None:
        failure.add_note(f"raised while learning the output spec of {name} from real elements")
        raise failure
    raise InvalidArgumentError(
        f"cannot learn the output spec of {name}: it fails on sample inputs of spec "
        f"{input_dataset.element_spec} and the input has no elements"
    )
