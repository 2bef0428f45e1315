"""What a training process that reads from the data service loads: no dispatcher, worker,
journal or status-page code (``feedline.service``'s layout by role)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

# A training process: it imports feedline.service, reads a distribute() dataset to its end and
# reports what it read and which modules it loaded.
_CONSUMER = """
import json, sys
from feedline import service
from feedline.data import Dataset

to_service = service.distribute("parallel_epochs", {target!r})
dataset = Dataset.range(6).map(lambda x: x * 10).apply(to_service)
got = sorted(int(x) for x in dataset)
print(json.dumps({{"got": got, "modules": sorted(sys.modules)}}))
"""

# Modules a consumer must not load: the servers' code and what only they use.
_SERVER_ONLY = (
    "feedline.service.dispatcher",
    "feedline.service.worker",
    "feedline.service.status",
    "sqlite3",
    "http.server",
)
# feedline modules outside feedline.data (whose operations all load with it) that a consumer
# loaded when this bound was set: 39 (with TLS, the local secret, element specs as data, the
# retries of the gRPC layer, the cross-trainer cache, distributed_save's client and the shares of
# a job read by a cluster); the bound leaves room for a few more.
_MAX_FEEDLINE_MODULES = 42


def test_a_consumer_loads_no_server_code(make_cluster: Any) -> None:
    cluster = make_cluster(1)
    done = subprocess.run(
        [sys.executable, "-c", _CONSUMER.format(target=cluster.target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["got"] == [0, 10, 20, 30, 40, 50]
    modules = report["modules"]
    loaded = [m for m in modules if any(m == s or m.startswith(s + ".") for s in _SERVER_ONLY)]
    assert loaded == []
    feedline = [m for m in modules if m == "feedline" or m.startswith("feedline.")]
    print(f"a consumer loads {len(feedline)} feedline modules")
    assert "feedline.service.client.job_reader" in feedline
    beyond_data = [m for m in feedline if not m.startswith("feedline.data")]
    print(f"{len(beyond_data)} of them outside feedline.data")
    assert len(beyond_data) <= _MAX_FEEDLINE_MODULES, beyond_data
