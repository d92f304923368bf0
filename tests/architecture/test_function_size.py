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

from tests.architecture.scan import REPOSITORY as ROOT, write_tree

MAX_LINES = 60
MAX_PARAMETERS = 8

WATCHED = (  # (file, top-level function)
    ("tabletune_pipelines/engine/profiler.py", "profile_step_times"),
    ("tabletune_pipelines/formats/published.py", "parse_published"),
    ("tabletune_pipelines/formats/live_counters.py", "window_line"),
    ("tabletune_pipelines/tuning/derive.py", "derive_table"),
    ("tabletune_pipelines/core/remeasure.py", "remeasure"),
    ("tabletune_pipelines/core/evidence.py", "search_with_evidence"),
    ("tabletune_pipelines/formats/published_build.py", "published_document"),
    ("tabletune_pipelines/embedded.py", "main"),
)


def function(path: str, name: str, root: Path = ROOT) -> ast.FunctionDef | None:
    """The top-level function ``name`` of the file ``path`` under ``root``; None where it has none."""
    tree = ast.parse((root / path).read_text(), filename=path)
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return found[0] if len(found) == 1 else None


def size(node: ast.FunctionDef) -> tuple[int, int]:
    """(lines, parameters) of a function definition."""
    a = node.args
    params = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return node.end_lineno - node.lineno, params


def function_size_breaches(root: Path, watched: tuple[tuple[str, str], ...] = WATCHED) -> list[str]:
    """Every watched function under ``root`` over ``MAX_LINES`` lines or ``MAX_PARAMETERS`` parameters,
    or no longer where ``watched`` says."""
    bad = []
    for path, name in watched:
        node = function(path, name, root)
        if node is None:
            bad.append(f"{path} has no top-level function {name} (moved? update WATCHED)")
            continue
        lines, params = size(node)
        if lines > MAX_LINES:
            bad.append(f"{path}:{name} is {lines} lines (at most {MAX_LINES}): split it into named steps")
        if params > MAX_PARAMETERS:
            bad.append(f"{path}:{name} takes {params} parameters (at most {MAX_PARAMETERS}): pass the ones that "
                       "travel together as one typed record")
    return bad


def test_watched_functions_stay_short():
    bad = function_size_breaches(ROOT)
    assert bad == [], "\n".join(bad)


def test_the_function_size_check_reports_each_breach(tmp_path):
    long_body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    params = ", ".join(f"p{i}" for i in range(MAX_PARAMETERS + 1))
    write_tree(tmp_path, {"m.py": f"def long():\n{long_body}    return 0\n\ndef wide({params}):\n    return 0\n"
                                  "\ndef fine(a, b):\n    return a\n"})
    assert function_size_breaches(tmp_path, (("m.py", "long"), ("m.py", "wide"), ("m.py", "fine"),
                                             ("m.py", "gone"))) == [
        f"m.py:long is {MAX_LINES + 1} lines (at most {MAX_LINES}): split it into named steps",
        f"m.py:wide takes {MAX_PARAMETERS + 1} parameters (at most {MAX_PARAMETERS}): pass the ones that travel "
        "together as one typed record",
        "m.py has no top-level function gone (moved? update WATCHED)",
    ]


def test_the_main_command_is_named_steps_without_imports_of_its_own():
    """``tabletune run`` (``embedded.main``) reads as its steps: it imports nothing itself."""
    main = function("tabletune_pipelines/embedded.py", "main")
    assert main is not None
    assert [n for n in ast.walk(main) if isinstance(n, ast.Import | ast.ImportFrom)] == []


def test_the_measure_counts_what_it_says():
    node = ast.parse("def f(a, /, b, *c, d, **e):\n    x = 1\n    return x\n").body[0]
    assert size(node) == (2, 5)
