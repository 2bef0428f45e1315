"""Tests of feedline/examples/_progress.py: bars on a terminal only."""

from __future__ import annotations

import io

import pytest

from feedline.examples import _progress


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("stderr", "enabled", "drawn"),
    [
        (Terminal(), True, True),
        (Terminal(), False, False),  # a worker other than the chief
        (io.StringIO(), True, False),  # a log file or a pipe
    ],
    ids=["terminal", "terminal-disabled", "log"],
)
def test_a_bar_is_drawn_only_on_a_terminal(
    stderr: io.StringIO, enabled: bool, drawn: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stderr", stderr)
    bar = _progress.progress_bar(range(5), total=5, desc="epoch 1", enabled=enabled)
    assert bar.disable is not drawn
    assert list(bar) == [0, 1, 2, 3, 4]
    assert ("epoch 1" in stderr.getvalue()) is drawn
