"""Variables on parameter servers: placement, pulls and pushes of touched rows, pickling,
checkpoints (in-process ps servers, real gRPC on loopback)."""

from __future__ import annotations

import pickle

import pytest
import torch

from feedline._net import rpc
from feedline.distribute.experimental import partitioners
from feedline.distribute.parameter_server import PSParameter, _tensors
from feedline.distribute.parameter_server.protocol import SERVICE_NAME
from feedline.distribute.parameter_server.runtime import held_pushes
from feedline.errors import FailedPreconditionError, InvalidArgumentError
from feedline.train import Checkpoint, latest_checkpoint
from tests.distribute.parameter_server._cluster import chief_strategy


def test_round_robin_placement_in_creation_order(ps_spec) -> None:
    strategy = chief_strategy(ps_spec)
    with strategy.scope():
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    table = {name: p.spec.shard_list for name, p in model.named_parameters()}
    # TF's rule: one ps after the other, in creation order.
    assert table == {
        "0.weight": ((0, 0, 3),),
        "0.bias": ((1, 0, 3),),
        "1.weight": ((0, 0, 1),),
        "1.bias": ((1, 0, 1),),
    }
    assert all(isinstance(p, PSParameter) for p in model.parameters())


def test_partitioned_rows_first_shards_get_one_more(ps_spec) -> None:
    strategy = chief_strategy(
        ps_spec, variable_partitioner=partitioners.FixedShardsPartitioner(num_shards=5)
    )
    with strategy.scope():
        table = torch.nn.Embedding(13, 2)
    # 13 rows over 5 shards: 3, 3, 3, 2, 2; shards take the ps tasks round-robin.
    assert table.weight.spec.shard_list == ((0, 0, 3), (1, 3, 3), (0, 6, 3), (1, 9, 2), (0, 11, 2))
    expected = table.weight.detach().clone()
    assert torch.equal(table(torch.arange(13)), expected)  # created, then pulled by rows


def test_a_partitioner_must_split_rows_only(ps_spec) -> None:
    strategy = chief_strategy(ps_spec, variable_partitioner=lambda shape, dtype: [1, 2])
    with (
        pytest.raises(InvalidArgumentError, match=r"returned \[1, 2\].*axis 0 only"),
        strategy.scope(),
    ):
        torch.nn.Linear(3, 4)


def _spy(strategy, method: str) -> list:
    """Records the header of every ``method`` call this process sends to the ps tasks."""
    seen: list = []
    runtime = strategy._ps_placer.runtime
    original = runtime.call

    def call(ps, name, header, buffers=()):
        if name == method:
            seen.append((ps, header, [memoryview(b).nbytes for b in buffers]))
        return original(ps, name, header, buffers)

    runtime.call = call
    return seen


@pytest.mark.parametrize("sparse", [False, True])
def test_only_touched_rows_travel(ps_spec, sparse: bool) -> None:
    strategy = chief_strategy(ps_spec)
    with strategy.scope():
        table = torch.nn.EmbeddingBag(1000, 8, mode="sum", sparse=sparse)
        optimizer = torch.optim.SGD(table.parameters(), lr=1.0)
    before = table.weight.detach().clone()
    pulls, pushes = _spy(strategy, "Pull"), _spy(strategy, "Push")

    def step() -> None:
        optimizer.zero_grad()
        table(torch.tensor([[3, 7, 7]])).sum().backward()
        optimizer.step()

    strategy.run(step)
    assert [header["variables"][0]["rows"] for _, header, _ in pulls] == [True]
    assert pulls[0][2] == [2 * 8]  # the ids of rows 3 and 7, no more
    ((_, header, sizes),) = pushes
    assert header["variables"][0]["rows"] is True
    assert sizes == [2 * 8, 2 * 8 * 4]  # 2 row ids, 2 rows of 8 float32 gradients
    after = table.state_dict()["weight"]
    changed = (after != before).any(dim=1).nonzero().flatten().tolist()
    assert changed == [3, 7]
    assert torch.allclose(after[7], before[7] - 2.0)  # row 7 counted twice in the bag


