"""``live_acceptance_counters``: the controller's exported counters → a live prior for next week's tables."""

import dagster as dg
from dagster_duckdb import DuckDBResource

from tabletune_pipelines.defs import OWNERS
from tabletune_pipelines.orchestration.metadata import describe_live_priors, failures
from tabletune_pipelines.orchestration.partitions import week_bounds, weekly_partitions
from tabletune_pipelines.orchestration.resources import (
    EngineResource,
    FleetResource,
    TuningSettings,
    check_config,
    store_from,
)
from tabletune_pipelines.tuning.feedback import ingest_live_counters

controller_live_counters = dg.AssetSpec(
    "controller_live_counters",
    group_name="sources",
    kinds={"jsonl"},
    owners=OWNERS,
    description=("Per-position drafted/accepted counters exported by the TableTune controller inside vLLM "
                 "(which loads published_table as its prior). JSONL, format documented in "
                 "tabletune_pipelines/formats/live_counters.py; path: the fleet's `live_counters`."),
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
        "(â_i = (w·a_i + accepted_i) / (w + drafted_i), docs/method.md, \"Online controller\"). "
        "Stored as a `live` prior in DuckDB `acceptance_priors`, which draft_length_table prefers within its week. "
        "Only windows counted by the deployment's current engine identity count; windows of other engines in the "
        "same file (a mid-week upgrade) are left out and reported. A window exported twice counts once; "
        "overlapping windows of one writer, or more draft positions than max_k, fail the run."
    ),
)
def live_acceptance_counters(context: dg.AssetExecutionContext, config: FeedbackConfig, duckdb: DuckDBResource,
                             fleet: FleetResource, engine: EngineResource, policy: TuningSettings):
    week = context.partition_key
    with failures():
        check_config(config, fleet, engine, policy)
        live = ingest_live_counters(store_from(duckdb), fleet.load(), week, week_bounds(week), engine,
                                    deployments=config.deployments, prior_weight=policy.prior_weight, log=context.log)
    return describe_live_priors(live)
