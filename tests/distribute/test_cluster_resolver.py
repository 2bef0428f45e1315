"""Tests of feedline/distribute/cluster_resolver.py."""

from __future__ import annotations

import json

import pytest

from feedline.distribute.cluster_resolver import (
    ClusterResolver,
    ClusterSpec,
    SimpleClusterResolver,
    SyncGroup,
    TFConfigClusterResolver,
    TorchrunClusterResolver,
    multi_worker_environment,
    resolve,
    shared_store_warning,
    sync_group,
)
from feedline.errors import FailedPreconditionError, InvalidArgumentError
from tests.launcher import run, tf_config_envs, torchrun_envs

_CLUSTER_VARIABLES = (
    "TF_CONFIG",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)

# The example TF_CONFIG of TensorFlow's strategy documentation.
SEED_TF_CONFIG = {
    "cluster": {"worker": ["localhost:12345", "localhost:23456"], "ps": ["localhost:34567"]},
    "task": {"type": "worker", "index": 0},
}

TORCHRUN_ENV = {
    "RANK": "2",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.7",
    "MASTER_PORT": "29500",
}


@pytest.fixture(autouse=True)
def _no_cluster_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _CLUSTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _set_tf_config(monkeypatch: pytest.MonkeyPatch, config: object) -> None:
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))


def _set_torchrun(monkeypatch: pytest.MonkeyPatch, **overrides: str | None) -> None:
    for name, value in {**TORCHRUN_ENV, **overrides}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


# ClusterSpec


def test_cluster_spec_dense_and_sparse_jobs() -> None:
    spec = ClusterSpec({"worker": ["w0:1", "w1:1"], "ps": {"2": "p2:1", 0: "p0:1"}})
    assert spec.jobs == ["ps", "worker"]
    assert spec.num_tasks("worker") == 2
    assert spec.num_tasks("ps") == 2
    assert spec.task_indices("ps") == [0, 2]
    assert spec.task_address("ps", 2) == "p2:1"
    assert spec.job_tasks("ps") == ["p0:1", None, "p2:1"]
    assert spec.job_tasks("worker") == ["w0:1", "w1:1"]
    assert spec.as_dict() == {"ps": {0: "p0:1", 2: "p2:1"}, "worker": ["w0:1", "w1:1"]}
    assert repr(spec) == "ClusterSpec({'ps': {0: 'p0:1', 2: 'p2:1'}, 'worker': ['w0:1', 'w1:1']})"


def test_cluster_spec_copy_equality_and_truth() -> None:
    source = {"worker": ["w0:1"]}
    spec = ClusterSpec(source)
    source["worker"].append("w1:1")  # the spec keeps its own copy
    assert spec.num_tasks("worker") == 1
    assert ClusterSpec(spec) == spec
    assert spec == ClusterSpec({"worker": {0: "w0:1"}})
    assert spec != ClusterSpec({"worker": ["w0:2"]})
    assert spec != {"worker": ["w0:1"]}
    assert spec and not ClusterSpec({})
    assert ClusterSpec({"ps": {}}).as_dict() == {"ps": {}}
    assert ClusterSpec({"ps": {}}).job_tasks("ps") == []


def test_cluster_spec_lookup_errors_are_value_errors() -> None:
    spec = ClusterSpec({"worker": ["w0:1"]})
    with pytest.raises(InvalidArgumentError, match=r"No such job in cluster: 'ps' .*\['worker'\]"):
        spec.num_tasks("ps")
    for method in (spec.task_indices, spec.job_tasks):
        with pytest.raises(ValueError, match="No such job in cluster: 'chief'"):
            method("chief")
    with pytest.raises(ValueError, match=r"No task with index 1 in job 'worker' .*\[0\]"):
        spec.task_address("worker", 1)


