"""docs/architecture.md, the one map of the code, names every module of the package: a module added,
moved or renamed without its map fails here. The README links the map instead of repeating it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tabletune_pipelines"
MODULES = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                 if p.name != "__init__.py" and "__pycache__" not in p.parts)


def named(module: str, text: str) -> bool:
    """The module's file stem as a word of ``text`` (``step_log`` in "step_log (reading...)")."""
    return re.search(rf"(?<![\w]){re.escape(Path(module).stem)}(\.py)?(?!\w)", text) is not None


def test_every_module_is_on_the_map():
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = [m for m in MODULES if not named(m, text)]
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_the_readme_points_to_the_map_and_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    # test-times.md is a reference table of the suite's timings, not a page to read next.
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "test-times.md")
    unlinked = [p for p in pages if f"docs/{p}" not in readme]
    assert not unlinked, f"README.md does not point to {unlinked}"


def test_the_check_sees_a_missing_module():
    assert named("engine/step_log.py", "reading the step log: step_log.py")
    assert named("engine/step_log.py", "step_log (the records)")
    assert not named("engine/step_log.py", "the step log")
    assert not named("core/steptime.py", "core/steptime_extra.py")