@pytest.mark.parametrize("module", ["EmbeddingBag-sum", "EmbeddingBag-mean", "Embedding"])
def test_a_dense_table_gradient_is_built_from_its_touched_rows(ps_spec, module: str) -> None:
    # A row module made with sparse=False (torch's default) has a dense .grad with the values
    # torch's dense backward gives, built from the rows the step touched: its backward runs
    # sparse, and the table of the last step's gradient is used again where nothing holds it.
    strategy = chief_strategy(ps_spec)

    def make() -> torch.nn.Module:
        if module == "Embedding":
            return torch.nn.Embedding(1000, 8)
        return torch.nn.EmbeddingBag(1000, 8, mode=module.split("-")[1])

    with strategy.scope():
        table = make()
    local = make()
    local.load_state_dict(table.state_dict())
    batches = [torch.tensor([[3, 7, 7]]), torch.tensor([[5, 9, 3]]), torch.tensor([[1, 2, 2]])]
    grads = []
    for ids in batches:
        table.weight.grad = local.weight.grad = None  # as zero_grad() does
        strategy.run(lambda ids=ids: table(ids).square().sum().backward())
        local(ids).square().sum().backward()
        grad = table.weight.grad
        assert grad is not None and not grad.is_sparse and table.sparse is False
        torch.testing.assert_close(grad, local.weight.grad)
        grads.append(grad.data_ptr())
        if len(grads) == 2:
            kept = grad  # held by the user: the next step's gradient is another table
        del grad
    assert grads[1] == grads[0]  # nothing held the first: its table written again
    assert grads[2] != grads[1]
    torch.testing.assert_close(
        kept,
        local.weight.grad.new_zeros(1000, 8).index_put_(
            (torch.tensor([5, 9, 3]),), kept[[5, 9, 3]]
        ),
    )  # the second step's rows only
    view = table.weight.grad[1:3]  # a view holds the third table too
    del kept
    table.weight.grad = None
    strategy.run(lambda: table(torch.tensor([[4, 4, 6]])).square().sum().backward())
    assert table.weight.grad.data_ptr() != grads[2] and view.abs().sum() > 0


def test_a_max_bag_keeps_torchs_dense_backward(ps_spec) -> None:
    strategy = chief_strategy(ps_spec)
    with strategy.scope():
        table = torch.nn.EmbeddingBag(100, 4, mode="max")
    strategy.run(lambda: table(torch.tensor([[3, 7]])).sum().backward())
    assert not table.weight.grad.is_sparse and table.sparse is False
    assert not getattr(table.weight, "_feedline_densifies", False)


def _on_ps(ps_spec, param: PSParameter) -> torch.Tensor:
    """``param``'s value as its ps holds it now (a call of its own, past the runtime)."""
    ((ps, name, _, _),) = param.spec.shards()
    client = rpc.RpcClient(ps_spec.task_address("ps", ps), SERVICE_NAME)
    header, buffers = client.call(
        "Pull", {"variables": [{"name": name, "rows": False}]}, timeout=10
    )
    client.close()
    return _tensors.unpack(header["values"][0], buffers[0])


def test_a_held_push_travels_with_the_next_pull_or_a_flush(ps_spec) -> None:
    strategy = chief_strategy(ps_spec)
    with strategy.scope():
        model = torch.nn.Sequential(
            torch.nn.EmbeddingBag(100, 4, mode="sum"), torch.nn.Linear(4, 1)
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.25)
    local = torch.nn.Sequential(torch.nn.EmbeddingBag(100, 4, mode="sum"), torch.nn.Linear(4, 1))
    local.load_state_dict(model.state_dict())
    local_optimizer = torch.optim.SGD(local.parameters(), lr=0.25)
    table = model[0].weight
    pulls, pushes = _spy(strategy, "Pull"), _spy(strategy, "Push")

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
        optimizer.zero_grad()
        loss = model(torch.tensor([[1, 2], [2, 5]])).square().mean()
        loss.backward()
        optimizer.step()
        return loss.item()

    with held_pushes():
        losses = [strategy.run(step, args=(model, optimizer))]
        assert not pushes  # held: the ps has the first values still
        assert torch.equal(_on_ps(ps_spec, table), local[0].weight.detach())
        pulls.clear()
        losses.append(strategy.run(step, args=(model, optimizer)))
    # The second step's pulls carried the first step's push, applied before they read.
    assert not pushes and sorted(len(h.get("push", [])) for _, h, _ in pulls) == [1, 2]
    expected = [step(local, local_optimizer) for _ in range(2)]
    assert losses == pytest.approx(expected, rel=1e-6)
    strategy._ps_placer.runtime.flush()  # the second step's push, alone
    assert sorted(len(h["variables"]) for _, h, _ in pushes) == [1, 2]
    assert torch.allclose(_on_ps(ps_spec, table), local[0].weight.detach())
    strategy._ps_placer.runtime.flush()  # nothing held: no call
    assert len(pushes) == 2


