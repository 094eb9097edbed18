"""The product does not depend on its testbed or its benchmarks, and the shared package depends on neither side.

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
    "gpudra": {"driver", "controller", "sim", "bench", "cli"},
    "driver": {"controller", "sim", "bench", "cli"},
    "controller": {"driver", "sim", "bench", "cli"},
    "proto": {"gpudra", "driver", "controller", "sim", "bench", "cli"},
    "sim": {"bench", "cli"},
    "bench": {"cli"},
}
# The one seam (docs/architecture.md): the NVML backend loader imports the simulator when asked for `sim:...`.
ALLOWED: set[tuple[str, str]] = {("driver/nvml.py", "sim.nvml")}


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Call) and _is_import_call(node.func) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names.append(arg.value)
    return names


def _is_import_call(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in ("import_module", "__import__")


def violations(package: str) -> list[str]:
    found = []
    for path in sorted((REPO / package).rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for name in imported_modules(path):
            top = name.split(".")[0]
            if top in FORBIDDEN[package] and (rel, name) not in ALLOWED:
                found.append(f"{rel} imports {name}")
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
    assert imported_modules(source) == ["importlib", "sim.nvml", "bench.stats", "sim.demo.runner"]


def test_the_seam_is_the_only_exception_and_is_still_there() -> None:
    # If the loader stops importing the simulator this way, the exception must go too.
    assert "sim.nvml" in imported_modules(REPO / "driver/nvml.py")
