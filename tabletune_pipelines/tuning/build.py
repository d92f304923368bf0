"""The draft-length table of one engine identity, from the store (no Dagster): its profile, the prior
``gates.prior_for_table`` picks (the rule ``tabletune table`` follows too), the table search
(``derive_context.derive_context_table`` over the surface per context level), the table stored,
every table gate and the table's plot.

``build_table`` returns a plain ``BuiltTable`` that the Dagster layer describes; when no table can
be derived it raises ``PipelineFailure`` saying what to materialize first.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from tabletune_pipelines.core.evidence import DEFAULT_CONFIDENCE, DEFAULT_SEARCH_RULE
from tabletune_pipelines.core.table import DEFAULT_STICKINESS
from tabletune_pipelines.errors import InvalidValueError, PipelineFailure, TableTuneError
from tabletune_pipelines.formats.documents import AcceptancePrior, DraftLengthTable, StepTimeProfile
from tabletune_pipelines.tuning.derive import DeriveOptions, TunedTable
from tabletune_pipelines.tuning.derive_context import (
    derive_context_table,
    rates_per_level,
    stored_context_surface,
    stored_decode_surface,
)
from tabletune_pipelines.tuning.gates import (
    Gate,
    GateThresholds,
    blocking_table_gates,
    cuda_graph_headroom_gate,
    engine_dependence_gate,
    fixed_launch_cells,
    k0_gate,
    prior_for_table,
)
from tabletune_pipelines.tuning.report import table_plot
from tabletune_pipelines.vocab import SEARCH_RULES, is_search_rule


class BuildSettings(Protocol):
    """The knobs a table is built with (the pipeline's ``TuningSettings`` resource has them all): the
    gate thresholds (``gates()``) and the table search's."""

    def gates(self) -> GateThresholds: ...

    # Read-only: a frozen dataclass (``DefaultBuildSettings``) or a Dagster resource provides them.
    @property
    def stickiness(self) -> float: ...
    @property
    def search_policy(self) -> str: ...
    @property
    def confidence(self) -> float: ...


@dataclass(frozen=True)
class DefaultBuildSettings:
    """``BuildSettings`` without Dagster, at the defaults of the pipeline's ``TuningSettings`` resource
    (a run on a GPU node with only vLLM: ``benchmarks/gpu_flow.py``)."""

    thresholds: GateThresholds = GateThresholds()
    """The gates' thresholds."""
    stickiness: float = DEFAULT_STICKINESS
    """The threshold a gain (its lower bound, under the evidence rule) must exceed for the table to change k."""
    search_policy: str = DEFAULT_SEARCH_RULE
    """``evidence`` or ``stickiness`` (``core.evidence``)."""
    confidence: float = DEFAULT_CONFIDENCE
    """Level of every bound."""

    def gates(self) -> GateThresholds:
        return self.thresholds


def derive_options(settings: BuildSettings, **fields: Any) -> DeriveOptions:
    """``DeriveOptions`` with ``settings``' table-search knobs (stickiness, rule, confidence) and
    ``fields``; a ``search_policy`` outside ``vocab.SEARCH_RULES`` → InvalidValueError naming it."""
    rule = settings.search_policy
    if not is_search_rule(rule):
        raise InvalidValueError(f"search_policy = {rule!r} must be one of {SEARCH_RULES}")
    return DeriveOptions(stickiness=settings.stickiness, policy=rule, confidence=settings.confidence, **fields)


@dataclass(frozen=True)
class BuiltTable:
    """One run of ``build_table``."""

    tuned: TunedTable
    """The table with the predictions and evidence behind it."""
    table_id: str
    """The id it is stored under."""
    profile: StepTimeProfile
    prior: AcceptancePrior
    """The prior it was built from."""
    gates: tuple[Gate, ...]
    """The blocking table gates, then ``engine_dependence_trap``, ``k0_costs_vs_no_spec``, ``cuda_graph_headroom``."""
    plot: bytes
    """The goodput-vs-batch-size plot (PNG)."""

    @property
    def table(self) -> DraftLengthTable:
        return self.tuned.table


def _served_calibration(store: Any, key: str, profile: Any, prior: Any, log: logging.Logger) -> Any:
    """The identity's newest served calibration (kept by a served verification), restricted to the ks
    the profile measured; None when there is none or the prior carries no workload to correct."""
    cal = store.latest_served_calibration(key)
    if cal is None:
        return None
    if prior.workload_model() is None:
        log.info(f"a served calibration of {key} is stored but not used: prior {prior.prior_id} carries no workload, "
                 "so the table is searched on decode steps")
        return None
    ks = {c.k for c in profile.cells if c.k is not None}
    points = tuple(p for p in cal.points if p.k in ks)
    if not points:
        return None
    log.info(f"served price corrected by {len(points)} served points ({cal.source})")
    return dataclasses.replace(cal, points=points)


def build_table(store: Any, key: str, settings: BuildSettings, *, allowed_ks: Iterable[int] | None = None,
                log: logging.Logger) -> BuiltTable:
    """Derive, store and judge the table of engine identity ``key`` under ``settings``."""
    if not store.has_identity(key):
        raise PipelineFailure(f"engine identity {key} has no step_time_profile yet; materialize it first")
    try:
        profile = store.load_profile(key)
    except TableTuneError as exc:
        raise PipelineFailure(f"{exc}; materialize step_time_profile for this partition first") from exc
    ident = profile.identity
    thresholds = settings.gates()
    prior, skipped = prior_for_table(store, ident, thresholds.min_prior_drafts)
    for s in skipped:
        log.warning(f"skipping prior: {s}")
    if prior is None:
        raise PipelineFailure(
            f"no sane acceptance prior for {ident.model} / {ident.drafter} / {ident.method} at K = {ident.max_k}; "
            "materialize acceptance_prior for a week with logged prompts"
            + (f" (rejected: {'; '.join(skipped)})" if skipped else ""))
    calibration = _served_calibration(store, key, profile, prior, log)
    try:
        options = derive_options(settings, allowed_ks=None if allowed_ks is None else tuple(allowed_ks),
                                 served_calibration=calibration)
        surfaces = stored_context_surface(profile, prior, options)
        rates, pooled_why = rates_per_level(prior, sorted(surfaces))
        if pooled_why:
            log.warning(pooled_why)
        decode = stored_decode_surface(profile, prior, options) if len(surfaces) > 1 else None
        tuned = derive_context_table(profile, prior, surfaces, rates=rates, options=options, decode=decode)
    except (TableTuneError, ValueError) as exc:
        raise PipelineFailure(f"cannot derive a table for {key}: {exc}") from exc
    table = tuned.table
    for w in tuned.warnings:
        log.warning(w)
    table_id = store.write_table(table)
    reject = profile.reject_cells()
    no_spec = profile.no_spec_ms()
    gates = (
        *blocking_table_gates(table, thresholds.max_predicted_loss),
        engine_dependence_gate(table, fixed_launch_cells(store.profile_cells(key, "fixed_k")),
                               thresholds.trap_margin, reject),
        k0_gate(table, no_spec, reject.get(0, {}), thresholds.k0_margin),
        cuda_graph_headroom_gate(table, ident.cudagraph_mode),
    )
    plot = table_plot(tuned, no_spec, f"{key}\nprior {prior.prior_id}")
    return BuiltTable(tuned=tuned, table_id=table_id, profile=profile, prior=prior, gates=gates, plot=plot)
