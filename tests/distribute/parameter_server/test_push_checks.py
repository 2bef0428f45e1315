"""What a parameter server refuses, checked against real ``feedline server`` ps processes: a
push is applied whole or not at all; a gradient of another dtype than its variable's, or with a
NaN or an infinity, is refused (non-finite ones are counted, and accepted under
``allow_nonfinite=True``); malformed requests are INVALID_ARGUMENT naming what is wrong, never
the server's traceback."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import torch

from feedline._net import rpc
from feedline._net.wire import encode_frame
from feedline.distribute.cluster_resolver import ClusterSpec
from feedline.distribute.parameter_server import _tensors
from feedline.distribute.parameter_server.protocol import SERVICE_NAME
from feedline.errors import InvalidArgumentError, NotFoundError
from tests import launcher
from tests.distribute.parameter_server._cluster import chief_strategy, servers
from tests.launcher import local_auth

# A bound, not a measure: the first push to a ps just started has taken more than 10 s on a
# loaded machine (load average 25 on 2 cores).
_TIMEOUT_S = 60.0
_names = itertools.count()


class _PS:
    """One running ps task, called as a worker would."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.client = rpc.RpcClient(address, SERVICE_NAME)

    def create(self, value: torch.Tensor) -> str:
        name = f"v{next(_names)}"
        meta, array = _tensors.pack(value)
        self.client.upload(
            "Create", {"variables": [{"name": name, "value": meta}]}, [array], timeout=_TIMEOUT_S
        )
        return name

    def pull(self, name: str) -> torch.Tensor:
        header, buffers = self.client.call(
            "Pull", {"variables": [{"name": name, "rows": False}]}, timeout=_TIMEOUT_S
        )
        return _tensors.unpack(header["values"][0], buffers[0])

    def push(self, *grads: tuple[str, torch.Tensor], **entry: Any) -> None:
        items, arrays = [], []
        for name, grad in grads:
            meta, array = _tensors.pack(grad)
            items.append(
                {
                    "name": name,
                    "rows": False,
                    "grad": meta,
                    "optimizer": "SGD",
                    "hyper": {"lr": 1.0},
                    **entry,
                }
            )
            arrays.append(array)
        self.client.upload("Push", {"variables": items}, arrays, timeout=_TIMEOUT_S)

    def metrics(self) -> dict[str, int]:
        header, _ = self.client.call("Ping", {}, timeout=_TIMEOUT_S)
        return header["metrics"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[_PS, _PS]]:
    """Two ps processes (``feedline server``); the first holds variable ``m``."""
    processes = launcher.tf_config_envs({"ps": 2})
    addresses = json.loads(processes[0][1]["TF_CONFIG"])["cluster"]["ps"]
    with servers(processes, timeout=300):
        made = (_PS(addresses[0]), _PS(addresses[1]))
        meta, array = _tensors.pack(torch.zeros(2))
        made[0].client.upload(
            "Create", {"variables": [{"name": "m", "value": meta}]}, [array], timeout=_TIMEOUT_S
        )
        yield made
        for ps in made:
            ps.client.close()


def test_a_push_that_is_refused_applies_nothing(cluster: tuple[_PS, _PS]) -> None:
    ps, _ = cluster
    first, second = ps.create(torch.zeros(3)), ps.create(torch.zeros(2, 2))
    with pytest.raises(InvalidArgumentError, match=rf"gradient of '{second}' has shape \[3\]"):
        ps.push((first, torch.ones(3)), (second, torch.ones(3)))
    with pytest.raises(NotFoundError, match="holds no variable 'missing'"):
        ps.push((first, torch.ones(3)), ("missing", torch.ones(3)))
    with pytest.raises(InvalidArgumentError, match=f"'{second}'.*float64"):
        ps.push((first, torch.ones(3)), (second, torch.ones(2, 2, dtype=torch.float64)))
    with pytest.raises(InvalidArgumentError, match=f"'{second}'.*not finite"):
        ps.push((first, torch.ones(3)), (second, torch.full((2, 2), float("nan"))))
    assert ps.pull(first).tolist() == [0.0, 0.0, 0.0]
    ps.push((first, torch.ones(3)), (second, torch.ones(2, 2)))
    assert ps.pull(first).tolist() == [-1.0, -1.0, -1.0]
    assert ps.pull(second).tolist() == [[-1.0, -1.0], [-1.0, -1.0]]


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.complex64, torch.bool, torch.float16, torch.int32]
)
def test_a_gradient_of_another_dtype_is_refused(cluster: tuple[_PS, _PS], dtype) -> None:
    ps, _ = cluster
    name = ps.create(torch.zeros(4))
    grad = torch.ones(4).to(dtype)
    expected = f"gradient of '{name}' is {_tensors.dtype_name(dtype)}; the variable is float32"
    with pytest.raises(InvalidArgumentError, match=expected):
        ps.push((name, grad))
    assert ps.pull(name).tolist() == [0.0] * 4


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_nonfinite_gradient_is_refused_and_counted(cluster: tuple[_PS, _PS], bad) -> None:
    ps, _ = cluster
    name = ps.create(torch.zeros(4))
    before = ps.metrics()
    with pytest.raises(InvalidArgumentError, match=f"gradient of '{name}' is not finite"):
        ps.push((name, torch.tensor([1.0, bad, 1.0, 1.0])))
    assert ps.pull(name).tolist() == [0.0] * 4
    after = ps.metrics()
    assert after["pushes_refused_nonfinite"] == before["pushes_refused_nonfinite"] + 1
    assert after["pushes_refused"] == before["pushes_refused"] + 1
    assert after["pushes"] == before["pushes"]
    ps.push((name, torch.tensor([1.0, bad, 1.0, 1.0])), allow_nonfinite=True)
    value = ps.pull(name)
    assert value[0] == -1.0 and not torch.isfinite(value[1])
    assert ps.metrics()["pushes"] == after["pushes"] + 1


