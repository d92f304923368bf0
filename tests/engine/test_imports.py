"""The engine layer imports no Dagster, pandas or DuckDB; the control protocol is stdlib only."""

from __future__ import annotations

import json
import subprocess
import sys

ENGINE_MODULES = ["tabletune_pipelines.engine", "tabletune_pipelines.engine.config",
                  "tabletune_pipelines.engine.command", "tabletune_pipelines.engine.process",
                  "tabletune_pipelines.engine.client", "tabletune_pipelines.engine.installed",
                  "tabletune_pipelines.engine.identity", "tabletune_pipelines.engine.plan",
                  "tabletune_pipelines.engine.cell", "tabletune_pipelines.engine.progress",
                  "tabletune_pipelines.engine.profiler", "tabletune_pipelines.engine.acceptance",
                  "tabletune_pipelines.engine.tiny_models", "tabletune_pipelines.engine.launcher",
                  "tabletune_pipelines.engine.runtime_control", "tabletune_pipelines.engine.step_log"]


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True).stdout
    return {m.split(".")[0] for m in json.loads(out.strip().splitlines()[-1])}


def test_engine_imports_no_dagster_pandas_duckdb():
    loaded = _loaded_after("\n".join(f"import {m}" for m in ENGINE_MODULES)
                           + "\nfrom tabletune_pipelines.engine import ServerConfig, VLLMServer, ProfileOptions, "
                             "profile_step_times, measure_acceptance")
    assert not loaded & {"dagster", "pandas", "duckdb"}


def test_engine_package_import_is_cheap():
    assert not _loaded_after("import tabletune_pipelines.engine") & {"vllm", "torch", "numpy", "dagster"}


def test_control_protocol_is_stdlib_only():
    loaded = _loaded_after("import tabletune_pipelines.formats.control_protocol")
    assert not loaded & {"numpy", "dagster", "pandas", "duckdb", "vllm", "torch"}
    assert "tabletune_pipelines" in loaded
