"""Whether a map function may run once on a whole batch instead of once per element.

``map(fn).batch(n)`` may call ``fn`` on the ``n`` stacked input rows (``fn(xs, ys)`` instead of
``fn(x, y)`` per row) only where that gives, bit for bit, the batch that calling it per element
and stacking gives, for every batch, and where calling it fewer or more times cannot be seen.
That cannot be proven of arbitrary Python, so the rule is conservative; a function passes only if
all of these hold:

1. **It is a plain function of straight-line NumPy arithmetic** (``screen``), under NumPy 2
   (whose result dtypes do not depend on values, NEP 50): a Python function
   (no partial, method or callable object) without branches, loops, nested functions,
   comprehensions, ``yield``, imports, subscripts, in-place operators, ``@`` or ``**``, and
   without writes to anything but its own local names. Every attribute it reads is ``astype`` or
   one of NumPy's dtypes and elementwise functions with exactly rounded results
   (``_NUMPY_NAMES``: ``add``, ``multiply``, ``clip``, ``where``, ``sqrt``, ``float32``, ...;
   no reductions, no ``random``, no transcendental functions, whose vector and scalar loops may
   round differently); no call names an ``out=`` argument. Every global or closure value it reads
   is the ``numpy`` module, one of those NumPy names, or an inert constant (a number, a dtype, a
   numeric array). Such a function has no effect but its result, so calling it on stand-in data,
   or once more on a batch whose elements are then computed one by one, cannot be seen.
2. **Every input component is numeric or bool with a fully known shape**, and so is every
   output component (strings and ragged data keep the per-element path).
3. **Trials agree exactly** (``agrees``): on random stand-in rows of the input spec and on the
   first rows of the real input (up to a batch of them), the batched call returns the same
   structure, dtypes, shapes and bytes as the per-element calls stacked. Random stand-ins catch
   what reads the batch as one (``x - x.mean()``, ``x[0]``, ``x.shape[0]``) even where the real
   first rows happen to be alike. A floating-point error or warning in a trial (division by
   zero, overflow) counts as a difference.

At run time a batched call that raises, or returns anything but the expected structure of
arrays with the batch's rows, is thrown away and the batch is computed element by element, so
an error is always raised by the element that causes it, as without fusion.
"""

from __future__ import annotations

import dis
import functools
import inspect
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from feedline import structure
from feedline.structure import TensorSpec

# fmt: off
_DTYPE_NAMES = frozenset((
    "bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "intp",
    "uintp", "float16", "float32", "float64", "complex64", "complex128",
))
_UFUNC_NAMES = frozenset((
    "add", "subtract", "multiply", "divide", "true_divide", "floor_divide", "remainder", "mod",
    "fmod", "negative", "positive", "absolute", "abs", "minimum", "maximum", "fmin", "fmax",
    "clip", "where", "sqrt", "square", "sign", "floor", "ceil", "trunc", "rint", "equal",
    "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and", "logical_or",
    "logical_not", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "invert",
    "left_shift", "right_shift", "isnan", "isinf", "isfinite",
))
#: The attributes a vectorisable function may read (of numpy, of its arguments or constants).
_NUMPY_NAMES = _DTYPE_NAMES | _UFUNC_NAMES
_ATTRIBUTES = _NUMPY_NAMES | {"astype"}

_OPCODES = frozenset((
    "RESUME", "NOP", "CACHE", "EXTENDED_ARG", "PRECALL", "CALL", "KW_NAMES", "CALL_KW",
    "PUSH_NULL", "LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST", "STORE_FAST",
    "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST", "LOAD_CONST", "RETURN_CONST", "RETURN_VALUE",
    "LOAD_GLOBAL", "LOAD_ATTR", "LOAD_METHOD", "LOAD_DEREF", "COPY_FREE_VARS", "BINARY_OP",
    "UNARY_NEGATIVE", "UNARY_INVERT", "CALL_INTRINSIC_1", "COMPARE_OP", "BUILD_TUPLE",
    "BUILD_MAP", "BUILD_CONST_KEY_MAP", "POP_TOP", "LOAD_SMALL_INT", "LOAD_FAST_BORROW",
    "LOAD_FAST_BORROW_LOAD_FAST_BORROW", "LOAD_CONST_IMMORTAL",
))
# fmt: on
_GENERATOR_FLAGS = (
    inspect.CO_GENERATOR
    | inspect.CO_COROUTINE
    | inspect.CO_ITERABLE_COROUTINE
    | inspect.CO_ASYNC_GENERATOR
)
# NumPy 2 types results by dtype alone (NEP 50); NumPy 1 looks at the values of scalars, so a
# scalar row and an array batch could promote differently from one batch to the next.
_DTYPES_BY_TYPE_ALONE = int(np.__version__.split(".", 1)[0]) >= 2
# BINARY_OP arguments: 4 is ``@``, 8 is ``**``, 13 and up are the in-place forms (``+=``).
_MATMUL, _POWER, _FIRST_INPLACE = 4, 8, 13
# Random stand-in rows per trial: odd and prime, so that no axis of the batch is mistaken for
# another of the same length.
_STAND_IN_ROWS = 7
_MAX_TRIAL_ROWS = 256


