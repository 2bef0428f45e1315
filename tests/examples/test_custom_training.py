"""Tests of feedline/examples/custom_training.py, the main job (on the bundled digits)."""

from __future__ import annotations

import pathlib

import pytest

from feedline.cli import main
from feedline.examples import custom_training


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    # No Fashion-MNIST copy and no network: the demo falls back to the digits.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FEEDLINE_DATA_DIR", raising=False)
    monkeypatch.setattr(
        custom_training.fashion_mnist, "BASE_URL", (tmp_path / "none").as_uri() + "/"
    )


def test_demo_trains_checkpoints_restores_and_resumes(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoints = tmp_path / "ckpt"
    args = ["--epochs", "3", "--checkpoint-dir", str(checkpoints)]
    assert main(["demo", *args]) == 0
    out = capsys.readouterr().out
    assert "training on scikit-learn's 8x8 digits" in out
    assert "Number of devices: 2" in out
    epochs = [line for line in out.splitlines() if line.startswith("Epoch ") and "Test" in line]
    assert [line.split(",")[0] for line in epochs] == ["Epoch 1", "Epoch 2", "Epoch 3"]
    assert "Accuracy after restoring the saved model without strategy" in out
    assert sorted(p.name for p in checkpoints.glob("ckpt-*")) == ["ckpt-1", "ckpt-2"]

    assert main(["demo", "--epochs", "4", "--checkpoint-dir", str(checkpoints), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "after epoch 3" in out
    epochs = [line for line in out.splitlines() if line.startswith("Epoch ") and "Test" in line]
    assert [line.split(",")[0] for line in epochs] == ["Epoch 4"]


def test_model_fits_both_image_sizes() -> None:
    import torch

    for size in (28, 8):
        out = custom_training.create_model(size)(torch.zeros(2, 1, size, size))
        assert out.shape == (2, 10)


@pytest.mark.timeout(240)
def test_demo_on_two_workers_through_torchrun(tmp_path: pathlib.Path) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "RANK", "WORLD_SIZE")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), FEEDLINE_DATA_DIR=str(tmp_path / "none"))
    checkpoints = tmp_path / "ckpt"
    result = subprocess.run(
        [sys.executable, "-m", "feedline.cli", "demo", "--workers", "2", "--epochs", "2",
         "--checkpoint-dir", str(checkpoints)],
        env=env, capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout
    assert out.count("training on scikit-learn's 8x8 digits") == 1  # the chief speaks
    assert "Number of workers: 2" in out and "Number of devices: 2" in out
    epochs = [line for line in out.splitlines() if line.startswith("Epoch ") and "Test" in line]
    assert [line.split(",")[0] for line in epochs] == ["Epoch 1", "Epoch 2"]
    assert "2 replicas on 2 workers" in out
    assert sorted(p.name for p in checkpoints.glob("ckpt-*")) == ["ckpt-1"]  # the chief's only
