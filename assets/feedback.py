"""``live_acceptance_counters``: the controller's exported counters → a live prior for next week's tables."""


import hashlib

import dagster as dg
import numpy as np
from dagster_duckdb import DuckDBResource

from assets.common import OWNERS
from tabletune_pipelines.core.acceptance import AcceptanceEstimator, EstimatorConfig
from tabletune_pipelines.errors import TableTuneError
from tabletune_pipelines.live_counters import LiveCountersError, read_live_counters
from tabletune_pipelines.documents import AcceptancePrior
from tabletune_pipelines.partitions import week_bounds, weekly_partitions
from tabletune_pipelines.resources import EngineResource, FleetResource, TuningPolicy, store_from

controller_live_counters = dg.AssetSpec(
    "controller_live_counters",
    group_name="sources",
    kinds={"jsonl"},
    owners=OWNERS,
    description=("Per-position drafted/accepted counters exported by the TableTune controller inside vLLM "
                 "(which loads published_table as its prior). JSONL, format documented in "
                 "tabletune_pipelines/live_counters.py; path: the fleet's `live_counters`."),
)


class FeedbackConfig(dg.Config):
    deployments: list[str] = []


def _measured_prior(store, deployment: str, week: str) -> AcceptancePrior | None:
    rows = store.query("SELECT prior_json FROM acceptance_priors WHERE deployment = ? AND source = 'measured' "
                       "AND (week IS NULL OR week <= ?) ORDER BY week DESC NULLS LAST, measured_at DESC LIMIT 1",
                       [deployment, week])
    return AcceptancePrior.from_json(rows[0][0]) if rows else None


@dg.asset(
    partitions_def=weekly_partitions,
    deps=[controller_live_counters],
    kinds={"json", "duckdb"},
    group_name="acceptance",
    owners=OWNERS,
    description=(
        "Live acceptance of the week per deployment, from the controller's exported counters (windows whose end "
        "falls in the week), blended with the latest measured prior as w observations (DESIGN §2: "
        "â_i = (w·a_i + accepted_i) / (w + drafted_i)). Stored as a `live` prior in DuckDB `acceptance_priors`, "
        "which draft_length_table prefers within its week."
    ),
)
def live_acceptance_counters(context: dg.AssetExecutionContext, config: FeedbackConfig, duckdb: DuckDBResource,
                             fleet: FleetResource, engine: EngineResource, policy: TuningPolicy):
    week = context.partition_key
    start, end = week_bounds(week)
    the_fleet = fleet.load()
    deps = [the_fleet.deployment(n) for n in config.deployments] if config.deployments else list(the_fleet.deployments)
    store = store_from(duckdb)
    rows = ["| deployment | windows | drafts | drafted_i | accepted_i | live prior |", "|---|---|---|---|---|---|"]
    notes, written = [], []
    for dep in deps:
        if dep.live_counters is None:
            notes.append(f"{dep.name}: no live_counters file configured")
            continue
        if not dep.live_counters.exists():
            notes.append(f"{dep.name}: {dep.live_counters} does not exist yet (no controller export)")
            continue
        try:
            read = read_live_counters(dep.live_counters)
        except LiveCountersError as exc:
            raise dg.Failure(description=f"{dep.name}: unreadable live counters: {exc}") from exc
        if read.skipped_partial_last_line:
            context.log.warning(f"{dep.name}: skipped a half-written last line in {dep.live_counters}")
        wins = [w for w in read.windows if w.deployment == dep.name and start <= w.window_end < end]
        if not wins:
            notes.append(f"{dep.name}: no counter windows ending in the week of {week}")
            continue
        k = max(dep.max_k, max(len(w.drafted_per_pos) for w in wins))
        drafted, accepted = np.zeros(k), np.zeros(k)
        for w in wins:
            drafted[: len(w.drafted_per_pos)] += w.drafted_per_pos
            accepted[: len(w.accepted_per_pos)] += w.accepted_per_pos
        num_drafts = sum(w.num_drafts for w in wins)
        measured = _measured_prior(store, dep.name, week)
        if measured is not None and len(measured.rates) >= k:
            est = AcceptanceEstimator(measured.rates[:k], EstimatorConfig(prior_weight=policy.prior_weight,
                                                                          halve_after_rebuild=False))
            est.observe_counts(drafted, accepted)
            rates = est.estimate()
            basis = f"blended with {measured.prior_id} (w = {policy.prior_weight:g})"
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                rates = np.where(drafted > 0, accepted / np.maximum(drafted, 1), 0.0)
            rates = np.minimum.accumulate(np.clip(rates, 0.0, 1.0))
            basis = "live counters only (no measured prior; never-drafted positions count as 0)"
            context.log.warning(f"{dep.name}: {basis}")
        key = wins[-1].identity_key
        if not key:
            try:
                key = store.upsert_identity(engine.current_identity(dep))
            except TableTuneError:
                key = None
        prior = AcceptancePrior(
            rates=tuple(float(r) for r in rates), num_drafts=int(num_drafts),
            drafted_per_pos=tuple(int(x) for x in drafted), accepted_per_pos=tuple(int(x) for x in accepted),
            prompt_fingerprint=hashlib.sha256((read.fingerprint + week + dep.name).encode()).hexdigest(),
            prompt_count=0, source="live", week=week, deployment=dep.name,
        )
        if key and key not in store.identity_keys():
            key = None  # unknown identity: keep the prior, unlinked
        pid = store.write_acceptance_prior(prior, key)
        written.append(pid)
        rows.append(f"| {dep.name} | {len(wins)} | {num_drafts} | {drafted.astype(int).tolist()} | "
                    f"{accepted.astype(int).tolist()} | `{pid}`: {[round(float(r), 3) for r in rates]} — {basis} |")
    for n in notes:
        context.log.info(n)
    return dg.MaterializeResult(metadata={
        "live_priors": dg.MetadataValue.md("\n".join(rows)),
        "dagster/row_count": len(written),
        "week": week,
        "notes": dg.MetadataValue.json(notes),
    })
