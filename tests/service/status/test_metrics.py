"""Prometheus metrics at ``/metrics`` of the dispatcher's and the workers' status ports.

Each test runs real servers on loopback, reads a known dataset through them, scrapes
``/metrics`` over HTTP and parses it with ``prometheus_client``'s own parser, then checks the
values that follow from the run: reading ``range(100)`` of int64 scalars serves 100 elements
of 800 bytes in all.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from feedline import service
from feedline.data import Dataset
from tests.service.conftest import Cluster
from tests.service.http_helpers import fetch, scrape, value

pytestmark = pytest.mark.timeout(60)

WAIT_S = 10.0


def status_cluster(make_cluster: Callable[..., Cluster], workers: int, **config: object) -> Cluster:
    """A dispatcher and ``workers`` workers, each with a status port."""
    cluster = make_cluster(num_workers=0, status_port=0, **config)
    for _ in range(workers):
        cluster.add_worker(status_port=0, heartbeat_interval_ms=200)
    return cluster


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.05)


def test_elements_and_bytes_served_follow_from_the_run(make_cluster) -> None:
    cluster = status_cluster(make_cluster, workers=1)
    dataset = Dataset.range(100).apply(
        service.distribute("distributed_epoch", cluster.target, job_name="counted")
    )
    assert sorted(int(x) for x in dataset) == list(range(100))

    (worker,) = cluster.workers
    samples = scrape(worker.status_url)
    assert value(samples, "feedline_worker_elements_served_total") == 100
    assert value(samples, "feedline_worker_bytes_served_total") == 100 * 8
    replies = value(samples, "feedline_worker_get_elements_duration_seconds_count")
    assert 1 <= replies <= 101  # one reply carries many elements
    assert value(samples, "feedline_worker_get_elements_duration_seconds_bucket", le="+Inf") == (
        replies
    )

    def job_finished() -> bool:
        samples = scrape(cluster.dispatcher.status_url)
        return value(samples, "feedline_dispatcher_jobs", state="finished") == 1

    # The dispatcher hears that the task ended with the worker's next heartbeat.
    wait_for(job_finished, "the dispatcher sees the job finish")
    samples = scrape(cluster.dispatcher.status_url)
    get_job = "feedline_dispatcher_request_duration_seconds_count"
    assert value(samples, get_job, method="GetOrCreateJob") == 1
    assert value(samples, get_job, method="RegisterDataset") == 1
    assert value(samples, get_job, method="WorkerHeartbeat") >= 1
    assert value(samples, "feedline_dispatcher_workers") == 1
    assert value(samples, "feedline_dispatcher_datasets") == 1
    # The named job stays (job_gc_timeout_ms) after its consumer left; its task ended.
    assert value(samples, "feedline_dispatcher_jobs", state="running") == 0
    assert value(samples, "feedline_dispatcher_tasks", state="done") == 1
    assert value(samples, "feedline_dispatcher_consumers") == 0
    assert value(samples, "feedline_dispatcher_heartbeats_missed_total", kind="worker") == 0


def test_two_workers_count_apart_and_add_up(make_cluster) -> None:
    """Each server has a registry of its own: two workers in one process share nothing."""
    cluster = status_cluster(make_cluster, workers=2)
    dataset = Dataset.range(100).apply(service.distribute("distributed_epoch", cluster.target))
    assert sorted(int(x) for x in dataset) == list(range(100))
    served = [
        value(scrape(w.status_url), "feedline_worker_elements_served_total")
        for w in cluster.workers
    ]
    assert sum(served) == 100, served


def test_buffer_and_task_gauges_while_a_job_runs(make_cluster) -> None:
    cluster = status_cluster(make_cluster, workers=1)
    dataset = Dataset.range(10**9).apply(service.distribute("distributed_epoch", cluster.target))
    iterator = iter(dataset)
    try:
        assert [int(next(iterator)) for _ in range(10)] == list(range(10))
        (worker,) = cluster.workers
        samples: dict[tuple[str, frozenset], float] = {}

        def buffered() -> bool:
            samples.clear()
            samples.update(scrape(worker.status_url))
            return value(samples, "feedline_worker_buffered_elements") > 0

        # The gauges of the scrape that saw elements buffered (one snapshot of the buffer): a
        # later scrape may find the consumer's prefetch has just taken them all.
        wait_for(buffered, "the worker buffers elements ahead of the consumer")
        assert value(samples, "feedline_worker_tasks") == 1
        assert value(samples, "feedline_worker_buffered_bytes") > 0
        assert 0 < value(samples, "feedline_worker_buffer_fill") <= 1
        assert 0 <= value(samples, "feedline_worker_seconds_since_heartbeat") < WAIT_S
        samples = scrape(cluster.dispatcher.status_url)
        assert value(samples, "feedline_dispatcher_jobs", state="running") == 1
        assert value(samples, "feedline_dispatcher_tasks", state="running") == 1
        assert value(samples, "feedline_dispatcher_consumers") == 1
    finally:
        iterator.close()


def test_errors_are_counted_by_type(make_cluster) -> None:
    cluster = status_cluster(make_cluster, workers=1)

    def label(x):
        if x == 3:
            raise KeyError("element 3 has no label")
        return x

    # A named job: it outlives its consumer, which may raise (the error comes in the worker's
    # reply) and leave before the worker's report reaches the dispatcher.
    dataset = (
        Dataset.range(10)
        .map(label)
        .apply(service.distribute("distributed_epoch", cluster.target, job_name="labelled"))
    )
    with pytest.raises(KeyError):
        list(dataset)
    (worker,) = cluster.workers
    samples = scrape(worker.status_url)
    assert value(samples, "feedline_worker_task_failures_total", type="KeyError") == 1

    def job_failure_counted() -> bool:  # the worker reports the failure with a heartbeat
        samples = scrape(cluster.dispatcher.status_url)
        key = ("feedline_dispatcher_job_failures_total", frozenset({("type", "KeyError")}))
        return samples.get(key) == 1

    wait_for(job_failure_counted, "the dispatcher counts the job's failure")
    # A request the dispatcher refuses is counted by method and type.
    with pytest.raises(Exception, match="not registered"):
        service.from_dataset_id("parallel_epochs", cluster.target, "no-such-dataset")
    samples = scrape(cluster.dispatcher.status_url)
    assert (
        value(
            samples,
            "feedline_dispatcher_request_errors_total",
            method="GetElementSpec",
            type="NotFoundError",
        )
        == 1
    )
    _, _, page = fetch(cluster.dispatcher.status_url)
    assert "KeyError: element 3 has no label" in page


def test_a_worker_that_stops_heartbeating_is_counted(make_cluster) -> None:
    cluster = status_cluster(
        make_cluster, workers=1, worker_timeout_ms=300, job_gc_check_interval_ms=100
    )
    cluster.workers[0].stop()  # no drain: the dispatcher is not told

    def dropped() -> bool:
        # Both in one scrape: under load (-n 3) a scrape right after the one that saw the count
        # once still found the worker registered, so the two are not read one scrape apart.
        samples = scrape(cluster.dispatcher.status_url)
        missed = value(samples, "feedline_dispatcher_heartbeats_missed_total", kind="worker")
        return missed >= 1 and value(samples, "feedline_dispatcher_workers") == 0

    wait_for(dropped, "the dispatcher counts the worker's missed heartbeats and drops it")
    _, _, page = fetch(cluster.dispatcher.status_url)
    assert "missed its heartbeats" in page


def test_the_page_and_metrics_need_the_token_when_the_service_has_one(make_cluster) -> None:
    cluster = make_cluster(num_workers=0, status_port=0, token="s3cret")
    url = cluster.dispatcher.status_url
    status, headers, body = fetch(url + "metrics")
    assert status == 401 and "Bearer" in headers["WWW-Authenticate"], body
    status, _, _ = fetch(url + "metrics", {"Authorization": "Bearer wrong"})
    assert status == 401
    assert value(scrape(url, token="s3cret"), "feedline_dispatcher_workers") == 0
    # The page shows jobs' error messages (pipeline data): it needs the token as well, from
    # the header or (for a browser) the query, and shows no secret.
    status, _, body = fetch(url)
    assert status == 401 and "token" in body
    assert fetch(url + "?token=wrong")[0] == 401
    status, _, page = fetch(url, {"Authorization": "Bearer s3cret"})
    assert status == 200 and "s3cret" not in page
    status, headers, page = fetch(url + "?token=s3cret")
    assert status == 200 and "s3cret" not in page
    # The browser keeps it in a cookie that scripts cannot read, for the page's links.
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    kept = {"Authorization": "", "Cookie": cookie.split(";")[0]}
    assert fetch(url + "metrics", kept)[0] == 200
    assert fetch(url, {"Authorization": "", "Cookie": "feedline_token=wrong"})[0] == 401


def test_without_a_status_port_there_is_no_status_server(make_cluster) -> None:
    cluster = make_cluster(num_workers=1)
    assert cluster.dispatcher.status_url is None
    assert cluster.workers[0].status_url is None


def test_worker_gauges_say_how_many_workers_the_jobs_need(make_cluster) -> None:
    """``feedline_dispatcher_workers`` counts the live workers and
    ``feedline_dispatcher_desired_workers`` the workers the running jobs need: none while no
    job runs, at least one while one does, more while its consumer waits for elements that
    a slow map makes."""
    cluster = status_cluster(make_cluster, workers=1)
    samples = scrape(cluster.dispatcher.status_url)
    assert value(samples, "feedline_dispatcher_workers") == 1
    assert value(samples, "feedline_dispatcher_desired_workers") == 0

    def slow(x):
        time.sleep(0.02)  # the worker makes at most 50 elements/s; the consumer takes more
        return x

    dataset = (
        Dataset.range(10**9)
        .map(slow)
        .apply(service.distribute("distributed_epoch", cluster.target))
    )
    iterator = iter(dataset)
    try:

        def desired() -> float:
            next(iterator)
            return value(
                scrape(cluster.dispatcher.status_url), "feedline_dispatcher_desired_workers"
            )

        wait_for(lambda: desired() >= 2, "the dispatcher asks for more workers")
    finally:
        iterator.close()
