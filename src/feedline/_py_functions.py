"""``tf.py_function`` and ``tf.numpy_function``: calls of Python functions, as pass-throughs.

TensorFlow needs them to run Python code inside a traced graph. feedline runs eagerly, so both
simply call ``func`` on the inputs (NumPy arrays, as a pipeline's elements are) and convert what
it returns to ``Tout``. They work inside ``Dataset.map``, where ported code calls them. A body
that calls ``.numpy()`` on its inputs fails with ``AttributeError``: drop the call, the inputs
are NumPy already.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from feedline import structure

__all__ = ["numpy_function", "py_function"]


def _convert(value: Any, dtype: Any) -> Any:
    array = structure.to_array(value)
    dtype = np.dtype(dtype)
    if dtype == structure.BYTES or dtype.kind in "SU":
        return structure.as_bytes_leaf(np.asarray(array), encode_str=True)
    return np.asarray(array).astype(dtype, copy=False)


def _args(inp: Any) -> list[Any]:
    return list(inp) if isinstance(inp, Sequence) and not isinstance(inp, str | bytes) else [inp]


def _scalar(value: Any) -> Any:
    """A 0-d array as NumPy's scalar of it (``bytes`` for a byte string), as TensorFlow hands
    ``numpy_function`` its scalar inputs; anything else as it is."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value[()]
    return value


def _call(func: Callable[..., Any], args: list[Any], Tout: Any) -> Any:
    result = func(*args)
    if Tout is None:
        return None
    if isinstance(Tout, list | tuple):
        values = result if isinstance(result, list | tuple) else [result]
        if len(values) != len(Tout):
            raise ValueError(
                f"{getattr(func, '__name__', func)!r} returned {len(values)} values, but Tout "
                f"lists {len(Tout)} dtypes"
            )
        return [_convert(v, t) for v, t in zip(values, Tout, strict=True)]
    return _convert(result, Tout)


def py_function(
    func: Callable[..., Any],
    inp: Any,
    Tout: Any,
    name: str | None = None,
) -> Any:
    """``func(*inp)`` converted to ``Tout`` (a dtype, or a list of dtypes for several results).

    Example:
      >>> import numpy as np
      >>> import feedline as tf
      >>> tf.py_function(lambda a, b: a + b, [np.int64(1), 2], tf.float32)
      array(3., dtype=float32)
    """
    return _call(func, _args(inp), Tout)


def numpy_function(
    func: Callable[..., Any],
    inp: Any,
    Tout: Any,
    stateful: bool = True,
    name: str | None = None,
) -> Any:
    """``func(*inp)`` on NumPy inputs, converted to ``Tout``; ``stateful`` changes nothing.

    As in TensorFlow, a scalar input comes as a NumPy scalar, and a byte string as ``bytes``:

      >>> import numpy as np
      >>> import feedline as tf
      >>> tf.numpy_function(lambda s: s.decode().upper(), [np.array(b"hi", object)], tf.string)
      array(b'HI', dtype=object)
    """
    return _call(func, [_scalar(a) for a in _args(inp)], Tout)
