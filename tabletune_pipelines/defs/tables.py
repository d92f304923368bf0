"""``draft_length_table``: the goodput-best table of one engine identity under its prior, by batch
size and, where the profile holds several context levels, by context (``tuning.build.build_table``
derives through ``tuning.derive_context``; the prior is ``tuning.gates.prior_for_table``'s, the
rule ``tabletune table`` follows too)."""

from typing import ClassVar

import dagster as dg
from dagster_duckdb import DuckDBResource

from tabletune_pipelines.defs import OWNERS
from tabletune_pipelines.options import Bound
from tabletune_pipelines.orchestration.metadata import describe_table, failures
from tabletune_pipelines.orchestration.partitions import engine_identity_partitions
from tabletune_pipelines.orchestration.resources import TuningSettings, check_config, store_from
from tabletune_pipelines.tuning.build import build_table
from tabletune_pipelines.tuning.derive import DeriveOptions


class TableConfig(dg.Config):
    """Restrict the table's k values (default: every profiled k)."""

    allowed_ks: list[int] | None = None

    BOUNDS: ClassVar[dict[str, Bound]] = {"allowed_ks": DeriveOptions.BOUNDS["allowed_ks"]}


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
        "controller-fed prior wins within a week). With several context levels, one search per level, adjacent "
        "context buckets whose k agree merged (tuning.derive_context); the plot is then a k heat-map over (B, ctx) "
        "with goodput against B per bucket. Rows: DuckDB `draft_length_tables`."
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
                       policy: TuningSettings):
    with failures():
        check_config(config, policy)
        built = build_table(store_from(duckdb), context.partition_key, policy, allowed_ks=config.allowed_ks,
                            log=context.log)
    yield describe_table(built)
