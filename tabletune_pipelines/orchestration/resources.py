"""Dagster resources: the DuckDB store, the fleet file, the engine, the tuning settings.

Thin wrappers: each resource holds configuration and calls the library (``store``, ``fleet``,
``deployments``, ``tuning.gates``). Paths default from the environment so the same definitions
serve the embedded default, tests and a fleet:

* ``TABLETUNE_HOME`` (default ``~/.tabletune``): data of the embedded default;
* ``TABLETUNE_DUCKDB`` (default ``$TABLETUNE_HOME/tabletune_store.duckdb``; not ``tabletune.duckdb``:
  DuckDB finds a file named like a schema inside it ambiguous);
* ``TABLETUNE_FLEET`` (default: the embedded default, ``tabletune_pipelines/data/fleet.yaml``).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, ClassVar

import dagster as dg
from dagster_duckdb import DuckDBResource
from pydantic import Field

from tabletune_pipelines.core.acceptance_estimate import DEFAULT_PRIOR_WEIGHT, EstimatorConfig
from tabletune_pipelines.core.evidence import DEFAULT_CONFIDENCE, DEFAULT_SEARCH_RULE
from tabletune_pipelines.core.table import DEFAULT_STICKINESS
from tabletune_pipelines.errors import PipelineFailure, TableTuneError
from tabletune_pipelines.formats.documents import AcceptancePrior, DraftLengthTable, EngineIdentity, StepTimeProfile
from tabletune_pipelines.formats.fleet import Deployment, Fleet, default_store_path, load_fleet
from tabletune_pipelines.options import Bound, check_bounds, field_docs
from tabletune_pipelines.store import TableTuneStore
from tabletune_pipelines.tuning import deployments
from tabletune_pipelines.tuning.derive import DeriveOptions
from tabletune_pipelines.tuning.gates import GateThresholds
from tabletune_pipelines.tuning.served_plan import ServedVerificationOptions
from tabletune_pipelines.tuning.served_verdict import ServedVerification


def store_from(duckdb: DuckDBResource) -> TableTuneStore:
    """The project's store on the resource's connections (plain SQL through the store, no IO manager)."""
    Path(duckdb.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    return TableTuneStore.on(duckdb.get_connection, path=duckdb.database)


class FleetResource(dg.ConfigurableResource):
    """The fleet file (strictly validated on every load, so an edit shows up in the next run)."""

    path: str | None = Field(default=None,
                             description="Fleet YAML; default $TABLETUNE_FLEET or the embedded default fleet.")

    def load(self) -> Fleet:
        return load_fleet(self.path)


class EngineResource(dg.ConfigurableResource):
    """How runs reach vLLM: ``tabletune_pipelines.tuning.deployments`` with this configuration; tests override it."""

    cache_dir: str | None = Field(default=None, description="Tiny models cache; default $TABLETUNE_HOME/models.")
    work_dir: str | None = Field(default=None, description="Server logs and scratch; default $TABLETUNE_HOME/work.")
    probe_timeout_s: float = Field(default=5.0, description="Timeout of a deployment's /version probe.")
    profile_options: dict[str, Any] = Field(
        default_factory=dict, description="engine.plan.ProfileOptions fields, e.g. batch_sizes, repetitions, "
                                          "fixed_k_baseline.")
    acceptance_options: dict[str, Any] = Field(
        default_factory=dict, description="deployments.AcceptanceOptions fields, e.g. max_tokens, seed.")
    served_verification: dict[str, Any] = Field(
        default_factory=dict, description="tuning.served_plan.ServedVerificationOptions fields for the "
                                          "blocking check served_goodput_verified before publishing, e.g. "
                                          "enabled (default true), budget_s (default 75 on the CPU build, "
                                          "300 on a GPU), loads, rounds, window_s, tolerance (0.03), "
                                          "acceptance (auto|real|prior).")

    BOUNDS: ClassVar[dict[str, Bound]] = deployments.LocalEngine.BOUNDS
    """The library engine's bounds (the option mappings are checked by their own classes: ``check_config``)."""

    def local(self) -> deployments.LocalEngine:
        """This configuration as the library's engine, which every call below goes to."""
        return deployments.LocalEngine(
            cache_dir=self.cache_dir, work_dir=self.work_dir, probe_timeout_s=self.probe_timeout_s,
            profile_options=self.profile_options, acceptance_options=self.acceptance_options,
            served_verification=self.served_verification, where="EngineResource")

    def current_identity(self, dep: Deployment) -> EngineIdentity:
        """Raises ``errors.EndpointUnreachable`` when a remote endpoint does not answer."""
        return self.local().current_identity(dep)

    def local_model_path(self, name: str | None, drafter: bool = False, dtype: str | None = None) -> str | None:
        """Where a fleet model name lives for this engine (``tiny:<size>`` → the folder built in ``dtype``)."""
        return self.local().local_model_path(name, drafter, dtype)

    def profile(self, identity: EngineIdentity, dep: Deployment | None, store: TableTuneStore,
                log: logging.Logger) -> StepTimeProfile:
        return self.local().profile(identity, dep, store, log)

    def served_verification_options(self) -> ServedVerificationOptions:
        return self.local().served_verification_options()

    def verify_served(self, identity: EngineIdentity, dep: Deployment | None, table: DraftLengthTable,
                      prior: AcceptancePrior | None, log: logging.Logger) -> ServedVerification:
        """The table against every fixed k by served goodput, in one launch of this engine."""
        return self.local().verify_served(identity, dep, table, prior, log)

    def measure_acceptance(self, identity: EngineIdentity, dep: Deployment, prompts_file: Path, week: str,
                           log: logging.Logger) -> AcceptancePrior:
        return self.local().measure_acceptance(identity, dep, prompts_file, week, log)


