"""Shared helpers of the assets: partition → identity, prior choice, gates (checks), metadata.

The gates are plain functions so the same rule runs as an asset check and again right before
publishing (a table that failed a blocking gate is never published, whichever run tries).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from tabletune_pipelines import pipeline_ops
from tabletune_pipelines.core.goodput import tau_curve, validate_acceptance
from tabletune_pipelines.core.table import expand_table, validate_table, validate_vllm_schedule
from tabletune_pipelines.errors import TableTuneError
from tabletune_pipelines.fleet import Deployment, Fleet, tabletune_home
from tabletune_pipelines.documents import AcceptancePrior, DraftLengthTable, EngineIdentity, StepTimeProfile
from tabletune_pipelines.report import table_step_and_tau
from tabletune_pipelines.store import TableTuneStore

OWNERS = ["team:tabletune"]
IDENTITY_TAG = "tabletune/identity"


# -- identities ----------------------------------------------------------------------------

def deployment_for_identity(fleet: Fleet, identity: EngineIdentity, preferred: str = "") -> Deployment | None:
    if preferred:
        return fleet.deployment(preferred)
    for d in fleet.deployments:
        if (d.model, d.drafter, d.method, d.gpu, d.max_k, d.max_num_seqs) == (
                identity.model, identity.drafter, identity.method, identity.gpu, identity.max_k, identity.max_num_seqs):
            return d
    return None


def resolve_identity(key: str, *, identity_json: str, fleet: Fleet, engine: Any, store: TableTuneStore,
                     log: Any) -> EngineIdentity:
    """The EngineIdentity behind a partition key: run config (sensor), then the store, then the fleet."""
    if identity_json:
        ident = EngineIdentity.from_json(identity_json)
        if ident.key != key:
            raise dg.Failure(description=f"run config identity has key {ident.key}, but the run's partition is {key}")
        return ident
    if key in store.identity_keys():
        return store.identity(key)
    unreachable = []
    for d in fleet.deployments:
        try:
            ident = engine.current_identity(d)
        except pipeline_ops.EndpointUnreachable as exc:
            unreachable.append(f"{d.name}: {exc}")
            continue
        if ident.key == key:
            return ident
    raise dg.Failure(
        description=(f"partition {key} is not an engine identity TableTune knows: it is not in the store and no "
                     f"deployment of {fleet.source} runs it now" + (f" (unreachable: {'; '.join(unreachable)})"
                                                                     if unreachable else "")),
    )


def deployments_running(key: str, fleet: Fleet, engine: Any, log: Any) -> tuple[list[Deployment], list[str]]:
    """Deployments whose current identity is ``key``, and messages for the ones not reachable."""
    running, notes = [], []
    for d in fleet.deployments:
        try:
            ident = engine.current_identity(d)
        except pipeline_ops.EndpointUnreachable as exc:
            notes.append(f"{d.name}: unreachable ({exc})")
            log.warning(f"deployment {d.name} is unreachable, not publishing to it: {exc}")
            continue
        if ident.key == key:
            running.append(d)
    return running, notes


# -- gates ---------------------------------------------------------------------------------

@dataclass
class Gate:
    name: str
    passed: bool
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)

    def result(self, asset_key: str | None = None, severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR
               ) -> dg.AssetCheckResult:
        md = {k: v for k, v in self.metadata.items()}
        md["summary"] = dg.MetadataValue.text(self.description)
        return dg.AssetCheckResult(check_name=self.name, passed=self.passed, severity=severity, metadata=md,
                                   description=self.description, **({"asset_key": asset_key} if asset_key else {}))


def profile_gate(profile: StepTimeProfile) -> Gate:
    """Every k in 0..K measured at the same batch sizes, from B = 1 up to max_num_seqs."""
    ident = profile.identity
    cells = profile.reject_cells()
    want = set(range(0, ident.max_k + 1))
    missing_k = sorted(want - set(cells))
    md: dict[str, Any] = {"ks_measured": dg.MetadataValue.json(sorted(cells)), "cells": len(profile.cells)}
    if missing_k:
        return Gate("profile_complete", False,
                    f"profile of {ident.key} misses k = {missing_k} (needs every k in 0..{ident.max_k}); "
                    "re-run step_time_profile for this partition to measure the missing cells", md)
    try:
        surface = profile.surface()
        surface.dense(ident.max_num_seqs)
    except TableTuneError as exc:
        return Gate("profile_complete", False, f"profile of {ident.key} is incomplete: {exc}", md)
    md["batch_sizes"] = dg.MetadataValue.json(list(surface.batch_sizes))
    return Gate("profile_complete", True,
                f"{len(surface.ks)} k values × {len(surface.batch_sizes)} batch sizes (1..{surface.max_batch_size})", md)


def prior_gate(prior: AcceptancePrior, max_k: int, min_drafts: int) -> Gate:
    """Rates in [0, 1], non-increasing, at least max_k of them, enough drafts behind them."""
    name = "prior_sane"
    md = {"rates": dg.MetadataValue.json(list(prior.rates)), "num_drafts": prior.num_drafts}
    try:
        validate_acceptance(prior.rates, name=f"prior {prior.prior_id}")
    except TableTuneError as exc:
        return Gate(name, False, str(exc), md)
    if len(prior.rates) < max_k:
        return Gate(name, False, f"prior {prior.prior_id} has {len(prior.rates)} rates; the engine drafts up to "
                                 f"k = {max_k}", md)
    if prior.num_drafts < min_drafts:
        return Gate(name, False, f"prior {prior.prior_id} rests on {prior.num_drafts} drafts; at least {min_drafts} "
                                 "are needed (log more prompts or lower policy.min_prior_drafts)", md)
    return Gate(name, True, f"{prior.prior_id}: a = {[round(a, 3) for a in prior.rates]} from {prior.num_drafts} drafts", md)


def table_gates(table: DraftLengthTable, max_predicted_loss: float) -> list[Gate]:
    """The blocking gates of a table: vLLM's validation, and the predicted loss threshold."""
    gates = []
    try:
        validate_vllm_schedule([list(r) for r in table.ranges])
        validate_table([list(r) for r in table.ranges], table.max_num_seqs, table.max_k)
        gates.append(Gate("valid_for_vllm", True, f"{len(table.ranges)} ranges cover 1..{table.max_num_seqs}, "
                                                  f"k <= {table.max_k}"))
    except TableTuneError as exc:
        gates.append(Gate("valid_for_vllm", False, f"vLLM would reject the table: {exc}"))
    loss = float(table.predicted_worst_loss)
    gates.append(Gate(
        "predicted_loss_under_threshold", loss < max_predicted_loss,
        f"predicted worst loss vs the best fixed k at any batch size: {loss:.2%} "
        f"({'<' if loss < max_predicted_loss else '>='} threshold {max_predicted_loss:.2%})",
        {"predicted_worst_loss": loss, "threshold": max_predicted_loss},
    ))
    return gates


