"""``feedline torchrun``: torch's elastic launcher, set up for agents that join later rounds.

torch's c10d rendezvous shares its agent's store with the workers by default, and an agent that
joins a later round of the rendezvous (a node added under ``--nnodes MIN:MAX``, or one that
replaces a lost node) then waits for ever for the first round's store (pytorch#135712).
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` turns the sharing off; feedline's workers meet in either
store. ``feedline torchrun ARGS`` is ``torchrun ARGS`` (``python -m torch.distributed.run``,
which replaces this process, so signals and the exit code are torchrun's own) with that variable
set to 1 unless the environment sets it already.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

__all__ = ["SHARE_STORE_VARIABLE", "launcher_command", "torchrun"]

#: torch's switch for the agent store that workers share (``"1"``: not shared).
SHARE_STORE_VARIABLE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def launcher_command(
    argv: Sequence[str], environ: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that ``feedline torchrun ARGV`` runs."""
    env = dict(environ)
    env.setdefault(SHARE_STORE_VARIABLE, "1")
    return [sys.executable, "-m", "torch.distributed.run", *argv], env


def torchrun(argv: Sequence[str]) -> int:
    """Replaces this process with torchrun given ``argv`` (``launcher_command``); returns only
    if that cannot start (exit code 2, the reason on stderr)."""
    command, env = launcher_command(argv, os.environ)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(command[0], command, env)
    except OSError as error:
        print(f"feedline torchrun: error: cannot start {command[0]}: {error}", file=sys.stderr)
    return 2
