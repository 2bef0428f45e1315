"""``data.experimental.from_list``: a dataset of the elements of a Python list, one by one."""

from __future__ import annotations

import functools
from typing import Any

from feedline import structure
from feedline.data.dataset import Dataset
from feedline.data.ops.elements import ElementsDataset
from feedline.errors import InvalidArgumentError


class ListDataset(ElementsDataset):
    """The elements of ``elements``, a non-empty list of elements of one structure; random-access.

    Unlike ``from_tensor_slices``, each list item is one element, so the items may differ in
    shape (``[[1], [2, 3]]``): the element spec has ``None`` where they differ, and an unknown
    rank where their ranks differ (as TensorFlow's). Every item must have the same structure
    and, leaf for leaf, the same dtype (an InvalidArgumentError, a ``ValueError``, otherwise).
    Elements are read-only views.

    Example:
      >>> ds = ListDataset([(1, "a"), (2, "b")])
      >>> [(int(x), y.item()) for x, y in ds]
      [(1, b'a'), (2, b'b')]
    """

    def __init__(self, elements: list[Any]) -> None:
        if not isinstance(elements, list):
            raise InvalidArgumentError(
                f"from_list: elements must be a list, got {type(elements).__name__}"
            )
        if not elements:
            raise InvalidArgumentError("from_list: elements must not be empty")
        normalized = [structure.normalize(e) for e in elements]
        specs = [structure.spec_of(e) for e in normalized]
        for i, spec in enumerate(specs[1:], start=1):
            if not structure.same_structure(specs[0], spec):
                raise InvalidArgumentError(
                    f"from_list: elements[{i}] has the structure {spec}, but elements[0] has "
                    f"{specs[0]}; every element needs the same structure"
                )
        try:
            self._element_spec = functools.reduce(structure.common_spec, specs)
        except InvalidArgumentError as error:
            raise InvalidArgumentError(
                f"from_list: the elements' components differ in dtype ({error}); give "
                "every element the same dtypes, e.g. np.float32(1) instead of 1"
            ) from None
        super().__init__(
            [structure.map_structure(structure.read_only, e) for e in normalized],
            self._element_spec,
            "from_list",
        )


def from_list(elements: list[Any], name: str | None = None) -> Dataset:
    """``tf.data.experimental.from_list``: a dataset of the items of ``elements``, one by one.

    Args:
      elements: a non-empty list of elements of the same structure, dtypes and ranks; their
        shapes may differ.
      name: accepted for TensorFlow compatibility; feedline names no operations.

    Example:
      >>> [x.tolist() for x in from_list([[1], [2, 3]])]
      [[1], [2, 3]]
    """
    return ListDataset(elements)