@pytest.mark.parametrize(
    "hyper", [{"lr": "x"}, {"lr": -1.0}, {"lr": None}, {"lr": 10**400}, {"lr": [1.0]}]
)
def test_bad_hyperparameters_are_refused_before_anything_is_applied(
    cluster: tuple[_PS, _PS], hyper: dict
) -> None:
    ps, _ = cluster
    first, second = ps.create(torch.zeros(2)), ps.create(torch.zeros(2))
    ps.push((first, torch.ones(2)), (second, torch.ones(2)))  # both have an optimizer now
    items = [
        {"name": first, "rows": False, "grad": {"dtype": "float32", "shape": [2]},
         "optimizer": "SGD", "hyper": {"lr": 1.0}},
        {"name": second, "rows": False, "grad": {"dtype": "float32", "shape": [2]},
         "optimizer": "SGD", "hyper": hyper},
    ]  # fmt: skip
    ones = np.ones(2, np.float32)
    with pytest.raises(InvalidArgumentError, match="lr"):
        ps.client.upload("Push", {"variables": items}, [ones, ones], timeout=_TIMEOUT_S)
    assert ps.pull(first).tolist() == [-1.0, -1.0]
    ps.push((first, torch.ones(2)), (second, torch.ones(2)))
    assert ps.pull(second).tolist() == [-2.0, -2.0]


_F32 = {"dtype": "float32", "shape": [2]}
MALFORMED: list[tuple[str, dict[str, Any], int, str]] = [
    ("Create", {"variables": [1]}, 1, "'name'"),
    ("Create", {"variables": [None]}, 1, "'name'"),
    ("Create", {"variables": [{"name": "m", "value": {"dtype": "float32", "shape": [10**30]}}]},
     1, "shape"),
    ("Pull", {"variables": [1]}, 0, "'name'"),
    ("Pull", {"variables": "all"}, 0, "'variables'"),
    ("Push", {"variables": [1]}, 1, "'name'"),
    ("Push", {"variables": [{"name": "m", "rows": False, "grad": {"dtype": "float32",
     "shape": [10**30]}, "optimizer": "SGD", "hyper": {}}]}, 1, "shape"),
    ("Push", {"variables": [{"name": "m", "rows": False, "grad": {"dtype": "no-type",
     "shape": [2]}, "optimizer": "SGD", "hyper": {}}]}, 1, "dtype"),
    ("GetState", {"names": [[1]]}, 0, "names"),
    ("GetState", {"names": [{}]}, 0, "names"),
    ("SetState", {"variables": [1]}, 1, "'name'"),
    ("SetState", {"variables": [{"name": "m", "value": _F32, "state": {"x": 1}}]}, 1, "state"),
    ("SetState", {"variables": [{"name": "m", "value": _F32, "optimizer": "SGD",
     "hyper": {"lr": "fast"}}]}, 1, "lr"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "header", "buffers", "names"),
    MALFORMED,
    ids=[f"{m}-{i}" for i, (m, *_) in enumerate(MALFORMED)],
)
def test_a_malformed_request_is_invalid_without_a_traceback(
    cluster: tuple[_PS, _PS], method: str, header: dict, buffers: int, names: str
) -> None:
    ps, _ = cluster
    channel = grpc.insecure_channel(ps.address)
    stub = channel.unary_unary(f"/{SERVICE_NAME}/{method}")
    frame = encode_frame(header, [np.zeros(2, np.float32)] * buffers)
    with pytest.raises(grpc.RpcError) as raised:
        stub(frame, timeout=_TIMEOUT_S, metadata=local_auth())
    channel.close()
    error = raised.value
    assert isinstance(error, grpc.Call)
    details = error.details() or ""
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, details
    assert names in details, details
    assert "Traceback" not in details and ".py" not in details, details
    assert ps.metrics()["pushes_refused_nonfinite"] >= 0  # the ps serves on


