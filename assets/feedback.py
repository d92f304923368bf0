"""``live_acceptance_counters``: the controller's exported counters → a live prior for next week's tables."""

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets import OWNERS
from tabletune_pipelines.errors import InvalidValueError, TableTuneError
from tabletune_pipelines.live_counters import LiveCountersError, read_live_counters
from tabletune_pipelines.orchestration.partitions import week_bounds, weekly_partitions
from tabletune_pipelines.orchestration.resources import EngineResource, FleetResource, TuningPolicy, store_from
from tabletune_pipelines.tuning.feedback import live_prior, windows_in_week

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
    """Which deployments to read counters of (empty = every deployment of the fleet)."""

    deployments: list[str] = []


@dg.asset(
    partitions_def=weekly_partitions,
    deps=[controller_live_counters],
    kinds={"json", "duckdb"},
    group_name="acceptance",
    owners=OWNERS,
    description=(
        "Live acceptance of the week per deployment, from the controller's exported counters (windows whose end "
        "falls in the week), blended with the latest measured prior as w observations "
        "(â_i = (w·a_i + accepted_i) / (w + drafted_i), docs/method.md, \"Online controller\"). Stored as a `live` prior "
        "in DuckDB `acceptance_priors`, which draft_length_table prefers within its week. A window exported twice "
        "counts once; overlapping windows of one writer, or more draft positions than max_k, fail the run."
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
            read = read_live_counters(dep.live_counters, max_k=dep.max_k)
            live = live_prior(dep.name, week, windows_in_week(read.windows, dep.name, start, end), max_k=dep.max_k,
                              measured=store.latest_measured_prior(dep.name, up_to_week=week),
                              prior_weight=policy.prior_weight, counters_fingerprint=read.fingerprint)
        except (LiveCountersError, InvalidValueError) as exc:
            raise dg.Failure(description=f"{dep.name}: unreadable live counters: {exc}") from exc
        if read.skipped_partial_last_line:
            context.log.warning(f"{dep.name}: skipped a half-written last line in {dep.live_counters}")
        if read.duplicates:
            context.log.warning(f"{dep.name}: {read.duplicates} window(s) of {dep.live_counters} were exported twice; "
                                "each is counted once")
        if live is None:
            notes.append(f"{dep.name}: no counter windows ending in the week of {week}")
            continue
        if live.blended_with is None:
            context.log.warning(f"{dep.name}: {live.basis}")
        key = live.identity_key
        if not key:
            try:
                key = store.upsert_identity(engine.current_identity(dep))
            except TableTuneError:
                key = None
        if key and not store.has_identity(key):
            key = None  # an identity the store does not know: keep the prior, unlinked
        pid = store.write_acceptance_prior(live.prior, key)
        written.append(pid)
        rows.append(f"| {dep.name} | {live.windows} | {live.prior.num_drafts} | {list(live.drafted)} | "
                    f"{list(live.accepted)} | `{pid}`: {[round(r, 3) for r in live.prior.rates]} — {live.basis} |")
    for n in notes:
        context.log.info(n)
    return dg.MaterializeResult(metadata={
        "live_priors": dg.MetadataValue.md("\n".join(rows)),
        "dagster/row_count": len(written),
        "week": week,
        "notes": dg.MetadataValue.json(notes),
    })
