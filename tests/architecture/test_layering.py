"""The layers of docs/architecture.md ("Layers"), read from the source (AST, no import).

Every module of the package belongs to a layer, and imports only from the layers below it
(``MAY_IMPORT``): the base words and errors (``vocab``, ``errors``, ``options``, the package's own
``__init__``) under ``core``, under ``formats``, under the controller, the store and the engine,
under ``tuning``, under the CLI, ``evaluation`` and ``orchestration``, under the Dagster
definitions (``defs/``, then ``definitions.py``), under the main command ``embedded.py`` and the
top-level ``assets/`` that re-exports the code location. Nothing of the package imports
``evaluation`` but ``evaluation`` itself, and nothing imports the top-level ``assets``. ``EXCEPTIONS`` lists the few imports that point elsewhere, each with its
reason; those marked "when called" must sit inside a function. Only the Dagster layer imports
``dagster`` when it loads (the CLI's ``run`` checks for it when called). No module imports a private
name (``_x``) of another package of the library. No module of the library, of the Dagster assets or
of the benchmark scripts (``benchmarks/*.py``) imports ``tests``, and no benchmark script touches
``sys.path``: the scripts import the installed package and nothing else of the repository.

Each check is a function of a root folder, run on the checkout and on a small synthetic tree that
breaks the rule (the failing cases below).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.architecture.scan import REPOSITORY, imports_of_file, python_files, write_tree

ROOT = REPOSITORY
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


#: Each layer of the package, by the first part of a module's name under ``tabletune_pipelines``.
LAYERS = {
    "": "base", "vocab": "base", "errors": "base", "options": "base",
    "core": "core", "formats": "formats", "controller": "controller", "store": "store", "engine": "engine",
    "tuning": "tuning", "cli": "cli", "evaluation": "evaluation", "orchestration": "orchestration",
    "defs": "defs", "definitions": "definitions", "embedded": "embedded",
}
_LIBRARY = {"base", "core", "formats", "controller", "store", "engine", "tuning"}
#: What each layer may import (its own layer always); docs/architecture.md, "Layers".
MAY_IMPORT: dict[str, set[str]] = {
    "base": set(),
    "core": {"base"},
    "formats": {"base", "core"},
    "controller": {"base", "core", "formats"},
    "store": {"base", "core", "formats"},
    "engine": {"base", "core", "formats"},
    "tuning": {"base", "core", "formats", "store", "engine"},
    "cli": _LIBRARY,
    "evaluation": _LIBRARY,
    "orchestration": _LIBRARY,
    "defs": _LIBRARY | {"orchestration"},
    "definitions": _LIBRARY | {"orchestration", "defs"},
    "embedded": _LIBRARY | {"orchestration", "defs", "definitions"},
    "assets": {"definitions"},
}
DAGSTER_LAYER = {"orchestration", "defs", "definitions", "embedded", "assets"}
#: (importing module, imported module): (only when called, why).
EXCEPTIONS: dict[tuple[str, str], tuple[bool, str]] = {
    ("tabletune_pipelines.engine.timing_scheduler", "tabletune_pipelines.controller.step"): (
        False, "the profiler's timing scheduler counts drafts the way the controller does (stdlib only)"),
    ("tabletune_pipelines.cli", "tabletune_pipelines.embedded"): (
        True, "`tabletune run` alone runs the Dagster layer; profile, acceptance, table and show run without it"),
    ("tabletune_pipelines.cli", "dagster"): (True, "`tabletune run` names the extra to install when it is missing"),
}


def layer_of(module: str) -> str | None:
    """The layer of a module of the package or of the top-level ``assets``; None for anything else
    (the stdlib, third-party packages)."""
    parts = module.split(".")
    if parts[0] == "assets":
        return "assets"
    if parts[0] != "tabletune_pipelines":
        return None
    return LAYERS.get(parts[1] if len(parts) > 1 else "", "?")


def _excepted(module: str, target: str, at_load: bool, used: set[tuple[str, str]]) -> bool:
    for (importer, imported), (when_called, _) in EXCEPTIONS.items():
        if module == importer and (target == imported or target.startswith(imported + ".")) \
                and not (when_called and at_load):
            used.add((importer, imported))
            return True
    return False


def layer_breaches(root: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """(every import under ``root``'s ``tabletune_pipelines/`` and ``assets/`` that breaks the layers,
    every entry of ``EXCEPTIONS`` that no import uses)."""
    bad: list[str] = []
    used: set[tuple[str, str]] = set()
    files = [*python_files(root / "tabletune_pipelines"), *python_files(root / "assets")]
    for path in files:
        name, found = imports_of_file(path, root)
        layer = layer_of(name)
        if layer == "?":
            bad.append(f"{name} is in no layer (add its folder to LAYERS and MAY_IMPORT)")
            continue
        for imp in found:
            target = imp.module
            if target.split(".")[0] == "tabletune_pipelines" and target == "tabletune_pipelines" and imp.names:
                targets = [f"tabletune_pipelines.{n}" for n in imp.names]  # from tabletune_pipelines import defs
            else:
                targets = [target]
            for t in targets:
                if _excepted(name, t, imp.at_load, used):
                    continue
                if t.split(".")[0] == "dagster" and layer not in DAGSTER_LAYER:
                    bad.append(f"{name} ({layer}) imports dagster: only the Dagster layer does")
                    continue
                other = layer_of(t)
                if other is None or other == layer or other in MAY_IMPORT[layer]:
                    continue
                bad.append(f"{name} ({layer}) imports {t} ({other}); {layer} may import "
                           f"{sorted(MAY_IMPORT[layer]) or 'nothing of the package'}")
    return bad, sorted(set(EXCEPTIONS) - used)


def test_every_layer_has_its_rule():
    folders = {p.name if p.is_dir() else p.stem for p in (ROOT / "tabletune_pipelines").iterdir()
               if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"} - {"__init__"}
    assert folders <= set(LAYERS), f"no layer for {sorted(folders - set(LAYERS))}"
    assert set(LAYERS.values()) | {"assets"} == set(MAY_IMPORT)
    assert {"core", "formats", "engine", "tuning", "store", "controller", "evaluation", "orchestration", "defs",
            "definitions"} <= set(LAYERS.values())


def test_every_import_points_down_the_layers():
    bad, unused = layer_breaches(ROOT)
    assert bad == [], "these import across the layers (docs/architecture.md, Layers):\n" + "\n".join(bad)
    assert unused == [], f"no import needs these any more, delete them from EXCEPTIONS: {unused}"


LAYERED_TREE = {
    "tabletune_pipelines/__init__.py": "",
    "tabletune_pipelines/vocab.py": "",
    "tabletune_pipelines/core/__init__.py": "",
    "tabletune_pipelines/core/table.py": "from tabletune_pipelines import vocab\n",
    "tabletune_pipelines/formats/__init__.py": "",
    "tabletune_pipelines/formats/doc.py": "from ..core import table\n",
    "tabletune_pipelines/engine/__init__.py": "",
    "tabletune_pipelines/engine/timing_scheduler.py": "from tabletune_pipelines.controller.step import count_drafts\n",
    "tabletune_pipelines/controller/__init__.py": "",
    "tabletune_pipelines/controller/step.py": "import numpy\n",
    "tabletune_pipelines/defs/__init__.py": "import dagster as dg\nfrom tabletune_pipelines.formats import doc\n",
    "tabletune_pipelines/cli.py": "def run():\n    import dagster\n    from tabletune_pipelines.embedded import main\n",
    "tabletune_pipelines/orchestration/__init__.py": "",
    "tabletune_pipelines/embedded.py": "import dagster\ndef f():\n    from tabletune_pipelines.definitions import defs\n",
    "tabletune_pipelines/definitions.py": "from tabletune_pipelines import defs\n",
    "assets/definitions.py": "from tabletune_pipelines.definitions import defs\n",
}


def test_a_tree_that_keeps_the_layers_passes(tmp_path):
    assert layer_breaches(write_tree(tmp_path, LAYERED_TREE)) == ([], [])


@pytest.mark.parametrize("path, code, breach", [
    ("tabletune_pipelines/core/x.py", "from tabletune_pipelines.formats import doc\n",
     "tabletune_pipelines.core.x (core) imports tabletune_pipelines.formats (formats)"),
    ("tabletune_pipelines/formats/x.py", "def f():\n    from ..engine import timing_scheduler\n",
     "tabletune_pipelines.formats.x (formats) imports tabletune_pipelines.engine (engine)"),
    ("tabletune_pipelines/store/x.py", "from tabletune_pipelines.tuning import derive\n",
     "tabletune_pipelines.store.x (store) imports tabletune_pipelines.tuning (tuning)"),
    ("tabletune_pipelines/tuning/x.py", "import tabletune_pipelines.evaluation.served\n",
     "tabletune_pipelines.tuning.x (tuning) imports tabletune_pipelines.evaluation.served (evaluation)"),
    ("tabletune_pipelines/controller/x.py", "from tabletune_pipelines.engine import cell\n",
     "tabletune_pipelines.controller.x (controller) imports tabletune_pipelines.engine (engine)"),
    ("tabletune_pipelines/engine/x.py", "from tabletune_pipelines.controller import logic\n",
     "tabletune_pipelines.engine.x (engine) imports tabletune_pipelines.controller (controller)"),
    ("tabletune_pipelines/evaluation/x.py", "from tabletune_pipelines.orchestration import jobs\n",
     "tabletune_pipelines.evaluation.x (evaluation) imports tabletune_pipelines.orchestration (orchestration)"),
    ("tabletune_pipelines/orchestration/x.py", "from tabletune_pipelines.defs import tables\n",
     "tabletune_pipelines.orchestration.x (orchestration) imports tabletune_pipelines.defs (defs)"),
    ("tabletune_pipelines/defs/x.py", "from tabletune_pipelines.evaluation import served\n",
     "tabletune_pipelines.defs.x (defs) imports tabletune_pipelines.evaluation (evaluation)"),
    ("tabletune_pipelines/tuning/x.py", "import dagster\n", "tabletune_pipelines.tuning.x (tuning) imports dagster"),
    ("tabletune_pipelines/orchestration/x.py", "import assets.definitions\n",
     "tabletune_pipelines.orchestration.x (orchestration) imports assets.definitions (assets)"),
    ("tabletune_pipelines/cli.py", "import dagster\n", "tabletune_pipelines.cli (cli) imports dagster"),
    ("tabletune_pipelines/cli.py", "from tabletune_pipelines.embedded import main\n",
     "tabletune_pipelines.cli (cli) imports tabletune_pipelines.embedded (embedded)"),
    ("tabletune_pipelines/definitions.py", "def f():\n    from tabletune_pipelines import embedded\n",
     "tabletune_pipelines.definitions (definitions) imports tabletune_pipelines.embedded (embedded)"),
    ("tabletune_pipelines/newlayer/x.py", "", "tabletune_pipelines.newlayer.x is in no layer"),
])
def test_the_layer_check_reports_an_import_that_breaks_the_layers(tmp_path, path, code, breach):
    """Each layer's rule can fail: one import that breaks it, added to a tree that keeps them all."""
    bad, _ = layer_breaches(write_tree(tmp_path, {**LAYERED_TREE, path: code}))
    assert len(bad) == 1 and bad[0].startswith(breach), bad


