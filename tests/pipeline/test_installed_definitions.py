"""The code location loads from an installed package, not from the checkout: the package is installed
into a new virtual environment (its dependencies from this one's site-packages), and from an empty
temporary folder, without ``PYTHONPATH``, ``dagster definitions validate -m
tabletune_pipelines.definitions`` loads it and the definitions hold every asset. The installed
``tabletune`` finds the embedded default fleet and seeds a Dagster home from the package's own files
(package data), with no checkout beside it and no engine started. The checkout is copied first
(pyproject.toml, README.md and the package), so the install writes nothing into it."""

from __future__ import annotations

import json
import os
import shutil
import site
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


FOUND = """
import json
from tabletune_pipelines.embedded import prepare_dagster_home
from tabletune_pipelines.formats.fleet import load_fleet
fleet = load_fleet()
home = prepare_dagster_home()
print(json.dumps({"source": fleet.source, "names": [d.name for d in fleet.deployments],
                  "published": str(fleet.deployments[0].published_table),
                  "dagster_yaml": (home / "dagster.yaml").read_text()}))
"""


def _clean_env(tmp_path: Path) -> dict[str, str]:
    """This environment without the checkout on the path or a fleet, store or Dagster home of its own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TABLETUNE_FLEET", "TABLETUNE_DUCKDB", "DAGSTER_HOME")}
    env["TABLETUNE_HOME"] = str(tmp_path / "home")
    return env


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
    # Created from inside a venv, "system" is the base interpreter's site-packages; this interpreter's
    # own (setuptools with bdist_wheel, dagster, vllm) come first through a .pth file.
    own = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                         capture_output=True, text=True).stdout.strip()
    Path(own, "_tabletune_test_parent.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", str(src)], check=True, capture_output=True, cwd=tmp_path)
    return python


def test_the_installed_package_loads_its_definitions_from_another_folder(tmp_path):
    python = _install(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _clean_env(tmp_path)
    env["DAGSTER_HOME"] = str(tmp_path / "dagster_home")
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


def test_the_packaged_defaults_are_the_top_level_files():
    """The top-level fleet.yaml and dagster.yaml are the files users copy; the package ships the same
    bytes (package data), which is what runs when no fleet is named and what seeds a new Dagster home."""
    for name in ("fleet.yaml", "dagster.yaml"):
        assert (ROOT / "tabletune_pipelines" / "data" / name).read_bytes() == (ROOT / name).read_bytes(), name


def test_the_installed_tabletune_finds_its_fleet_without_the_checkout(tmp_path):
    python = _install(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _clean_env(tmp_path)
    found = subprocess.run([str(python), "-c", FOUND], cwd=elsewhere, env=env, capture_output=True, text=True,
                           timeout=300)
    assert found.returncode == 0, found.stderr[-3000:]
    got = json.loads(found.stdout.strip().splitlines()[-1])
    venv = (tmp_path / "venv").resolve()
    # the fleet read is the venv's package data; the Dagster home is $TABLETUNE_HOME/dagster, seeded from it
    assert Path(got["source"]).resolve().is_relative_to(venv), got["source"]
    assert Path(got["source"]).name == "fleet.yaml" and got["names"] == ["local-cpu"]
    assert got["published"] == str(tmp_path / "home" / "published" / "local-cpu.json")
    assert got["dagster_yaml"] == (ROOT / "dagster.yaml").read_text()
    # the console script gets past loading the fleet: `show` stops at the table nothing has published yet
    shown = subprocess.run([str(tmp_path / "venv" / "bin" / "tabletune"), "show"], cwd=elsewhere, env=env,
                           capture_output=True, text=True, timeout=300)
    assert shown.returncode == 2, shown.stdout[-3000:] + shown.stderr[-3000:]
    assert f"published table {tmp_path / 'home' / 'published' / 'local-cpu.json'} does not exist" in shown.stderr
    assert "fleet file" not in shown.stderr
