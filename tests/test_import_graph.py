"""The product does not depend on its testbed, its benchmarks or the embedded control plane; the shared package
depends on neither side; and no module imports itself back through others.

Imports are read from the source (the AST), so an import inside a function and an `importlib.import_module("x.y")`
with a literal name count as much as a top-level `import`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# package -> top-level packages of this project it must never import
FORBIDDEN: dict[str, set[str]] = {
    "gpudra": {"controlplane", "driver", "controller", "sim", "bench", "cli"},
    "driver": {"controlplane", "controller", "sim", "bench", "cli"},
    "controller": {"controlplane", "driver", "sim", "bench", "cli"},
    # The embedded control plane stands for kube-apiserver: it knows Kubernetes (gpudra), not our components.
    "controlplane": {"driver", "controller", "sim", "bench", "cli"},
    "sim": {"bench", "cli"},
    "bench": {"cli"},
}
PACKAGES = ("gpudra", "controlplane", "driver", "controller", "sim", "bench", "cli", "tools")
# The seams (docs/architecture.md): the NVML backend loader imports the simulator when asked for `sim:...`; the
# controller loads the testbed's scheduler and controller-manager roles when asked for `--embedded`.
ALLOWED: set[tuple[str, str]] = {("driver/nvml.py", "sim.nvml"),
                                 ("controller/commands/controller.py", "sim.roles.embedded.EmbeddedRoles")}


def imported_modules(path: Path, root: Path = REPO) -> list[str]:
    """Every module name `path` imports; `from a import b` gives `a.b` (b may be a module or a name in a)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
            module = _absolute(path, node.module or "", node.level, root)
            names.extend(module if alias.name == "*" else f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and _is_import_call(node.func) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names.append(arg.value)
    return names


def _absolute(path: Path, module: str, level: int, root: Path = REPO) -> str:
    if not level:
        return module
    package = path.relative_to(root).with_suffix("").parts[:-1]
    return ".".join([*package[: len(package) - (level - 1)], *([module] if module else [])])


def _is_import_call(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in ("import_module", "__import__")


def violations(package: str) -> list[str]:
    found = []
    for path in sorted((REPO / package).rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for name in imported_modules(path):
            top = name.split(".")[0]
            if top in FORBIDDEN[package] and (rel, name) not in ALLOWED and f"{rel} imports {name}" not in found:
                found.append(f"{rel} imports {name}")
    return found


def module_graph(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """module -> the project modules it imports, at any depth of its code (functions included). A name that is
    not a module (`from a.b import C`) stands for the module that defines it (`a.b`)."""
    paths = {
        ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
        for package in packages
        for p in (root / package).rglob("*.py")
    }

    def owner(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets = {owner(name) for name in imported_modules(path, root)}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_its_layer_may(package: str) -> None:
    assert violations(package) == []


def test_the_checker_sees_function_level_and_importlib_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import importlib\n"
        "def f():\n"
        "    from sim.nvml import load_simulator\n"
        "    import bench.stats\n"
        "    return importlib.import_module('sim.demo.runner')\n"
    )
    assert imported_modules(source) == ["importlib", "sim.nvml.load_simulator", "bench.stats", "sim.demo.runner"]


def test_the_seam_is_the_only_exception_and_is_still_there() -> None:
    # If the loader stops importing the simulator this way, the exception must go too.
    assert "sim.nvml" in imported_modules(REPO / "driver/nvml.py")
    assert "sim.nvml" in module_graph()["driver.nvml"]


def test_no_module_imports_itself_back_through_others() -> None:
    assert cycles(module_graph()) == []


def test_the_cycle_check_sees_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import B\nclass A: ...\n")
    (tmp_path / "pkg" / "b.py").write_text("class B:\n    def f(self):\n        from pkg import a\n        return a.A\n")
    (tmp_path / "pkg" / "c.py").write_text("from . import a\n")
    graph = module_graph(tmp_path, ("pkg",))
    assert graph["pkg.c"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
