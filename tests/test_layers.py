"""The layers of DESIGN.md: feedline.data (and io) never import torch; dependencies point down,
and no feedline modules import each other in a circle."""

from __future__ import annotations

import ast
import collections
import dataclasses
import pathlib
import subprocess
import sys
from collections.abc import Mapping, Sequence

import feedline


def _run(code: str) -> None:
    """Runs ``code`` in a fresh interpreter, where nothing was imported yet."""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_feedline_data_does_not_import_torch() -> None:
    _run(
        "import sys, feedline, feedline.data, feedline.io, feedline.train\n"
        "import feedline.data.experimental\n"
        "assert 'torch' not in sys.modules, 'feedline.data imported torch'\n"
        "assert 'feedline.distribute' not in sys.modules\n"
        "assert 'feedline.service' not in sys.modules\n"
    )


def test_the_torch_adapters_import_torch_only_when_called() -> None:
    _run(
        "import sys, feedline.data as fd\n"
        "assert callable(fd.Dataset.from_torch) and callable(fd.Dataset.as_torch)\n"
        "assert 'torch' not in sys.modules and 'feedline.data.torch_loader' not in sys.modules\n"
        "loader = fd.Dataset.range(3).as_torch()\n"
        "assert 'torch' in sys.modules and [int(x) for x in loader] == [0, 1, 2]\n"
    )


def test_feedline_service_does_not_import_torch() -> None:
    _run(
        "import sys, feedline.service\n"
        "import feedline.data.experimental as experimental\n"
        "assert experimental.service.distribute is feedline.service.distribute\n"
        "from feedline.data.experimental.service import distribute\n"
        "assert distribute is feedline.service.distribute\n"
        "assert 'torch' not in sys.modules, 'feedline.service imported torch'\n"
    )


def test_import_feedline_imports_nothing_heavy() -> None:
    _run(
        "import sys, feedline\n"
        "for name in ('torch', 'feedline.data', 'feedline.distribute', 'feedline.service'):\n"
        "    assert name not in sys.modules, f'import feedline imported {name}'\n"
        "assert {'data', 'distribute', 'config', 'nn', 'compat'} <= set(dir(feedline))\n"
    )


def test_lazy_modules_of_feedline_do_not_import_torch() -> None:
    _run(
        "import sys, feedline as tf\n"
        "tf.data.Dataset.range(3), tf.data.experimental.AutoShardPolicy, tf.TensorSpec\n"
        "tf.data.experimental.service.distribute, tf.errors.OutOfRangeError, tf.io, tf.train\n"
        "tf.compat.v1.data.Options, tf.config.list_physical_devices('CPU')\n"
        "tf.config.set_logical_device_configuration(\n"
        "    tf.config.list_physical_devices('CPU')[0], [tf.config.LogicalDeviceConfiguration()])\n"
        "assert tf.config.list_logical_devices('CPU')[0].name == '/device:CPU:0'\n"
        "assert 'torch' not in sys.modules, 'a torch-free module of feedline imported torch'\n"
        "assert 'feedline.distribute' not in sys.modules\n"
        "tf.distribute.MirroredStrategy\n"
        "assert 'torch' in sys.modules\n"
    )


# -- the import graph ------------------------------------------------------------------------------
# Every import of one feedline module by another, read from the source: at module level and
# inside functions, ``importlib.import_module("...")``, ``sys.modules["..."]`` and
# ``sys.modules.get("...")`` lookups, and the targets of ``_porting.lazy_attributes`` tables
# (imported on first access). Imports under ``if TYPE_CHECKING:`` are for annotations and do not
# count. ``from package import name`` is an edge to ``package.name`` where that is a module, else
# to ``package``; importing a submodule runs its package's ``__init__`` too, but that implicit
# edge does not count (a package that re-exports its modules would otherwise be a circle).

SRC = pathlib.Path(feedline.__file__).resolve().parent

#: The floors of DESIGN.md, lowest first; a module takes the rank of its longest listed prefix.
RANKS: dict[str, int] = {
    # 0, the ground floor: the element model, errors, the gRPC layer, file formats, contracts.
    "feedline._checkpointable": 0,
    "feedline._cluster_shares": 0,
    "feedline._enums": 0,
    "feedline._fs": 0,
    "feedline._net": 0,
    "feedline._porting": 0,
    "feedline._s3_session": 0,
    "feedline._tfrecord": 0,
    "feedline.config": 0,
    "feedline.errors": 0,
    "feedline.structure": 0,
    "feedline._composite": 0,
    "feedline._csv_columns": 0,
    # 1: the input pipeline, and the tf.io and keras.datasets names beside it.
    "feedline.data": 1,
    "feedline.datasets": 1,
    "feedline.io": 1,
    # 2: the data service.
    "feedline.service": 2,
    # 3: strategies (PyTorch enters here).
    "feedline.distribute": 3,
    # 4: what training loops use on top of a strategy.
    "feedline.metrics": 4,
    "feedline.nn": 4,
    # 5: checkpoints, preemption, backup.
    "feedline.train": 5,
    # 6: the command line, the examples, and the facades that reach everything lazily.
    "feedline": 6,
    "feedline.cli": 6,
    "feedline.compat": 6,
    "feedline.examples": 6,
}

