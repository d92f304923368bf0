"""The evaluation package's place: tests import from the library, never the other way round, and
the evaluation package and the Dagster layer sit on top of the import graph.

No module under ``tuning/``, ``store/``, ``controller/`` or ``orchestration/`` imports
``tabletune_pipelines.evaluation`` (publishing never depends on the measuring harness), no module of
the package imports the top-level ``assets`` (the Dagster definitions import the package, not the
other way round), and no module imports a private name (``_x``) of another package of the library.
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


def imported_modules(tree: ast.AST, module: str) -> list[tuple[str, list[str]]]:
    """Every module ``tree`` (the module named ``module``) imports, anywhere in it (a function-level
    import counts), relative imports resolved, each with the names taken from it."""
    package = module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            out.append((base, [a.name for a in node.names]))
    return out


def module_name(p: Path) -> str:
    rel = p.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


LOWER = ("tuning", "store", "controller", "orchestration")
PACKAGE = sorted((ROOT / "tabletune_pipelines").rglob("*.py"))


@pytest.mark.parametrize("code, module, found", [
    ("from tabletune_pipelines.evaluation.served import x", "tabletune_pipelines.tuning.a",
     [("tabletune_pipelines.evaluation.served", ["x"])]),
    ("def f():\n    from ..evaluation import served", "tabletune_pipelines.tuning.a",
     [("tabletune_pipelines.evaluation", ["served"])]),
    ("import assets.publishing", "tabletune_pipelines.orchestration.jobs", [("assets.publishing", [])]),
])
def test_the_scan_finds_every_import(code, module, found):
    assert imported_modules(ast.parse(code), module) == found


def upward_imports() -> dict[str, list[str]]:
    """module -> what it imports from above its layer: ``evaluation`` from a lower layer, ``assets``
    from anywhere in the package."""
    bad: dict[str, list[str]] = {}
    for p in PACKAGE:
        name = module_name(p)
        layer = name.split(".")[1] if name.count(".") else ""
        for mod, _ in imported_modules(ast.parse(p.read_text(), filename=str(p)), name):
            top = mod.split(".")
            if (layer in LOWER and top[:2] == ["tabletune_pipelines", "evaluation"]) or top[0] == "assets":
                bad.setdefault(name, []).append(mod)
    return bad


def test_no_lower_layer_imports_evaluation_and_the_package_never_imports_assets():
    assert upward_imports() == {}, "these import up (evaluation or the Dagster definitions in assets/)"


def test_no_module_imports_a_private_name_of_another_package():
    bad = {}
    for p in PACKAGE:
        name = module_name(p)
        for mod, names in imported_modules(ast.parse(p.read_text(), filename=str(p)), name):
            if mod.split(".")[:2] == name.split(".")[:2] or not mod.startswith("tabletune_pipelines."):
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private:
                bad.setdefault(name, []).extend(f"{mod}.{n}" for n in private)
    assert bad == {}, f"these import private names across packages (make them public, named parts): {bad}"
