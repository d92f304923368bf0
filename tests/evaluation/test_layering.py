"""The evaluation package's place: tests import from the library, never the other way round.

No module of the library (``tabletune_pipelines/**``), of the Dagster assets or of the benchmark
scripts (``benchmarks/*.py``) imports ``tests`` (read from the source: AST, no import), and no
benchmark script touches ``sys.path``: the scripts import the installed package and nothing else of
the repository.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "tabletune_pipelines").rglob("*.py"), *(ROOT / "assets").rglob("*.py"),
                  *(ROOT / "benchmarks").glob("*.py")])


def imports_of_tests(tree: ast.AST) -> list[str]:
    """Every ``import tests...`` / ``from tests... import`` in ``tree``, and every string naming a
    ``tests.`` module passed to ``importlib.import_module`` / ``__import__``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "tests"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "tests":
                out.append(node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            arg = node.args[0].value
            if name in ("import_module", "__import__") and isinstance(arg, str) and arg.split(".")[0] == "tests":
                out.append(arg)
    return out


def uses_sys_path(tree: ast.AST) -> bool:
    """Whether ``tree`` reads or edits ``sys.path`` at all."""
    return any(isinstance(n, ast.Attribute) and n.attr == "path" and isinstance(n.value, ast.Name)
               and n.value.id == "sys" for n in ast.walk(tree))


def test_the_scan_sees_every_layer():
    names = {p.relative_to(ROOT).as_posix() for p in SOURCES}
    assert {"tabletune_pipelines/evaluation/rig.py", "tabletune_pipelines/controller/logic.py",
            "benchmarks/evaluate.py", "benchmarks/gpu_controller.py"} <= names


@pytest.mark.parametrize("code, found", [
    ("from tests.controller.references import near_best", ["tests.controller.references"]),
    ("import tests.controller._engine as e", ["tests.controller._engine"]),
    ("def f():\n    from tests import x", ["tests"]),
    ("import importlib\nimportlib.import_module('tests.controller.references')", ["tests.controller.references"]),
    ("from testsuite import x\nfrom . import tests\nimport tabletune_pipelines.tests", []),
])
def test_the_scan_finds_an_import_of_tests(code, found):
    assert imports_of_tests(ast.parse(code)) == found


def test_no_library_asset_or_benchmark_module_imports_tests():
    bad = {}
    for p in SOURCES:
        found = imports_of_tests(ast.parse(p.read_text(), filename=str(p)))
        if found:
            bad[p.relative_to(ROOT).as_posix()] = found
    assert bad == {}, f"these import tests/ (move what they need into the package): {bad}"


def test_no_benchmark_script_edits_sys_path():
    bad = [p.name for p in SOURCES if p.parent.name == "benchmarks" and p.parent.parent == ROOT
           and uses_sys_path(ast.parse(p.read_text()))]
    assert bad == [], f"these edit sys.path (the package is installed; import it): {bad}"
