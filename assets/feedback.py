"""``live_acceptance_counters``: the controller's exported counters → a live prior for next week's tables."""

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets import OWNERS
from tabletune_pipelines.errors import InvalidValueError, TableTuneError
from tabletune_pipelines.live_counters import LiveCountersError, read_live_counters
from tabletune_pipelines.orchestration.partitions import week_bounds, weekly_partitions
from tabletune_pipelines.orchestration.resources import EngineResource, FleetResource, TuningPolicy, store_from
from tabletune_pipelines.tuning.feedback import live_prior, windows_in_week, windows_of_engine

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
        "in DuckDB `acceptance_priors`, which draft_length_table prefers within its week. Only windows counted by "
        "the deployment's current engine identity count; windows of other engines in the same file (a mid-week "
        "upgrade) are left out and reported. A window exported twice counts once; overlapping windows of one "
        "writer, or more draft positions than max_k, fail the run."
    ),
)
def live_acceptance_counters(context: dg.AssetExecutionContext, config: FeedbackConfig, duckdb: DuckDBResource,
                             fleet: FleetResource, engine: EngineResource, policy: TuningPolicy):
    week = context.partition_key
    start, end = week_bounds(week)
    the_fleet = fleet.load()
    deps = [the_fleet.deployment(n) for n in config.deployments] if config.deployments else list(the_fleet.deployments)
    store = store_from(duckdb)
    rows = ["| deployment | windows | drafts | drafted_i | accepted_i | live prior | other engines' windows left out |",
            "|---|---|---|---|---|---|---|"]
    notes, written, left_out = [], [], {}
    for dep in deps:
        if dep.live_counters is None:
            notes.append(f"{dep.name}: no live_counters file configured")
            continue
        if not dep.live_counters.exists():
            notes.append(f"{dep.name}: {dep.live_counters} does not exist yet (no controller export)")
            continue
        try:
            identity = engine.current_identity(dep)
        except TableTuneError as exc:  # counts of an engine we cannot name cannot be attributed to it
            notes.append(f"{dep.name}: live counters not read: the engine it runs could not be learned ({exc})")
            continue
        try:
            read = read_live_counters(dep.live_counters, max_k=dep.max_k)
            split = windows_of_engine(windows_in_week(read.windows, dep.name, start, end), identity.key)
            live = live_prior(dep.name, week, split.kept, max_k=dep.max_k,
                              measured=store.latest_measured_prior(dep.name, up_to_week=week),
                              prior_weight=policy.prior_weight, counters_fingerprint=read.fingerprint,
                              identity_key=identity.key)
        except (LiveCountersError, InvalidValueError) as exc:
            raise dg.Failure(description=f"{dep.name}: unreadable live counters: {exc}") from exc
        if split.left_out:
            left_out[dep.name] = split.left_out
            context.log.warning(f"{dep.name}: {split.describe_left_out()}")
        if read.skipped_partial_last_line:
            context.log.warning(f"{dep.name}: skipped a half-written last line in {dep.live_counters}")
        if read.duplicates:
            context.log.warning(f"{dep.name}: {read.duplicates} window(s) of {dep.live_counters} were exported twice; "
                                "each is counted once")
        if live is None:
            notes.append(f"{dep.name}: no counter windows of {identity.key} ending in the week of {week}"
                         + (f" ({split.left_out_count} of other engines left out)" if split.left_out else ""))
            continue
        if live.blended_with is None:
            context.log.warning(f"{dep.name}: {live.basis}")
        pid = store.write_acceptance_prior(live.prior, store.upsert_identity(identity))
        written.append(pid)
        rows.append(f"| {dep.name} | {live.windows} | {live.prior.num_drafts} | {list(live.drafted)} | "
                    f"{list(live.accepted)} | `{pid}`: {[round(r, 3) for r in live.prior.rates]} — {live.basis} | "
                    f"{split.left_out_count} |")
    for n in notes:
        context.log.info(n)
    return dg.MaterializeResult(metadata={
        "live_priors": dg.MetadataValue.md("\n".join(rows)),
        "dagster/row_count": len(written),
        "week": week,
        "notes": dg.MetadataValue.json(notes),
        "windows_left_out": sum(n for per in left_out.values() for n in per.values()),
        "windows_left_out_by_engine": dg.MetadataValue.json(left_out),
    })
