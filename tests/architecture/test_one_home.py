"""One concept, one home: a second copy of a named concept, in the shape such copies take, fails here.

Every check reads the source (AST, no import) of the library (``tabletune_pipelines``), the Dagster
layer (``assets``) and the benchmark scripts; tests may keep reference implementations. ``KNOWN``
lists the copies still left in files being reworked elsewhere: each must still be there, so the list
can only shrink (delete its entry when the copy goes).

    concept                                  home
    validating a table's ranges              core.table.DraftTable.from_entries
    ranges -> k per batch size (expanding)   core.table.DraftTable.dense / vllm_lookup
    k per batch size -> ranges (compacting)  core.table.DraftTable.from_dense
    counts -> monotone acceptance rates      core.acceptance_estimate.rates_from_counts / monotone_rates
    reading GET /version                     engine.client.version_from_answer
    comparing vLLM versions of identities    identity_match.identity_mismatches
    the batch-size grid                      core.steptime.batch_size_grid
    which prior builds a table               tuning.gates.prior_for_table
    options from a mapping                   options.options_from_mapping
    a measurement's launch overrides         engine.plan.LaunchOverrides
    the gate thresholds and their defaults   tuning.gates.GateThresholds
    building an engine identity              engine.identity.engine_identity / deployment_identity
    writing a whole file atomically          formats.strict_io.atomic_write_bytes / atomic_write_text
                                             (it refuses a symbolic link at the path)
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import pytest

from tests.architecture.scan import REPOSITORY as ROOT, write_tree

SCANNED = ("tabletune_pipelines", "assets", "benchmarks")

Finder = Callable[[ast.AST, list[ast.AST]], bool]
"""(node, its enclosing nodes, outermost first) -> whether the node is a copy of the concept."""


@cache
def trees(dirs: tuple[str, ...] = SCANNED, root: Path = ROOT) -> dict[str, ast.Module]:
    """file (relative to ``root``) -> its parsed source, for every ``.py`` file under ``dirs``."""
    out = {}
    for d in dirs:
        for p in sorted((root / d).rglob("*.py")):
            if "__pycache__" not in p.parts:
                out[p.relative_to(root).as_posix()] = ast.parse(p.read_text(), filename=str(p))
    return out


def _walk(node: ast.AST, stack: list[ast.AST]) -> Iterator[tuple[ast.AST, list[ast.AST]]]:
    yield node, stack
    for child in ast.iter_child_nodes(node):
        yield from _walk(child, [*stack, node])


def _where(stack: list[ast.AST]) -> str:
    names = [n.name for n in stack if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    return ".".join(names) or "<module>"


def copies(finder: Finder, dirs: tuple[str, ...] = SCANNED, root: Path = ROOT) -> set[tuple[str, str]]:
    """(file, enclosing class/function) of every node ``finder`` flags in the files under ``dirs``."""
    found = set()
    for path, tree in trees(dirs, root).items():
        docstrings = {id(n.body[0].value) for n, _ in _walk(tree, [])
                      if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node, stack in _walk(tree, []):
            if id(node) not in docstrings and finder(node, stack):
                found.add((path, _where(stack)))
    return found


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


# -- the shapes of a copy ------------------------------------------------------------------------

def range_expander(node: ast.AST, stack: list[ast.AST]) -> bool:
    """``for s, e, k in ranges:`` whose body walks ``range(s, e + 1)`` or assigns ``out[s - 1:e]``."""
    if not (isinstance(node, ast.For) and isinstance(node.target, ast.Tuple) and len(node.target.elts) == 3
            and all(isinstance(e, ast.Name) for e in node.target.elts)):
        return False
    bounds = {node.target.elts[0].id, node.target.elts[1].id}
    for inner in ast.walk(ast.Module(body=node.body, type_ignores=[])):
        if (isinstance(inner, ast.For) and isinstance(inner.iter, ast.Call) and isinstance(inner.iter.func, ast.Name)
                and inner.iter.func.id == "range" and _names(inner.iter) & bounds):
            return True
        if isinstance(inner, ast.Assign | ast.AugAssign):
            targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
            for t in targets:
                if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Slice) and _names(t.slice) & bounds:
                    return True
    return False


def _last_range_k(node: ast.AST) -> bool:
    """``x[-1][2]``: the k of the last range built so far."""
    return (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == 2
            and isinstance(node.value, ast.Subscript) and isinstance(node.value.slice, ast.UnaryOp)
            and isinstance(node.value.slice.operand, ast.Constant) and node.value.slice.operand.value == 1)


def range_compactor(node: ast.AST, stack: list[ast.AST]) -> bool:
    """``if out and out[-1][2] == k`` with k a variable: merging equal neighbours into ranges."""
    return (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq | ast.NotEq)
            and any(_last_range_k(side) for side in (node.left, node.comparators[0]))
            and any(not isinstance(side, ast.Constant) and not _last_range_k(side)
                    for side in (node.left, node.comparators[0])))


TABLE_RULE = re.compile(r"gap between ranges|ranges? .{0,60}overlap|must start at 1|must end at max_num_seqs")


def _text(node: ast.AST, stack: list[ast.AST]) -> str | None:
    """A string literal's text (an f-string's with ``{}`` for each field); None for other nodes and
    for the parts of an f-string (its whole text is read once)."""
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and not (stack and isinstance(
            stack[-1], ast.JoinedStr)):
        return node.value
    return None


def table_validator(node: ast.AST, stack: list[ast.AST]) -> bool:
    """A message of the table rules (gaps, overlaps, coverage of 1..max_num_seqs) in a ``raise``."""
    text = _text(node, stack)
    return text is not None and bool(TABLE_RULE.search(text)) and any(isinstance(s, ast.Raise) for s in stack)


def monotone_rates(node: ast.AST, stack: list[ast.AST]) -> bool:
    """``np.minimum.accumulate``: survival rates made non-increasing by hand."""
    return (isinstance(node, ast.Attribute) and node.attr == "accumulate" and isinstance(node.value, ast.Attribute)
            and node.value.attr == "minimum")


def version_reader(node: ast.AST, stack: list[ast.AST]) -> bool:
    """A ``.../version`` URL built outside the client."""
    text = _text(node, stack)
    return text is not None and text.endswith("/version") and " " not in text


def _is_vllm_version(node: ast.AST) -> bool:
    return ((isinstance(node, ast.Attribute) and node.attr == "vllm_version")
            or (isinstance(node, ast.Name) and node.id == "vllm_version")
            or (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                and node.slice.value == "vllm_version"))


def version_comparison(node: ast.AST, stack: list[ast.AST]) -> bool:
    """``a.vllm_version == b`` / ``!=``: a version rule of its own."""
    return (isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops)
            and any(_is_vllm_version(side) for side in (node.left, *node.comparators)))


def batch_size_grid(node: ast.AST, stack: list[ast.AST]) -> bool:
    """A function that makes a batch-size grid of its own (``*_grid``)."""
    return isinstance(node, ast.FunctionDef) and node.name.endswith("_grid")


def _every_batch_size(e: ast.AST | None) -> bool:
    return (isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "arange" and bool(e.args)
            and isinstance(e.args[0], ast.Constant) and e.args[0].value == 1)


def dense_step_times(node: ast.AST, stack: list[ast.AST]) -> bool:
    """``np.interp`` onto ``np.arange(1, n + 1)``, directly or through a name the enclosing function
    assigns it: measured step times turned into step times for every batch size by hand."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "interp"
            and node.args):
        return False
    x = node.args[0]
    if _every_batch_size(x):
        return True
    scope = next((s for s in reversed(stack) if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)), None)
    return isinstance(x, ast.Name) and scope is not None and any(
        isinstance(a, ast.Assign) and _every_batch_size(a.value)
        and any(isinstance(t, ast.Name) and t.id == x.id for t in a.targets) for a in ast.walk(scope))


