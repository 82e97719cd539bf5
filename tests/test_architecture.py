"""The house's rules, checked from the code: one-way imports, no cycles, every module importable alone.

``graph/`` imports ``agents/``, ``agents/`` imports ``tools/``, never back: the nodes' shared vocabulary
(``agents/state.py``, ``agents/context.py``) lives with the nodes and imports none of them. Nothing in ``tools/``
knows about LangGraph. Inside ``tools/`` the packages stand in layers (:data:`TOOLS_LAYERS`), and every import
goes to the same layer or a lower one.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("graph", "agents", "tools")
VOCABULARY = {"agents.state", "agents.context"}
MAX_LINES = 600
MAX_FUNCTION_LINES = 60
#: The packages (and loose modules) of ``tools/``, from the bottom up: a module imports only its own layer or
#: lower ones. ``tools`` itself (the package's ``__init__``, which resolves ``load_compressed`` lazily) is the top.
TOOLS_LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(layer)
    for layer in (
        {"tools.text", "tools.schemas", "tools.clock", "tools.stages"},
        {"tools.stats"},
        {"tools.store"},
        {"tools.llm"},
        {"tools.models"},
        {"tools.profiling"},
        {"tools.compression"},
        {"tools.deploy"},
        {"tools.artifacts"},
        {"tools.evaluation"},
        {"tools.reporting"},
        {"tools.stages.run_data"},
        {"tools.stages.judging"},
        {"tools.stages.ops", "tools.stages.not_built"},
        {"tools.stages.cross_fit", "tools.stages.deployment", "tools.stages.predict"},
        {"tools"},
    )
)
#: The package of the run's stages, the top of ``tools/``: layered module by module in :data:`TOOLS_LAYERS` (its
#: ``__init__`` holds a docstring only).
STAGES = "tools.stages"
#: Packages of ``tools/`` that stand apart: they import nothing of the project.
TOOLS_APART = frozenset({"tools.zoo"})


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {
    _module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py")) if "assets" not in p.parts
}


def _imports(path: Path) -> set[str]:
    """Every module named by an import statement of ``path`` (top level, functions and TYPE_CHECKING too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _project_imports(path: Path) -> set[str]:
    """The project modules ``path`` imports (a package's name counts as its ``__init__``)."""
    return {name for name in _imports(path) if name in MODULES}


def _imported_modules(path: Path) -> set[str]:
    """The project modules ``path`` takes names from: ``from tools.stages import ops`` imports ``tools.stages.ops``, not
    the package ``tools.stages`` (whose ``__init__`` every ``tools.stages.*`` import runs); ``from tools import
    load_compressed`` imports ``tools``. Top level, functions and TYPE_CHECKING alike, as :func:`_imports`."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                names.add(submodule if submodule in MODULES else node.module)
    return {name for name in names if name in MODULES}


def _tools_unit(module: str) -> str:
    """The package of ``tools/`` that ``module`` belongs to (``tools.deploy.registry``: ``tools.deploy``; ``tools``:
    the package's ``__init__``), or, in :data:`STAGES` (layered module by module), the module itself."""
    parts = module.split(".")
    return ".".join(parts[:3] if ".".join(parts[:2]) == STAGES and len(parts) > 2 else parts[:2])


def test_tools_never_import_the_graph_the_agents_or_langgraph() -> None:
    offenders = {
        name: sorted(i for i in _imports(path) if i.split(".")[0] in {"graph", "agents", "langgraph"})
        for name, path in MODULES.items()
        if name.startswith("tools")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_tools_layers_name_every_package_of_tools_once() -> None:
    units = {_tools_unit(name) for name in MODULES if name.split(".")[0] == "tools"}
    layered = [unit for layer in TOOLS_LAYERS for unit in layer]
    assert len(layered) == len(set(layered)) and not set(layered) & TOOLS_APART
    assert units == set(layered) | TOOLS_APART


def test_tools_packages_import_only_their_own_layer_or_lower_ones() -> None:
    """Package direction, not only file cycles: no import of ``tools/`` runs back up a layer."""
    level = {unit: i for i, layer in enumerate(TOOLS_LAYERS) for unit in layer}
    upward = {
        f"{name} -> {target}"
        for name, path in MODULES.items()
        if _tools_unit(name) in level
        for target in _imported_modules(path)
        if target.startswith("tools") and level.get(_tools_unit(target), -1) > level[_tools_unit(name)]
    }
    assert not upward, "imports that run back up a layer:\n" + "\n".join(sorted(upward))


def test_packages_apart_import_nothing_of_the_project() -> None:
    offenders = {
        name: sorted(_imported_modules(path) - {name})
        for name, path in MODULES.items()
        if _tools_unit(name) in TOOLS_APART
        if _imported_modules(path) - {name}
    }
    assert offenders == {}


def test_agents_never_import_the_graph() -> None:
    offenders = {
        name: sorted(i for i in _imports(path) if i.split(".")[0] == "graph")
        for name, path in MODULES.items()
        if name.startswith("agents")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_vocabulary_imports_no_node() -> None:
    for name in VOCABULARY:
        nodes = {i for i in _project_imports(MODULES[name]) if i.startswith(("agents", "graph"))} - VOCABULARY
        assert not nodes, name


def test_no_import_cycle_between_project_files() -> None:
    graph = {name: _project_imports(path) - {name} for name, path in MODULES.items()}
    done: set[str] = set()

    def visit(node: str, trail: list[str]) -> None:
        if node in trail:
            cycle = [*trail[trail.index(node) :], node]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if node in done:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, [*trail, node])
        done.add(node)

    for name in sorted(graph):
        visit(name, [])


def test_no_project_file_is_too_long() -> None:
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_function_is_too_long() -> None:
    """A reader holds a function in mind: none is over :data:`MAX_FUNCTION_LINES` lines, docstring included."""
    long = sorted(
        f"{name}.{node.name}: {n} lines"
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        if (n := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES
    )
    assert not long, "functions to split where a reader loses the thread:\n" + "\n".join(long)


def test_every_module_imports_on_its_own() -> None:
    """Each module imported with no project module loaded before it (third-party ones stay cached)."""
    script = f"""
import importlib, sys, traceback
failed = []
for name in {sorted(MODULES)!r}:
    for loaded in [m for m in sys.modules if m.split(".")[0] in {PACKAGES!r}]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name + ": " + traceback.format_exc().strip().splitlines()[-1])
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


#: String literals outside ``tools/deploy/`` that equal a runtime's name but are not ours: (file, text) -> why.
NOT_OUR_RUNTIME_NAMES = {("tools/profiling/static.py", "pytorch"): "ptflops's own backend argument"}


def test_no_runtime_name_is_typed_outside_the_deploy_package() -> None:
    """Runtimes are described once, in ``tools/deploy/registry.py``: a new runtime is one module and one registry
    line, so no other module may type a deployment's or a runtime's name (they ask the registry)."""
    from tools.deploy.registry import DEPLOYMENTS

    names = set(DEPLOYMENTS) | {described.runtime for described in DEPLOYMENTS.values()}
    typed = sorted(
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
        for name, path in MODULES.items()
        if not name.startswith("tools.deploy")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
        if (str(path.relative_to(ROOT)), node.value) not in NOT_OUR_RUNTIME_NAMES
    )
    assert not typed, "runtime names typed outside tools/deploy/ (ask tools.deploy.registry):\n" + "\n".join(typed)
