"""Reading imports from the source (AST, no import), for the architecture rules: every module of a
tree, the modules each imports (relative imports resolved) and whether an import runs when the
module loads or only when a function is called."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
"""The checkout the rules read; each rule's check also takes another root (a synthetic tree)."""


@dataclass(frozen=True)
class Import:
    """One imported module, as a statement of the source names it."""

    module: str
    """The imported module, relative imports resolved (``tabletune_pipelines.core.table``)."""
    names: tuple[str, ...]
    """The names taken from it (``from m import a, b``); empty for ``import m``."""
    at_load: bool
    """Whether the statement runs when the module loads (module or class level), not only inside a
    function when it is called."""


def module_name(path: Path, root: Path) -> str:
    """The dotted name of the module at ``path`` under ``root`` (a package's ``__init__`` is the package)."""
    rel = path.relative_to(root).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def python_files(folder: Path) -> list[Path]:
    """Every ``.py`` file under ``folder``, sorted, ``__pycache__`` left out."""
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def imports(tree: ast.AST, module: str, is_package: bool = False) -> list[Import]:
    """Every import in ``tree`` (the module named ``module``), anywhere in it, relative imports
    resolved, in source order. ``from pkg import sub`` names ``pkg``; the names say what it takes."""
    package = module if is_package else module.rsplit(".", 1)[0]
    out: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.Import):
            out.extend(Import(a.name, (), not in_function) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            out.append(Import(base, tuple(a.name for a in node.names), not in_function))
        inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return out


def imports_of_file(path: Path, root: Path) -> tuple[str, list[Import]]:
    """(module name, its imports) of the file at ``path`` under ``root``."""
    name = module_name(path, root)
    return name, imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), name,
                         path.name == "__init__.py")


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (path relative to ``root`` -> source) under ``root``, for the rules' failing
    cases; returns ``root``."""
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return root