PRIOR_PICKERS = {"applicable_priors", "latest_acceptance_prior", "first_sane_prior"}


def prior_picker(node: ast.AST, stack: list[ast.AST]) -> bool:
    """The asset or the CLI choosing a table's prior from the store by a rule of its own."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)) in PRIOR_PICKERS


def _raises_text(node: ast.AST, word: str) -> bool:
    """A ``raise`` inside ``node`` whose message has ``word`` in it."""
    for inner, _ in _walk(node, []):
        if isinstance(inner, ast.Raise) and inner.exc is not None:
            if any(word in (_text(n, st) or "") for n, st in _walk(inner.exc, [])):
                return True
    return False


def _calls(node: ast.AST, names: set[str]) -> bool:
    """A call inside ``node`` of a function or method named one of ``names``."""
    return any(isinstance(n, ast.Call) and (n.func.attr if isinstance(n.func, ast.Attribute)
                                             else getattr(n.func, "id", None)) in names for n in ast.walk(node))


def mapping_reader(node: ast.AST, stack: list[ast.AST]) -> bool:
    """A function that reads a dataclass's ``fields`` and raises on an ``unknown`` key itself (a
    ``from_mapping`` that does not call ``options_from_mapping``)."""
    return (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _calls(node, {"fields", "field_names"})
            and _raises_text(node, "unknown"))


LAUNCH_OVERRIDES = {"startup_timeout", "kv_cache_space_gib", "max_model_len"}


def launch_overrides(node: ast.AST, stack: list[ast.AST]) -> bool:
    """A class declaring two or more of the launch overrides with default None (an options class
    that does not build on ``LaunchOverrides``), or a literal listing all three (a ``server_overrides``
    of its own)."""
    if isinstance(node, ast.ClassDef):
        declared = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                    and isinstance(s.value, ast.Constant) and s.value.value is None}
        return len(declared & LAUNCH_OVERRIDES) >= 2
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return LAUNCH_OVERRIDES <= {e.value for e in node.elts if isinstance(e, ast.Constant)}
    return False


GATE_THRESHOLDS = {"max_predicted_loss", "min_prior_drafts", "trap_margin", "k0_margin"}


def _number(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def gate_threshold(node: ast.AST, stack: list[ast.AST]) -> bool:
    """A class field named like a gate threshold with a number of its own as default (``= 0.03`` or
    ``Field(default=0.03)``), not ``GateThresholds``'."""
    if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            and node.target.id in GATE_THRESHOLDS and stack and isinstance(stack[-1], ast.ClassDef)):
        return False
    v = node.value
    return _number(v) or (isinstance(v, ast.Call) and any(k.arg == "default" and _number(k.value) for k in v.keywords))


