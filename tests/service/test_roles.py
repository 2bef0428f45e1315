"""The service is laid out by the process that runs its code (DESIGN.md, "feedline.service: by
role"): no role imports another role, and the shared modules import no role at all.

==============  ===========================================================================
dispatcher/     may import the shared modules and status/
worker/         may import the shared modules and status/
client/         may import the shared modules only (a training process runs it)
status/         may import the shared modules only
shared modules  (protocol, config, splits, ledger, position, shm) import no role
==============  ===========================================================================

Imports placed inside functions count as much as those at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import feedline.service

SERVICE = Path(feedline.service.__file__).parent
ROLES = ("dispatcher", "worker", "client", "status")
ALLOWED = {
    "dispatcher": {"status"},
    "worker": {"status"},
    "client": set(),
    "status": set(),
    None: set(),  # the shared modules
}


def _role_of(module: str) -> str | None:
    """The role a ``feedline.service...`` module belongs to; None for a shared module."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[2] in ROLES else None


def _imports(path: Path) -> set[str]:
    """Every ``feedline.service...`` module that ``path`` imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("feedline.service.")}


def _modules() -> list[tuple[str, Path]]:
    return [
        (".".join(("feedline", "service", *path.relative_to(SERVICE).with_suffix("").parts)), path)
        for path in sorted(SERVICE.rglob("*.py"))
        if path.name != "__init__.py" or path.parent != SERVICE
    ]


@pytest.mark.parametrize(("module", "path"), _modules(), ids=lambda value: str(value))
def test_no_role_imports_another_role(module: str, path: Path) -> None:
    role = _role_of(module)
    foreign = {
        name
        for name in _imports(path)
        if (other := _role_of(name)) is not None and other != role and other not in ALLOWED[role]
    }
    assert not foreign, f"{module} ({role or 'shared'}) imports {sorted(foreign)}"


def test_every_role_has_its_package() -> None:
    assert {path.name for path in SERVICE.iterdir() if (path / "__init__.py").exists()} == set(
        ROLES
    )