_GATE_DOCS = field_docs(GateThresholds)


def _gate_threshold(name: str) -> Any:
    """The config field of ``GateThresholds.<name>``: its default and its meaning are GateThresholds'."""
    return Field(default=getattr(GateThresholds, name), description=_GATE_DOCS.get(name, f"GateThresholds.{name}"))


class TuningSettings(dg.ConfigurableResource):
    """Thresholds of the asset checks and knobs of the table search.

    Its resource key in the code location's ``Definitions`` is ``policy`` (``default_resources``; the
    assets' ``policy`` parameter), unchanged when the class was renamed, so users' run configs
    (``resources: policy: config: ...``) keep working; its config fields keep their names too.

    The thresholds are ``tuning.gates.GateThresholds``'s fields, declared again here only because a
    Dagster config schema needs them as fields: default and description come from GateThresholds, and
    ``gates()`` is the GateThresholds they make (tests/pipeline/test_resources.py checks that every
    GateThresholds field is here with its default)."""

    max_predicted_loss: float = _gate_threshold("max_predicted_loss")
    min_prior_drafts: int = _gate_threshold("min_prior_drafts")
    trap_margin: float = _gate_threshold("trap_margin")
    k0_margin: float = _gate_threshold("k0_margin")
    stickiness: float = Field(default=DEFAULT_STICKINESS,
                              description="Keep the previous B's k unless another is this much better.")
    search_policy: str = Field(default=DEFAULT_SEARCH_RULE, description=(
        "Table search rule: 'evidence' (switch k only where the gain's lower confidence bound exceeds the "
        "stickiness) or 'stickiness' (the method's rule on point estimates)."))
    confidence: float = Field(default=DEFAULT_CONFIDENCE, description=(
        "Confidence level of the table search's bounds and of the accepted-work fit's significance."))
    prior_weight: float = Field(default=DEFAULT_PRIOR_WEIGHT, description=(
        "Observations the measured prior counts as when live counters are blended in (docs/method.md, "
        "\"Online controller\")."))

    BOUNDS: ClassVar[dict[str, Bound]] = {
        **GateThresholds.BOUNDS,
        **{name: DeriveOptions.BOUNDS[name] for name in ("stickiness", "confidence")},
        "prior_weight": EstimatorConfig.BOUNDS["prior_weight"],
    }
    """Each field's bounds, declared by the library class that uses it (``check_config`` walks them)."""

    def gates(self) -> GateThresholds:
        """The gate thresholds this resource is configured with."""
        return GateThresholds(**{f.name: getattr(self, f.name) for f in dataclasses.fields(GateThresholds)})


def check_config(*configs: Any) -> None:
    """Every numeric field of each Dagster resource or run config (``dg.ConfigurableResource``,
    ``dg.Config``) through ``options.check_bounds`` by its class's ``BOUNDS``, the rule the documents
    follow (NaN, infinity, a negative or an absurd value refused by name); an ``EngineResource``'s
    option mappings are read by their own classes too (``LocalEngine.check_options``). The first
    refusal is a ``PipelineFailure`` of one line naming the class, the field and the value, so the
    step fails before it reads or writes anything. Every asset and op calls it first, inside
    ``failures()``."""
    keys = {EngineResource: "engine", TuningSettings: "policy", FleetResource: "fleet"}
    for config in configs:
        key = next((k for cls, k in keys.items() if isinstance(config, cls)), None)
        name = type(config).__name__
        where = f"resources: {key}: config ({name})" if key else f"run config ({name})"
        try:
            if hasattr(type(config), "BOUNDS"):  # a class with a numeric field declares them (tests/pipeline)
                check_bounds(config, where=where, error=PipelineFailure)
            if isinstance(config, EngineResource):
                config.local().check_options()
        except PipelineFailure:
            raise
        except TableTuneError as exc:  # its message names EngineResource and the option mapping
            raise PipelineFailure(str(exc)) from None


def default_resources() -> dict[str, Any]:
    """The resources of the code location (paths from the environment, see the module docstring)."""
    return {
        "duckdb": DuckDBResource(database=str(default_store_path())),
        "fleet": FleetResource(),
        "engine": EngineResource(),
        "policy": TuningSettings(),
    }
