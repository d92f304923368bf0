"""Fixtures of the pipeline tests (Dagster in-process, sensors, schedules, e2e)."""

from __future__ import annotations

import pytest

from tests.pipeline.helpers import deployment_dict, write_fleet


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
