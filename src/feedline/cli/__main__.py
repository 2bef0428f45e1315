"""``python -m feedline.cli``: the ``feedline`` command line."""

from feedline.cli import main

raise SystemExit(main())
