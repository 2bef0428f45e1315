"""Progress bars for the demos: on a terminal only.

In a log (stderr redirected to a file or a pipe) a bar's redraws would be noise, so there the
demos show no bar and print one line per epoch, as they do on a terminal too.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def on_a_terminal() -> bool:
    """Whether stderr, where bars are drawn, is a terminal."""
    return sys.stderr.isatty()


def progress_bar(
    iterable: Iterable[T], *, total: int | None, desc: str, enabled: bool = True
) -> tqdm[T]:
    """A ``tqdm`` bar over ``iterable`` that goes away when done (``leave=False``), drawn only
    where ``enabled`` and stderr is a terminal; elsewhere it iterates without drawing.

    Example:
      >>> bar = progress_bar(range(3), total=3, desc="epoch 1", enabled=False)
      >>> [x for x in bar]
      [0, 1, 2]
    """
    return tqdm(
        iterable, total=total, desc=desc, leave=False, disable=not (enabled and on_a_terminal())
    )
