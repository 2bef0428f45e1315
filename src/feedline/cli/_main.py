"""``main``: parses ``feedline``'s arguments and runs the sub-command they name."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

from feedline.cli._parser import RUN, build_parser, parameter_server_demo_parser
from feedline.errors import FeedlineError

_PARAMETER_SERVER = "--parameter-server"
_TORCHRUN = "torchrun"


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``feedline ARGV``; its exit code.

    Args:
      argv: the arguments after ``feedline``; default ``sys.argv[1:]``.

    ``feedline torchrun ARGS`` hands ARGS to torchrun unparsed (``feedline.cli._torchrun``).
    A feedline error or ``OSError`` that a command raises is one line on stderr,
    ``feedline COMMAND: error: ...``, and exit code 2.

    Raises:
      SystemExit: for ``--help`` and ``--version`` (code 0) and for a bad argument (code 2,
        after one line on stderr).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [_TORCHRUN]:  # every argument after it is torchrun's, --help too
        return _runner("feedline.cli._torchrun:torchrun")(argv[1:])
    # `feedline demo --parameter-server` has options of its own (its --workers are cluster
    # tasks): its own parser, whose --help lists them.
    if argv[:1] == ["demo"] and _PARAMETER_SERVER in argv[1:]:
        options = vars(parameter_server_demo_parser().parse_args(argv[1:]))
    else:
        options = vars(build_parser().parse_command(argv))
        if options.pop("parameter_server", False):  # an abbreviation of the flag
            options = vars(parameter_server_demo_parser().parse_args(argv[1:]))
    command = options.pop("command", None) or "demo"
    options.pop("parameter_server", None)
    runner = _runner(options.pop(RUN))
    try:
        return runner(**options)
    except (FeedlineError, OSError) as error:  # one line, as a bad argument is
        print(f"feedline {command}: error: {error}", file=sys.stderr, flush=True)
        return 2


def _runner(target: str) -> Callable[..., int]:
    """The function ``"module:function"`` names. Each command imports only what it runs:
    ``feedline worker`` and ``feedline dispatcher`` never load torch, nor ``--help`` anything."""
    module, _, name = target.partition(":")
    runner: Callable[..., int] = getattr(importlib.import_module(module), name)
    return runner
