"""The benchmark scripts of benchmarks/ import: what they take from feedline still exists.

(Each one's measurements are run by hand, as benchmarks/README.md says; a script whose imports
went stale when a module moved fails here instead of on the next person to run it.) Each is
imported as a module, so its ``main`` does not run; the TensorFlow peers (``_tf_*``), which run
under their own interpreter, are left out.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_tf_"))


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_the_script_imports(path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import their siblings
    spec = importlib.util.spec_from_file_location(f"_benchmark_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    assert module.__doc__, f"{path.name} has no docstring saying what it measures"