def engine_dependence_gate(table: DraftLengthTable, fixed_cells: Mapping[int, Mapping[int, float]],
                           margin: float, table_reject_ms: Mapping[int, Mapping[int, float]]) -> Gate:
    """Warn: is the table slower somewhere than the best fixed k launched with K = k (no table)?

    Like is compared with like: both sides use step times measured with every draft rejected
    (``table_reject_ms`` = the profile's cells under the launch K), at the batch sizes both measured.
    """
    name = "engine_dependence_trap"
    if not fixed_cells:
        return Gate(name, True, "NOT MEASURED: the profile has no cells of launches with K = k and no table, so the "
                                "engine-dependence trap (DESIGN §4b) cannot be checked; profile in fixed_k mode "
                                "(EngineResource fixed_k_baseline, or `tabletune profile --mode fixed_k`) to measure it", {"status": "not measured"})
    dense_k = expand_table([list(r) for r in table.ranges], table.max_num_seqs, table.max_k)
    taus = tau_curve(table.acceptance_rates)
    rows, worst, worst_b = [], 0.0, None
    bs = sorted(set.intersection(*[set(v) for v in fixed_cells.values()]))
    for b in bs:
        k_table = dense_k[b - 1] if b <= table.max_num_seqs else None
        if k_table is None or b not in table_reject_ms.get(k_table, {}):
            continue
        g_fixed = {k: 1000.0 * b * taus[k] / fixed_cells[k][b] for k in fixed_cells if k < len(taus)}
        best_k = max(g_fixed, key=g_fixed.get)
        g_table = 1000.0 * b * taus[k_table] / table_reject_ms[k_table][b]
        slow = 1.0 - g_table / g_fixed[best_k]
        rows.append(f"| {b} | {best_k} | {g_fixed[best_k]:.1f} | {g_table:.1f} | {slow:+.1%} |")
        if slow > worst:
            worst, worst_b = slow, b
    md = {"worst_slowdown": float(worst), "at_batch_size": worst_b or 0,
          "comparison": dg.MetadataValue.md("| B | best fixed k (K=k) | its tok/s | table tok/s | table slower by |\n"
                                            "|---|---|---|---|---|\n" + "\n".join(rows))}
    if worst > margin:
        return Gate(name, False, f"the table is {worst:.1%} slower at B = {worst_b} than the best fixed k launched "
                                 f"with K = k and no table (margin {margin:.0%}): check the engine path before "
                                 "deploying a table", md)
    return Gate(name, True, f"the table is never more than {margin:.0%} slower than the best fixed k launched with "
                            f"K = k (worst {worst:.1%})", md)


