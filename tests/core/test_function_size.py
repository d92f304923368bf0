"""Long functions that mixed several jobs were split into named steps; they must not grow back.

Each function below reads as a short sequence of named steps (``profile_step_times`` dispatches to
one function per launch strategy, ``parse_published`` calls one parser per section) and takes its
parameters that travel together as one typed record. Measured from the source with ``ast`` (no
import): lines are ``end_lineno - lineno`` of the ``def`` (signature and docstring included),
parameters are every positional, keyword-only, ``*args`` and ``**kwargs`` parameter.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 60
MAX_PARAMETERS = 8

WATCHED = (  # (file, top-level function)
    ("tabletune_pipelines/engine/profiler.py", "profile_step_times"),
    ("tabletune_pipelines/formats/published.py", "parse_published"),
    ("tabletune_pipelines/formats/live_counters.py", "window_line"),
    ("tabletune_pipelines/tuning/derive.py", "derive_table"),
    ("tabletune_pipelines/core/remeasure.py", "remeasure"),
    ("tabletune_pipelines/core/evidence.py", "search_with_evidence"),
    ("tabletune_pipelines/formats/published.py", "published_document"),
    ("tabletune_pipelines/embedded.py", "main"),
)


def function(path: str, name: str) -> ast.FunctionDef:
    tree = ast.parse((ROOT / path).read_text(), filename=path)
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(found) == 1, f"{path} has no top-level function {name} (moved? update WATCHED)"
    return found[0]


def size(node: ast.FunctionDef) -> tuple[int, int]:
    """(lines, parameters) of a function definition."""
    a = node.args
    params = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return node.end_lineno - node.lineno, params


@pytest.mark.parametrize(("path", "name"), WATCHED)
def test_function_stays_short(path, name):
    lines, params = size(function(path, name))
    assert lines <= MAX_LINES, f"{path}:{name} is {lines} lines (at most {MAX_LINES}): split it into named steps"
    assert params <= MAX_PARAMETERS, (f"{path}:{name} takes {params} parameters (at most {MAX_PARAMETERS}): pass "
                                      "the ones that travel together as one typed record")


def test_the_main_command_is_named_steps_without_imports_of_its_own():
    """``tabletune run`` (``embedded.main``) reads as its steps: it imports nothing itself."""
    main = function("tabletune_pipelines/embedded.py", "main")
    assert [n for n in ast.walk(main) if isinstance(n, ast.Import | ast.ImportFrom)] == []


def test_the_measure_counts_what_it_says():
    node = ast.parse("def f(a, /, b, *c, d, **e):\n    x = 1\n    return x\n").body[0]
    assert size(node) == (2, 5)