def identity_builder(node: ast.AST, stack: list[ast.AST]) -> bool:
    """``EngineIdentity(...)``: an engine identity built field by field outside ``engine.identity``
    (loading a stored one, ``EngineIdentity.from_dict``/``from_json``, is no copy)."""
    return isinstance(node, ast.Call) and (node.func.attr if isinstance(node.func, ast.Attribute)
                                           else getattr(node.func, "id", None)) == "EngineIdentity"


def atomic_writer(node: ast.AST, stack: list[ast.AST]) -> bool:
    """``os.replace(tmp, path)`` / ``os.rename(...)`` or ``tmp.replace(path)`` (a ``Path``'s, one
    argument): a temp file renamed over its target, an atomic writer of its own."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("replace", "rename") and not node.keywords):
        return False
    if isinstance(node.func.value, ast.Name) and node.func.value.id == "os":
        return True
    return len(node.args) == 1 and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "dataclasses")


CONCEPTS: dict[str, tuple[Finder, set[str], set[tuple[str, str]]]] = {
    # concept: (finder, files allowed to hold it, known copies left elsewhere)
    "range expansion": (range_expander, {"tabletune_pipelines/core/table.py"}, set()),
    "range compaction": (range_compactor, {"tabletune_pipelines/core/table.py"}, set()),
    "table validation": (table_validator, {"tabletune_pipelines/core/table.py"}, set()),
    "monotone rates": (monotone_rates, {"tabletune_pipelines/core/acceptance_estimate.py"}, set()),
    "reading /version": (version_reader, {"tabletune_pipelines/engine/client.py"}, set()),
    "vLLM version comparison": (version_comparison, {"tabletune_pipelines/formats/identity_match.py"}, set()),
    "batch-size grid": (batch_size_grid, {"tabletune_pipelines/core/steptime.py"}, set()),
    "profile to step times for every batch size": (dense_step_times, {"tabletune_pipelines/core/steptime.py"}, {
        # Not a profile: the served offsets (served minus priced time per step) and their variances.
        ("tabletune_pipelines/core/served_calibration.py", "ServedCalibration.offsets"),
    }),
    "options from a mapping": (mapping_reader, {"tabletune_pipelines/options.py"}, set()),
    "launch overrides": (launch_overrides, {"tabletune_pipelines/engine/plan.py"}, set()),
    "gate thresholds": (gate_threshold, {"tabletune_pipelines/tuning/gates.py"}, set()),
    "engine identity": (identity_builder, {"tabletune_pipelines/engine/identity.py"}, set()),
    "atomic file writer": (atomic_writer, {"tabletune_pipelines/formats/strict_io.py"}, {
        # The model folders built beside their final place (a folder swap plus its marker file): a
        # folder, which the file writer does not replace.
        ("tabletune_pipelines/engine/real_model.py", "ensure_real_model"),
        ("tabletune_pipelines/engine/tiny_models.py", "ensure_tiny_models"),
    }),
}


def concept_breaches(concept: str, root: Path = ROOT) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(copies of ``concept`` under ``root`` outside its homes and not known, known copies that are gone)."""
    finder, homes, known = CONCEPTS[concept]
    found = {c for c in copies(finder, root=root) if c[0] not in homes}
    return found - known, known - found