def k0_gate(table: DraftLengthTable, no_spec_ms: Mapping[int, float], k0_ms: Mapping[int, float],
            margin: float) -> Gate:
    """Warn: k = 0 is not "off" (limitation 3). Fails (WARN) where no speculation beats the table by
    more than ``margin``, or where the table runs k = 0 and k = 0 costs ``margin`` more than no speculation."""
    name = "k0_costs_vs_no_spec"
    if not no_spec_ms:
        return Gate(name, True, "NOT MEASURED: the profile has no no-speculation baseline cells",
                    {"status": "not measured"})
    t, tau = table_step_and_tau(table)
    dense_k = expand_table([list(r) for r in table.ranges], table.max_num_seqs, table.max_k)
    rows, losing, k0_costly, worst_overhead = [], [], [], 0.0
    for b in sorted(no_spec_ms):
        if b > table.max_num_seqs:
            continue
        ns = no_spec_ms[b]
        g_ns, g_table = 1000.0 * b / ns, 1000.0 * b * tau[b - 1] / t[b - 1]
        over = (k0_ms[b] / ns - 1.0) if b in k0_ms else float("nan")
        if b in k0_ms:
            worst_overhead = max(worst_overhead, over)
            if dense_k[b - 1] == 0 and over > margin:
                k0_costly.append(b)
        rows.append(f"| {b} | {dense_k[b - 1]} | {ns:.2f} | {k0_ms.get(b, float('nan')):.2f} | {over:+.1%} | "
                    f"{g_ns * 1000:.0f} | {g_table * 1000:.0f} |")
        if g_ns > g_table * (1.0 + margin):
            losing.append(b)
    md = {"k0_worst_overhead": float(worst_overhead),
          "batch_sizes_where_no_spec_wins": dg.MetadataValue.json(losing),
          "batch_sizes_where_table_runs_costly_k0": dg.MetadataValue.json(k0_costly),
          "comparison": dg.MetadataValue.md(
              "| B | table k | no-spec ms | k=0 ms | k=0 overhead | no-spec tok/s | table tok/s |\n"
              "|---|---|---|---|---|---|---|\n" + "\n".join(rows))}
    bad = sorted(set(losing) | set(k0_costly))
    if bad:
        parts = []
        if losing:
            parts.append(f"no speculation beats the table by more than {margin:.0%} at B = {losing}")
        if k0_costly:
            parts.append(f"the table runs k = 0 at measured B = {k0_costly}, where k = 0 costs more than "
                         f"{margin:.0%} over no speculation (the drafter still runs)")
        advice = ("consider serving without speculation" if min(bad) == 1
                  else f"consider turning speculation off above B = {min(bad) - 1}")
        return Gate(name, False, "; ".join(parts) + f" (k = 0 overhead up to {worst_overhead:.0%}): {advice}", md)
    return Gate(name, True, f"the table stays within {margin:.0%} of no speculation everywhere "
                            f"(k = 0 overhead up to {worst_overhead:.0%})", md)


# -- priors --------------------------------------------------------------------------------

def select_prior(store: TableTuneStore, identity: EngineIdentity, min_drafts: int
                 ) -> tuple[AcceptancePrior | None, list[str]]:
    """Latest sane prior for this engine's model/drafter/method (acceptance does not depend on the GPU
    or the vLLM version); within a week a live (controller-fed) prior wins over the offline one."""
    rows = store.query(
        """SELECT p.prior_json FROM acceptance_priors p
           LEFT JOIN engine_identities e ON p.identity_key = e.identity_key
           WHERE p.identity_key = ? OR (e.model = ? AND e.drafter IS NOT DISTINCT FROM ? AND e.method = ?)
           ORDER BY p.week DESC NULLS LAST, CASE p.source WHEN 'live' THEN 0 ELSE 1 END, p.measured_at DESC""",
        [identity.key, identity.model, identity.drafter, identity.method],
    )
    skipped = []
    for (text,) in rows:
        prior = AcceptancePrior.from_json(text)
        gate = prior_gate(prior, identity.max_k, min_drafts)
        if gate.passed:
            return prior, skipped
        skipped.append(gate.description)
    return None, skipped


# -- metadata ------------------------------------------------------------------------------

def identity_markdown(identity: EngineIdentity) -> str:
    body = identity.to_dict()
    lines = ["| field | value |", "|---|---|", f"| key | `{identity.key}` |"]
    for k in ("gpu", "vllm_version", "model", "drafter", "method", "max_k", "max_num_seqs", "dtype", "cudagraph_mode"):
        lines.append(f"| {k} | {body[k]} |")
    return "\n".join(lines)


def plots_dir() -> Path:
    p = tabletune_home() / "plots"
    p.mkdir(parents=True, exist_ok=True)
    return p


def image_metadata(png: bytes, name: str) -> dict[str, dg.MetadataValue]:
    """The plot inline (markdown with a base64 PNG) and as a file path."""
    path = plots_dir() / f"{name}.png"
    path.write_bytes(png)
    b64 = base64.b64encode(png).decode()
    return {"goodput_plot": dg.MetadataValue.md(f"![goodput vs batch size](data:image/png;base64,{b64})"),
            "goodput_plot_path": dg.MetadataValue.path(str(path))}


def json_md(obj: Any) -> dg.MetadataValue:
    return dg.MetadataValue.md("```json\n" + json.dumps(obj, indent=2, sort_keys=True) + "\n```")