def _inert(value: Any) -> bool:
    """A value a vectorisable function may read from its globals, closure or defaults."""
    if value is None or type(value) in (bool, int, float, complex):
        return True
    if isinstance(value, np.generic | np.dtype):
        return value.dtype.kind in "biufc" if isinstance(value, np.generic) else True
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "biufc"
    if value is np:
        return True
    if isinstance(value, type) and issubclass(value, np.generic):
        return True
    return isinstance(value, np.ufunc) and value.__name__ in _UFUNC_NAMES


def screen(fn: Callable[..., Any]) -> bool:
    """Rule 1 of the module docstring: whether ``fn`` is straight-line NumPy arithmetic."""
    if type(fn) is not types.FunctionType or not _DTYPES_BY_TYPE_ALONE:
        return False
    code = fn.__code__
    if code.co_flags & _GENERATOR_FLAGS:
        return False
    if any(isinstance(c, types.CodeType) for c in code.co_consts):
        return False  # nested functions, lambdas, comprehensions
    if any(isinstance(c, tuple) and "out" in c for c in code.co_consts):
        return False  # a call with ``out=``
    builtins = fn.__globals__.get("__builtins__", {})
    cells = dict(zip(code.co_freevars, fn.__closure__ or (), strict=True))
    for instruction in dis.get_instructions(code):
        name = instruction.opname
        if name not in _OPCODES:
            return False
        if name == "BINARY_OP" and instruction.arg in (_MATMUL, _POWER):
            return False
        if name == "BINARY_OP" and (instruction.arg or 0) >= _FIRST_INPLACE:
            return False
        if name == "CALL_INTRINSIC_1" and instruction.argrepr != "INTRINSIC_UNARY_POSITIVE":
            return False
        if name in ("LOAD_ATTR", "LOAD_METHOD") and instruction.argval not in _ATTRIBUTES:
            return False
        if name == "LOAD_GLOBAL":
            key = str(instruction.argval)
            if key in fn.__globals__:
                value = fn.__globals__[key]
            elif isinstance(builtins, dict) and key in builtins:
                value = builtins[key]
            else:
                value = getattr(builtins, key, _MISSING)
            if not _inert(value):
                return False
        if name == "LOAD_DEREF":
            try:
                value = cells[str(instruction.argval)].cell_contents
            except (KeyError, ValueError):
                return False
            if not _inert(value):
                return False
    return all(_inert(v) for v in (fn.__defaults__ or ())) and all(
        _inert(v) for v in (fn.__kwdefaults__ or {}).values()
    )


_MISSING = object()


def numeric_known(spec: Any) -> bool:
    """Rule 2: every component is a numeric or bool ``TensorSpec`` with a fully known shape."""
    leaves = structure.spec_leaves(spec)
    return bool(leaves) and all(
        type(s) is TensorSpec
        and s.shape is not None  # (a rank that may be unknown)
        and None not in s.shape
        and s.dtype.kind in "biufc"
        for s in leaves
    )


def call(fn: Callable[..., Any], element: Any) -> Any:
    """``fn`` on ``element`` as map calls it: a plain tuple is unpacked into arguments."""
    return fn(*element) if type(element) is tuple else fn(element)