@pytest.mark.parametrize("concept", list(CONCEPTS))
def test_one_home_per_concept(concept):
    homes = CONCEPTS[concept][1]
    second, gone = concept_breaches(concept)
    assert second == set(), f"a second {concept} (its home: {', '.join(sorted(homes))}): {sorted(second)}"
    assert gone == set(), f"gone, delete from KNOWN: {sorted(gone)}"


def test_the_one_home_check_reports_a_second_copy_in_a_tree(tmp_path):
    expander = ("def dense(ranges, n):\n    ks = [0] * n\n    for s, e, k in ranges:\n"
                "        for b in range(s, e + 1):\n            ks[b - 1] = k\n    return ks\n")
    write_tree(tmp_path, {"tabletune_pipelines/core/table.py": expander,
                          "tabletune_pipelines/tuning/derive.py": "class Table:\n" + expander.replace("\n", "\n    ")
                          .replace("def dense", "    def dense"),
                          "tabletune_pipelines/errors.py": "class TableTuneError(Exception): ...\n",
                          "tabletune_pipelines/engine/x.py": "class LaunchFailed(RuntimeError): ...\n"})
    assert concept_breaches("range expansion", tmp_path) == ({("tabletune_pipelines/tuning/derive.py", "Table.dense")},
                                                            set())
    assert {c for c in exception_classes(trees(root=tmp_path)) if c[0] != ERRORS_HOME} == {
        ("tabletune_pipelines/engine/x.py", "LaunchFailed")}


def test_the_asset_and_the_cli_pick_a_tables_prior_by_the_one_rule():
    """``tuning.gates.prior_for_table`` decides which prior builds a table; ``assets/``, the library
    function the asset calls (``tuning/build.py``) and ``cli.py`` never choose one from the store themselves."""
    callers = ("tabletune_pipelines/cli.py", "tabletune_pipelines/tuning/build.py")
    found = {c for c in copies(prior_picker) if c[0].startswith("assets/") or c[0] in callers}
    assert found == set()


def test_the_finders_see_the_shapes_they_look_for():
    """Each finder flags the copy it was written for (so an empty result means no copy, not a blind check)."""
    samples = {
        range_expander: "def f(ranges, n):\n    ks = [0] * n\n    for s, e, k in ranges:\n"
                        "        for b in range(s, e + 1):\n            ks[b - 1] = k\n",
        range_compactor: "def f(ks):\n    out = []\n    for b, k in enumerate(ks, 1):\n"
                         "        if out and out[-1][2] == k:\n            out[-1][1] = b\n",
        table_validator: "def f(a, b):\n    raise ValueError(f'ranges {a} and {b} overlap')\n",
        monotone_rates: "import numpy as np\nr = np.minimum.accumulate([0.7, 0.8])\n",
        version_reader: "def f(url):\n    return url + '/version'\n",
        version_comparison: "def f(a, here):\n    return here != a.vllm_version\n",
        batch_size_grid: "def method_grid(n):\n    return list(range(1, n + 1))\n",
        dense_step_times: "def f(xs, row, n):\n    return np.interp(np.arange(1, n + 1, dtype=float), xs, row)\n",
        prior_picker: "def f(store, ident):\n    return store.latest_acceptance_prior()\n",
        mapping_reader: "def from_mapping(cls, data):\n    unknown = set(data) - {f.name for f in fields(cls)}\n"
                        "    if unknown:\n        raise ValueError(f'unknown key(s) {unknown}')\n",
        launch_overrides: "class O:\n    startup_timeout: float | None = None\n    max_model_len: int | None = None\n",
        gate_threshold: "class P:\n    trap_margin: float = Field(default=0.03)\n",
        identity_builder: "def f(name, n):\n    return EngineIdentity(gpu='H200', vllm_version='0.26.0', model=name,\n"
                          "                          drafter=None, method='ngram', max_k=3, max_num_seqs=n)\n",
        atomic_writer: "def f(path, text):\n    tmp = path.with_name(path.name + '.tmp')\n    tmp.write_text(text)\n"
                       "    os.replace(tmp, path)\n",
    }
    for finder, code in samples.items():
        tree = ast.parse(code)
        assert any(finder(node, stack) for node, stack in _walk(tree, [])), finder.__name__
    more = {range_expander: "def f(ranges, n):\n    for s, e, k in ranges:\n        out[s - 1:e] = k\n",
            table_validator: "def f(a):\n    raise ValueError(f'gap between ranges {a} and {a}')\n",
            version_reader: "def f(endpoint):\n    return f'{endpoint}/version'\n",
            dense_step_times: "def f(xs, rows, n):\n    b = np.arange(1, n + 1)\n    return [np.interp(b, xs, r) for r in rows]\n",
            launch_overrides: "names = ('startup_timeout', 'kv_cache_space_gib', 'max_model_len')\n",
            gate_threshold: "class P:\n    max_predicted_loss: float = 0.03\n",
            identity_builder: "from tabletune_pipelines import documents\nx = documents.EngineIdentity(**fields)\n",
            atomic_writer: "def f(p, text):\n    tmp = p.with_suffix('.tmp')\n    tmp.write_text(text)\n    tmp.replace(p)\n"}
    for finder, code in more.items():
        assert any(finder(node, stack) for node, stack in _walk(ast.parse(code), [])), finder.__name__
    # The copies this suite replaced would be found.
    old_published = ("def validate_ranges(where, ranges, n, k):\n    for prev, cur in zip(ranges, ranges[1:]):\n"
                     "        raise _fail(where, f'ranges {list(prev)} and {list(cur)} overlap')\n")
    assert any(table_validator(node, stack) for node, stack in _walk(ast.parse(old_published), []))