def test_an_exception_no_import_uses_is_reported(tmp_path):
    tree = {**LAYERED_TREE, "tabletune_pipelines/engine/timing_scheduler.py": "import json\n"}
    assert layer_breaches(write_tree(tmp_path, tree)) == (
        [], [("tabletune_pipelines.engine.timing_scheduler", "tabletune_pipelines.controller.step")])


# -- private names and tests/ ------------------------------------------------------------------

def private_imports(root: Path) -> dict[str, list[str]]:
    """module -> the private names (``_x``) it imports from another package of the library under ``root``."""
    bad: dict[str, list[str]] = {}
    for p in python_files(root / "tabletune_pipelines"):
        name, found = imports_of_file(p, root)
        for imp in found:
            if imp.module.split(".")[:2] == name.split(".")[:2] or not imp.module.startswith("tabletune_pipelines."):
                continue
            private = [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
            if private:
                bad.setdefault(name, []).extend(f"{imp.module}.{n}" for n in private)
    return bad


def test_no_module_imports_a_private_name_of_another_package():
    bad = private_imports(ROOT)
    assert bad == {}, f"these import private names across packages (make them public, named parts): {bad}"


def test_the_private_name_check_reports_one(tmp_path):
    write_tree(tmp_path, {"tabletune_pipelines/core/a.py": "_x = 1\n",
                          "tabletune_pipelines/core/b.py": "from tabletune_pipelines.core.a import _x\n",
                          "tabletune_pipelines/tuning/c.py": "from tabletune_pipelines.core.a import _x, __all__\n"})
    assert private_imports(tmp_path) == {"tabletune_pipelines.tuning.c": ["tabletune_pipelines.core.a._x"]}


def test_the_tests_import_check_reports_one_in_a_tree(tmp_path):
    write_tree(tmp_path, {"benchmarks/b.py": "import sys\nsys.path.insert(0, '.')\nfrom tests.tuning import runs\n"})
    p = tmp_path / "benchmarks" / "b.py"
    assert imports_of_tests(ast.parse(p.read_text())) == ["tests.tuning"]
    assert uses_sys_path(ast.parse(p.read_text()))