# -- through ParameterServerStrategy --------------------------------------------------------


@pytest.fixture
def fresh_cluster() -> Iterator[ClusterSpec]:
    """Two ps processes of a cluster of their own (a strategy names its variables by creation
    order), and the chief's address."""
    processes = launcher.tf_config_envs({"ps": 2, "chief": 1})
    spec = json.loads(processes[0][1]["TF_CONFIG"])["cluster"]
    with servers(processes, timeout=300):
        yield ClusterSpec(spec)


def _train_on_nan(spec: ClusterSpec, **options: Any) -> tuple[torch.nn.Linear, Any]:
    """A Linear model (weight on ps 0, bias on ps 1) after one step whose input holds a NaN:
    the weight's gradient is NaN, the bias's is finite."""
    strategy = chief_strategy(spec, **options)
    with strategy.scope():
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start = {k: v.clone() for k, v in model.state_dict().items()}

    def step() -> None:
        optimizer.zero_grad()
        model(torch.tensor([[1.0, float("nan")]])).sum().backward()
        optimizer.step()

    error = None
    try:
        strategy.run(step)
    except InvalidArgumentError as raised:
        error = raised
    return model, (start, error)


def test_a_nan_step_changes_no_variable_on_any_ps(fresh_cluster: ClusterSpec) -> None:
    model, (start, error) = _train_on_nan(fresh_cluster)
    assert error is not None and "0/Linear.weight" in str(error) and "not finite" in str(error)
    assert "allow_nonfinite=True" in str(error)
    for key, value in model.state_dict().items():
        assert torch.equal(value, start[key]), key  # the bias (finite, on ps 1) too
    ps0 = _PS(fresh_cluster.task_address("ps", 0))
    assert ps0.metrics()["pushes_refused_nonfinite"] == 1
    ps0.client.close()


def test_allow_nonfinite_applies_what_it_is_given(fresh_cluster: ClusterSpec) -> None:
    model, (start, error) = _train_on_nan(fresh_cluster, allow_nonfinite=True)
    assert error is None
    state = model.state_dict()
    assert torch.isnan(state["weight"][0, 1]) and torch.isfinite(state["weight"][0, 0])
    assert torch.allclose(state["bias"], start["bias"] - 0.1)


def test_a_step_one_ps_would_refuse_changes_no_variable_on_any_ps(
    fresh_cluster: ClusterSpec,
) -> None:
    # The weight (ps 0) steps with a valid learning rate, the bias (ps 1) with a negative one,
    # which torch checks only in the optimizer's constructor: ps 1 refuses its part, and ps 0
    # must not apply its own.
    strategy = chief_strategy(fresh_cluster)
    with strategy.scope():
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias]}], lr=0.1)
    optimizer.param_groups[1]["lr"] = -1.0
    start = {k: v.clone() for k, v in model.state_dict().items()}

    def step() -> None:
        optimizer.zero_grad()
        model(torch.tensor([[1.0, 2.0]])).sum().backward()
        optimizer.step()

    with pytest.raises(InvalidArgumentError, match="lr") as raised:
        strategy.run(step)
    for key, value in model.state_dict().items():
        assert torch.equal(value, start[key]), key  # the weight (ps 0) too
    assert "no parameter server applied any of this step" in str(raised.value)
    metrics = [_PS(fresh_cluster.task_address("ps", i)) for i in range(2)]
    assert [ps.metrics()["pushes"] for ps in metrics] == [0, 0]
    assert metrics[1].metrics()["pushes_refused"] == 1
    for ps in metrics:
        ps.client.close()
    # The same step with a valid rate is applied on both.
    optimizer.param_groups[1]["lr"] = 0.1
    strategy.run(step)
    state = model.state_dict()
    assert torch.allclose(state["weight"], start["weight"] - 0.1 * torch.tensor([[1.0, 2.0]]))
    assert torch.allclose(state["bias"], start["bias"] - 0.1)
