"""``feedline.compat.v1``: ``tf.compat.v1`` names, resolved to feedline's modules.

Example:
  >>> import feedline
  >>> feedline.compat.v1.data is feedline.data
  True
"""

from feedline import _porting

__getattr__, __dir__ = _porting.lazy_attributes(
    __name__, {"data": "feedline.data", "distribute": "feedline.distribute"}
)

__all__ = ["data", "distribute"]  # noqa: F822 (resolved by __getattr__)
