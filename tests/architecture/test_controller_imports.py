"""The controller runs inside vLLM: it may import only vLLM, numpy, the stdlib and TableTune's
stdlib/numpy-only modules, and only the adapter may import vLLM (a simulator drives the rest).
``metrics`` may import ``prometheus_client`` (installed with vLLM), lazily: loading the logic does
not import it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.architecture.scan import REPOSITORY as ROOT, imports_of_file, python_files, write_tree

ALLOWED_TT = ("tabletune_pipelines.core", "tabletune_pipelines.formats.published",
              "tabletune_pipelines.formats.published_schema",
              "tabletune_pipelines.formats.controller_settings",
              "tabletune_pipelines.formats.live_counters", "tabletune_pipelines.formats.control_protocol",
              "tabletune_pipelines.errors", "tabletune_pipelines.vocab",
              "tabletune_pipelines.formats.identity_match", "tabletune_pipelines.options",
              "tabletune_pipelines.controller")


def controller_import_breaches(root: Path) -> list[str]:
    """Every import of a module under ``root``'s ``tabletune_pipelines/controller/`` that the
    controller may not make: only the stdlib, numpy, ``ALLOWED_TT``, vLLM in ``scheduler`` and
    ``prometheus_client`` in ``metrics``."""
    bad = []
    for path in python_files(root / "tabletune_pipelines" / "controller"):
        name, found = imports_of_file(path, root)
        module = name.rsplit(".", 1)[-1]
        for imp in found:
            top = imp.module.split(".")[0]
            ok = (top in sys.stdlib_module_names or top == "numpy" or (top == "vllm" and module == "scheduler")
                  or (top == "prometheus_client" and module == "metrics")
                  or any(imp.module == a or imp.module.startswith(a + ".") for a in ALLOWED_TT))
            if not ok:
                bad.append(f"controller/{path.name} imports {imp.module}")
    return bad


def test_only_allowed_imports():
    assert {p.stem for p in python_files(ROOT / "tabletune_pipelines" / "controller")} >= {"logic", "scheduler"}
    bad = controller_import_breaches(ROOT)
    assert bad == [], bad


@pytest.mark.parametrize("path, code, breach", [
    ("logic.py", "import vllm\n", "controller/logic.py imports vllm"),
    ("logic.py", "def f():\n    from ..engine import cell\n", "controller/logic.py imports tabletune_pipelines.engine"),
    ("search.py", "import pandas as pd\n", "controller/search.py imports pandas"),
    ("loader.py", "from tabletune_pipelines.formats.fleet import load_fleet\n",
     "controller/loader.py imports tabletune_pipelines.formats.fleet"),
])
def test_the_controller_import_check_reports_a_breach(tmp_path, path, code, breach):
    ok = {"scheduler.py": "import vllm\nfrom tabletune_pipelines.core import table\n",
          "metrics.py": "import json\nimport numpy\ndef f():\n    import prometheus_client\n"}
    write_tree(tmp_path, {f"tabletune_pipelines/controller/{k}": v for k, v in {**ok, path: code}.items()})
    assert controller_import_breaches(tmp_path) == [breach]


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
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "", f"the production plugin imported {out.stdout.strip()}"
