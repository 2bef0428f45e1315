"""The chaos harness (``benchmarks/chaos.py``), short: one fault at a time on a real cluster,
and what the service promises under it in its delivery mode.

Each scenario runs a dispatcher, three workers and two consumers as processes; the harness
counts what the consumers received, lost, got twice or got from another dataset, and whether
one hung. In at-most-once mode only what a killed worker or consumer held may be lost; every
other column is zero, and a lost job is an error every consumer sees.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks.chaos import MODES, SCENARIOS, run_scenario, table

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_service_keeps_its_promise_under_one_fault(scenario: str, tmp_path: Path) -> None:
    row = run_scenario(
        scenario, MODES["at-most-once"], elements=3000, hang_seconds=45, workdir=tmp_path
    )
    assert not row.violations, table([row])
    assert row.wrong == row.duplicated == 0 and not row.hung
