"""``acceptance_prior``: a_1..a_K per deployment, measured weekly on that week's logged prompts."""

import dagster as dg
from dagster_duckdb import DuckDBResource

from tabletune_pipelines.defs import OWNERS
from tabletune_pipelines.orchestration.metadata import describe_acceptance, failures
from tabletune_pipelines.orchestration.partitions import weekly_partitions
from tabletune_pipelines.orchestration.resources import (
    EngineResource,
    FleetResource,
    TuningSettings,
    check_config,
    store_from,
)
from tabletune_pipelines.tuning.measure import measure_week

logged_prompts = dg.AssetSpec(
    "logged_prompts",
    group_name="sources",
    kinds={"jsonl"},
    owners=OWNERS,
    description=("Each deployment's logged real prompts, one JSONL file per week: "
                 "`<logged_prompts>/<Monday YYYY-MM-DD>.jsonl`, one `{\"prompt\": ...}` object per line "
                 "(fleet file, `logged_prompts`; format: tabletune_pipelines/formats/prompts.py). Written by "
                 "the serving side, not by this pipeline."),
)


class AcceptanceConfig(dg.Config):
    """Which deployments to measure (empty = every deployment of the fleet)."""

    deployments: list[str] = []


@dg.asset(
    partitions_def=weekly_partitions,
    deps=[logged_prompts],
    kinds={"vllm", "duckdb"},
    group_name="acceptance",
    owners=OWNERS,
    tags={"tabletune/uses_engine": "true"},
    description=(
        "Acceptance prior a_i (probability the first i drafts are all accepted) per deployment, measured at "
        "K = max_k on the week's logged prompts (docs/method.md, \"Acceptance\"). Weekly partitions, weeks start "
        "Monday 00:00 UTC. Rows: DuckDB `acceptance_priors` (`WHERE week = '<partition>' AND source = 'measured'`); "
        "with two or more `context_levels` in the engine's acceptance options, per context bucket in "
        "`acceptance_prior_buckets` (metadata `context_buckets`: each bucket's n and rates, or why it is pooled)."
    ),
    check_specs=[dg.AssetCheckSpec("prior_sane", asset="acceptance_prior", blocking=True,
                                   description="Rates in [0, 1], non-increasing, one per k up to K, enough drafts.")],
)
def acceptance_prior(context: dg.AssetExecutionContext, config: AcceptanceConfig, duckdb: DuckDBResource,
                     fleet: FleetResource, engine: EngineResource, policy: TuningSettings):
    with failures():
        check_config(config, fleet, engine, policy)
        week = measure_week(store_from(duckdb), fleet.load(), context.partition_key, engine,
                            deployments=config.deployments, min_drafts=policy.min_prior_drafts, log=context.log)
    yield describe_acceptance(week)