@pytest.mark.parametrize(
    ("cluster", "error", "message"),
    [
        (["w0:1"], TypeError, "must be a mapping from job names"),
        ({1: ["w0:1"]}, TypeError, "job name 1 must be a string"),
        ({"worker": "w0:1"}, TypeError, "tasks of job 'worker' must be a list"),
        ({"worker": [1234]}, TypeError, "task address 1234 of job 'worker' must be a string"),
        ({"worker": {"a": "w0:1"}}, InvalidArgumentError, "task index 'a' of job 'worker'"),
        ({"worker": {-1: "w0:1"}}, InvalidArgumentError, "task index -1 .* must be >= 0"),
        ({"worker": {0: "a:1", "0": "b:1"}}, InvalidArgumentError, "index 0 appears twice"),
    ],
)
def test_cluster_spec_rejects_malformed_clusters(
    cluster: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ClusterSpec(cluster)  # type: ignore[arg-type]


# TFConfigClusterResolver


def test_tf_config_seed_example(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_tf_config(monkeypatch, SEED_TF_CONFIG)
    resolver = TFConfigClusterResolver()
    assert resolver.cluster_spec().as_dict() == {
        "ps": ["localhost:34567"],
        "worker": ["localhost:12345", "localhost:23456"],
    }
    assert (resolver.task_type, resolver.task_id) == ("worker", 0)
    assert resolver.rpc_layer is None
    assert resolver.environment == ""
    assert resolver.master() == "localhost:12345"
    assert resolver.master(rpc_layer="grpc") == "grpc://localhost:12345"
    assert resolver.master("ps", 0) == "localhost:34567"
    assert resolver.master("worker", 1, "grpc") == "grpc://localhost:23456"


def test_tf_config_rpc_layer_environment_and_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_tf_config(monkeypatch, {**SEED_TF_CONFIG, "rpc_layer": "grpc", "environment": "cloud"})
    resolver = TFConfigClusterResolver()
    assert resolver.master() == "grpc://localhost:12345"
    assert (resolver.rpc_layer, resolver.environment) == ("grpc", "cloud")

    resolver = TFConfigClusterResolver(
        task_type="ps", task_id=0, rpc_layer="grpc+verbs", environment="google"
    )
    assert (resolver.task_type, resolver.task_id) == ("ps", 0)
    assert resolver.master() == "grpc+verbs://localhost:34567"
    assert resolver.environment == "google"
    resolver.task_type, resolver.task_id, resolver.rpc_layer = "worker", 1, None
    assert resolver.master() == "grpc://localhost:23456"


def test_tf_config_is_read_again_on_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    resolver = TFConfigClusterResolver()
    assert resolver.cluster_spec() == ClusterSpec({})
    assert (resolver.task_type, resolver.task_id, resolver.master()) == (None, None, "")
    _set_tf_config(monkeypatch, SEED_TF_CONFIG)
    assert resolver.cluster_spec().num_tasks("worker") == 2
    assert (resolver.task_type, resolver.task_id) == ("worker", 0)


def test_tf_config_master_is_empty_for_a_single_task(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_tf_config(
        monkeypatch, {"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0}}
    )
    assert TFConfigClusterResolver().master() == ""
    _set_tf_config(monkeypatch, {"cluster": {"worker": ["h:1", "h:2"]}})
    with pytest.raises(InvalidArgumentError, match="master\\(\\) needs a task"):
        TFConfigClusterResolver().master()


def test_tf_config_evaluator_may_stay_out_of_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_tf_config(monkeypatch, {**SEED_TF_CONFIG, "task": {"type": "evaluator", "index": 0}})
    resolver = TFConfigClusterResolver()
    assert (resolver.task_type, resolver.task_id) == ("evaluator", 0)
    assert resolver.cluster_spec().jobs == ["ps", "worker"]


def test_tf_config_with_ipv6_and_sparse_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = {"worker": ["[::1]:2222", "[fe80::1]:2223"], "ps": {"1": "ps1.example.com:2222"}}
    _set_tf_config(monkeypatch, {"cluster": cluster, "task": {"type": "ps", "index": "1"}})
    resolver = TFConfigClusterResolver()
    assert resolver.task_id == 1
    assert resolver.master() == "ps1.example.com:2222"
    assert resolver.cluster_spec().as_dict()["ps"] == {1: "ps1.example.com:2222"}


def _worker_config(**changes: object) -> dict[str, object]:
    return {**SEED_TF_CONFIG, **changes}


@pytest.mark.parametrize(
    ("tf_config", "message"),
    [
        (
            "{cluster: {worker: [localhost:1]}}",
            r"TF_CONFIG is not valid JSON \(Expecting property name enclosed in double quotes at "
            r"char 1\); it starts with '\{cluster: \{worker: \[localhost:1\]\}\}'",
        ),
        ("x" * 100, r"not valid JSON .* it starts with 'x{60}\.\.\.'$"),
        (json.dumps(["localhost:1"]), "TF_CONFIG must be a JSON object .* got list"),
        (
            json.dumps(_worker_config(cluster=["localhost:1"])),
            "TF_CONFIG field 'cluster' must be an object .* got list: \\['localhost:1'\\]",
        ),
        (
            json.dumps(_worker_config(cluster={"worker": "localhost:1"})),
            "TF_CONFIG field 'cluster' is malformed: the tasks of job 'worker' must be a list",
        ),
        (
            json.dumps(_worker_config(cluster={"worker": ["localhost"]})),
            r"TF_CONFIG field 'cluster.worker\[0\]' is 'localhost', which is not a 'host:port'",
        ),
        (
            json.dumps(_worker_config(cluster={"worker": ["h:1", "h:http"]})),
            r"'cluster.worker\[1\]' is 'h:http', which is not a 'host:port'",
        ),
        (
            json.dumps(_worker_config(cluster={"worker": ["::1:2222"]})),
            r"'cluster.worker\[0\]' is '::1:2222'.* IPv6 host in brackets",
        ),
        (
            json.dumps(_worker_config(cluster={"worker": ["h:99999"]})),
            r"'h:99999', which is not a 'host:port' address \(port 0-65535",
        ),
        (
            json.dumps(_worker_config(task={"type": "worker", "index": 3})),
            "TF_CONFIG field 'task.index': task index 3 is out of range for job 'worker' with "
            "2 tasks",
        ),
        (
            json.dumps(_worker_config(task={"type": "chief", "index": 0})),
            r"TF_CONFIG field 'task.type' is 'chief', which is not a job of 'cluster' \(its jobs "
            r"are \['ps', 'worker'\]\)",
        ),
        (
            json.dumps(_worker_config(task={"type": "worker"})),
            "TF_CONFIG field 'task.index' is missing",
        ),
        (
            json.dumps(_worker_config(task={"type": "worker", "index": "first"})),
            "TF_CONFIG field 'task.index' must be an integer, got 'first'",
        ),
        (
            json.dumps(_worker_config(task={"type": "worker", "index": 0.5})),
            "TF_CONFIG field 'task.index' must be an integer, got 0.5",
        ),
        (
            json.dumps(_worker_config(task={"type": "worker", "index": -1})),
            "TF_CONFIG field 'task.index' must be >= 0, got -1",
        ),
        (json.dumps(_worker_config(task=["worker", 0])), "TF_CONFIG field 'task' must be an"),
        (
            json.dumps(_worker_config(task={"type": 0, "index": 0})),
            "TF_CONFIG field 'task.type' must be a job name, got 0",
        ),
        (json.dumps(_worker_config(rpc_layer=1)), "TF_CONFIG field 'rpc_layer' must be a string"),
    ],
)
def test_malformed_tf_config_names_the_field(
    monkeypatch: pytest.MonkeyPatch, tf_config: str, message: str
) -> None:
    monkeypatch.setenv("TF_CONFIG", tf_config)
    resolver = TFConfigClusterResolver()
    with pytest.raises(InvalidArgumentError, match=message):
        resolver.cluster_spec()
    with pytest.raises(ValueError, match=message):
        resolve()


def test_blank_tf_config_is_an_empty_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", "  ")
    assert TFConfigClusterResolver().cluster_spec() == ClusterSpec({})


def test_num_accelerators_counts_local_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    _set_tf_config(monkeypatch, SEED_TF_CONFIG)
    gpus = torch.cuda.device_count()
    expected = {"GPU": gpus} if gpus else {}
    assert TFConfigClusterResolver().num_accelerators() == expected
    assert TFConfigClusterResolver().num_accelerators("ps", 0) == expected


# SimpleClusterResolver


def test_simple_cluster_resolver_returns_what_it_was_given() -> None:
    spec = ClusterSpec({"worker": ["w0:1", "w1:1"]})
    resolver = SimpleClusterResolver(
        spec,
        master="w0:1",
        task_type="worker",
        task_id=1,
        environment="google",
        num_accelerators={"GPU": 8},
        rpc_layer="grpc",
    )
    assert resolver.cluster_spec() is spec
    assert (resolver.task_type, resolver.task_id, resolver.environment) == ("worker", 1, "google")
    assert resolver.master() == "grpc://w0:1"
    assert resolver.master("worker", 1, rpc_layer="http") == "http://w1:1"
    assert resolver.num_accelerators() == {"GPU": 8}
    bare = SimpleClusterResolver(spec)
    assert (bare.master(), bare.num_accelerators(), bare.rpc_layer) == ("", {}, None)
    assert (bare.task_type, bare.task_id, bare.environment) == (None, None, "")


def test_simple_cluster_resolver_type_errors() -> None:
    with pytest.raises(TypeError, match=r"cluster_spec must be a ClusterSpec, got dict"):
        SimpleClusterResolver({"worker": ["w0:1"]})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="master must be a string, got int"):
        SimpleClusterResolver(ClusterSpec({}), master=1)  # type: ignore[arg-type]


def test_cluster_resolver_base_class() -> None:
    class Forgetful(ClusterResolver):
        def __init__(self) -> None:
            pass

        def cluster_spec(self) -> ClusterSpec:
            return ClusterSpec({})

        def master(self, task_type=None, task_id=None, rpc_layer=None) -> str:  # type: ignore[no-untyped-def]
            return ""

    with pytest.raises(TypeError, match="abstract"):
        ClusterResolver()  # type: ignore[abstract]
    with pytest.raises(FailedPreconditionError, match=r"Forgetful.__init__ did not call super"):
        _ = Forgetful().task_type


# TorchrunClusterResolver


def test_torchrun_resolver(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_torchrun(monkeypatch)
    resolver = TorchrunClusterResolver()
    assert (resolver.task_type, resolver.task_id) == ("worker", 2)
    assert resolver.cluster_spec().as_dict() == {"worker": ["10.0.0.7:29500", "", "", ""]}
    assert (resolver.rank, resolver.world_size) == (2, 4)
    assert (resolver.local_rank, resolver.local_world_size, resolver.group_rank) == (0, 2, 1)
    assert (resolver.master_addr, resolver.master_port) == ("10.0.0.7", 29500)
    assert resolver.master() == "10.0.0.7:29500"
    assert resolver.master("worker", 0, rpc_layer="grpc") == "grpc://10.0.0.7:29500"
    with pytest.raises(InvalidArgumentError, match="does not tell the address of worker 3"):
        resolver.master("worker", 3)


def test_torchrun_optional_variables_and_ipv6(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_torchrun(
        monkeypatch, LOCAL_RANK=None, LOCAL_WORLD_SIZE=None, GROUP_RANK=None, MASTER_ADDR="::1"
    )
    resolver = TorchrunClusterResolver()
    assert (resolver.local_rank, resolver.local_world_size, resolver.group_rank) == (
        None,
        None,
        None,
    )
    assert resolver.cluster_spec().task_address("worker", 0) == "[::1]:29500"
    assert sync_group(resolver) == SyncGroup(4, 2, "::1", 29500)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"RANK": None}, "environment variable RANK is not set"),
        ({"WORLD_SIZE": None}, "environment variable WORLD_SIZE is not set"),
        ({"MASTER_ADDR": None}, "environment variable MASTER_ADDR is not set"),
        ({"MASTER_PORT": None}, "environment variable MASTER_PORT is not set"),
        ({"RANK": "two"}, "environment variable RANK='two' is not an integer"),
        ({"WORLD_SIZE": "4.0"}, "environment variable WORLD_SIZE='4.0' is not an integer"),
        ({"MASTER_PORT": "http"}, "environment variable MASTER_PORT='http' is not an integer"),
        ({"LOCAL_RANK": "x"}, "environment variable LOCAL_RANK='x' is not an integer"),
        ({"RANK": "4"}, "RANK=4 is out of range: it must be >= 0 and < 4"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 is out of range: it must be >= 1"),
        ({"LOCAL_RANK": "2"}, "LOCAL_RANK=2 is out of range: it must be >= 0 and < 2"),
        (
            {"MASTER_PORT": "70000"},
            "MASTER_PORT=70000 is out of range: it must be >= 1 and < 65536",
        ),
        ({"GROUP_RANK": "-1"}, "GROUP_RANK=-1 is out of range: it must be >= 0"),
    ],
)
def test_torchrun_bad_variables_are_named(
    monkeypatch: pytest.MonkeyPatch, overrides: dict[str, str | None], message: str
) -> None:
    _set_torchrun(monkeypatch, **overrides)
    with pytest.raises(InvalidArgumentError, match=message):
        TorchrunClusterResolver()


# resolve() and multi_worker_environment()


def test_resolve_order(monkeypatch: pytest.MonkeyPatch) -> None:
    default = resolve()
    assert type(default) is SimpleClusterResolver
    assert (default.cluster_spec(), default.task_type, default.task_id) == (
        ClusterSpec({}),
        None,
        None,
    )
    assert (default.master(), default.rpc_layer) == ("", None)

    _set_torchrun(monkeypatch)
    assert type(resolve()) is TorchrunClusterResolver

    monkeypatch.setenv("TF_CONFIG", json.dumps({"task": {"type": "worker", "index": 0}}))
    assert type(resolve()) is TorchrunClusterResolver  # a TF_CONFIG without a cluster

    _set_tf_config(monkeypatch, SEED_TF_CONFIG)
    assert type(resolve()) is TFConfigClusterResolver  # TF_CONFIG comes before torchrun

    given = SimpleClusterResolver(ClusterSpec({"worker": ["h:1"]}))
    assert resolve(given) is given
    with pytest.raises(TypeError, match=r"must be a feedline\.distribute\.cluster_resolver"):
        resolve({"worker": ["h:1"]})  # type: ignore[arg-type]


def test_resolve_needs_both_rank_and_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    assert type(resolve()) is SimpleClusterResolver
    assert multi_worker_environment() == 1


def test_multi_worker_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert multi_worker_environment() == 1
    _set_torchrun(monkeypatch)
    assert multi_worker_environment() == 4
    _set_tf_config(monkeypatch, SEED_TF_CONFIG)
    assert multi_worker_environment() == 2  # the workers; the ps does not count
    cluster = {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"], "evaluator": ["e:1"]}
    _set_tf_config(monkeypatch, {"cluster": cluster, "task": {"type": "chief", "index": 0}})
    assert multi_worker_environment() == 3
    monkeypatch.setenv("TF_CONFIG", "not json")
    with pytest.raises(InvalidArgumentError, match="TF_CONFIG is not valid JSON"):
        multi_worker_environment()


# sync_group()

CLUSTER_WITH_CHIEF = ClusterSpec(
    {
        "chief": ["chief0:2222"],
        "worker": ["worker0:2222", "worker1:2222"],
        "ps": ["ps0:2222"],
        "evaluator": ["eval0:2222"],
    }
)
CLUSTER_WITHOUT_CHIEF = ClusterSpec(
    {"worker": ["worker0:3333", "worker1:3333", "worker2:3333"], "ps": ["ps0:2222"]}
)


def _group(spec: ClusterSpec, task_type: str, task_id: int) -> SyncGroup:
    return sync_group(SimpleClusterResolver(spec, task_type=task_type, task_id=task_id))


def test_sync_group_with_a_chief() -> None:
    table = {
        (task, index): tuple(_group(CLUSTER_WITH_CHIEF, task, index))
        for task, index in [("chief", 0), ("worker", 0), ("worker", 1)]
    }
    assert table == {
        ("chief", 0): (3, 0, "chief0", 2222),
        ("worker", 0): (3, 1, "chief0", 2222),
        ("worker", 1): (3, 2, "chief0", 2222),
    }


def test_sync_group_without_a_chief() -> None:
    table = {index: tuple(_group(CLUSTER_WITHOUT_CHIEF, "worker", index)) for index in range(3)}
    assert table == {
        0: (3, 0, "worker0", 3333),
        1: (3, 1, "worker0", 3333),
        2: (3, 2, "worker0", 3333),
    }


def test_sync_group_of_tf_config_torchrun_and_a_single_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert sync_group(resolve()) == SyncGroup(1, 0, "127.0.0.1", 0)
    _set_torchrun(monkeypatch)
    assert sync_group(resolve()) == SyncGroup(4, 2, "10.0.0.7", 29500)
    _set_tf_config(monkeypatch, {**SEED_TF_CONFIG, "task": {"type": "worker", "index": 1}})
    assert sync_group(resolve()) == SyncGroup(2, 1, "localhost", 12345)


@pytest.mark.parametrize(
    ("spec", "task_type", "task_id", "message"),
    [
        (CLUSTER_WITH_CHIEF, "ps", 0, "task 'ps' 0 is not in the synchronous training group"),
        (CLUSTER_WITH_CHIEF, "evaluator", 0, "task 'evaluator' 0 is not in the synchronous"),
        (CLUSTER_WITH_CHIEF, "worker", 2, "task index 2 is out of range for job 'worker' with 2"),
        (CLUSTER_WITH_CHIEF, None, None, "the current task is unknown"),
        (ClusterSpec({"ps": ["p:1"]}), "ps", 0, "the cluster has no chief or worker task"),
        (ClusterSpec({"chief": ["a:1", "b:1"]}), "chief", 0, "has 2 chief tasks; there can be"),
        (ClusterSpec({"worker": {1: "w:1"}}), "worker", 1, r"job 'worker' has task indices \[1\]"),
        (ClusterSpec({"worker": ["w0"]}), "worker", 0, "the address of worker 0 is 'w0', which"),
    ],
)
def test_sync_group_errors(
    spec: ClusterSpec, task_type: str | None, task_id: int | None, message: str
) -> None:
    resolver = SimpleClusterResolver(spec, task_type=task_type, task_id=task_id)
    with pytest.raises(InvalidArgumentError, match=message):
        sync_group(resolver)


# Real processes: each resolves its cluster, and the sync group it finds really rendezvous.

_RESOLVE_AND_MEET = """
import torch.distributed as dist

from feedline.distribute.cluster_resolver import resolve, sync_group
from tests.launcher import report

resolver = resolve()
group = sync_group(resolver)
dist.init_process_group(
    "gloo",
    init_method=f"tcp://{group.rendezvous_host}:{group.rendezvous_port}",
    world_size=group.world_size,
    rank=group.rank,
)
members = [None] * group.world_size
dist.all_gather_object(members, f"{resolver.task_type}:{resolver.task_id}")
dist.destroy_process_group()
report([type(resolver).__name__, resolver.task_type, resolver.task_id, list(group), members])
"""


def test_processes_of_a_tf_config_cluster_resolve_and_meet() -> None:
    envs = tf_config_envs({"chief": 1, "worker": 2})
    chief_address = json.loads(envs[0][1]["TF_CONFIG"])["cluster"]["chief"][0]
    host, port = chief_address.split(":")
    results = run(_RESOLVE_AND_MEET, envs, timeout=120)
    members = ["chief:0", "worker:0", "worker:1"]
    assert {name: result.result for name, result in results.items()} == {
        "chief:0": ["TFConfigClusterResolver", "chief", 0, [3, 0, host, int(port)], members],
        "worker:0": ["TFConfigClusterResolver", "worker", 0, [3, 1, host, int(port)], members],
        "worker:1": ["TFConfigClusterResolver", "worker", 1, [3, 2, host, int(port)], members],
    }


def test_processes_started_like_torchrun_resolve_and_meet() -> None:
    envs = torchrun_envs(2)
    port = int(envs[0][1]["MASTER_PORT"])
    results = run(_RESOLVE_AND_MEET, envs, timeout=120)
    members = ["worker:0", "worker:1"]
    assert {name: result.result for name, result in results.items()} == {
        "rank:0": ["TorchrunClusterResolver", "worker", 0, [2, 0, "127.0.0.1", port], members],
        "rank:1": ["TorchrunClusterResolver", "worker", 1, [2, 1, "127.0.0.1", port], members],
    }


@pytest.mark.parametrize(
    ("environ", "warns"),
    [
        # c10d rendezvous (a run id), restarts allowed, the store shared: a later node waits.
        ({"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "3",
          "GROUP_WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "train-42"}, True),
        ({"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "3",
          "GROUP_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "none"}, True),
        # Not shared (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, or not under torchrun).
        ({"TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_MAX_RESTARTS": "3",
          "GROUP_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "train-42"}, False),
        ({}, False),
        # No restarts: nothing joins a later round.
        ({"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "0",
          "GROUP_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "train-42"}, False),
        # One node's `torchrun --standalone --max-restarts 3`: nothing else joins its rendezvous.
        ({"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "3",
          "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "localhost",
          "TORCHELASTIC_RUN_ID": "637db0fe-1bc1-4b37-83f9-fe0477eae979"}, False),
        # A rendezvous at an address, even one named by a UUID, may take another node.
        ({"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "3",
          "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "10.0.0.1",
          "TORCHELASTIC_RUN_ID": "637db0fe-1bc1-4b37-83f9-fe0477eae979"}, True),
        # One node's static launch (`torchrun --nproc-per-node 8 --max-restarts 3`).
        ({"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "3",
          "GROUP_WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "none"}, False),
        ({"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "x"}, False),
    ],
)  # fmt: skip
def test_shared_store_warning_names_the_launcher_where_a_later_node_would_wait(
    environ: dict[str, str], warns: bool
) -> None:
    warning = shared_store_warning(environ)
    assert (warning is not None) == warns
    if warning is not None:
        assert "feedline torchrun" in warning and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in warning
