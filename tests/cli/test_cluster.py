"""``feedline membership-store`` (``feedline.cli._cluster``): a real process, a real round."""

from __future__ import annotations

import signal

from feedline.distribute.elastic import ElasticClusterResolver, Rounds
from tests.launcher import FEEDLINE_CLI, Processes, free_port


def test_membership_store_serves_rounds_and_stops_on_sigterm() -> None:
    port = free_port()
    argv = ["membership-store", "--port", str(port)]
    with Processes(FEEDLINE_CLI, [("store", {})], argv=argv, timeout=60) as procs:
        banner = procs.wait_for_line("store", "feedline membership-store serving at")
        assert banner.endswith(f"127.0.0.1:{port}")
        rounds = Rounds(ElasticClusterResolver(f"127.0.0.1:{port}", timeout_seconds=10))
        generation = rounds.meet(None, 0)
        rounds.stop()
        assert (generation.number, generation.world_size, generation.rank) == (1, 1, 0)
        procs.send("store", signal.SIGTERM)
        assert procs.wait_exit("store", timeout=30) == 0
