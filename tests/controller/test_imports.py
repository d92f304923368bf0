"""The controller runs inside vLLM: it may import only vLLM, numpy, the stdlib and TableTune's
stdlib/numpy-only modules, and only the adapter may import vLLM (a simulator drives the rest)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import tabletune_pipelines.controller as pkg

ROOT = Path(pkg.__file__).parent
ALLOWED_TT = ("tabletune_pipelines.core", "tabletune_pipelines.published", "tabletune_pipelines.live_counters",
              "tabletune_pipelines.control_protocol", "tabletune_pipelines.errors", "tabletune_pipelines.vocab",
              "tabletune_pipelines.identity_match", "tabletune_pipelines.controller")
MODULES = sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "__init__")


def imported(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


@pytest.mark.parametrize("module", MODULES)
def test_only_allowed_imports(module):
    for name in imported(ROOT / f"{module}.py"):
        top = name.split(".")[0]
        ok = (top in sys.stdlib_module_names or top == "numpy" or (top == "vllm" and module == "scheduler")
              or any(name == a or name.startswith(a + ".") for a in ALLOWED_TT))
        assert ok, f"controller/{module}.py imports {name}"


def test_the_logic_loads_without_vllm_or_torch():
    code = ("import sys; import tabletune_pipelines.controller.logic; "
            "print(','.join(m for m in ('vllm', 'torch', 'dagster', 'duckdb', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
