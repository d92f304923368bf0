"""No module of the package grows over ``MAX_LINES`` lines: a module that big holds several jobs, and
is split along its own seams (each part a module of the same package whose docstring says what it
holds). ``KNOWN`` lists the modules still over the bound in files being reworked elsewhere; each
must still be over it, so the list can only shrink (delete its entry when the module is split)."""

from __future__ import annotations

from pathlib import Path

from tests.architecture.scan import REPOSITORY as ROOT, python_files, write_tree

MAX_LINES = 600
KNOWN: frozenset[str] = frozenset()


def lines_of(path: Path) -> int:
    """Lines of a file, as ``wc -l`` counts them."""
    return path.read_bytes().count(b"\n")


def module_size_breaches(root: Path, known: frozenset[str] = KNOWN) -> list[str]:
    """Every module under ``root``'s ``tabletune_pipelines/`` over ``MAX_LINES`` lines and not in
    ``known``, and every entry of ``known`` that is not over it (split, or gone)."""
    sizes = {p.relative_to(root).as_posix(): lines_of(p) for p in python_files(root / "tabletune_pipelines")}
    bad = [f"{path} is {n} lines (at most {MAX_LINES}): split it along its seams"
           for path, n in sizes.items() if n > MAX_LINES and path not in known]
    bad += [f"{path} is {sizes.get(path, 0)} lines now: delete it from KNOWN"
            for path in sorted(known) if sizes.get(path, 0) <= MAX_LINES]
    return bad


def test_no_module_is_over_the_bound():
    bad = module_size_breaches(ROOT)
    assert bad == [], "\n".join(bad)


def test_the_module_size_check_reports_each_breach(tmp_path):
    write_tree(tmp_path, {"tabletune_pipelines/core/big.py": "x = 1\n" * (MAX_LINES + 1),
                          "tabletune_pipelines/core/fine.py": "x = 1\n" * MAX_LINES,
                          "tabletune_pipelines/store/split.py": "x = 1\n"})
    assert module_size_breaches(tmp_path, frozenset({"tabletune_pipelines/store/split.py"})) == [
        f"tabletune_pipelines/core/big.py is {MAX_LINES + 1} lines (at most {MAX_LINES}): split it along its seams",
        "tabletune_pipelines/store/split.py is 1 lines now: delete it from KNOWN",
    ]
