"""The project speaks in the present tense: no citations of its own issue numbers, and no "session"
used as a counter of how it was built.

A reader of the repository has neither this project's issue tracker nor the history of how it was
built, so "issue 17", "(issue 19, item 8)", "#18", "session 20", "tried in this session" or a data
folder named ``flow-session19`` says nothing to them. The README, ``docs/``, the code (package,
Dagster assets, benchmarks, tests) and the paths of the benchmark data say the thing itself instead,
with a date where a measurement needs one (``benchmarks/data/h200/2026-12-03-dense-judge-L128/``).

Still allowed: citations of upstream projects' issues and pull requests (vLLM, SGLang: public
sources), and "session" in its technical senses (``start_new_session``, pytest's
``scope="session"``, an HTTP client session).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.architecture.scan import REPOSITORY as ROOT, write_tree

# -- the patterns ------------------------------------------------------------------------------

#: "issue 17", "Issue 19", "issues 17, 20", "issue #12", "issue-16", "issue 18's"; or a bare "#18"
#: (not "#1f77b4", not "&#39;").
PROJECT_ISSUE = re.compile(r"\b[Ii]ssues?[ -]?#?\d+\b|(?<![\w#&])#\d+\b")
#: An upstream citation: the project's name (or its GitHub path) right before the match, e.g.
#: "vLLM issue #54418", "SGLang issue 39231", "vllm-project/vllm issue #1", "vLLM #47808"; or a
#: pull request ("PR #39231": this project cites none of its own).
UPSTREAM_BEFORE = re.compile(
    r"(vLLM|vllm|SGLang|sglang|vllm-project/vllm|sgl-project/sglang|upstream|\bPRs?)(?:'s)?\W{0,3}$")

#: "session" as a build counter: numbered ("session 20", "Session 9", "sessions 21 and 22",
#: "session-22", "session_19", "flow-session19", "(session 7)"), or pointing at a build step ("this
#: session", "the next session", "a later session", "from session to session"). A letter right
#: before it is another word; "start_new_session", "scope='session'" and "requests.Session()" are
#: none of these forms.
BUILD_SESSION = re.compile(
    r"(?<![A-Za-z])sessions?[ \t]*[-_#]?[ \t]*\d+"
    r"|\b(?:this|that|next|last|previous|earlier|later)[ \t]+sessions?\b"
    r"|\bsession[ \t]+to[ \t]+session\b",
    re.IGNORECASE)


def project_issue_citations(text: str) -> list[str]:
    """Every match of a project issue number in ``text`` that is not an upstream citation."""
    found = []
    for m in PROJECT_ISSUE.finditer(text):
        if UPSTREAM_BEFORE.search(text[max(0, m.start() - 40):m.start()]):
            continue
        found.append(m.group(0))
    return found


def build_sessions(text: str) -> list[str]:
    """Every use of "session" as a counter of the project's build history in ``text``."""
    return [m.group(0) for m in BUILD_SESSION.finditer(text)]


# -- what is scanned ----------------------------------------------------------------------------

#: This file: its examples are citations on purpose.
SELF = Path(__file__).resolve()
DATA = ROOT / "benchmarks" / "data"

#: Files edited concurrently elsewhere that still carry build history; each entry names the file and
#: is to be removed once that file is reworded (the test then covers it too).
PENDING: frozenset[str] = frozenset()


def checked_files(root: Path = ROOT) -> list[Path]:
    """The README, every page of docs/, and the Python of the package, the Dagster assets, the
    benchmarks and the tests (comments, docstrings and code alike) under ``root``."""
    files = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    for folder in ("tabletune_pipelines", "assets", "benchmarks", "tests"):
        files += sorted(f for f in (root / folder).rglob("*.py") if ".venv" not in f.parts)
    return [f for f in files if f.resolve() != SELF and f.relative_to(root).as_posix() not in PENDING]


def data_paths() -> list[str]:
    """Every file and folder under benchmarks/data/, relative to the repository."""
    return sorted(p.relative_to(ROOT).as_posix() for p in DATA.rglob("*"))