# -- exception classes: home tabletune_pipelines/errors.py (the one error hierarchy) -----------------

ERRORS_HOME = "tabletune_pipelines/errors.py"
EXCEPTION_CLASSES_ELSEWHERE: dict[tuple[str, str], str] = {
    # (file, class): why it is not a TableTuneError in errors.py
    ("tabletune_pipelines/formats/strict_io.py", "NotRegularFileError"): "strict_io's stdlib-shaped vocabulary (an OSError, "
    "like the OS's own refusals): every reader turns it into its own TableTuneError naming the file",
    ("tabletune_pipelines/formats/strict_io.py", "FileTooLargeError"): "as NotRegularFileError (an OSError)",
    ("tabletune_pipelines/formats/strict_io.py", "NotAWriteTargetError"): "as NotRegularFileError (an OSError, the "
    "one atomic writer's refusal of a link or a non-file: every writer turns it into its own TableTuneError)",
    ("tabletune_pipelines/formats/strict_io.py", "LineTooLongError"): "as NotRegularFileError (a ValueError)",
    ("tabletune_pipelines/formats/strict_io.py", "StrictJSONError"): "as NotRegularFileError (a ValueError, like "
    "json.JSONDecodeError)",
    ("tabletune_pipelines/formats/strict_io.py", "DuplicateKeyError"): "as StrictJSONError",
    ("tabletune_pipelines/formats/fleet_yaml.py", "_YAMLRefused"): "raised inside PyYAML's loader, so a yaml.YAMLError that the "
    "fleet reader turns into a FleetError; errors.py is stdlib-only and cannot import yaml",
}


def exception_classes(modules: dict[str, ast.Module]) -> set[tuple[str, str]]:
    """(file, class) of every class in ``modules`` that derives from an exception: a built-in one, one of
    another package (``yaml.YAMLError``: by its name), or such a class of ``modules`` (to a fixed point)."""
    import builtins
    known = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
    classes = [(path, n) for path, tree in modules.items() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]

    def derives(base: ast.expr) -> bool:
        name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
        return name in known or (isinstance(base, ast.Attribute) and name.endswith(("Error", "Exception")))

    found: set[tuple[str, str]] = set()
    while True:
        more = {(path, c.name) for path, c in classes if (path, c.name) not in found and any(map(derives, c.bases))}
        if not more:
            return found
        found |= more
        known |= {name for _, name in more}


def test_one_home_for_exception_classes():
    found = {c for c in exception_classes(trees()) if c[0] != ERRORS_HOME}
    allowed = set(EXCEPTION_CLASSES_ELSEWHERE)
    assert found - allowed == set(), f"define it in {ERRORS_HOME}, a TableTuneError: {sorted(found - allowed)}"
    assert allowed - found == set(), f"gone, delete from EXCEPTION_CLASSES_ELSEWHERE: {sorted(allowed - found)}"


