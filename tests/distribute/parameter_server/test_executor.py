"""What a worker task does with a ``Run`` request (``executor``): a real worker ``Server`` in
this process, called as the coordinator's agent calls it, with several functions to a request."""

from __future__ import annotations

import sys
import threading
import time
from concurrent import futures
from typing import Any

from feedline._net import rpc
from feedline.distribute import Server
from feedline.distribute.parameter_server import closures, results
from feedline.distribute.parameter_server.protocol import SERVICE_NAME
from tests import launcher

RAN: list[int] = []


def _record(x: int) -> int:
    RAN.append(x)
    if x < 0:
        raise ValueError(f"negative: {x}")
    return x * 10


def _run(
    client: rpc.RpcClient, incarnation: str, *args: int, budget: float | None = None
) -> tuple[dict, list]:
    data = [closures.dumps_closure(_record, (x,), {})[0] for x in args]
    return _upload_run(client, incarnation, data, budget)


def _upload_run(
    client: rpc.RpcClient, incarnation: str, data: list[bytes], budget: float | None = None
) -> tuple[dict, list]:
    """A ``Run`` request of the pickled closures ``data``."""
    header: dict[str, Any] = {"incarnation": incarnation, "closures": [[] for _ in data]}
    if budget is not None:
        header["budget_s"] = budget
    # Waits for the channel: a connection whose handshake the server, starved of CPU, does not
    # answer within gRPC's 20 s is tried again instead of failing the call (seen once in a full
    # run with four test processes on two cores).
    return client.upload("Run", header, data, timeout=60, wait_for_ready=True)


def test_a_request_runs_its_functions_in_order_until_one_raises_or_its_time_is_up() -> None:
    spec = launcher.tf_config_cluster({"ps": 1, "worker": 1})
    RAN.clear()
    with Server(spec, "worker", 0) as server:
        client = rpc.RpcClient(spec["worker"][0], SERVICE_NAME)
        header, buffers = _run(client, server.incarnation, 1, 2, 3)
        assert [o["result"] for o in header["outcomes"]] == [True, True, True]
        assert all(o["seconds"] >= 0 for o in header["outcomes"])
        assert [results.loads(b) for b in buffers] == [10, 20, 30]

        header, buffers = _run(client, server.incarnation, 4, -5, 6, 7)
        first, failed, *skipped = header["outcomes"]
        assert first["result"] is True and [results.loads(b) for b in buffers] == [40]
        assert failed["error"]["message"] == "negative: -5" and failed["ps_task"] is None
        assert skipped == [{"skipped": True}, {"skipped": True}]
        assert RAN == [1, 2, 3, 4, -5]  # 6 and 7 never ran

        header, buffers = _run(client, server.incarnation, 8, 9, 10, budget=0.0)
        first, *skipped = header["outcomes"]  # the first one used the request's time
        assert first["result"] is True and [results.loads(b) for b in buffers] == [80]
        assert skipped == [{"skipped": True}, {"skipped": True}] and RAN[-1] == 8

        header, _ = _run(client, "an earlier incarnation", 11)
        assert header == {"restarted": True} and RAN[-1] == 8
        client.close()


# The functions of the test below: the first waits for the test's word, the second for the
# first's reply.
FIRST_RUNS = threading.Event()
FIRST_MAY_END = threading.Event()
FIRST_ANSWERED = threading.Event()


def _first() -> int:
    FIRST_RUNS.set()
    FIRST_MAY_END.wait(30)
    return 1


def _second() -> int:
    FIRST_ANSWERED.wait(30)
    return 2


def _call(client: rpc.RpcClient, incarnation: str, fn: Any) -> Any:
    data = closures.dumps_closure(fn, (), {})[0]
    header, buffers = _upload_run(client, incarnation, [data])
    return results.loads(buffers[0]) if header["outcomes"][0].get("result") else header


def test_a_reply_does_not_wait_for_the_function_run_after_it() -> None:
    """A function's pushes ride with the next waiting request's pulls; its reply goes at
    once, not once the next function (which took the lock as it ended) has run."""
    spec = launcher.tf_config_cluster({"ps": 1, "worker": 1})
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over often: the next request takes the lock
    try:
        with Server(spec, "worker", 0) as server, futures.ThreadPoolExecutor(2) as pool:
            executor = server._executor
            assert executor is not None
            client = rpc.RpcClient(spec["worker"][0], SERVICE_NAME)
            try:
                for _ in range(10):
                    for event in (FIRST_RUNS, FIRST_MAY_END, FIRST_ANSWERED):
                        event.clear()
                    first = pool.submit(_call, client, server.incarnation, _first)
                    assert FIRST_RUNS.wait(30)
                    second = pool.submit(_call, client, server.incarnation, _second)
                    deadline = time.monotonic() + 30
                    while executor._waiting < 2:  # the second request waits for the lock
                        assert time.monotonic() < deadline, "the second request never came"
                        time.sleep(0.005)
                    FIRST_MAY_END.set()
                    # The second function waits for the first reply: were that reply to
                    # wait for the second function, this would time out.
                    assert first.result(timeout=20) == 1
                    FIRST_ANSWERED.set()
                    assert second.result(timeout=30) == 2
            finally:  # nothing left waiting, whatever failed
                FIRST_MAY_END.set()
                FIRST_ANSWERED.set()
                client.close()
    finally:
        sys.setswitchinterval(interval)
