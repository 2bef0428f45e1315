"""What the seed-page tests share: running a page's snippets, and the one output normaliser.

A page's snippets run as a notebook runs them: in order, in one namespace, in a fresh Python
process started by ``tests/launcher.py`` (with no GPU visible, and in a temporary working
directory, so that ``'./training_checkpoints'`` and the like land there), which ends as soon as
it has reported, without tearing down what the page left running (servers, as a notebook leaves
them). Each snippet's printed output and traceback are kept apart, so one failing snippet fails
its own test only (the snippets after it still run, and fail too if they needed what it should
have defined).

``normalise`` turns a seed's printed output and feedline's into one form, by these rules only:

1. TensorFlow's log records are dropped: lines starting with ``INFO:tensorflow:`` or
   ``WARNING:tensorflow:``, and an ``Instructions for updating:`` line with the line after it.
   (TensorFlow writes them to stderr; the notebooks interleave them with the printed output.)
2. Tensor and array reprs become their values: ``tf.Tensor(V, shape=..., dtype=...)``,
   ``<tf.Tensor: shape=..., dtype=..., numpy=V>``, ``array(V, dtype=...)``, torch's
   ``tensor(V, dtype=..., device=..., grad_fn=..., requires_grad=...)`` and NumPy 2's scalar
   reprs ``np.int64(V)`` all become ``V``.
3. Numbers are compared as values, rounded to 4 decimal places (torch prints 4):
   ``0.7000``, ``0.7`` and ``0.70000005`` are all ``0.7``; ``1.``, ``1.0`` and ``1`` are all ``1``.
4. Commas and runs of whitespace are one separator, and there is none just inside brackets:
   ``[[0.7]\\n [0.7]]`` (NumPy's ``str``) and ``[[0.7000],\\n        [0.7000]]`` (torch's) are
   both ``[[0.7] [0.7]]``.
5. Only where a snippet prints with ``tf.print`` (``summarize=3``): every list of more than 6
   entries is shown as its first 3, ``...`` and its last 3, as ``tf.print`` shows it.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests import launcher

EXPECTED = Path(__file__).resolve().parent / "expected"

# Hides GPUs: the seeds' printed outputs come from one device (or the CPU devices they name).
PAGE_ENV = {"CUDA_VISIBLE_DEVICES": ""}

_RUNNER = """
import contextlib, io, json, os, sys, tempfile, traceback
from tests.launcher import report

snippets = json.loads(open(sys.argv[1]).read())
os.chdir(tempfile.mkdtemp(prefix="feedline-seed-"))
namespace = {"__name__": "__main__"}
results = {}
for name, code in snippets:
    out = io.StringIO()
    error = None
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, name, "exec"), namespace)
    except BaseException:
        error = traceback.format_exc()
    results[name] = {"stdout": out.getvalue(), "error": error}
report(results)
os._exit(0)  # no interpreter teardown: the page leaves servers running, as a notebook does
"""


def run_page(
    snippets: Sequence[tuple[str, str]], *, timeout: float = 120.0
) -> dict[str, dict[str, Any]]:
    """Runs ``(name, code)`` snippets in order in one fresh process; per name, stdout and error."""
    with tempfile.TemporaryDirectory(prefix="feedline-seed-page-") as folder:
        path = Path(folder) / "snippets.json"
        path.write_text(json.dumps(list(snippets)))
        results = launcher.run(
            _RUNNER, [("page", {})], timeout=timeout, argv=[str(path)], env=PAGE_ENV
        )
    return results["page"].result


def check_snippet(
    page: Mapping[str, Mapping[str, Any]],
    name: str,
    *,
    tf_print: bool = False,
    compare: bool = True,
) -> str:
    """Fails if snippet ``name`` raised; with ``compare``, compares its output with the seed's
    if the seed shows one (``expected/<name>.txt``). Returns what the snippet printed."""
    result = page[name]
    if result["error"]:
        raise AssertionError(
            f"snippet {name} raised:\n{result['error']}\nafter printing:\n{result['stdout']}"
        )
    path = EXPECTED / f"{name}.txt"
    if compare and path.exists():
        assert normalise(result["stdout"], tf_print=tf_print) == normalise(
            path.read_text(), tf_print=tf_print
        )
    return result["stdout"]


def expected(name: str) -> str:
    """The seed's printed output for snippet ``name``, verbatim."""
    return (EXPECTED / f"{name}.txt").read_text()


_LOG_LINE = re.compile(r"^(INFO|WARNING):tensorflow:")
_TF_TENSOR = re.compile(r"tf\.Tensor\(\s*(.*?),\s*shape=\([^)]*\),\s*dtype=\w+\)", re.DOTALL)
_TF_EAGER = re.compile(r"<tf\.Tensor: shape=\([^)]*\), dtype=\w+, numpy=(.*?)>", re.DOTALL)
_ARRAY = re.compile(r"array\((.*?)(?:,\s*dtype=\w+)?\)", re.DOTALL)
_TORCH = re.compile(
    r"tensor\((.*?)"
    r"(?:,\s*(?:dtype=torch\.\w+|device='[^']*'|grad_fn=<\w+>|requires_grad=True))*\)",
    re.DOTALL,
)
_NP_SCALAR = re.compile(r"np\.\w+\((.*?)\)")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?(?![\w.])")


def _number(match: re.Match[str]) -> str:
    value = round(float(match.group(0)), 4)
    return str(int(value)) if value == int(value) else repr(value)


def normalise(text: str, *, tf_print: bool = False) -> str:
    """The printed output ``text`` in the comparable form of the module docstring."""
    lines, skip = [], False
    for line in text.splitlines():
        if skip:
            skip = False
        elif line.startswith("Instructions for updating:"):
            skip = True
        elif not _LOG_LINE.match(line):
            lines.append(line)
    text = "\n".join(lines)
    for pattern in (_TF_TENSOR, _TF_EAGER, _ARRAY, _TORCH, _NP_SCALAR):
        text = pattern.sub(r"\1", text)
    text = _NUMBER.sub(_number, text)
    text = re.sub(r"\s+", " ", text.replace(",", " ")).strip()
    text = re.sub(r"([\[({]) ", r"\1", text)
    text = re.sub(r" ([\])}])", r"\1", text)
    return _summarise(text) if tf_print else text


def _summarise(text: str, edge: int = 3) -> str:
    """Rule 5: every bracketed list of more than ``2 * edge`` entries keeps its ends only."""
    tokens = re.findall(r"\[|\]|[^\s\[\]]+", text)

    def parse(i: int) -> tuple[list[Any], int]:
        items: list[Any] = []
        while tokens[i] != "]":
            if tokens[i] == "[":
                item, i = parse(i + 1)
                items.append(item)
            else:
                items.append(tokens[i])
            i += 1
        return items, i

    def show(items: list[Any]) -> str:
        if len(items) > 2 * edge:
            items = [*items[:edge], "...", *items[-edge:]]
        return "[" + " ".join(show(x) if isinstance(x, list) else x for x in items) + "]"

    out, i = [], 0
    while i < len(tokens):
        if tokens[i] == "[":
            items, i = parse(i + 1)
            out.append(show(items))
        else:
            out.append(tokens[i])
        i += 1
    text = " ".join(out)
    text = re.sub(r"([\[({]) ", r"\1", text)
    return re.sub(r" ([\])}])", r"\1", text)
