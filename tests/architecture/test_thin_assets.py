"""Assets are thin: each function decorated with ``dg.asset``, ``dg.op`` or ``dg.multi_asset`` in
the package's ``defs/`` folder (``tabletune_pipelines/defs/``) is at most 20 lines (from ``def`` to its last line, decorators not counted), reading as
"call the library, describe the result"; the logic lives in the library and the description in
``orchestration/metadata.py``. Read from the source (AST), no import."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.architecture.scan import REPOSITORY as ROOT, python_files, write_tree

MAX_LINES = 20
DECORATORS = {"asset", "op", "multi_asset"}
"""Dagster decorators whose functions must be thin (``@dg.asset``, ``@dg.asset(...)``, ``@asset`` ...)."""


def _decorator_name(node: ast.expr) -> str | None:
    """``dg.asset`` / ``dg.asset(...)`` / ``asset(...)`` / ``dagster.op`` → its last name."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def dagster_functions(source: str) -> list[tuple[str, int]]:
    """(name, lines from ``def`` to the end) of every function decorated with a Dagster asset/op decorator."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                _decorator_name(d) in DECORATORS for d in node.decorator_list):
            out.append((node.name, node.end_lineno - node.lineno + 1))
    return out


def scanned(root: Path = ROOT) -> dict[str, list[tuple[str, int]]]:
    """file -> (name, lines) of its asset and op functions, for every file of ``root``'s ``defs/`` folder."""
    return {p.relative_to(root).as_posix(): dagster_functions(p.read_text())
            for p in python_files(root / "tabletune_pipelines" / "defs")}


def too_long(root: Path) -> list[str]:
    """Every asset or op function of ``root``'s ``defs/`` folder over ``MAX_LINES`` lines."""
    return [f"{path}: {name} has {n} lines" for path, found in scanned(root).items() for name, n in found
            if n > MAX_LINES]


def helpers(root: Path) -> list[str]:
    """Every top-level function of ``root``'s ``defs/`` folder that is no asset or op."""
    out = []
    for p in python_files(root / "tabletune_pipelines" / "defs"):
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not any(
                    _decorator_name(d) in DECORATORS for d in node.decorator_list):
                out.append(f"{p.relative_to(root).as_posix()}: {node.name}")
    return out


def test_every_asset_and_op_function_is_at_most_20_lines():
    too_long_now = too_long(ROOT)
    assert not too_long_now, (f"asset/op functions over {MAX_LINES} lines (move the logic into the library and the "
                          f"metadata into orchestration/metadata.py): {too_long_now}")


def test_the_scan_sees_every_asset_and_op():
    """Not a blind check: the scan finds the pipeline's assets and the rollback op."""
    names = {name for found in scanned().values() for name, _ in found}
    assert {"acceptance_prior", "live_acceptance_counters", "step_time_profile", "draft_length_table",
            "published_table", "rollback_published_table_op"} <= names


def test_the_scan_flags_a_long_function_under_each_decorator_form():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))  # 20 lines of body + def = 21
    for decorator in ("@dg.asset", "@dg.asset(group_name='g')", "@dg.op(tags={})", "@dg.multi_asset(specs=[])",
                      "@asset", "@dagster.op"):
        found = dagster_functions(f"{decorator}\ndef f(context):\n{body}\n")
        assert found == [("f", MAX_LINES + 1)], decorator
    assert dagster_functions(f"@dg.asset_check(asset='a')\ndef f():\n{body}\n") == []
    assert dagster_functions(f"def helper():\n{body}\n") == []


def test_assets_hold_no_helper_functions():
    """A helper beside an asset would only move its logic out of the count: library functions live
    in the library, metadata builders in orchestration/metadata.py."""
    found = helpers(ROOT)
    assert not found, f"functions in tabletune_pipelines/defs/ that are no asset or op: {found}"


def test_the_thin_asset_checks_report_a_long_asset_and_a_helper(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    write_tree(tmp_path, {"tabletune_pipelines/defs/tables.py": (
        f"import dagster as dg\n\n@dg.asset\ndef table(context):\n{body}\n\n"
        "@dg.asset\ndef thin(context):\n    return 1\n\ndef helper():\n    return 2\n")})
    assert too_long(tmp_path) == [f"tabletune_pipelines/defs/tables.py: table has {MAX_LINES + 1} lines"]
    assert helpers(tmp_path) == ["tabletune_pipelines/defs/tables.py: helper"]
