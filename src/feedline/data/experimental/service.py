"""``feedline.data.experimental.service``: the data service under the seed's name.

The same objects as ``feedline.service`` (which depends on ``feedline.data``, not the other way
round: this module is only an alias, imported when asked for). Its names resolve on first use,
as ``feedline.service``'s servers do.
"""

from feedline import _porting
from feedline.service import __all__ as __all__

__getattr__, __dir__ = _porting.lazy_attributes(
    __name__, {name: f"feedline.service:{name}" for name in __all__}
)
