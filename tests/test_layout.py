"""The package's shape: imports point one way (cli -> api -> distributed -> pipeline ->
config -> selectors -> objectives -> io/data), no module imports itself back through
others, and only the CLI knows argparse."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import datamask

ROOT = Path(datamask.__file__).parent

#: Layer of each part of the package, outermost first. A module may import its own layer
#: and the layers below it, never one above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("cli", ("cli",)),
    # the doors: select() and select_table(), and the integrations built on them
    ("api", ("api", "doors", "integrations")),
    # the sharded planner and runner: runs the pipeline's group step on every group
    ("distributed", ("distributed",)),
    # the group step and the writer; apply, evaluate and bench stand beside them
    ("pipeline", ("pipeline", "applying", "evaluation")),
    ("config", ("config", "partition_spec", "_needs")),
    ("selectors", ("selectors", "greedy", "optim", "ranking", "base")),
    ("objectives", ("objectives", "neighbors", "_ivf_lists", "coverage", "near_duplicates")),
    (
        "io/data",
        (
            "io",
            "data",
            "budget",
            "_validation",
            "_device",
            "_memory",
            "_copies",
            "_units",
            "measure",
            "settings",
            "_version",
            "columns",
            "quality",
            "synthetic",
            "embedding",
        ),
    ),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None  # datamask itself: the public re-exports (checked below)
    for rank, (_, members) in enumerate(LAYERS):
        if parts[1] in members:
            return rank
    raise AssertionError(f"{module} belongs to no layer; add it to LAYERS")


def _imports(path: Path, top_level_only: bool) -> list[tuple[str, int]]:
    """datamask modules ``path`` imports (resolved), with the line."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.startswith("datamask"):
                # ``from .pkg import name`` may name a submodule: prefer it when it exists
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    out.append((sub if _exists(sub) else target, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("datamask"):
                    out.append((alias.name, node.lineno))
    return out


def _exists(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (ROOT / rel).with_suffix(".py").exists() or (ROOT / rel / "__init__.py").exists()


def _modules() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def test_imports_point_inwards():
    wrong = []
    for path in _modules():
        module = _module_name(path)
        own = _layer(module)
        if own is None:
            continue
        for target, line in _imports(path, top_level_only=False):
            rank = _layer(target)
            if rank is not None and rank < own:
                wrong.append(
                    f"{module}:{line} ({LAYERS[own][0]}) imports {target} ({LAYERS[rank][0]})"
                )
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_import_cycle_between_modules():
    graph = {}
    for path in _modules():
        module = _module_name(path)
        targets = set()
        for target, _ in _imports(path, top_level_only=True):
            # importing a.b.c runs a.b's __init__ first, unless the importer is inside a.b
            parts = target.split(".")
            for i in range(2, len(parts) + 1):
                parent = ".".join(parts[:i])
                if not (module == parent or module.startswith(parent + ".")):
                    targets.add(parent)
        graph[module] = targets
    seen: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        seen[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt == node or nxt not in graph:
                continue
            if seen.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in seen:
                visit(nxt)
        stack.pop()
        seen[node] = 2

    for node in sorted(graph):
        if node not in seen:
            visit(node)
    # ``package -> its own submodule -> package`` is Python's normal re-export pattern only
    # when the submodule imports a sibling through the package; report every other cycle.
    real = [c for c in cycles if not _through_own_init(c)]
    assert not real, "import cycles:\n" + "\n".join(" -> ".join(c) for c in real)


def _through_own_init(cycle: list[str]) -> bool:
    """A cycle made only of a package's __init__ and its own submodules."""
    head = min(cycle, key=len)
    return all(m == head or m.startswith(head + ".") for m in cycle)


def test_the_package_root_reaches_the_top_floor_only_through_the_doors():
    """``import datamask`` loads the doors (api) and what lies below them; nothing of the
    CLI, and no other module of the api layer or the distributed planner directly."""
    allowed = {"datamask.api", "datamask.doors"}
    wrong = []
    for target, line in _imports(ROOT / "__init__.py", top_level_only=False):
        rank = _layer(target)
        if target in allowed or rank is None:
            continue
        if LAYERS[rank][0] in ("cli", "api", "distributed"):
            wrong.append(f"datamask:{line} imports {target} ({LAYERS[rank][0]})")
    assert not wrong, "the package root passes the doors:\n" + "\n".join(wrong)


def test_no_module_getattr_hides_an_import():
    """A module-level ``__getattr__`` that imports on first use hides a cycle from the check
    above; none is allowed."""
    users = []
    for path in _modules():
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                users.append(_module_name(path))
    assert not users, f"module __getattr__ in {users}"


def test_pipeline_does_not_import_distributed():
    """The group step and the writer stand below the sharded runner, which uses them."""
    for path in sorted((ROOT / "pipeline").rglob("*.py")):
        for target, line in _imports(path, top_level_only=False):
            assert not target.startswith("datamask.distributed"), f"{path.name}:{line} -> {target}"


def test_greedy_does_not_import_the_learner():
    """The baselines stand on their own: the registry joining them with the learner is
    :mod:`datamask.selectors`."""
    for path in sorted((ROOT / "greedy").rglob("*.py")):
        for target, line in _imports(path, top_level_only=False):
            assert not target.startswith("datamask.optim"), f"{path.name}:{line} -> {target}"


def test_only_the_cli_imports_argparse():
    users = []
    for path in _modules():
        module = _module_name(path)
        if module.startswith("datamask.cli"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if "argparse" in names:
                users.append(f"{module}:{node.lineno}")
    assert not users, f"argparse outside datamask.cli: {users}"


def test_the_layout_test_sees_a_wrong_import(tmp_path, monkeypatch):
    """The checks above are not vacuous: an objective importing a selector is caught. The
    probe is a copy of the package in tmp_path: nothing is written into src/."""
    import shutil

    copy = tmp_path / "datamask"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "objectives" / "_layout_probe.py").write_text("from ..selectors import SELECTORS\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", copy)
    try:
        test_imports_point_inwards()
    except AssertionError as exc:
        assert "_layout_probe" in str(exc)
    else:
        raise AssertionError("the layering check let objectives import greedy")


def test_no_import_cycle_between_modules_even_inside_functions():
    """The module import graph, imports inside functions included, is acyclic: a cycle
    is not hidden behind a lazy import (e.g. distributed: runner, steps, cap, executors)."""
    graph = {_module_name(p): {t for t, _ in _imports(p, top_level_only=False)} for p in _modules()}
    packages = {m for m in graph if (ROOT.parent / Path(*m.split("."))).is_dir()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            # a package's __init__ re-exports its modules: an edge into the package from
            # one of its own modules is not a cycle between modules
            if t in packages and m.startswith(t + "."):
                continue
            if state.get(t) == 1:
                cycle = stack[stack.index(t) :] + [t]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if t in graph and not state.get(t):
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if not state.get(m):
            visit(m)


#: The house's bounds on src/ (issue 43): a function a reader holds in one screen, a file
#: a reader holds in one sitting.
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 600


def test_no_function_over_80_lines_and_no_file_over_600():
    long_files, long_functions = [], []
    for path in sorted(ROOT.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(ROOT.parent)
        if len(text.splitlines()) > MAX_FILE_LINES:
            long_files.append(f"{rel} ({len(text.splitlines())} lines)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long_functions.append(f"{rel}:{node.lineno} {node.name} ({lines} lines)")
    assert not long_files, f"files over {MAX_FILE_LINES} lines: {long_files}"
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines: {long_functions}"
