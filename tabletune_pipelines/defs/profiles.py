"""``step_time_profile``: T(B, k) of one engine identity, measured on the real serving path."""

import dagster as dg
from dagster_duckdb import DuckDBResource

from tabletune_pipelines.defs import OWNERS
from tabletune_pipelines.orchestration.metadata import describe_profile, failures
from tabletune_pipelines.orchestration.partitions import engine_identity_partitions
from tabletune_pipelines.orchestration.resources import EngineResource, FleetResource, check_config, store_from
from tabletune_pipelines.tuning.measure import profile_identity


class ProfileConfig(dg.Config):
    """Set by the upgrade sensor; empty when launched by hand (then the store / fleet resolve it)."""

    deployment: str = ""
    identity_json: str = ""


@dg.asset(
    partitions_def=engine_identity_partitions,
    kinds={"vllm", "duckdb"},
    group_name="profiling",
    owners=OWNERS,
    tags={"tabletune/uses_engine": "true"},
    description=(
        "Step time T(B, k) of one engine identity (GPU × vLLM version × model/drafter/method), measured in one "
        "vLLM launch with every draft rejected (docs/method.md, \"Step time T(B, k)\"). Rows: DuckDB table "
        "`step_time_cells` (`WHERE identity_key = '<partition>'`). Cells are written as they are measured; a re-run "
        "resumes."
    ),
    check_specs=[dg.AssetCheckSpec("profile_complete", asset="step_time_profile", blocking=True,
                                   description="Every k in 0..K measured at the same batch sizes, 1..max_num_seqs.")],
)
def step_time_profile(context: dg.AssetExecutionContext, config: ProfileConfig, duckdb: DuckDBResource,
                      fleet: FleetResource, engine: EngineResource):
    with failures():
        check_config(config, fleet, engine)
        run = profile_identity(store_from(duckdb), fleet.load(), context.partition_key, engine,
                               deployment=config.deployment, identity_json=config.identity_json, log=context.log)
    yield describe_profile(run)
