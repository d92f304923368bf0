"""Fixtures of the CLI tests: an empty TABLETUNE_HOME and a store seeded with one profile and one prior."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Medium target on CPU, every draft rejected (docs/engine-facts.md, "CPU build"): with
# a = (0.7, 0.5, 0.3) the best k moves from 3 to 1 near B = 16.
MEDIUM = {None: {1: 14.1, 4: 15.3, 16: 25.6}, 0: {1: 15.0, 4: 16.5, 16: 27.0},
          1: {1: 16.9, 4: 22.6, 16: 42.3}, 3: {1: 17.4, 4: 28.1, 16: 64.6}}
RATES = (0.7, 0.5, 0.3)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty TABLETUNE_HOME; no fleet or store override from the caller's environment."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("TABLETUNE_HOME", str(h))
    for var in ("TABLETUNE_FLEET", "TABLETUNE_DUCKDB"):
        monkeypatch.delenv(var, raising=False)
    return h


def embedded_identity():
    """The identity of the engine the embedded default deployment runs on this machine (the fleet's
    fields, the installed vLLM, this CPU's dtype): the profile `tabletune table` picks by default."""
    from tabletune_pipelines.tuning.deployments import current_identity
    from tabletune_pipelines.formats.fleet import DEFAULT_FLEET_PATH, load_fleet

    return current_identity(load_fleet(DEFAULT_FLEET_PATH).deployments[0])


def seed_store(db: Path) -> str:
    """A store with the MEDIUM profile of the embedded default's identity and one prior; the identity key."""
    from tabletune_pipelines.formats.documents import AcceptancePrior, StepTimeCell
    from tabletune_pipelines.store import TableTuneStore
    from tabletune_pipelines.vocab import DEFAULT_SAMPLE_SIZE

    store = TableTuneStore(db)
    ident = embedded_identity()
    store.write_profile_cells(ident, [StepTimeCell(k=k, batch_size=b, median_ms=ms, repetitions_ms=(ms,), launch_k=3)
                                      for k, row in MEDIUM.items() for b, ms in row.items()])
    drafts = 5000
    store.write_acceptance_prior(AcceptancePrior(rates=RATES, num_drafts=drafts, drafted_per_pos=(drafts,) * 3,
                                                 accepted_per_pos=tuple(int(r * drafts) for r in RATES),
                                                 prompt_fingerprint="f" * 64, prompt_count=DEFAULT_SAMPLE_SIZE,
                                                 deployment="local-cpu"),
                                 ident.key)
    return ident.key


@pytest.fixture
def seeded(home):
    """The seeded store at the default path ($TABLETUNE_HOME/tabletune_store.duckdb)."""
    from tabletune_pipelines.formats.fleet import default_store_path

    db = default_store_path()
    seed_store(db)
    return db


@pytest.fixture
def run_cli(home):
    """``run_cli(*args)``: ``python -m tabletune_pipelines.cli ARGS`` in a fresh interpreter on ``home``."""
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tabletune_pipelines.cli", *args], capture_output=True,
                              text=True, env=dict(os.environ), cwd=home, timeout=120)

    return run
