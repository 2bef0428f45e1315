"""feedline: TensorFlow's distributed input system for PyTorch users.

``import feedline as tf`` reaches what the TensorFlow guides use: ``tf.data``,
``tf.distribute``, ``tf.data.experimental.service``, ``tf.config``, ``tf.nn``, ``tf.metrics``,
``tf.train``, ``tf.errors``, ``tf.datasets``, ``tf.compat.v1``, ``tf.nest``, and
``tf.py_function``/``tf.numpy_function`` (pass-throughs: feedline runs eagerly). Each is
imported on first access, so ``import feedline`` stays light and ``feedline.data`` never
imports torch. Dtype names (``feedline.float32``) and ``TensorSpec``/``TensorShape`` are here so
that tf.data code ports line
by line. TensorFlow names that feedline does not have (``tf.constant``, ``tf.keras``, ...) raise
an ``AttributeError`` that names the replacement; ``docs/porting.md`` lists them.

Example:
  >>> import feedline as tf
  >>> [b.tolist() for b in tf.data.Dataset.range(6).batch(4)]
  [[0, 1, 2, 3], [4, 5]]
"""

import numpy as _np

from feedline import _porting

__version__ = "0.1.0"

bool_ = _np.dtype(_np.bool_)
float16 = _np.dtype(_np.float16)
float32 = _np.dtype(_np.float32)
float64 = _np.dtype(_np.float64)
int8 = _np.dtype(_np.int8)
int16 = _np.dtype(_np.int16)
int32 = _np.dtype(_np.int32)
int64 = _np.dtype(_np.int64)
uint8 = _np.dtype(_np.uint8)
string = _np.dtype(object)  # byte strings: object arrays of Python bytes, as tf .numpy() gives


def TensorShape(dims: "list[int | None] | tuple[int | None, ...] | None") -> "tuple | None":
    """A shape as a tuple (``None`` for unknown dimensions), as ``tf.TensorShape`` spells it;
    ``TensorShape(None)``, an unknown rank, is ``None`` (what ``TensorSpec`` takes for it)."""
    return None if dims is None else tuple(None if d is None else int(d) for d in dims)


__getattr__, __dir__ = _porting.lazy_attributes(
    __name__,
    {
        "RaggedTensorSpec": "feedline.structure:RaggedTensorSpec",
        "SparseTensorSpec": "feedline.structure:SparseTensorSpec",
        "TensorSpec": "feedline.structure:TensorSpec",
        "compat": "feedline.compat",
        "config": "feedline.config",
        "data": "feedline.data",
        "datasets": "feedline.datasets",
        "distribute": "feedline.distribute",
        "errors": "feedline.errors",
        "io": "feedline.io",
        "metrics": "feedline.metrics",
        "nest": "feedline.nest",
        "nn": "feedline.nn",
        "numpy_function": "feedline._py_functions:numpy_function",
        "py_function": "feedline._py_functions:py_function",
        "service": "feedline.service",
        "train": "feedline.train",
    },
)

__all__ = [
    "RaggedTensorSpec",
    "SparseTensorSpec",
    "TensorShape",
    "TensorSpec",
    "__version__",
    "bool_",
    "compat",
    "config",
    "data",
    "datasets",
    "distribute",
    "errors",
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "io",
    "metrics",
    "nest",
    "nn",
    "numpy_function",
    "py_function",
    "service",
    "string",
    "train",
    "uint8",
]
