"""Enum-valued settings as users type them: a member, or the member's name as a string.

TensorFlow accepts ``"SUM"`` for ``ReduceOp.SUM`` in some places and only members in others;
feedline accepts both wherever an enum is asked for, and says which members exist when given
something else.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, TypeVar

from feedline.errors import InvalidArgumentError

__all__ = ["parse_member"]

E = TypeVar("E", bound=enum.Enum)


def parse_member(
    enum_type: type[E], value: Any, what: str, aliases: Mapping[str, E] | None = None
) -> E:
    """The member of ``enum_type`` that ``value`` names.

    Accepted: a member; the member's name in any case (``"DATA"``, ``"data"``); a string of
    ``aliases``; for an integer enum, the member's integer value (not a bool).

    Args:
      enum_type: the enum class.
      value: what the user gave.
      what: the setting's name, for the error message (``"auto_shard_policy"``).
      aliases: other strings that name members, matched exactly.

    Raises:
      InvalidArgumentError: ``value`` names no member; the message lists them.

    Example:
      >>> class Mode(enum.Enum):
      ...     SUM = "SUM"
      ...     MEAN = "MEAN"
      >>> parse_member(Mode, "mean", "reduce_op")
      <Mode.MEAN: 'MEAN'>
    """
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str):
        if aliases and value in aliases:
            return aliases[value]
        name = value.strip().upper()
        if name in enum_type.__members__:
            return enum_type[name]
    elif isinstance(value, int) and not isinstance(value, bool) and issubclass(enum_type, int):
        try:
            return enum_type(value)
        except ValueError:
            pass
    members = ", ".join(f"{enum_type.__name__}.{name}" for name in enum_type.__members__)
    example = next(iter(enum_type.__members__))
    others = "".join(f", {alias!r}" for alias in aliases or ())
    raise InvalidArgumentError(
        f"{what} must be a member of {enum_type.__name__} ({members}) or a member's name as a "
        f"string (such as {example!r}{others}), got {value!r}"
    )
