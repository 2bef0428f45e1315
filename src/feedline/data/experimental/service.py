"""``feedline.data.experimental.service``: the data service under the seed's name.

The same objects as ``feedline.service`` (which depends on ``feedline.data``, not the other way
round: this module is only an alias, imported when asked for).
"""

from feedline.service import *  # noqa: F403
from feedline.service import __all__ as __all__
