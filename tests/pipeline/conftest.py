"""Fixtures of the pipeline tests (Dagster in-process, sensors, schedules, e2e)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import ScriptedEngine, deployment_dict, write_fleet  # noqa: E402


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh TABLETUNE_HOME (plots, models cache, work dirs) for one test."""
    h = tmp_path / "tt_home"
    h.mkdir()
    monkeypatch.setenv("TABLETUNE_HOME", str(h))
    monkeypatch.delenv("TABLETUNE_FLEET", raising=False)
    monkeypatch.delenv("TABLETUNE_DUCKDB", raising=False)
    return h


@pytest.fixture
def one_fleet(home):
    return write_fleet(home, [deployment_dict("local-cpu")])


def make_resources(home: Path, fleet_path: Path, engine=None, **policy):
    from dagster_duckdb import DuckDBResource

    from tabletune_pipelines.resources import FleetResource, TuningPolicy

    return {
        "duckdb": DuckDBResource(database=str(home / "tabletune_store.duckdb")),
        "fleet": FleetResource(path=str(fleet_path)),
        "engine": engine if engine is not None else ScriptedEngine(),
        "policy": TuningPolicy(**policy),
    }
