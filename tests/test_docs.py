"""The Python snippets of docs/*.md run, in order, each document in one namespace."""

from __future__ import annotations

import pathlib
import re

import pytest

DOCS = sorted((pathlib.Path(__file__).resolve().parents[1] / "docs").glob("*.md"))


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_doc_snippets_run(path: pathlib.Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.DOTALL)
    assert blocks, f"{path.name} has no Python snippets"
    namespace: dict[str, object] = {"__name__": "__doc_snippets__"}
    for index, block in enumerate(blocks):
        try:
            exec(compile(block, f"{path.name}[{index}]", "exec"), namespace)
        except Exception as error:
            error.add_note(f"in snippet {index} of {path.name}:\n{block}")
            raise


MULTI_PROCESS = re.compile(r"```python torchrun=(\d+)\n(.*?)```\s*```text\n(.*?)```", re.DOTALL)
MULTI_PROCESS_DOCS = [p for p in DOCS if MULTI_PROCESS.search(p.read_text())]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", MULTI_PROCESS_DOCS, ids=[p.name for p in MULTI_PROCESS_DOCS])
def test_multi_process_snippets_print_what_the_doc_shows(path: pathlib.Path) -> None:
    """Blocks fenced ```python torchrun=N run as N real worker processes; each process's output,
    prefixed "worker RANK: ", must be the ```text block that follows."""
    from tests.launcher import run, torchrun_envs

    for index, (count, code, expected) in enumerate(MULTI_PROCESS.findall(path.read_text())):
        results = run(code, torchrun_envs(int(count)), timeout=240)
        printed = [
            f"worker {rank}: {line}"
            for rank in range(int(count))
            for line in results[f"rank:{rank}"].stdout.splitlines()
        ]
        assert printed == expected.strip().splitlines(), f"{path.name}, process block {index}"