def test_the_exception_class_finder_sees_subclasses_of_subclasses():
    tree = ast.parse("import yaml\nclass B(A): ...\nclass A(ValueError): ...\nclass C(yaml.YAMLError): ...\n"
                     "class D: ...\nclass E(D): ...\n")
    assert exception_classes({"x.py": tree}) == {("x.py", "A"), ("x.py", "B"), ("x.py", "C")}

# -- the engine-identity partition and its profile run (home: orchestration/partitions.py) ----------

def identity_registration(node: ast.AST, stack: list[ast.AST]) -> bool:
    """``instance.add_dynamic_partitions(...)``: an engine identity registered by hand."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_dynamic_partitions")


def profile_run_config(node: ast.AST, stack: list[ast.AST]) -> bool:
    """A dict literal with an ``"identity_json"`` key: a profile run's config spelled out by hand."""
    return isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "identity_json"
                                              for k in node.keys)


PARTITIONS_HOME = "tabletune_pipelines/orchestration/partitions.py"
PARTITIONS_SCANNED = (*SCANNED, "tests")
"""The tests too: a test registers an identity the way the pipeline does."""
NOT_A_REGISTRATION = {
    # (file, function): why its add_dynamic_partitions is another concept
    ("tests/pipeline/test_pipeline_automation.py", "tick"): "applies a sensor result's dynamic-partition requests "
    "as the Dagster daemon does (whatever partitions they name): Dagster's part, not TableTune's registration",
}


@pytest.mark.parametrize("finder", [identity_registration, profile_run_config])
def test_the_identity_partition_and_its_profile_run_have_one_home(finder):
    """The upgrade sensor, the main command and the tests register an identity and build its profile
    run's config through ``partitions.register_identity`` / ``partitions.profile_run_config``."""
    found = {c for c in copies(finder, PARTITIONS_SCANNED) if c[0] != PARTITIONS_HOME}
    allowed = set(NOT_A_REGISTRATION) if finder is identity_registration else set()
    assert found - allowed == set()
    assert allowed - found == set(), f"gone, delete from NOT_A_REGISTRATION: {sorted(allowed - found)}"
    sample = ("def f(instance, key, dep, ident):\n    instance.add_dynamic_partitions('engine_identity', [key])\n"
              "    return {'ops': {'step_time_profile': {'config': {'identity_json': ident.to_json()}}}}\n")
    assert any(finder(node, stack) for node, stack in _walk(ast.parse(sample), []))
    assert any(c[0] == PARTITIONS_HOME for c in copies(finder))


# -- the simulated engine (home: evaluation/simulator.py: simulate and the fake engine) --------------

SIMULATOR_HOME = "tabletune_pipelines/evaluation/simulator.py"


def simulated_engine_model(node: ast.AST, stack: list[ast.AST]) -> bool:
    """A ``*FakeEngine*`` class, or a function drawing a request's kept drafts (``*kept*``): a
    second model of the simulated engine."""
    return ((isinstance(node, ast.ClassDef) and "FakeEngine" in node.name)
            or (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and "kept" in node.name))


def test_the_simulated_engine_has_one_home():
    """The replay simulator and the fake engine of the controller's tests share one engine model in
    ``evaluation/simulator.py``; no other module of the library or the benchmarks has its own."""
    assert {c for c in copies(simulated_engine_model) if c[0] != SIMULATOR_HOME} == set()
    sample = "class FakeEngine:\n    def kept(self, k):\n        return 0\n"
    assert sum(simulated_engine_model(n, s) for n, s in _walk(ast.parse(sample), [])) == 2
    assert any(c[0] == SIMULATOR_HOME for c in copies(simulated_engine_model))

# -- a record's fields as loose parameters -------------------------------------------------------
# Parameters that travel together live in one typed record; a signature that lists several of its
# fields again is a second home for them (the long parameter lists these records replaced).

RECORDS = {  # record: the file that defines it
    "CounterWindow": "tabletune_pipelines/formats/live_counters.py",
    "DeriveOptions": "tabletune_pipelines/tuning/derive.py",
    "RemeasureSettings": "tabletune_pipelines/core/remeasure.py",
    "ProfileHooks": "tabletune_pipelines/engine/profile_run.py",
    "ProfileServers": "tabletune_pipelines/engine/profile_run.py",
}