def test_the_row_pull_also_brings_the_dense_variables_a_step_reads(ps_spec) -> None:
    strategy = chief_strategy(ps_spec)
    with strategy.scope():
        model = torch.nn.Sequential(torch.nn.EmbeddingBag(100, 4), torch.nn.Linear(4, 1))
        optimizer = torch.optim.Adagrad(model.parameters(), lr=0.5)
    table = {name: p.spec.shard_list for name, p in model.named_parameters()}
    assert table == {"0.weight": ((0, 0, 100),), "1.weight": ((1, 0, 1),), "1.bias": ((0, 0, 1),)}
    local = torch.nn.Sequential(torch.nn.EmbeddingBag(100, 4), torch.nn.Linear(4, 1))
    local.load_state_dict(model.state_dict())
    local_optimizer = torch.optim.Adagrad(local.parameters(), lr=0.5)
    pulls = _spy(strategy, "Pull")

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
        optimizer.zero_grad()
        loss = model(torch.tensor([[1, 2], [2, 5]])).square().mean()
        loss.backward()
        optimizer.step()
        return loss.item()

    def calls() -> list[str]:
        made = [f"ps{ps}: " + ", ".join(v["name"] for v in h["variables"]) for ps, h, _ in pulls]
        pulls.clear()
        return sorted(made)

    losses = [strategy.run(step, args=(model, optimizer))]
    # The first step pulls the table's rows, then, at the Linear's forward, its variables.
    assert calls() == ["ps0: 0/EmbeddingBag.weight", "ps0: 2/Linear.bias", "ps1: 1/Linear.weight"]
    for _ in range(2):
        # The next ones pull the Linear's variables with the rows: one call per ps.
        losses.append(strategy.run(step, args=(model, optimizer)))
        assert calls() == ["ps0: 0/EmbeddingBag.weight, 2/Linear.bias", "ps1: 1/Linear.weight"]
    # Each step read what the one before it pushed: the losses of the same training, local.
    expected = [step(local, local_optimizer) for _ in range(3)]
    assert losses == pytest.approx(expected, rel=1e-6)

    with strategy.scope():
        unused = torch.nn.Linear(3, 3)  # not read by the step: not pulled with the rows...
    unused.weight.runtime.ensure_created()
    strategy.run(step, args=(model, optimizer))
    assert calls() == [
        "ps0: 0/EmbeddingBag.weight, 2/Linear.bias",
        "ps0: 4/Linear.bias",  # ...but, stale, by the Linear's forward, with every stale one
        "ps1: 1/Linear.weight",
        "ps1: 3/Linear.weight",
    ]


def test_pickled_parameters_are_references(ps_spec) -> None:
    strategy = chief_strategy(ps_spec)
    with strategy.scope():
        model = torch.nn.Embedding(100_000, 16)
    assert len(pickle.dumps(model)) < 10_000  # the 6.4 MB table is not in it
    assert pickle.loads(pickle.dumps(model)).weight is model.weight  # this process's copy


def test_a_module_made_outside_the_scope_fails_in_a_step(ps_spec) -> None:
    strategy = chief_strategy(ps_spec)
    with strategy.scope():
        inside = torch.nn.Linear(2, 1)
    outside = torch.nn.Linear(1, 1)
    with pytest.raises(
        FailedPreconditionError, match=r"Linear has parameters \['weight', 'bias'\]"
    ):
        strategy.run(lambda: outside(inside(torch.ones(2))))
    outside(inside(torch.ones(2)))  # outside a step, a local module is the user's business


def test_checkpoint_saves_what_the_ps_holds_and_restores_it(ps_spec, tmp_path) -> None:
    strategy = chief_strategy(ps_spec)
    with strategy.scope():
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1)

    def step() -> None:
        optimizer.zero_grad()
        model(torch.ones(3)).sum().backward()
        optimizer.step()

    strategy.run(step)
    checkpoint = Checkpoint(model=model, optimizer=optimizer)
    path = checkpoint.save(tmp_path / "ckpt")
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_step = optimizer.state_dict()["state"][0]["step"].item()
    for _ in range(3):
        strategy.run(step)
    assert not torch.equal(model.state_dict()["bias"], saved["bias"])
    checkpoint.restore(latest_checkpoint(tmp_path)).assert_consumed()
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    assert optimizer.state_dict()["state"][0]["step"].item() == saved_step == 1
    assert path.endswith("ckpt-1")