def stand_in_rows(spec: Any, seed: int = 0) -> Any:
    """``_STAND_IN_ROWS`` random rows of ``spec`` stacked (read-only, as a source's rows are)."""
    rng = np.random.default_rng(seed)

    def make(s: TensorSpec) -> np.ndarray:
        shape = (_STAND_IN_ROWS, *(int(d or 0) for d in s.shape or ()))
        if s.dtype.kind == "b":
            out = rng.integers(0, 2, shape).astype(bool)
        elif s.dtype.kind in "iu":
            info = np.iinfo(s.dtype)
            out = rng.integers(max(info.min, -1000), min(info.max, 1000), shape, endpoint=True)
            out = out.astype(s.dtype)
        else:
            out = (rng.standard_normal(shape) * 100).astype(s.dtype)
        return structure.read_only(out)

    return structure.map_spec(make, spec)


def accepted(
    out: Any, expected: list[tuple[tuple[int, ...], np.dtype]], treespec: Any, rows: int
) -> Any:
    """``out`` of a batched call as a batch of ``rows``, or None if it is not exactly one of
    the expected structure: fresh, writable arrays with the expected dtypes and row shapes
    (a leaf that shares memory with an earlier one, or is read-only, is copied)."""
    if type(out) is np.ndarray and treespec.is_leaf():
        leaves: Any = (out,)
    elif type(out) is tuple and len(out) == len(expected) and treespec == _flat_tuple(len(out)):
        leaves = out
    else:
        leaves, spec = structure.flatten(out)
        if spec != treespec:
            return None
    fixed: list[np.ndarray] = []
    for leaf, (shape, dtype) in zip(leaves, expected, strict=True):
        if type(leaf) is not np.ndarray or leaf.dtype != dtype or leaf.shape != (rows, *shape):
            return None
        if not leaf.flags.writeable or any(np.may_share_memory(leaf, f) for f in fixed):
            leaf = leaf.copy()
        fixed.append(leaf)
    if type(out) is tuple and leaves is out:
        return tuple(fixed)
    return structure.unflatten(treespec, fixed)


@functools.lru_cache(maxsize=64)
def _flat_tuple(n: int) -> Any:
    """The structure of a flat tuple of ``n`` leaves."""
    return structure.flatten(tuple(np.zeros(0) for _ in range(n)))[1]


def _same(a: Any, b: Any) -> bool:
    leaves_a, spec_a = structure.flatten(a)
    leaves_b, spec_b = structure.flatten(b)
    if spec_a != spec_b:
        return False
    for x, y in zip(leaves_a, leaves_b, strict=True):
        if type(x) is not np.ndarray or type(y) is not np.ndarray:
            return False
        if x.dtype != y.dtype or x.shape != y.shape or x.dtype.kind not in "biufc":
            return False
        if np.ascontiguousarray(x).tobytes() != np.ascontiguousarray(y).tobytes():
            return False
    return True


def agrees(fn: Callable[..., Any], batch: Any, rows: list[Any]) -> bool:
    """Rule 3 on one trial: whether ``fn`` on the stacked ``batch`` gives exactly the per-element
    results of ``rows`` stacked. Any error, floating-point errors included, counts as a
    difference."""
    try:
        with np.errstate(all="raise"):  # (per thread: other pipelines' threads are not touched)
            each = structure.batch_elements([structure.normalize(call(fn, r)) for r in rows])
            whole = structure.normalize(call(fn, batch))
    except Exception:
        return False
    return _same(each, whole)


def split_rows(batch: Any, rows: int) -> list[Any]:
    """The rows of a stacked ``batch`` as a source hands them out (read-only views)."""
    frozen = structure.map_structure(structure.read_only, batch)
    return [structure.slice_element(frozen, i) for i in range(rows)]


def output_layout(
    fn: Callable[..., Any], spec: Any
) -> tuple[list[tuple[tuple[int, ...], np.dtype]], Any] | None:
    """The row shape and dtype of every output component and the output structure, from one
    call on a stand-in row, or None where an output component is not numeric."""
    try:
        with np.errstate(all="ignore"):
            out = structure.normalize(call(fn, split_rows(stand_in_rows(spec), 1)[0]))
    except Exception:
        return None
    leaves, treespec = structure.flatten(out)
    if not leaves or any(
        not isinstance(leaf, np.ndarray | np.generic) or leaf.dtype.kind not in "biufc"
        for leaf in leaves
    ):
        return None
    return [(np.shape(leaf), leaf.dtype) for leaf in leaves], treespec


def trial_rows(batch_size: int) -> int:
    return min(batch_size, _MAX_TRIAL_ROWS)
