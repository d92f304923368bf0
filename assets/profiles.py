"""``step_time_profile``: T(B, k) of one engine identity, measured on the real serving path."""


import dagster as dg
import numpy as np
from dagster_duckdb import DuckDBResource

from assets.common import OWNERS, deployment_for_identity, identity_markdown, profile_gate, resolve_identity
from tabletune_pipelines.errors import TableTuneError
from tabletune_pipelines.partitions import engine_identity_partitions
from tabletune_pipelines.resources import EngineResource, FleetResource, store_from


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
        "vLLM launch with every draft rejected (DESIGN §2). Rows: DuckDB table `step_time_cells` "
        "(`WHERE identity_key = '<partition>'`). Cells are written as they are measured; a re-run resumes."
    ),
    check_specs=[dg.AssetCheckSpec("profile_complete", asset="step_time_profile", blocking=True,
                                   description="Every k in 0..K measured at the same batch sizes, 1..max_num_seqs.")],
)
def step_time_profile(context: dg.AssetExecutionContext, config: ProfileConfig, duckdb: DuckDBResource,
                      fleet: FleetResource, engine: EngineResource):
    key = context.partition_key
    store = store_from(duckdb)
    the_fleet = fleet.load()
    identity = resolve_identity(key, identity_json=config.identity_json, fleet=the_fleet, engine=engine,
                                store=store, log=context.log)
    dep = deployment_for_identity(the_fleet, identity, config.deployment)
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
    gate = profile_gate(profile)
    spreads = [c.spread for c in profile.cells]
    reject = profile.reject_cells()
    bs = sorted({b for v in reject.values() for b in v})
    head = "| B | " + " | ".join(f"k={k}" for k in sorted(reject)) + " | no-spec |"
    rows = [head, "|---" * (len(reject) + 2) + "|"]
    ns = profile.no_spec_ms()
    for b in bs:
        rows.append(f"| {b} | " + " | ".join(f"{reject[k].get(b, float('nan')):.2f}" for k in sorted(reject))
                    + f" | {ns.get(b, float('nan')):.2f} |")
    yield dg.MaterializeResult(
        metadata={
            "identity": dg.MetadataValue.md(identity_markdown(identity)),
            "identity_key": key,
            "deployment": dep.name if dep else "",
            "dagster/row_count": len(profile.cells),
            "cells_measured_this_run": len(profile.cells) - before,
            "step_ms": dg.MetadataValue.md("Step time, ms (median of repetitions, every draft rejected)\n\n"
                                           + "\n".join(rows)),
            "median_spread": float(np.median(spreads)) if spreads else 0.0,
            "max_spread": float(max(spreads)) if spreads else 0.0,
            "mode": profile.mode,
        },
        check_results=[gate.result()],
    )
