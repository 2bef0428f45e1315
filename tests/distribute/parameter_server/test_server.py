"""``Server`` and ``feedline server``: tasks of a ParameterServerStrategy cluster."""

from __future__ import annotations

import json
import signal

import pytest

from feedline._net import rpc
from feedline.cli import main
from feedline.distribute import Server
from feedline.distribute.parameter_server.protocol import SERVICE_NAME
from feedline.errors import InvalidArgumentError, PermissionDeniedError
from tests import launcher


def test_a_server_serves_its_task_and_stops() -> None:
    spec = launcher.tf_config_cluster({"ps": 1, "worker": 1})
    with Server(spec, "ps", 0) as server:
        client = rpc.RpcClient(spec["ps"][0], SERVICE_NAME)
        header, _ = client.call("Ping", {}, timeout=5)
        assert (header["job"], header["task"]) == ("ps", 0)
        assert server.target == f"grpc://{spec['ps'][0]}" and not server.join(timeout=0.01)
        client.close()
    assert server.join(timeout=1)


@pytest.mark.parametrize(
    ("job", "index", "match"),
    [
        ("chief", 0, "a Server plays a 'ps' or 'worker' task, not 'chief'"),
        ("ps", 3, r"has no task ps:3"),
    ],
)
def test_a_task_the_cluster_does_not_have_is_refused(job: str, index: int, match: str) -> None:
    spec = launcher.tf_config_cluster({"ps": 1, "chief": 1})
    with pytest.raises(InvalidArgumentError, match=match):
        Server(spec, job, index, start=False)


def test_feedline_server_checks_the_token_and_stops_on_sigterm() -> None:
    cluster = launcher.tf_config_envs({"ps": 1, "worker": 1})
    address = json.loads(cluster[0][1]["TF_CONFIG"])["cluster"]["ps"][0]
    with launcher.Processes(
        launcher.FEEDLINE_CLI,
        cluster[:1],
        argv=["server"],
        timeout=60,
        env={rpc.TOKEN_ENV: "s3cret"},
    ) as procs:
        banner = procs.wait_for_line("ps:0", "feedline server")
        assert banner == f"feedline server /job:ps/task:0 serving at {address}"
        with pytest.raises(PermissionDeniedError, match="missing or wrong service token"):
            rpc.RpcClient(address, SERVICE_NAME).call("Ping", {}, timeout=5)
        header, _ = rpc.RpcClient(address, SERVICE_NAME, "s3cret").call("Ping", {}, timeout=5)
        assert header["job"] == "ps"
        procs.send("ps:0", signal.SIGTERM)
        assert procs.wait_exit("ps:0", timeout=20) == 0


def test_feedline_server_reports_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    spec = launcher.tf_config_cluster({"worker": 1, "ps": 1})
    argv = ["server", "--cluster-spec", json.dumps(spec), "--job", "evaluator", "--task", "0"]
    assert main(argv) == 2
    assert (
        "error: a Server plays a 'ps' or 'worker' task, not 'evaluator'" in capsys.readouterr().err
    )