def record_fields(record: str) -> set[str]:
    """The annotated fields of ``record``'s class body, read from its file."""
    tree = trees()[RECORDS[record]]
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == record)
    return {s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


def loose_fields(fields: set[str]) -> Finder:
    """A function with at least min(4, half) of ``fields`` among its parameters."""
    need = min(4, (len(fields) + 1) // 2)

    def finder(node: ast.AST, stack: list[ast.AST]) -> bool:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return False
        a = node.args
        return len({p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)} & fields) >= need

    return finder


def store_writer(node: ast.AST, stack: list[ast.AST]) -> bool:
    """A call writing profile cells or mixed-step samples one measurement at a time
    (``engine.profiler.store_hooks`` is the one writer the profiler is handed)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("write_profile_cell", "write_step_samples"))


@pytest.mark.parametrize("record", list(RECORDS))
def test_no_signature_restates_a_records_fields(record):
    fields = record_fields(record)
    assert len(fields) >= 3, (record, fields)
    found = copies(loose_fields(fields))
    assert found == set(), f"parameters restating {record}'s fields {sorted(fields)}: pass a {record}: {sorted(found)}"


def test_profile_cells_and_samples_reach_the_store_through_store_hooks():
    found = {c for c in copies(store_writer) if c[0] != "tabletune_pipelines/engine/profiler.py"}
    assert found == set()


def test_the_record_finders_see_the_shapes_they_look_for():
    old_window_line = ("def window_line(*, deployment, window_start, window_end, num_drafts, drafted_per_pos,\n"
                       "                accepted_per_pos, identity_key=None):\n    pass\n")
    old_profiler = ("def profile_step_times(config, *, existing=(), on_cell=None, server=None, nospec_server=None):\n"
                    "    pass\n")
    old_remeasure = ("def remeasure(reps, measure, *, threshold=0.005, tolerance=0.0, max_repetitions=9,\n"
                     "              budget_s=None):\n    pass\n")
    for record, code in (("CounterWindow", old_window_line), ("ProfileHooks", old_profiler),
                         ("ProfileServers", old_profiler), ("RemeasureSettings", old_remeasure)):
        assert any(loose_fields(record_fields(record))(n, s) for n, s in _walk(ast.parse(code), [])), record
    old_hooks = ("def store_sample_hooks(store, identity, mode):\n"
                 "    return lambda s: store.write_step_samples(identity, s, mode)\n")
    assert any(store_writer(n, s) for n, s in _walk(ast.parse(old_hooks), []))

# -- a launched server's parts (homes: engine/runtime_control.py, engine/step_log.py) --------------

def control_writer(node: ast.AST, stack: list[ast.AST]) -> bool:
    """``ControlWriter(...)``: an engine's control channel written outside ``RuntimeControl``."""
    return isinstance(node, ast.Call) and (node.func.attr if isinstance(node.func, ast.Attribute)
                                           else getattr(node.func, "id", None)) == "ControlWriter"


def offset_jsonl_reader(node: ast.AST, stack: list[ast.AST]) -> bool:
    """A function that seeks into a file and parses its lines as JSON: a step-log reader of its own."""
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _calls(node, {"seek"}) and _calls(node, {"loads"})


@pytest.mark.parametrize(("finder", "home"), [(control_writer, "tabletune_pipelines/engine/runtime_control.py"),
                                               (offset_jsonl_reader, "tabletune_pipelines/engine/step_log.py")])
def test_a_launched_servers_control_and_step_log_have_one_home(finder, home):
    """``VLLMServer`` composes ``RuntimeControl`` (the writer side of the control channels) and
    ``StepLog`` (reading the step log); no other module opens a channel or reads the log itself."""
    assert {c for c in copies(finder) if c[0] != home} == set()
    assert any(c[0] == home for c in copies(finder))
    sample = ("def f(path, offset):\n    w = ControlWriter(path)\n    with open(path) as fh:\n"
              "        fh.seek(offset)\n        return [json.loads(line) for line in fh]\n")
    assert any(finder(n, s) for n, s in _walk(ast.parse(sample), []))

# -- one name, one thing: names retired when two concepts shared them ----------------------------
# Each concept below got a name of its own; the old name must not come back, as a module, a class,
# an alias, an import or a dotted path in a string (a ``--scheduler-cls`` value).

RETIRED_MODULES = {  # old module: its new home
    "tabletune_pipelines.core.acceptance": "core.acceptance_estimate (the controller's online estimator)",
    "tabletune_pipelines.controller.steptime": "controller.step_correction (live step-time correction)",
    "tabletune_pipelines.engine.step_scheduler": "engine.timing_scheduler (the profiler's timing plugin)",
}
RETIRED_NAMES = {  # old name, anywhere: the names it became
    "AcceptanceMode": "vocab.DraftVerdict / tuning.served_plan.AcceptanceSource",
    "ACCEPTANCE_MODES": "vocab.DRAFT_VERDICTS",
    "GatePolicy": "tuning.gates.GateThresholds",
    "TuningPolicy": "orchestration.resources.TuningSettings",
    "SearchPolicy": "vocab.SearchRule",
    "SEARCH_POLICIES": "vocab.SEARCH_RULES",
}
RETIRED_IN_MODULE = {  # (module, old name): the new name (the name itself lives on elsewhere)
    ("tabletune_pipelines.tuning.build", "TablePolicy"): "tuning.build.BuildSettings",
}
RETIRED_PATH = re.compile("|".join(rf"{re.escape(m)}(?![\w])" for m in RETIRED_MODULES))
"""A retired module's dotted path in a string (not the prefix of a longer name: ``core.acceptance_estimate``)."""


def _module_of(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def retired_names(path: str) -> Finder:
    """A node of the file at ``path`` that brings back a retired name: defines, binds, imports or
    reads it, imports a retired module, or names one in a string."""
    here = _module_of(path)

    def finder(node: ast.AST, stack: list[ast.AST]) -> bool:
        names: set[str] = set()
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Name | ast.Attribute):
            names.add(node.id if isinstance(node, ast.Name) else node.attr)
        elif isinstance(node, ast.alias):
            names |= {node.name.rsplit(".", 1)[-1], node.asname or ""}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            mods = {node.module or ""} if isinstance(node, ast.ImportFrom) else {a.name for a in node.names}
            if isinstance(node, ast.ImportFrom):
                mods |= {f"{node.module}.{a.name}" for a in node.names}
                if any((node.module, a.name) in RETIRED_IN_MODULE for a in node.names):
                    return True
            return bool(mods & set(RETIRED_MODULES))
        text = _text(node, stack)
        if text is not None and RETIRED_PATH.search(text):
            return True
        return bool(names & set(RETIRED_NAMES)) or any((here, n) in RETIRED_IN_MODULE for n in names
                                                       if isinstance(node, ast.ClassDef | ast.Name))

    return finder


def test_retired_modules_are_gone():
    left = {m for m in RETIRED_MODULES if (ROOT / (m.replace(".", "/") + ".py")).exists()}
    assert left == set(), f"renamed: {[f'{m} -> {RETIRED_MODULES[m]}' for m in sorted(left)]}"


def test_retired_names_do_not_come_back():
    found = set()
    for path, tree in trees().items():
        finder = retired_names(path)
        found |= {(path, _where(stack)) for node, stack in _walk(tree, []) if finder(node, stack)}
    assert found == set(), (f"a retired name is back ({RETIRED_NAMES}, {RETIRED_IN_MODULE}, modules "
                            f"{RETIRED_MODULES}): {sorted(found)}")


def test_the_retired_name_finder_sees_the_shapes_it_looks_for():
    samples = {
        "x.py": ("class GatePolicy:\n    pass\n", "TuningPolicy = object\n", "from v import SearchPolicy as S\n",
                 "import v\nx = v.AcceptanceMode\n", "from tabletune_pipelines.core.acceptance import f\n",
                 "from tabletune_pipelines.controller import steptime\n",
                 "cmd = ['--scheduler-cls', 'tabletune_pipelines.engine.step_scheduler.TimingScheduler']\n",
                 "from tabletune_pipelines.tuning.build import TablePolicy\n"),
        "tabletune_pipelines/tuning/build.py": ("class TablePolicy:\n    pass\n",),
    }
    for path, codes in samples.items():
        for code in codes:
            assert any(retired_names(path)(n, s) for n, s in _walk(ast.parse(code), [])), code
    # The simulator's TablePolicy (a k-choosing rule) keeps its name; the new module paths are not retired ones.
    keep = ("class TablePolicy:\n    pass\n\nfrom tabletune_pipelines.evaluation.simulator import TablePolicy\n"
            "from tabletune_pipelines.core.acceptance_estimate import f\n"
            "m = 'tabletune_pipelines.engine.timing_scheduler.TimingScheduler'\n")
    assert not any(retired_names("tabletune_pipelines/evaluation/simulator.py")(n, s)
                   for n, s in _walk(ast.parse(keep), []))
