"""The code location loads from an installed package, not from the checkout: the package is installed
into a new virtual environment (its dependencies from this one's site-packages), and from an empty
temporary folder, without ``PYTHONPATH``, ``dagster definitions validate -m
tabletune_pipelines.definitions`` loads it and the definitions hold every asset. The checkout is
copied first (pyproject.toml, README.md and the package), so the install writes nothing into it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ASSET_KEYS = ["acceptance_prior", "controller_live_counters", "draft_length_table", "live_acceptance_counters",
              "logged_prompts", "published_table", "step_time_profile"]
KEYS = """
import json, tabletune_pipelines.definitions as d
graph = d.defs().resolve_asset_graph()
print(json.dumps({"file": d.__file__, "keys": sorted(k.to_user_string() for k in graph.get_all_asset_keys()),
                  "checks": sorted(k.name for k in graph.asset_check_keys)}))
"""


def _install(tmp_path: Path) -> Path:
    """A venv over this interpreter's site-packages with the checkout installed (not editable) into it."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "tabletune_pipelines", src / "tabletune_pipelines",
                    ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", str(src)], check=True, capture_output=True, cwd=tmp_path)
    return python


def test_the_installed_package_loads_its_definitions_from_another_folder(tmp_path):
    python = _install(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TABLETUNE_FLEET", "TABLETUNE_DUCKDB")}
    env.update(TABLETUNE_HOME=str(tmp_path / "home"), DAGSTER_HOME=str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir()
    validated = subprocess.run([str(python), "-m", "dagster", "definitions", "validate", "-m",
                                "tabletune_pipelines.definitions"], cwd=elsewhere, env=env, capture_output=True,
                               text=True, timeout=300)
    assert validated.returncode == 0, validated.stdout[-3000:] + validated.stderr[-3000:]
    loaded = subprocess.run([str(python), "-c", KEYS], cwd=elsewhere, env=env, capture_output=True, text=True,
                            timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    found = json.loads(loaded.stdout.strip().splitlines()[-1])
    # the module is the venv's copy, not the checkout's (nor an editable install pointing at one)
    assert Path(found["file"]).resolve().is_relative_to((tmp_path / "venv").resolve()), found["file"]
    assert found["keys"] == ASSET_KEYS
    assert "served_goodput_verified" in found["checks"]
