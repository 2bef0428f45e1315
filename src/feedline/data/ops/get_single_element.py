"""``Dataset.get_single_element``: the one element of a dataset (a terminal method)."""

from __future__ import annotations

import contextlib
from typing import Any

from feedline.data.dataset import Dataset
from feedline.errors import InvalidArgumentError


def get_single_element(dataset: Dataset) -> Any:
    """The only element of ``dataset``; InvalidArgumentError if it has none or more than one.

    Example:
      >>> from feedline.data import Dataset
      >>> int(get_single_element(Dataset.range(3, 4)))
      3
    """
    with contextlib.closing(iter(dataset)) as elements:
        first = next(elements, _NONE)
        if first is _NONE:
            raise InvalidArgumentError("Dataset was empty.")
        if next(elements, _NONE) is not _NONE:
            raise InvalidArgumentError(
                "Dataset had more than one element. (take(1) or batch the dataset into one "
                "element first)"
            )
    return first


_NONE: Any = object()
