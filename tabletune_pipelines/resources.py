"""Dagster resources: the DuckDB store, the fleet file, the engine adapter, the tuning policy.

Paths default from the environment so the same definitions serve the embedded default, tests
and a fleet:

* ``TABLETUNE_HOME`` (default ``~/.tabletune``): data of the embedded default;
* ``TABLETUNE_DUCKDB`` (default ``$TABLETUNE_HOME/tabletune_store.duckdb``; the file is not named
  like a schema, see DESIGN §5);
* ``TABLETUNE_FLEET`` (default: ``fleet.yaml`` at the repository root).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import dagster as dg
from dagster_duckdb import DuckDBResource
from pydantic import Field

from tabletune_pipelines import pipeline_ops
from tabletune_pipelines.fleet import Deployment, Fleet, load_fleet, tabletune_home
from tabletune_pipelines.documents import AcceptancePrior, EngineIdentity, StepTimeProfile
from tabletune_pipelines.store import TableTuneStore


def default_duckdb_path() -> str:
    return os.environ.get("TABLETUNE_DUCKDB") or str(tabletune_home() / "tabletune_store.duckdb")


def store_from(duckdb: DuckDBResource) -> TableTuneStore:
    """The project's store on the resource's connections (plain SQL, no IO manager; DESIGN §5)."""
    Path(duckdb.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    return TableTuneStore.on(duckdb.get_connection, path=duckdb.database)


class FleetResource(dg.ConfigurableResource):
    """The fleet file (strictly validated on every load, so an edit shows up in the next run)."""

    path: str | None = Field(default=None, description="Fleet YAML; default $TABLETUNE_FLEET or the embedded fleet.yaml.")

    def load(self) -> Fleet:
        return load_fleet(self.path)


class EngineResource(dg.ConfigurableResource):
    """How runs reach vLLM. Methods are the adapter layer (``pipeline_ops``); tests override them."""

    cache_dir: str | None = Field(default=None, description="Tiny models cache; default $TABLETUNE_HOME/models.")
    work_dir: str | None = Field(default=None, description="Server logs and scratch; default $TABLETUNE_HOME/work.")
    probe_timeout_s: float = Field(default=5.0, description="Timeout of a deployment's /version probe.")
    profile_options: dict[str, Any] = Field(default_factory=dict, description="Extra profiler keyword arguments.")
    acceptance_options: dict[str, Any] = Field(default_factory=dict, description="Extra acceptance keyword arguments.")

    def _cache(self) -> str:
        return self.cache_dir or str(tabletune_home() / "models")

    def _work(self, sub: str) -> str:
        p = Path(self.work_dir or tabletune_home() / "work") / sub
        p.mkdir(parents=True, exist_ok=True)
        return str(p)

    def current_identity(self, dep: Deployment) -> EngineIdentity:
        """Raises ``pipeline_ops.EndpointUnreachable`` when a remote endpoint does not answer."""
        return pipeline_ops.current_identity(dep, self.probe_timeout_s)

    def local_model_path(self, name: str | None, drafter: bool = False) -> str | None:
        """Where a fleet model name lives for this engine (``tiny:<size>`` → the built folder)."""
        return pipeline_ops.resolve_model(name, self._cache(), drafter=drafter)

    def profile(self, identity: EngineIdentity, dep: Deployment | None, store: TableTuneStore,
                log: logging.Logger) -> StepTimeProfile:
        return pipeline_ops.profile(identity, dep, store, cache_dir=self._cache(), work_dir=self._work("profile"),
                                    log=log, options=dict(self.profile_options))

    def measure_acceptance(self, identity: EngineIdentity, dep: Deployment, prompts_file: Path, week: str,
                           log: logging.Logger) -> AcceptancePrior:
        return pipeline_ops.measure_acceptance(identity, dep, prompts_file, week, cache_dir=self._cache(),
                                               work_dir=self._work("acceptance"), log=log,
                                               options=dict(self.acceptance_options))


class TuningPolicy(dg.ConfigurableResource):
    """Thresholds of the asset checks and the table search."""

    max_predicted_loss: float = Field(
        default=0.03, description="Blocking: predicted worst loss vs the best fixed k at any B must be below this.")
    min_prior_drafts: int = Field(default=200, description="Blocking: a prior needs at least this many drafts.")
    trap_margin: float = Field(
        default=0.03, description="Warn when the table is this much slower than fixed k launched with K = k.")
    k0_margin: float = Field(
        default=0.10, description="Warn when k = 0 costs this much more than no speculation.")
    stickiness: float = Field(default=0.005, description="Keep the previous B's k unless another is this much better.")
    prior_weight: float = Field(default=2000.0, description="Observations the measured prior counts as when live "
                                                            "counters are blended in (DESIGN §2).")


def default_resources() -> dict[str, Any]:
    return {
        "duckdb": DuckDBResource(database=default_duckdb_path()),
        "fleet": FleetResource(),
        "engine": EngineResource(),
        "policy": TuningPolicy(),
    }
