"""``feedline.compat``: the ``tf.compat`` spellings that TensorFlow's pages use.

``feedline.compat.v1.distribute`` is ``feedline.distribute`` and ``feedline.compat.v1.data`` is
``feedline.data`` (the same module objects), imported on first access.
"""

from feedline import _porting

__getattr__, __dir__ = _porting.lazy_attributes(__name__, {"v1": "feedline.compat.v1"})

__all__ = ["v1"]
