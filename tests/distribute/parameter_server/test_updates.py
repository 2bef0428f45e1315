"""Updates on a parameter server compute what torch's optimizers compute; Adagrad on the rows of
an embedding takes a direct path, which must match torch's sparse step exactly."""

from __future__ import annotations

import pytest
import torch

from feedline.distribute.parameter_server.updates import Update

SETTINGS = [
    {"lr": 0.5, "eps": 1e-10},
    {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.2, "eps": 1e-6},
]


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("duplicates", [False, True])
def test_adagrad_on_rows_is_torch_s_sparse_step(settings: dict, duplicates: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    on_ps = torch.nn.Parameter(torch.randn(40, 3, generator=generator))
    local = torch.nn.Parameter(on_ps.detach().clone())
    update = Update("Adagrad", settings, on_ps)
    reference = torch.optim.Adagrad([local], **settings)
    if not duplicates:  # distinct rows never go through the torch optimizer's sparse path
        update.optimizer.step = _not_called  # type: ignore[method-assign]
    for _ in range(4):
        rows = torch.randperm(40, generator=generator)[:9]
        if duplicates:  # not what a worker sends, but what the ps must still get right
            rows = torch.cat([rows, rows[:2]])
        grad = torch.randn(len(rows), 3, generator=generator)
        update.apply(grad, rows)
        local.grad = torch.sparse_coo_tensor(rows[None], grad, local.shape, check_invariants=True)
        with torch.sparse.check_sparse_tensor_invariants():
            reference.step()
        if duplicates:
            assert torch.allclose(on_ps, local, rtol=0, atol=1e-6)
        else:
            assert torch.equal(on_ps, local)  # the same arithmetic, bit for bit
    state = update.state()
    assert state["step"].item() == reference.state[local]["step"].item() == 4
    assert torch.allclose(state["sum"], reference.state[local]["sum"], rtol=0, atol=1e-7)


def _not_called(*args: object) -> None:
    raise AssertionError("the torch optimizer stepped")


def test_adagrad_on_rows_continues_from_a_restored_state() -> None:
    on_ps = torch.nn.Parameter(torch.zeros(5, 2))
    update = Update("Adagrad", {"lr": 1.0}, on_ps)
    update.set_state({"step": torch.tensor(3.0), "sum": torch.full((5, 2), 4.0)})
    update.apply(torch.full((1, 2), 3.0), torch.tensor([2]))
    # sum 4 + 9 = 13 on row 2 only; the step moves it by 3 / sqrt(13).
    assert update.state()["step"].item() == 4
    assert update.state()["sum"][:, 0].tolist() == [4.0, 4.0, 13.0, 4.0, 4.0]
    assert on_ps[2].tolist() == pytest.approx([-3 / 13**0.5] * 2)
    assert on_ps[[0, 1, 3, 4]].abs().sum().item() == 0
