"""One error hierarchy on one page (``tabletune_pipelines/errors.py``).

Read from the source (AST, no import) of the library and the Dagster layer (``assets/``):

* product code raises the hierarchy's errors, never a bare ``ValueError``, ``RuntimeError``,
  ``TypeError`` or ``KeyError`` (``RAISE_ALLOWED`` names the few that stay, and why);
* every class in ``errors.py`` descends from ``TableTuneError``, and ``errors.py`` imports nothing
  but the standard library (the controller, a vLLM plugin, imports it);
* classes that callers written before the hierarchy catch as ``ValueError`` still are one.

That no exception class is defined outside ``errors.py`` is a one-home detector in
``tests/architecture/test_one_home.py`` ("exception classes").
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import tabletune_pipelines.errors as errors
from tests.architecture.test_one_home import trees as scanned_trees

ROOT = Path(__file__).resolve().parents[2]

PRODUCT = ("tabletune_pipelines", "assets")
BARE = frozenset({"ValueError", "RuntimeError", "TypeError", "KeyError"})
"""Built-in exceptions product code may not raise itself: a user would get a traceback, not ``error: ...``."""

RAISE_ALLOWED: dict[tuple[str, str, str], str] = {
    # (file, enclosing function, exception): why it stays
    ("tabletune_pipelines/tuning/report.py", "write_plot", "ValueError"):
        "a caller's bug (bytes that are not goodput_plot's PNG), never an input; no user can cause it",
    ("tabletune_pipelines/evaluation/baselines.py", "PolicyController.next_lookup", "ValueError"):
        "a baseline policy's bug (a lookup of the wrong length), caught on the next line and recorded "
        "as policy_failed; it never leaves the controller",
}

#: Classes that subclassed ValueError before they moved into errors.py (``except ValueError`` callers).
STILL_VALUE_ERRORS = ("SurfaceError", "InvalidCommand", "EngineConfigError", "ModelNotFoundError",
                      "VocabMismatchError", "PortInUseError", "VLLMNotInstalledError", "LiveCountersError",
                      "PublishedTableError", "SettingsError")


def trees() -> dict[str, ast.Module]:
    """The product's parsed modules: ``test_one_home``'s parse of the scanned tree, benchmarks left out."""
    return {path: tree for path, tree in scanned_trees().items() if path.split("/")[0] in PRODUCT}


def bare_raises(tree: ast.Module) -> set[tuple[str, str]]:
    """(enclosing function or class path, exception name) of every ``raise`` of a name in ``BARE``."""
    found = set()

    def visit(node: ast.AST, where: tuple[str, ...]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            where = (*where, node.name)
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in BARE:
                found.add((".".join(where) or "<module>", exc.id))
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    visit(tree, ())
    return found


def test_product_code_raises_no_bare_builtin_errors():
    found = {(path, where, name) for path, tree in trees().items() for where, name in bare_raises(tree)}
    unexpected = found - set(RAISE_ALLOWED)
    assert not unexpected, ("raise the fitting class of tabletune_pipelines/errors.py (message unchanged), or "
                            f"allow it here with a reason: {sorted(unexpected)}")
    gone = set(RAISE_ALLOWED) - found
    assert not gone, f"gone, delete from RAISE_ALLOWED: {sorted(gone)}"


def test_every_class_in_errors_py_descends_from_tabletune_error():
    classes = [v for v in vars(errors).values() if isinstance(v, type) and v.__module__ == errors.__name__]
    assert len(classes) > 30
    assert [c.__name__ for c in classes if not issubclass(c, errors.TableTuneError)] == []


def test_errors_py_is_stdlib_only_and_holds_only_error_classes():
    tree = ast.parse((ROOT / "tabletune_pipelines" / "errors.py").read_text())
    imported = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    others = [ast.unparse(n)[:60] for n in tree.body[1:]
              if not isinstance(n, ast.ClassDef | ast.Import | ast.ImportFrom)]
    assert others == []


def test_classes_that_were_value_errors_still_are():
    assert [n for n in STILL_VALUE_ERRORS if not issubclass(getattr(errors, n), ValueError)] == []


def test_the_raise_finder_sees_bare_raises():
    code = ("def f(x):\n    if x:\n        raise ValueError(f'x = {x}')\n    raise KeyError\n"
            "class C:\n    def g(self):\n        raise RuntimeError('no')\n"
            "def h():\n    try:\n        pass\n    except OSError:\n        raise\n")
    assert bare_raises(ast.parse(code)) == {("f", "ValueError"), ("f", "KeyError"), ("C.g", "RuntimeError")}
