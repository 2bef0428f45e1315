"""Clusters of real processes for the parameter-server tests: ``feedline server`` for the ps
and worker tasks (``servers``), beside the code under test that ``tests/launcher.py`` runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tests import launcher


@contextlib.contextmanager
def servers(
    processes: Sequence[tuple[str, Mapping[str, str]]],
    *,
    timeout: float = 120.0,
    wait: bool = True,
) -> Iterator[launcher.Processes]:
    """Starts ``feedline server`` for each ``ps:i`` and ``worker:i`` of ``processes`` (from
    ``launcher.tf_config_envs``) and, with ``wait``, waits until each serves (without, the
    tasks that call them wait for them: the cluster starts in parallel, as it does for real)."""
    tasks = [(name, env) for name, env in processes if name.split(":")[0] in ("ps", "worker")]
    with launcher.Processes(
        launcher.FEEDLINE_CLI, tasks, argv=["server"], timeout=timeout
    ) as procs:
        for name, _ in tasks if wait else ():
            procs.wait_for_line(name, "feedline server", timeout=60)
        yield procs


def only(processes: Sequence[tuple[str, Mapping[str, str]]], *names: str) -> list:
    """The entries of ``processes`` named ``names``."""
    return [(name, env) for name, env in processes if name in names]


@contextlib.contextmanager
def ps_here(processes: Sequence[tuple[str, Mapping[str, str]]]) -> Iterator[None]:
    """Runs the ``ps`` tasks of ``processes`` as servers in this (the test's) process."""
    import json

    from feedline.distribute import Server

    cluster = json.loads(processes[0][1]["TF_CONFIG"])["cluster"]
    running = [Server(cluster, "ps", i) for i in range(len(cluster["ps"]))]
    try:
        yield
    finally:
        for server in running:
            server.stop()


def chief_strategy(spec: Any, **kwargs: Any) -> Any:
    """A coordinator-form strategy (the chief's) over ``spec``."""
    from feedline.distribute import ParameterServerStrategy
    from feedline.distribute.cluster_resolver import SimpleClusterResolver

    return ParameterServerStrategy(
        SimpleClusterResolver(spec, task_type="chief", task_id=0), connect_timeout=10, **kwargs
    )
