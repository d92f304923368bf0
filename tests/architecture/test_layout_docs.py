"""docs/architecture.md is the one map of the code: it names every module of the package and only
paths that exist, so a module added, moved or renamed without its map fails here. The README links
the map (and every other page of docs/) instead of repeating it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.architecture.scan import REPOSITORY as ROOT, python_files, write_tree


def modules(root: Path) -> list[str]:
    """Every module of the package under ``root``, relative to the package, ``__init__`` left out."""
    package = root / "tabletune_pipelines"
    return [p.relative_to(package).as_posix() for p in python_files(package) if p.name != "__init__.py"]


def named(module: str, text: str) -> bool:
    """The module's file stem as a word of ``text`` (``step_log`` in "step_log (reading...)")."""
    return re.search(rf"(?<![\w]){re.escape(Path(module).stem)}(\.py)?(?!\w)", text) is not None


def modules_missing_from_map(root: Path) -> list[str]:
    """The modules of the package under ``root`` that its docs/architecture.md does not name."""
    text = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    return [m for m in modules(root) if not named(m, text)]


def test_every_module_is_on_the_map():
    missing = modules_missing_from_map(ROOT)
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_the_map_check_reports_a_module_left_off(tmp_path):
    write_tree(tmp_path, {"tabletune_pipelines/__init__.py": "", "tabletune_pipelines/core/table.py": "",
                          "tabletune_pipelines/core/table_extra.py": "",
                          "docs/architecture.md": "`tabletune_pipelines/core/table.py`: the table; see missing.py\n"})
    assert modules_missing_from_map(tmp_path) == ["core/table_extra.py"]
    assert paths_that_do_not_exist(tmp_path) == ["missing.py"]


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


# -- docs/architecture.md names only modules that exist ----------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: A path with a folder: tabletune_pipelines/core/table.py, assets/tables.py, core/evidence.py,
#: controller/, benchmarks/evaluate.py, tests/architecture/test_import_isolation.py.
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


def paths_that_do_not_exist(root: Path) -> list[str]:
    """The paths and bare module names in ``root``'s docs/architecture.md that name no file under ``root``."""
    paths, bare = named_paths((root / "docs" / "architecture.md").read_text(encoding="utf-8"))
    missing = sorted(p for p in paths if not any((root / base / p).exists() for base in BASES))
    files = {f.name for d in SEARCHED for f in (root / d).rglob("*.py")}
    return missing + sorted(b for b in bare if b not in files)


def test_architecture_names_only_modules_that_exist():
    paths, _ = named_paths(ARCHITECTURE.read_text(encoding="utf-8"))
    assert any(p.startswith("tabletune_pipelines/") for p in paths) and any(p.startswith("assets/") for p in paths)
    missing = paths_that_do_not_exist(ROOT)
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_architecture_names_every_controller_module():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    modules = sorted(f.name for f in (ROOT / "tabletune_pipelines" / "controller").glob("*.py")
                     if f.name != "__init__.py")
    absent = [m for m in modules if f"tabletune_pipelines/controller/{m}" not in text]
    assert not absent, f"docs/architecture.md does not name controller modules {absent}"


def test_readme_links_the_architecture_page():
    assert "docs/architecture.md" in (ROOT / "README.md").read_text(encoding="utf-8")
