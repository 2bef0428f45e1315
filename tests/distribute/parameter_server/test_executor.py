"""What a worker task does with a ``Run`` request (``executor``): a real worker ``Server`` in
this process, called as the coordinator's agent calls it, with several functions to a request."""

from __future__ import annotations

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
    header = {"incarnation": incarnation, "closures": [[] for _ in args]}
    if budget is not None:
        header["budget_s"] = budget
    return client.upload("Run", header, data, timeout=30)


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
