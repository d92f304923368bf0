"""``published_table``: the versioned, atomic export the controller loads; the rollback op.
Both call ``tabletune_pipelines.tuning.publishing`` (``publish_table``, ``rollback_table``)."""

import dagster as dg
from dagster_duckdb import DuckDBResource

from tabletune_pipelines.defs import OWNERS
from tabletune_pipelines.orchestration.metadata import (
    describe_publication,
    describe_rollback,
    failures,
    served_check,
)
from tabletune_pipelines.orchestration.partitions import ENGINE_IDENTITY_PARTITIONS_NAME, engine_identity_partitions
from tabletune_pipelines.orchestration.resources import (
    EngineResource,
    FleetResource,
    TuningSettings,
    check_config,
    store_from,
)
from tabletune_pipelines.orchestration.tags import engine_tag_warning
from tabletune_pipelines.tuning.publishing import publish_table, rollback_table


class PublishConfig(dg.Config):
    """``deployments``: publish only to these (default: every deployment running this identity now).
    ``force``: publish a new version even if the current one already holds the same table."""

    deployments: list[str] = []
    force: bool = False


@dg.asset(
    partitions_def=engine_identity_partitions,
    deps=[dg.AssetDep("draft_length_table")],
    kinds={"json", "duckdb"},
    group_name="publishing",
    owners=OWNERS,
    description=(
        "The table each deployment running this engine identity loads: an atomic JSON file "
        "(tabletune_pipelines.formats.published, schema tabletune.published_table) at the fleet's `published_table`, "
        "plus `<stem>.speculative-config.json` to paste into `--speculative-config` without the controller. "
        "Versioned in DuckDB `publications`; the job `rollback_published_table` re-publishes the previous version. "
        "Refuses a table that fails a blocking gate, so the last published table stays in place. Before it "
        "publishes, the table is verified by served goodput against every fixed k in one launch "
        "(check served_goodput_verified; EngineResource served_verification)."
    ),
    check_specs=[
        dg.AssetCheckSpec("served_goodput_verified", asset="published_table", blocking=True,
                          description="Served goodput in one launch, closed loop at ~3 loads up to max_num_seqs, the "
                                      "table against every fixed k in rotating rounds until each load is decided: "
                                      "passes when at every load the table's loss against the best fixed k is below "
                                      "3% with 97.5% confidence; fails when a fixed k beats it by more than that "
                                      "(nothing is published, the previous table stays); otherwise the table is "
                                      "published UNVERIFIED, shown as a warning with its figures "
                                      "(docs/evaluation.md, \"Served verification\")."),
    ],
)
def published_table(context: dg.AssetExecutionContext, config: PublishConfig, duckdb: DuckDBResource,
                    fleet: FleetResource, engine: EngineResource, policy: TuningSettings):
    with failures():
        check_config(config, fleet, engine, policy)
        publication = publish_table(store_from(duckdb), fleet.load(), context.partition_key, engine,
                                    deployments=config.deployments, force=config.force,
                                    max_predicted_loss=policy.max_predicted_loss, log=context.log)
    if publication.refusal:  # the served verification failed: its check, then nothing published
        yield served_check(publication)
        raise dg.Failure(description=publication.refusal)
    yield describe_publication(publication)


class RollbackConfig(dg.Config):
    """The deployment whose published table goes back one version."""

    deployment: str


@dg.op(tags={"kind": "duckdb"}, description="Re-publish the version before the current one, as a new version.")
def rollback_published_table_op(context: dg.OpExecutionContext, config: RollbackConfig, duckdb: DuckDBResource,
                                fleet: FleetResource, engine: EngineResource):
    with failures():
        check_config(config, fleet, engine)
        done = rollback_table(store_from(duckdb), fleet.load, config.deployment, engine, log=context.log)
    if warning := engine_tag_warning(context.run.tags, done.deployment, done.group):
        context.log.warning(warning)
    yield describe_rollback(done, context.instance.get_dynamic_partitions(ENGINE_IDENTITY_PARTITIONS_NAME))
    yield dg.Output(done.version)