#: TensorFlow's paths to objects that feedline keeps elsewhere, each resolved only when used, so
#: allowed to go up a floor or back to a package that imports the module:
#: ``tf.data.experimental.service``; ``PreemptionCheckpointHandler`` and ``TerminationConfig`` of
#: ``tf.distribute.experimental`` (in ``feedline.train``); ``MultiWorkerMirroredStrategy`` and
#: ``ParameterServerStrategy`` of ``tf.distribute.experimental``, looked up on
#: ``feedline.distribute`` (imported by then), so that both paths give the same object.
TENSORFLOW_PATHS = {
    ("feedline.data.experimental", "feedline.service"),  # lazy attribute ``service``
    # lazy attribute ``make_batched_features_dataset``, above feedline.data and feedline.io
    ("feedline.data.experimental", "feedline._batched_features"),
    ("feedline.data.experimental", "feedline._dataset_writer"),  # lazy ``TFRecordWriter``
    # lazy ``distributed_save``: the service's workers write the snapshot
    ("feedline.data.experimental", "feedline.service.client.save"),
    ("feedline.data.experimental.service", "feedline.service"),  # loaded only by that path
    ("feedline.distribute.experimental", "feedline.train.preemption"),  # lazy attributes
    ("feedline.distribute.experimental", "feedline.distribute"),  # lazy attributes
}


@dataclasses.dataclass(frozen=True)
class Edge:
    """``importer`` imports ``imported`` at ``line``; ``lazy`` when inside a function or in a
    table of names resolved on first access."""

    importer: str
    imported: str
    line: int
    lazy: bool

    def __str__(self) -> str:
        where = "in a function" if self.lazy else "at module level"
        return f"{self.importer} -> {self.imported} (line {self.line}, {where})"


