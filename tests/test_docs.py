"""The Python snippets of docs/*.md run, in order, each document in one namespace; paths under
/tmp/ are moved to a test folder."""

from __future__ import annotations

import pathlib
import re

import pytest

DOCS = sorted((pathlib.Path(__file__).resolve().parents[1] / "docs").glob("*.md"))


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_doc_snippets_run(path: pathlib.Path, tmp_path: pathlib.Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.DOTALL)
    assert blocks, f"{path.name} has no Python snippets"
    namespace: dict[str, object] = {"__name__": "__doc_snippets__"}
    for index, block in enumerate(blocks):
        code = block.replace("/tmp/", f"{tmp_path}/")
        try:
            exec(compile(code, f"{path.name}[{index}]", "exec"), namespace)
        except Exception as error:
            error.add_note(f"in snippet {index} of {path.name}:\n{block}")
            raise


MULTI_PROCESS = re.compile(
    r"```python torchrun=(\d+)( max-restarts=\d+)?\n(.*?)```\s*```text\n(.*?)```", re.DOTALL
)


def _process_groups(path: pathlib.Path) -> list[list[int]]:
    """The multi-process blocks of ``path`` in groups to run in order: a block joins the group
    of an earlier block that uses one of its /tmp/ folders (a checkpoint it reads); the groups
    are independent, so each is a test of its own."""
    groups: list[tuple[set[str], list[int]]] = []
    for index, (_, _, code, _) in enumerate(MULTI_PROCESS.findall(path.read_text())):
        folders = {m.split("/")[2] for m in re.findall(r"/tmp/[\w.-]+", code)}
        group = next((g for g in groups if g[0] & folders), None)
        if group is None:
            groups.append((folders, [index]))
        else:
            group[0].update(folders)
            group[1].append(index)
    return [indices for _, indices in groups]


MULTI_PROCESS_GROUPS = [
    (path, indices)
    for path in DOCS
    for indices in _process_groups(path)
]  # fmt: skip


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("path", "indices"),
    MULTI_PROCESS_GROUPS,
    ids=[f"{p.name}-{'-'.join(map(str, i))}" for p, i in MULTI_PROCESS_GROUPS],
)
def test_multi_process_snippets_print_what_the_doc_shows(
    path: pathlib.Path, indices: list[int], tmp_path: pathlib.Path
) -> None:
    """Blocks fenced ```python torchrun=N run as N real worker processes; each process's output,
    prefixed "worker RANK: ", must be the ```text block that follows. Blocks fenced ```python
    torchrun=N max-restarts=R run under torchrun's launcher, which restarts the group up to R
    times; the output is prefixed "attempt A, worker RANK: " and the launcher must succeed."""
    from tests.launcher import Processes, Torchrun, run, torchrun_envs

    blocks = MULTI_PROCESS.findall(path.read_text())
    for index in indices:
        count, restarts, code, expected = blocks[index]
        code = code.replace("/tmp/", f"{tmp_path}/")
        if restarts:
            launcher = Torchrun(int(count), max_restarts=int(restarts.split("=")[1]))
            with Processes(code, [("torchrun", {})], torchrun=launcher, timeout=240) as procs:
                (result,) = procs.wait().values()
                outputs = procs.worker_outputs("torchrun")
                errors = procs.worker_outputs("torchrun", "stderr")
            assert result.ok, f"{result.describe()}\nworkers' stderr: {errors}"
            printed = [
                f"attempt {attempt}, worker {rank}: {line}"
                for (attempt, rank), text in outputs.items()
                for line in text.splitlines()
            ]
        else:
            results = run(code, torchrun_envs(int(count)), timeout=240)
            printed = [
                f"worker {rank}: {line}"
                for rank in range(int(count))
                for line in results[f"rank:{rank}"].stdout.splitlines()
            ]
        assert printed == expected.strip().splitlines(), f"{path.name}, process block {index}"
