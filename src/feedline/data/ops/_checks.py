"""The argument checks that operations share: ints, counts, sizes, parallelism and seeds.

Each check returns the value as a plain ``int`` (NumPy integers and other ``__index__`` types
included, ``bool`` refused) or raises an error that names the operation, the argument, the
value given and the range allowed.

Example:
  >>> check_positive("batch_size", 4, "batch")
  4
  >>> check_count(-1, "take")
  -1
  >>> check_int("start", True, "enumerate")
  Traceback (most recent call last):
  ...
  feedline.errors.InvalidArgumentError: enumerate: start must be an int, got True
"""

from __future__ import annotations

import re
from typing import Any

from feedline.data.dataset import AUTOTUNE
from feedline.errors import InvalidArgumentError


def check_int(name: str, value: Any, operation: str, expected: str = "an int") -> int:
    """``value`` as an int; else an InvalidArgumentError ``"{operation}: {name} must be
    {expected}, got {value!r}"``."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidArgumentError(f"{operation}: {name} must be {expected}, got {value!r}")
    return int(value)


def check_positive(name: str, value: Any, operation: str) -> int:
    """``value`` as a positive int, or an InvalidArgumentError that names it and the range."""
    value = check_int(name, value, operation, expected="an int >= 1")
    if value <= 0:
        raise InvalidArgumentError(f"{operation}: {name} must be >= 1, got {value}")
    return value


def check_count(count: Any, operation: str) -> int:
    """``count`` as an int >= -1 (-1 meaning all), else an error naming it."""
    count = check_int("count", count, operation)
    if count < -1:
        raise InvalidArgumentError(
            f"{operation}: count must be >= 0, or -1 for all elements; got {count}"
        )
    return count


def check_parallel_calls(value: Any, operation: str) -> int | None:
    """``num_parallel_calls`` as None, an int >= 1 or ``AUTOTUNE``, else an error naming it."""
    if value is None:
        return None
    value = check_int("num_parallel_calls", value, operation)
    if value < 1 and value != AUTOTUNE:
        raise InvalidArgumentError(
            f"{operation}: num_parallel_calls must be >= 1 or AUTOTUNE (-1), got {value}"
        )
    return value


def check_seed(seed: Any, operation: str) -> int | None:
    """``seed`` as None or an int; else a TypeError naming the operation."""
    if seed is not None and (isinstance(seed, bool) or not hasattr(seed, "__index__")):
        raise TypeError(f"{operation}: seed must be an int or None, got {seed!r}")
    return seed if seed is None else int(seed)


_DEVICE = re.compile(
    r"^(?:/job:[^/]+(?:/replica:\d+)?(?:/task:\d+)?)?/?(?:device:)?(?P<kind>cpu|gpu|cuda)"
    r"(?::(?P<index>\d+))?$",
    re.IGNORECASE,
)


def canonical_device(name: Any) -> str:
    """``"cpu"`` or ``"cuda:N"`` for a PyTorch or TensorFlow device name (``"/gpu:0"``,
    ``"GPU:1"``, ``"/job:localhost/replica:0/task:0/device:GPU:0"``, ``"cuda"``, ``"/cpu:0"``)
    or a ``torch.device``.

    Example:
      >>> canonical_device("/gpu:1"), canonical_device("cuda"), canonical_device("/cpu:0")
      ('cuda:1', 'cuda:0', 'cpu')

    Raises:
      InvalidArgumentError: not the name of a CPU or CUDA device.
    """
    text = str(name) if type(name).__name__ == "device" else name
    match = _DEVICE.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise InvalidArgumentError(
            f"unknown device {name!r}; use 'cuda:N', '/gpu:N', 'GPU:N' or '/cpu:0'"
        )
    if match["kind"].lower() == "cpu":
        return "cpu"
    return f"cuda:{int(match['index'] or 0)}"
