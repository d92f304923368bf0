"""README §Layout and docs/architecture.md name every module of the package: a module added, moved
or renamed without its map fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tabletune_pipelines"
MODULES = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                 if p.name != "__init__.py" and "__pycache__" not in p.parts)


def readme_layout() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Layout")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def named(module: str, text: str) -> bool:
    """The module's file stem as a word of ``text`` (``step_log`` in "step_log (reading...)")."""
    return re.search(rf"(?<![\w]){re.escape(Path(module).stem)}(\.py)?(?!\w)", text) is not None


@pytest.mark.parametrize("doc", ["README.md §Layout", "docs/architecture.md"])
def test_every_module_is_on_the_map(doc):
    text = readme_layout() if doc.startswith("README") else (ROOT / doc).read_text()
    missing = [m for m in MODULES if not named(m, text)]
    assert not missing, f"{doc} does not name {missing}"


def test_the_check_sees_a_missing_module():
    assert named("engine/step_log.py", "reading the step log: step_log.py")
    assert named("engine/step_log.py", "step_log (the records)")
    assert not named("engine/step_log.py", "the step log")
    assert not named("core/steptime.py", "core/steptime_extra.py")
