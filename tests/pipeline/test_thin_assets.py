"""Assets are thin: each function decorated with ``dg.asset``, ``dg.op`` or ``dg.multi_asset`` in
the package's ``defs/`` folder (``tabletune_pipelines/defs/``) is at most 20 lines (from ``def`` to its last line, decorators not counted), reading as
"call the library, describe the result"; the logic lives in the library and the description in
``orchestration/metadata.py``. Read from the source (AST), no import."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


def scanned() -> dict[str, list[tuple[str, int]]]:
    return {p.relative_to(ROOT).as_posix(): dagster_functions(p.read_text())
            for p in sorted((ROOT / "tabletune_pipelines" / "defs").rglob("*.py")) if "__pycache__" not in p.parts}


def test_every_asset_and_op_function_is_at_most_20_lines():
    too_long = [f"{path}: {name} has {n} lines"
                for path, found in scanned().items() for name, n in found if n > MAX_LINES]
    assert not too_long, (f"asset/op functions over {MAX_LINES} lines (move the logic into the library and the "
                          f"metadata into orchestration/metadata.py): {too_long}")


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
    helpers = []
    for p in sorted((ROOT / "tabletune_pipelines" / "defs").rglob("*.py")):
        tree = ast.parse(p.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not any(
                    _decorator_name(d) in DECORATORS for d in node.decorator_list):
                helpers.append(f"{p.relative_to(ROOT).as_posix()}: {node.name}")
    assert not helpers, f"functions in tabletune_pipelines/defs/ that are no asset or op: {helpers}"