def offending_lines(files: list[Path], find, root: Path = ROOT) -> list[str]:
    bad = []
    for f in files:
        for no, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            for hit in find(line):
                bad.append(f"{f.relative_to(root)}:{no}: {hit!r} in {line.strip()[:120]!r}")
    return bad


# -- the patterns find what they should ---------------------------------------------------------

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
def test_the_issue_pattern_finds_project_issues_and_leaves_upstream_citations(text, expected):
    assert project_issue_citations(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("Tried and taken back (session 20): merging", ["session 20"]),
    ("RESULTS.md, sessions 20 and 21", ["sessions 20"]),
    ("in the session-22 launch", ["session-22"]),
    ("benchmarks/data/h200/flow-session19/run.log", ["session19"]),
    ("moe_session_19.json", ["session_19"]),
    ("Session 9 (CPU build, a busy machine)", ["Session 9"]),
    ("device time: 30 of 30 minutes used in this session", ["this session"]),
    ("a candidate for the next session to judge", ["next session"]),
    ("machines differ in speed from session to session", ["session to session"]),
    ("subprocess.Popen(cmd, start_new_session=True)", []),
    ('@pytest.fixture(scope="session")', []),
    ("with requests.Session() as http_session:", []),
    ("an aiohttp ClientSession per client", []),
    ("the HTTP session is closed after 3 retries", []),
    ("one session per client, each session reused", []),
])
def test_the_session_pattern_finds_build_counters_and_leaves_technical_uses(text, expected):
    assert build_sessions(text) == expected


def test_the_scan_covers_readme_docs_code_and_tests_but_not_itself():
    names = {f.relative_to(ROOT).as_posix() for f in checked_files()}
    assert {"README.md", "docs/controller.md", "tabletune_pipelines/controller/logic.py",
            "tests/controller/test_logic.py", "benchmarks/evaluate.py"} <= names
    assert any(n.startswith("assets/") for n in names)
    assert "tests/architecture/test_no_build_history.py" not in names
    assert data_paths(), "benchmarks/data/ holds no files to check"


# -- the scans ----------------------------------------------------------------------------------

def test_readme_docs_and_code_cite_no_project_issue_numbers():
    bad = offending_lines(checked_files(), project_issue_citations)
    assert not bad, "say the thing itself instead of citing an issue number:\n" + "\n".join(bad)


def test_readme_docs_and_code_count_no_build_sessions():
    bad = offending_lines(checked_files(), build_sessions)
    assert not bad, ("say what the code does and why, with the date of a measurement, instead of "
                     "the build session it came from:\n" + "\n".join(bad))


def test_benchmark_data_is_named_by_experiment_and_date_not_by_session_or_issue():
    bad = [p for p in data_paths() if build_sessions(p) or project_issue_citations(p)]
    assert not bad, ("name benchmark data by experiment and date "
                     "(benchmarks/data/h200/2026-12-03-dense-judge-L128/), not by build session:\n"
                     + "\n".join(bad))


def test_pending_files_exist():
    """An entry of PENDING whose file is gone (renamed, removed) is stale."""
    missing = sorted(p for p in PENDING if not (ROOT / p).is_file())
    assert not missing, f"PENDING names files that do not exist: {missing}"


def test_the_scans_report_build_history_in_a_tree(tmp_path):
    write_tree(tmp_path, {"README.md": "# T\nThe flapping bound (issue 18).\n",
                          "docs/method.md": "Measured in this session.\n",
                          "tabletune_pipelines/core/x.py": "# vLLM issue #54418 is upstream\nx = 1\n"})
    files = checked_files(tmp_path)
    assert offending_lines(files, project_issue_citations, tmp_path) == [
        "README.md:2: 'issue 18' in 'The flapping bound (issue 18).'"]
    assert offending_lines(files, build_sessions, tmp_path) == [
        "docs/method.md:1: 'this session' in 'Measured in this session.'"]
