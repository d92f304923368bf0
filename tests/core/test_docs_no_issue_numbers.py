"""The documentation speaks for itself: no citations of this project's issue numbers, and the
architecture page names only modules that exist.

A reader of the repository has no issue tracker of this project, so "issue 17" or "(issue 19,
item 8)" or "#18" says nothing to them; the docs, the README, the package's comments and
docstrings and the tests' docstrings and comments say the thing itself instead. Citations of
upstream projects' issues and pull requests (vLLM, SGLang) are public sources and stay.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: "issue 17", "Issue 19", "issues 17, 20", "issue #12", "issue-16", "issue 18's"; or a bare "#18"
#: (not "#1f77b4", not "&#39;").
PROJECT_ISSUE = re.compile(r"\b[Ii]ssues?[ -]?#?\d+\b|(?<![\w#&])#\d+\b")
#: An upstream citation: the project's name (or its GitHub path) right before the match, e.g.
#: "vLLM issue #54418", "SGLang issue 39231", "vllm-project/vllm issue #1", "vLLM #47808"; or a
#: pull request ("PR #39231": this project cites none of its own).
UPSTREAM_BEFORE = re.compile(
    r"(vLLM|vllm|SGLang|sglang|vllm-project/vllm|sgl-project/sglang|upstream|\bPRs?)(?:'s)?\W{0,3}$")

#: Files edited concurrently on other branches that still cite issue numbers; each entry names the
#: file and is to be removed once that file is reworded (the test then covers it too).
PENDING: frozenset[str] = frozenset()


def project_issue_citations(text: str) -> list[str]:
    """Every match of a project issue number in ``text`` that is not an upstream citation."""
    found = []
    for m in PROJECT_ISSUE.finditer(text):
        if UPSTREAM_BEFORE.search(text[max(0, m.start() - 40):m.start()]):
            continue
        found.append(m.group(0))
    return found


#: This file: its examples are citations on purpose.
SELF = Path(__file__).resolve()


def checked_files() -> list[Path]:
    files = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    files += sorted((ROOT / "tabletune_pipelines").rglob("*.py"))
    files += sorted(f for f in (ROOT / "tests").rglob("*.py") if f.resolve() != SELF)
    return [f for f in files if f.relative_to(ROOT).as_posix() not in PENDING]


@pytest.mark.parametrize("text, expected", [
    ("the flapping bound (issue 18)", ["issue 18"]),
    ("Issue 19, item 8: one publication at a time", ["Issue 19"]),
    ("WIP (issues 17, 20): one step-cost model", ["issues 17"]),
    ("the issue-16 figure", ["issue-16"]),
    ("see issue #12", ["issue #12"]),
    ("fixed in #18, see #7's note", ["#18", "#7"]),
    ("vLLM #47808 upstream", []),
    ("colour #1f77b4, &#39;, a 3 # 4 grid", []),
    ("vLLM #54418 and SGLang #39231", []),
    ("vLLM issue #54418, SGLang issue 39231, vLLM's issue 7", []),
    ("vLLM PR #54418 (PR #39231)", []),
    ("upstream PR #1234 (vllm-project/vllm issue 99)", []),
    ("an issue with the served cost", []),
    ("tissue 12", []),
])
def test_the_pattern_finds_project_issues_and_leaves_upstream_citations(text, expected):
    assert project_issue_citations(text) == expected


def test_the_scan_covers_docs_package_and_tests_but_not_itself():
    names = {f.relative_to(ROOT).as_posix() for f in checked_files()}
    assert {"README.md", "tabletune_pipelines/controller/logic.py", "tests/controller/test_logic.py"} <= names
    assert "tests/core/test_docs_no_issue_numbers.py" not in names


def test_docs_readme_package_and_tests_cite_no_project_issue_numbers():
    bad = []
    for f in checked_files():
        for no, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            for hit in project_issue_citations(line):
                bad.append(f"{f.relative_to(ROOT)}:{no}: {hit!r} in {line.strip()[:120]!r}")
    assert not bad, "say the thing itself instead of citing an issue number:\n" + "\n".join(bad)


def test_pending_files_exist():
    """An entry of PENDING whose file is gone (renamed, removed) is stale."""
    missing = sorted(p for p in PENDING if not (ROOT / p).is_file())
    assert not missing, f"PENDING names files that do not exist: {missing}"


# -- docs/architecture.md names only modules that exist ----------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: A path with a folder: tabletune_pipelines/core/table.py, assets/tables.py, core/evidence.py,
#: controller/, benchmarks/evaluate.py, tests/core/test_import_isolation.py.
PATH = re.compile(r"(?<![\w./<>-])((?:[A-Za-z_][\w-]*/)+(?:[\w-]+\.(?:py|md|sh|json|yaml))?)(?![\w/])")
#: A bare module file name: published.py, live_counters.py.
BARE = re.compile(r"(?<![\w./<>-])([A-Za-z_]\w*\.py)\b")
#: Where a path relative to the package may start (the page shortens tabletune_pipelines/core/x.py
#: to core/x.py inside the diagrams).
BASES = ("", "tabletune_pipelines/")
SEARCHED = ("tabletune_pipelines", "assets", "benchmarks", "tests")


def named_paths(text: str) -> tuple[set[str], set[str]]:
    paths = {m.group(1) for m in PATH.finditer(text)}
    bare = {m.group(1) for m in BARE.finditer(text)}
    return paths, bare


def test_the_path_parser_sees_the_forms_the_page_uses():
    paths, bare = named_paths("`tabletune_pipelines/core/table.py` and core/evidence.py, controller/ "
                              "(`assets/feedback.py`), published.py; <stem>.speculative-config.json; "
                              "<logged_prompts>/<Monday>.jsonl")
    assert paths == {"tabletune_pipelines/core/table.py", "core/evidence.py", "controller/",
                     "assets/feedback.py"}
    assert bare == {"published.py"}


def test_architecture_names_only_modules_that_exist():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    paths, bare = named_paths(text)
    assert any(p.startswith("tabletune_pipelines/") for p in paths) and any(p.startswith("assets/") for p in paths)
    missing = sorted(p for p in paths if not any((ROOT / base / p).exists() for base in BASES))
    files = {f.name for d in SEARCHED for f in (ROOT / d).rglob("*.py")}
    missing += sorted(b for b in bare if b not in files)
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_architecture_names_every_controller_module():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    modules = sorted(f.name for f in (ROOT / "tabletune_pipelines" / "controller").glob("*.py")
                     if f.name != "__init__.py")
    absent = [m for m in modules if f"tabletune_pipelines/controller/{m}" not in text]
    assert not absent, f"docs/architecture.md does not name controller modules {absent}"


def test_readme_links_the_architecture_page():
    assert "docs/architecture.md" in (ROOT / "README.md").read_text(encoding="utf-8")