def _modules() -> dict[str, tuple[pathlib.Path, bool]]:
    """Module name -> (its file, whether it is a package's ``__init__``)."""
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts.pop()
        found[".".join(parts)] = (path, package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_lazy_table(node: ast.AST) -> bool:
    """Whether ``node`` is a ``lazy_attributes(...)`` call, whose targets load on first access."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) == (
        "lazy_attributes"
    )


def _constant(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _targets(node: ast.AST, package: str, modules: Mapping[str, object]) -> list[str]:
    """The dotted names that ``node`` imports, if it is an import of any kind."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
        return [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
            for alias in node.names
        ]
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name == "import_module" and node.args and _constant(node.args[0]):
            return [_constant(node.args[0])]  # type: ignore[list-item]
        if name == "get" and isinstance(func, ast.Attribute) and node.args:
            owner = func.value
            if isinstance(owner, ast.Attribute) and owner.attr == "modules":
                return [name for name in [_constant(node.args[0])] if name]
        if name == "lazy_attributes" and len(node.args) == 2 and isinstance(node.args[1], ast.Dict):
            values = [_constant(value) for value in node.args[1].values if value is not None]
            return [value.partition(":")[0] for value in values if value]
    if isinstance(node, ast.Subscript):
        owner = node.value
        if isinstance(owner, ast.Attribute) and owner.attr == "modules" and _constant(node.slice):
            return [_constant(node.slice)]  # type: ignore[list-item]
    return []


def module_edges(
    tree: ast.Module, module: str, package: str, modules: Mapping[str, object]
) -> list[Edge]:
    """The edges from ``module`` (parsed as ``tree``, in ``package``) to the ``modules``."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: list[Edge] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, lazy)
            return
        on_access = lazy or _is_lazy_table(node)
        for target in _targets(node, package, modules):
            resolved = resolve(target) if target.startswith("feedline") else None
            if resolved is not None and resolved != module:
                edges.append(Edge(module, resolved, getattr(node, "lineno", 0), on_access))
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return edges


def import_edges() -> list[Edge]:
    """Every edge between two feedline modules (see the comment above)."""
    modules = _modules()
    edges: list[Edge] = []
    for module, (path, is_package) in sorted(modules.items()):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = module if is_package else module.rpartition(".")[0]
        edges += module_edges(tree, module, package, modules)
    return edges


def import_cycles(edges: Sequence[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = collections.defaultdict(set)
    for edge in edges:
        graph[edge.importer].add(edge.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                connect(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return cycles


def rank(module: str) -> int:
    """The floor of ``module``: that of its longest prefix in ``RANKS``."""
    name = module
    while name not in RANKS:
        if "." not in name:
            raise AssertionError(f"{module} has no floor: add its package to RANKS")
        name = name.rpartition(".")[0]
    return RANKS[name]


def _allowed(edge: Edge) -> bool:
    """A TensorFlow path: left out of the cycle and floor tests."""
    return (edge.importer, edge.imported) in TENSORFLOW_PATHS


def test_the_import_graph_sees_every_kind_of_import() -> None:
    found = {(e.importer, e.imported, e.lazy) for e in import_edges()}
    assert ("feedline.data._fluent", "feedline.data.torch_loader", True) in found  # in a fn
    assert ("feedline.train", "feedline.train.checkpoint", True) in found  # a lazy table
    assert ("feedline.data.dataset", "feedline.structure", False) in found  # from x import mod
    assert ("feedline.data.ops.batch", "feedline.data.dataset", False) in found  # from x import y
    assert ("feedline.train._cluster", "feedline.distribute.collective", False) in found
    tree = ast.parse(
        "import sys, importlib\n"
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "from .b import name\n"
        "if TYPE_CHECKING:\n"
        "    import feedline.c\n"
        "else:\n"
        "    import feedline.d\n"
        "def f():\n"
        "    importlib.import_module('feedline.c')\n"
        "    return sys.modules['feedline.d'], sys.modules.get('feedline.pkg.b')\n"
        "lazy_attributes(__name__, {'x': 'feedline.c:X'})\n"
    )
    modules = dict.fromkeys(["feedline.pkg.a", "feedline.pkg.b", "feedline.c", "feedline.d"])
    edges = module_edges(tree, "feedline.pkg.a", "feedline.pkg", modules)
    assert [(e.imported, e.line, e.lazy) for e in edges] == [
        ("feedline.pkg.b", 3, False),
        ("feedline.pkg.b", 4, False),
        ("feedline.d", 8, False),
        ("feedline.c", 10, True),
        ("feedline.d", 11, True),
        ("feedline.pkg.b", 11, True),
        ("feedline.c", 12, True),
    ]


def test_no_import_cycle_between_feedline_modules() -> None:
    edges = [e for e in import_edges() if not _allowed(e)]
    cycles = import_cycles(edges)
    described = [
        " <-> ".join(cycle)
        + ": "
        + "; ".join(str(e) for e in edges if e.importer in cycle and e.imported in cycle)
        for cycle in cycles
    ]
    assert not described, "import cycles:\n" + "\n".join(described)


def test_no_module_imports_a_higher_floor() -> None:
    upward = [
        str(edge)
        for edge in import_edges()
        if rank(edge.imported) > rank(edge.importer) and not _allowed(edge)
    ]
    assert not upward, "imports of a higher floor:\n" + "\n".join(upward)


def test_the_allowed_edges_are_still_there_and_tensorflow_paths_load_on_first_access() -> None:
    edges = import_edges()
    assert {(e.importer, e.imported) for e in edges} >= TENSORFLOW_PATHS
    eager = [
        str(e)
        for e in edges
        if (e.importer, e.imported) in TENSORFLOW_PATHS
        and not e.lazy
        and e.importer != "feedline.data.experimental.service"
    ]
    assert not eager, "\n".join(eager)


def test_data_and_io_stay_apart_but_for_the_experimental_names_of_parsed_records() -> None:
    """feedline.io never imports feedline.data; feedline.data imports feedline.io only in
    ``feedline.data.experimental``, whose TensorFlow names parse records into datasets
    (``parse_example_dataset``, ``make_batched_features_dataset``)."""

    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    between = [
        str(edge)
        for edge in import_edges()
        if {package(edge.importer), package(edge.imported)} == {"feedline.data", "feedline.io"}
        and not edge.importer.startswith("feedline.data.experimental")
    ]
    assert not between, "\n".join(between)


def test_only_the_old_name_imports_the_element_model_under_feedline_data() -> None:
    users = {e.importer for e in import_edges() if e.imported == "feedline.data.structure"}
    assert not users, sorted(users)


def test_distribute_reaches_the_preemption_handler_without_importing_train() -> None:
    _run(
        "import sys\n"
        "import feedline.distribute as fdist\n"
        "assert not any(name.startswith('feedline.train') for name in sys.modules)\n"
        "from feedline.train import preemption\n"
        "handler = fdist.experimental.PreemptionCheckpointHandler\n"
        "assert handler is preemption.PreemptionCheckpointHandler\n"
        "assert fdist.experimental.TerminationConfig is preemption.TerminationConfig\n"
    )
