"""The controller runs inside vLLM: it may import only vLLM, numpy, the stdlib and TableTune's
stdlib/numpy-only modules, and only the adapter may import vLLM (a simulator drives the rest).
``metrics`` may import ``prometheus_client`` (installed with vLLM), lazily: loading the logic does
not import it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import tabletune_pipelines.controller as pkg

ROOT = Path(pkg.__file__).parent
ALLOWED_TT = ("tabletune_pipelines.core", "tabletune_pipelines.formats.published",
              "tabletune_pipelines.formats.controller_settings",
              "tabletune_pipelines.formats.live_counters", "tabletune_pipelines.formats.control_protocol",
              "tabletune_pipelines.errors", "tabletune_pipelines.vocab",
              "tabletune_pipelines.formats.identity_match", "tabletune_pipelines.options",
              "tabletune_pipelines.controller")
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
              or (top == "prometheus_client" and module == "metrics")
              or any(name == a or name.startswith(a + ".") for a in ALLOWED_TT))
        assert ok, f"controller/{module}.py imports {name}"


def test_the_logic_loads_without_vllm_or_torch():
    code = ("import sys; import tabletune_pipelines.controller.logic; "
            "print(','.join(m for m in ('vllm', 'torch', 'dagster', 'duckdb', 'pandas', 'prometheus_client') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_a_production_engine_imports_no_evaluation_module(tmp_path):
    """The production plugin (``controller.scheduler``), its controller driven through steps and
    rebuilds, and a published version naming an evaluation baseline: no module of the evaluation
    package is ever imported (the baselines run only under ``evaluation.scheduler``)."""
    code = f"""
import logging, sys
from pathlib import Path
from tabletune_pipelines.controller import scheduler, logic
from tabletune_pipelines.controller.loader import EngineFacts
assert scheduler.ControllerHooks.controller_cls is logic.Controller
assert not [m for m in sys.modules if m.startswith("tabletune_pipelines.evaluation")]
from tabletune_pipelines.evaluation.simulator import FakeEngine
from tabletune_pipelines.evaluation.synthetic import linear_profile, publish
# The harness's synthetic inputs come from evaluation.synthetic: forget every evaluation module the
# harness loaded, so one the production code imports from here on is loaded again and shows below.
for m in [m for m in sys.modules if m.startswith("tabletune_pipelines.evaluation")]:
    del sys.modules[m]
clock = [0.0]
for policy in ("tabletune", "turbospec"):
    p = publish(Path({str(tmp_path)!r}) / (policy + ".json"), ranges=[(1, 16, 3)], rates=(0.7, 0.5, 0.3),
                allowed_k=[0, 1, 2, 3], controller={{"policy": policy}})
    c = scheduler.ControllerHooks.controller_cls(EngineFacts(
        max_k=3, max_num_seqs=16, launch_ranges=((1, 1, 0), (2, 2, 1), (3, 3, 2), (4, 16, 3))), p,
        clock=lambda: clock[0], log=logging.getLogger("t"))
    FakeEngine(c, (0.7, 0.5, 0.3), lambda b, k: linear_profile()[k][b], clock=clock).run(300, 8)
    assert c.rebuilds >= 2, c.rebuilds
    assert c.controlling == (policy == "tabletune"), (policy, c.controlling)
print(",".join(m for m in sys.modules if m.startswith("tabletune_pipelines.evaluation")))
"""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "", f"the production plugin imported {out.stdout.strip()}"
