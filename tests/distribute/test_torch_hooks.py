"""Tests of feedline/distribute/_torch_hooks.py: what feedline changes in torch, and when.

torch's global hooks cannot be taken back, so each test runs in a fresh interpreter.
"""

from __future__ import annotations

from typing import Any

from tests.launcher import run


def _in_fresh_process(code: str) -> Any:
    results = run("from tests.launcher import report\n" + code, [("hooks", {})], timeout=90)
    return results["hooks"].result


def test_importing_feedline_changes_nothing_in_torch() -> None:
    result = _in_fresh_process(
        "import torch\n"
        "init = torch.optim.Optimizer.__init__\n"
        "import feedline.distribute, feedline.train.preemption\n"
        "import feedline.distribute.parameter_server.strategy\n"
        "from feedline.distribute import _torch_hooks\n"
        "report([torch.optim.Optimizer.__init__ is init, list(_torch_hooks.installed())])\n"
    )
    assert result == [True, []]


def test_a_set_is_installed_once_and_optimizer_hooks_run_in_install_order() -> None:
    result = _in_fresh_process(
        "import torch\n"
        "from feedline.distribute import _torch_hooks\n"
        "torch_init = torch.optim.Optimizer.__init__\n"
        "calls = []\n"
        "first = _torch_hooks.HookSet(\n"
        "    'first', on_parameter=lambda m, n, p: calls.append(('param', n)),\n"
        "    on_optimizer=lambda o: calls.append(('optimizer', 'first')))\n"
        "second = _torch_hooks.HookSet(\n"
        "    'second', on_optimizer=lambda o: calls.append(('optimizer', 'second')))\n"
        "for hooks in (first, second, first, second):\n"
        "    _torch_hooks.install(hooks)\n"
        "model = torch.nn.Linear(2, 1)\n"
        "torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "plain = object.__new__(torch.optim.SGD)\n"
        "_torch_hooks.torch_optimizer_init(plain, list(model.parameters()), {'lr': 0.1})\n"
        "report([calls, list(_torch_hooks.installed()),\n"
        "        torch.optim.Optimizer.__init__.__wrapped__ is torch_init])\n"
    )
    calls, installed, wrapped_is_torchs = result
    assert calls == [
        ["param", "weight"],
        ["param", "bias"],
        ["optimizer", "first"],
        ["optimizer", "second"],
    ]
    assert installed == ["first", "second"]
    assert wrapped_is_torchs


def test_strategies_install_their_sets_when_first_used() -> None:
    result = _in_fresh_process(
        "import torch\n"
        "import feedline.distribute as fdist\n"
        "from feedline.distribute import _torch_hooks\n"
        "before = list(_torch_hooks.installed())\n"
        "fdist.MirroredStrategy(['cpu:0'])\n"
        "one_replica = list(_torch_hooks.installed())\n"
        "strategy = fdist.MirroredStrategy(['cpu:0', 'cpu:1'])\n"
        "with strategy.scope():\n"
        "    model = torch.nn.Linear(2, 1)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "with strategy.scope():\n"
        "    pass\n"
        "mirrored = strategy._mirroring.owns_module(model)\n"
        "report([before, one_replica, list(_torch_hooks.installed()), mirrored])\n"
    )
    assert result == [[], [], ["mirroring"], True]


def test_optimizers_made_without_optimizer_hooks_get_none_in_that_thread_only() -> None:
    result = _in_fresh_process(
        "import threading, torch\n"
        "from feedline.distribute import _torch_hooks\n"
        "calls = []\n"
        "_torch_hooks.install(_torch_hooks.HookSet(\n"
        "    'counting', on_optimizer=lambda o: calls.append(threading.current_thread().name)))\n"
        "p = torch.nn.Parameter(torch.zeros(1))\n"
        "def other():\n"
        "    torch.optim.SGD([p], lr=0.1)\n"
        "with _torch_hooks.without_optimizer_hooks():\n"
        "    torch.optim.SGD([p], lr=0.1)\n"
        "    thread = threading.Thread(target=other, name='other')\n"
        "    thread.start(); thread.join()\n"
        "torch.optim.SGD([p], lr=0.1)\n"
        "report(calls)\n"
    )
    assert result == ["other", "MainThread"]
