"""``step_time_profile``: T(B, k) of one engine identity, measured on the real serving path."""

import dagster as dg
import numpy as np
from dagster_duckdb import DuckDBResource

from assets import OWNERS
from tabletune_pipelines.deployments import deployment_for_identity, resolve_identity
from tabletune_pipelines.errors import TableTuneError
from tabletune_pipelines.orchestration.metadata import check_result
from tabletune_pipelines.orchestration.partitions import engine_identity_partitions
from tabletune_pipelines.orchestration.resources import EngineResource, FleetResource, store_from
from tabletune_pipelines.tuning.gates import profile_gate
from tabletune_pipelines.tuning.report import identity_markdown, profile_markdown


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
    key = context.partition_key
    store = store_from(duckdb)
    the_fleet = fleet.load()
    try:
        identity = resolve_identity(key, identity_json=config.identity_json, fleet=the_fleet,
                                    known=store.find_identity, identity_of=engine.current_identity)
        dep = deployment_for_identity(the_fleet, identity, config.deployment)
    except TableTuneError as exc:
        raise dg.Failure(description=str(exc)) from exc
    store.upsert_identity(identity)
    before = len(store.profile_cells(key))
    context.log.info(f"profiling {key} ({before} cells already in the store are kept and skipped)")
    try:
        profile = engine.profile(identity, dep, store, context.log)
    except TableTuneError as exc:
        kept = len(store.profile_cells(key))
        raise dg.Failure(
            description=(f"profiling engine identity {key} failed: {exc}\n{kept} measured cells of this partition are "
                         "kept in DuckDB; re-running the partition resumes from them. Other partitions are untouched."),
            metadata={"identity": key, "cells_kept": kept},
        ) from exc
    spreads = [c.spread for c in profile.cells]
    yield dg.MaterializeResult(
        metadata={
            "identity": dg.MetadataValue.md(identity_markdown(identity)),
            "identity_key": key,
            "deployment": dep.name if dep else "",
            "dagster/row_count": len(profile.cells),
            "cells_measured_this_run": len(profile.cells) - before,
            "step_ms": dg.MetadataValue.md("Step time, ms (median of repetitions, every draft rejected)\n\n"
                                           + profile_markdown(profile)),
            "median_spread": float(np.median(spreads)) if spreads else 0.0,
            "max_spread": float(max(spreads)) if spreads else 0.0,
            "cells_remeasured": len(profile.remeasured()),
            "wall_timed_cells": len(profile.wall_timed()),
            "mode": profile.mode,
        },
        check_results=[check_result(profile_gate(profile))],
    )
