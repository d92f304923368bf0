"""``draft_length_table``: the goodput-best table of one engine identity under its prior
(``tuning.gates.prior_for_table``, the rule ``tabletune table`` follows too)."""

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets import OWNERS
from tabletune_pipelines.errors import TableTuneError
from tabletune_pipelines.orchestration.metadata import check_result, image_metadata, json_md
from tabletune_pipelines.orchestration.partitions import engine_identity_partitions
from tabletune_pipelines.orchestration.resources import TuningPolicy, store_from
from tabletune_pipelines.tuning.derive import derive_table
from tabletune_pipelines.tuning.gates import (
    blocking_table_gates,
    cuda_graph_headroom_gate,
    engine_dependence_gate,
    fixed_launch_cells,
    k0_gate,
    prior_for_table,
)
from tabletune_pipelines.tuning.report import (
    accepted_work_text,
    boundaries_markdown,
    goodput_plot,
    identity_markdown,
    loss_text,
    table_markdown,
    within_noise_markdown,
)


class TableConfig(dg.Config):
    """Restrict the table's k values (default: every profiled k)."""

    allowed_ks: list[int] | None = None


@dg.asset(
    partitions_def=engine_identity_partitions,
    deps=[
        dg.AssetDep("step_time_profile"),
        dg.AssetDep("acceptance_prior", partition_mapping=dg.LastPartitionMapping()),
        dg.AssetDep("live_acceptance_counters", partition_mapping=dg.LastPartitionMapping()),
    ],
    kinds={"python", "duckdb"},
    group_name="tables",
    owners=OWNERS,
    description=(
        "num_speculative_tokens_per_batch_size for one engine identity: per batch size the k maximising goodput "
        "B·τ(k)/T(B,k), changing k only where the gain's lower confidence bound exceeds the 0.5% stickiness "
        "(policy.search_policy 'evidence'; tuning.derive.derive_table; docs/method.md, \"Table search\"), from this "
        "identity's step_time_profile and the latest sane acceptance prior of its model/drafter/method (a live, "
        "controller-fed prior wins within a week). Rows: DuckDB `draft_length_tables`."
    ),
    check_specs=[
        dg.AssetCheckSpec("valid_for_vllm", asset="draft_length_table", blocking=True,
                          description="vLLM's validation plus full coverage of 1..max_num_seqs and k <= K."),
        dg.AssetCheckSpec("predicted_loss_under_threshold", asset="draft_length_table", blocking=True,
                          description="Predicted worst loss vs the best fixed k per batch size < policy threshold "
                                      "(its lower confidence bound, when the profile has error estimates)."),
        dg.AssetCheckSpec("table_supported_by_evidence", asset="draft_length_table", blocking=True,
                          description="Every boundary's goodput gain has a lower confidence bound above the "
                                      "stickiness threshold; an unsupported table does not publish."),
        dg.AssetCheckSpec("engine_dependence_trap", asset="draft_length_table", blocking=False,
                          description="WARN if the table is slower somewhere than the best fixed k launched with "
                                      "K = k and no table (docs/method.md, \"Limitations\" 1)."),
        dg.AssetCheckSpec("k0_costs_vs_no_spec", asset="draft_length_table", blocking=False,
                          description="WARN if no speculation beats the table somewhere by a margin (k = 0 is not "
                                      "'off', docs/method.md, \"Limitations\" 3)."),
        dg.AssetCheckSpec("cuda_graph_headroom", asset="draft_length_table", blocking=True,
                          description="BLOCKS a table whose served steps (decode plus the workload's prefill) "
                                      "fall off vLLM's CUDA graphs where the profile never measured such a step "
                                      "(docs/method.md, \"What a served step costs\")."),
    ],
)
def draft_length_table(context: dg.AssetExecutionContext, config: TableConfig, duckdb: DuckDBResource,
                       policy: TuningPolicy):
    key = context.partition_key
    store = store_from(duckdb)
    if not store.has_identity(key):
        raise dg.Failure(description=f"engine identity {key} has no step_time_profile yet; materialize it first")
    try:
        profile = store.load_profile(key)
    except TableTuneError as exc:
        raise dg.Failure(description=f"{exc}; materialize step_time_profile for this partition first") from exc
    ident = profile.identity
    prior, skipped = prior_for_table(store, ident, policy.min_prior_drafts)
    for s in skipped:
        context.log.warning(f"skipping prior: {s}")
    if prior is None:
        raise dg.Failure(description=(
            f"no sane acceptance prior for {ident.model} / {ident.drafter} / {ident.method} at K = {ident.max_k}; "
            "materialize acceptance_prior for a week with logged prompts"
            + (f" (rejected: {'; '.join(skipped)})" if skipped else "")))
    try:
        tuned = derive_table(profile, prior, allowed_ks=config.allowed_ks, stickiness=policy.stickiness,
                             policy=policy.search_policy, confidence=policy.confidence)  # type: ignore[arg-type]
    except (TableTuneError, ValueError) as exc:
        raise dg.Failure(description=f"cannot derive a table for {key}: {exc}") from exc
    table = tuned.table
    for w in tuned.warnings:
        context.log.warning(w)
    table_id = store.write_table(table)
    reject = profile.reject_cells()
    no_spec = profile.no_spec_ms()
    gates = [
        *blocking_table_gates(table, policy.max_predicted_loss),
        engine_dependence_gate(table, fixed_launch_cells(store.profile_cells(key, "fixed_k")), policy.trap_margin,
                               reject),
        k0_gate(table, no_spec, reject.get(0, {}), policy.k0_margin),
        cuda_graph_headroom_gate(table, ident.cudagraph_mode),
    ]
    png = goodput_plot(table, no_spec, f"{key}\nprior {prior.prior_id}")
    yield dg.MaterializeResult(
        metadata={
            "table": dg.MetadataValue.md(table_markdown(table.ranges)),
            "table_json": dg.MetadataValue.json(table.as_vllm()),
            "table_id": table_id,
            "predicted_worst_loss": float(table.predicted_worst_loss),
            "predicted_worst_loss_lcb": float(table.predicted_worst_loss_lcb or 0.0),
            "predicted_worst_loss_ucb": float(table.predicted_worst_loss_ucb or 0.0),
            "predicted_loss": loss_text(table),
            "ranges": len(table.ranges),
            "one_batch_size_ranges": sum(1 for s, e, _ in table.ranges if s == e),
            "search_policy": table.search_policy,
            "boundaries": dg.MetadataValue.md(boundaries_markdown(table)),
            "k_within_noise": dg.MetadataValue.md(within_noise_markdown(table)),
            "cells_remeasured": table.cells_remeasured,
            "wall_timed_cells": table.wall_timed_cells,
            "has_error_estimates": table.has_error_estimates,
            "accepted_work_fit": dg.MetadataValue.md(accepted_work_text(table)),
            "warnings": dg.MetadataValue.json(list(tuned.warnings)),
            "identity_key": key,
            "identity": dg.MetadataValue.md(identity_markdown(ident)),
            "prior_id": prior.prior_id,
            "prior_week": prior.week or "",
            "prior_source": prior.source,
            "acceptance_rates": dg.MetadataValue.json(list(prior.rates)),
            "accepted_work_corrected": tuned.corrected,
            "dagster/row_count": len(table.ranges),
            "profile_cells": len(profile.cells),
            "speculative_config": json_md(table.speculative_config()),
            **image_metadata(png, f"{key}-{table_id}"),
        },
        check_results=[check_result(g) for g in gates],
    )
