"""``core.table.DraftTable`` is the one home of the draft-length table's shape.

Only ``core/table.py``, the file formats (``formats/``), the store (``store/``) and the one vLLM
adapter (``controller/scheduler.py``) know the wire shape, lists of ``[start, end, k]`` entries.
Everywhere else a table is a ``DraftTable``: its validator (``from_entries``), its dense lookup
(``dense``, ``vllm_lookup``), its compaction (``from_dense``), its lookups (``k_at``) and its
``diff``. Reads the source (AST, no import) of the library, the Dagster layer and the benchmarks.
"""

from __future__ import annotations

import ast

from tests.architecture.test_one_home import _walk, copies

HOMES = ("tabletune_pipelines/core/table.py", "tabletune_pipelines/formats/", "tabletune_pipelines/store/",
         "tabletune_pipelines/controller/scheduler.py")
RETIRED = {  # the free functions the table's shape lived in before it was a type: what replaces each
    "validate_vllm_schedule": "DraftTable.from_entries",
    "validate_table": "DraftTable.from_entries(..., max_num_seqs=, max_k=)",
    "expand_table": "DraftTable.from_entries(...).dense / vllm_lookup",
    "dense_from_ranges": "DraftTable.dense",
    "compact_ranges": "DraftTable.from_dense",
    "allowed_ks_from_table": "DraftTable.allowed_ks",
}


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value == 0


def lookup_by_hand(node: ast.AST, stack: list[ast.AST]) -> bool:
    """vLLM's lookup layout built by hand: ``[0, *dense]`` or ``[0] + [k] * n`` (index 0 unused, k
    integers; a float row such as ``[0.0, *row]`` is step times, not a lookup)."""
    if isinstance(node, ast.List) and len(node.elts) == 2:
        return _is_zero(node.elts[0]) and isinstance(node.elts[1], ast.Starred)
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.left, ast.List)
            and len(node.left.elts) == 1 and _is_zero(node.left.elts[0])
            and isinstance(node.right, ast.BinOp) and isinstance(node.right.op, ast.Mult))


def retired_table_function(node: ast.AST, stack: list[ast.AST]) -> bool:
    """A name, attribute, import or definition of one of ``RETIRED``."""
    if isinstance(node, ast.Name):
        return node.id in RETIRED
    if isinstance(node, ast.Attribute):
        return node.attr in RETIRED
    if isinstance(node, ast.alias):
        return node.name in RETIRED or (node.asname or "") in RETIRED
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return node.name in RETIRED
    return False


def _outside(found: set[tuple[str, str]]) -> list[tuple[str, str]]:
    return sorted(c for c in found if not c[0].startswith(HOMES))


def test_no_module_builds_vllms_lookup_by_hand():
    found = _outside(copies(lookup_by_hand))
    assert found == [], f"vLLM's lookup built outside DraftTable.vllm_lookup: {found}"


def test_the_retired_table_functions_stay_retired():
    found = sorted(copies(retired_table_function))
    assert found == [], f"use DraftTable ({RETIRED}): {found}"


def test_the_rule_fails_on_the_copies_it_replaced():
    """Both finders flag the code this type replaced (so an empty result means no copy, not a blind check)."""
    timing_scheduler = ("def build_lookup(table, n, k):\n"
                        "    from tabletune_pipelines.core.table import expand_table\n"
                        "    return [0, *expand_table(table, n, k)]\n")
    controller_search = "def vllm_lookup(dense):\n    return [0, *np.asarray(dense).tolist()]\n"
    baseline = "class P:\n    def reset(self):\n        self._lookup = [0] + [self.ks[-1]] * self.n\n"
    for code in (timing_scheduler, controller_search, baseline):
        assert any(lookup_by_hand(n, s) for n, s in _walk(ast.parse(code), [])), code
    gates = "from tabletune_pipelines.core.table import validate_table\nvalidate_table(r, 8, 3)\n"
    run_report = "def f(t, n):\n    return tbl.dense_from_ranges(t, n).tolist()\n"
    for code in (timing_scheduler, gates, run_report):
        assert any(retired_table_function(n, s) for n, s in _walk(ast.parse(code), [])), code
    # What stays allowed: a list that starts with 0 and has more items, and the type's own calls.
    fine = ("x = [0, 1, 2]\ny = [0, *a, *b]\ntp = [0.0, *row]\ncols = [0] + [i for i in c]\n"
            "lookup = t.vllm_lookup(n, k)\nks = t.dense(n)\n")
    assert not any(f(n, s) for f in (lookup_by_hand, retired_table_function) for n, s in _walk(ast.parse(fine), []))


def test_the_homes_are_where_the_layout_lives():
    """The one place that writes vLLM's layout is ``core.table.vllm_layout``."""
    assert copies(lookup_by_hand) == {("tabletune_pipelines/core/table.py", "vllm_layout")}
