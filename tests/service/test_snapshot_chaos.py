"""The ``distributed_save`` chaos harness (``benchmarks/snapshot_chaos.py``): one round of the
faults ``test_distributed_save.py`` does not cover, a worker and the fault-tolerant dispatcher
killed together (kill -9) mid-save while a ``Dataset.load(path, wait=True)`` reader reads the
snapshot through both kills. Real processes; every wait is bounded by the harness.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks.snapshot_chaos import run_round

pytestmark = pytest.mark.timeout(240)


def test_a_save_and_its_reader_under_kill_9_of_both_get_every_element_once(
    tmp_path: Path,
) -> None:
    row = run_round(
        "both-kill-9+reader",
        tmp_path,
        elements=320,
        delay=0.01,
        fault_fraction=0.25,
        hang_seconds=90,
        worker_timeout_ms=1000,  # the killed worker's stream moves after 1-2 s, not 10-11
    )
    # The fault came before the save had finished.
    assert not row.streams_done_at_fault.endswith("(finished)"), row
    assert (row.lost, row.duplicated, row.wrong, row.hung) == (0, 0, 0, False), row
    assert (row.reader_lost, row.reader_duplicated, row.reader_error) == (0, 0, None), row
    assert not row.broken
