"""``published_table``: the versioned, atomic export the controller loads; rollback job."""


import json

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import OWNERS, deployments_running, json_md, table_gates
from tabletune_pipelines.errors import StoreError
from tabletune_pipelines.documents import DraftLengthTable
from tabletune_pipelines.report import table_markdown
from tabletune_pipelines.partitions import engine_identity_partitions
from tabletune_pipelines.published import atomic_write_text
from tabletune_pipelines.resources import EngineResource, FleetResource, TuningPolicy, store_from


class PublishConfig(dg.Config):
    """``deployments``: publish only to these (default: every deployment running this identity now).
    ``force``: publish a new version even if the current one already holds the same table."""

    deployments: list[str] = []
    force: bool = False


def latest_table(store, key: str) -> DraftLengthTable | None:
    rows = store.query("SELECT table_json FROM draft_length_tables WHERE identity_key = ? "
                       "ORDER BY created_at DESC LIMIT 1", [key])
    return DraftLengthTable.from_json(rows[0][0]) if rows else None


def _base_config(dep, engine: EngineResource) -> dict:
    cfg = dep.base_speculative_config()
    if dep.embedded and "model" in cfg:  # a paste-able path, e.g. tiny:small -> the built draft folder
        cfg["model"] = engine.local_model_path(cfg["model"], drafter=True)
    return cfg


def write_speculative_config(path, doc: dict) -> None:
    atomic_write_text(path, json.dumps(doc["speculative_config"], indent=2, sort_keys=True) + "\n")


@dg.asset(
    partitions_def=engine_identity_partitions,
    deps=[dg.AssetDep("draft_length_table")],
    kinds={"json", "duckdb"},
    group_name="publishing",
    owners=OWNERS,
    description=(
        "The table each deployment running this engine identity loads: an atomic JSON file "
        "(tabletune_pipelines.published, schema tabletune.published_table) at the fleet's `published_table`, "
        "plus `<stem>.speculative-config.json` to paste into `--speculative-config` without the controller. "
        "Versioned in DuckDB `publications`; the job `rollback_published_table` re-publishes the previous version. "
        "Refuses a table that fails a blocking gate, so the last published table stays in place."
    ),
)
def published_table(context: dg.AssetExecutionContext, config: PublishConfig, duckdb: DuckDBResource,
                    fleet: FleetResource, engine: EngineResource, policy: TuningPolicy):
    key = context.partition_key
    store = store_from(duckdb)
    table = latest_table(store, key)
    if table is None:
        raise dg.Failure(description=f"no draft_length_table for {key}; materialize it first (nothing published)")
    failed = [g for g in table_gates(table, policy.max_predicted_loss) if not g.passed]
    if failed:
        raise dg.Failure(description=(
            f"refusing to publish table {table.table_id} of {key}: " + "; ".join(g.description for g in failed)
            + ". The previously published tables are untouched."))
    the_fleet = fleet.load()
    if config.deployments:
        targets, notes = [the_fleet.deployment(n) for n in config.deployments], []
    else:
        targets, notes = deployments_running(key, the_fleet, engine, context.log)
    if not targets:
        raise dg.Failure(description=(f"no deployment of {the_fleet.source} runs engine identity {key} now; nothing "
                                      "published" + (f" ({'; '.join(notes)})" if notes else "")))
    def base_config(dep):
        return _base_config(dep, engine)

    rows = ["| deployment | version | file | --speculative-config |", "|---|---|---|---|"]
    published, unchanged = [], []
    for dep in targets:
        pubs = store.publications(dep.name)
        if pubs and pubs[-1]["table_id"] == table.table_id and not config.force and dep.published_table.exists():
            unchanged.append(dep.name)
            rows.append(f"| {dep.name} | v{pubs[-1]['version']} (unchanged) | `{dep.published_table}` | "
                        f"`{dep.speculative_config_path}` |")
            continue
        doc = store.publish(dep.name, table, dep.published_table, base_speculative_config=base_config(dep),
                            note=f"identity {key}, prior {table.prior_id}")
        write_speculative_config(dep.speculative_config_path, doc)
        context.log.info(f"published {table.table_id} to {dep.name} as v{doc['version']}: {dep.published_table}")
        published.append({"deployment": dep.name, "version": doc["version"], "path": str(dep.published_table)})
        rows.append(f"| {dep.name} | v{doc['version']} | `{dep.published_table}` | `{dep.speculative_config_path}` |")
    return dg.MaterializeResult(
        metadata={
            "table": dg.MetadataValue.md(table_markdown(table.ranges)),
            "table_id": table.table_id,
            "identity_key": key,
            "prior_id": table.prior_id,
            "predicted_worst_loss": float(table.predicted_worst_loss),
            "publications": dg.MetadataValue.md("\n".join(rows)),
            "published": dg.MetadataValue.json(published),
            "unchanged": dg.MetadataValue.json(unchanged),
            "dagster/row_count": len(published),
            "speculative_config": json_md(table.speculative_config(base_config(targets[0]))),
            "rollback": dg.MetadataValue.md(
                "Roll back with the job `rollback_published_table` (config: `deployment`), e.g.\n\n"
                "`dg launch --job rollback_published_table --config-json "
                "'{\"ops\": {\"rollback_published_table_op\": {\"config\": {\"deployment\": \"<name>\"}}}}'`"),
            "skipped_deployments": dg.MetadataValue.json(notes),
        },
    )


class RollbackConfig(dg.Config):
    deployment: str


@dg.op(tags={"kind": "duckdb"}, description="Re-publish the version before the current one, as a new version.")
def rollback_published_table_op(context: dg.OpExecutionContext, config: RollbackConfig, duckdb: DuckDBResource,
                                fleet: FleetResource, engine: EngineResource):
    dep = fleet.load().deployment(config.deployment)
    store = store_from(duckdb)
    try:
        doc = store.rollback(dep.name, dep.published_table, base_speculative_config=_base_config(dep, engine))
    except StoreError as exc:
        raise dg.Failure(description=f"cannot roll back {dep.name}: {exc}") from exc
    write_speculative_config(dep.speculative_config_path, doc)
    identity_key = doc["table"]["identity_key"]
    context.log.info(f"{dep.name}: rolled back; now v{doc['version']} ({doc['table']['ranges']})")
    partitions = context.instance.get_dynamic_partitions(engine_identity_partitions.name)
    yield dg.AssetMaterialization(
        asset_key="published_table",
        partition=identity_key if identity_key in partitions else None,
        description=f"rollback of {dep.name}",
        metadata={"deployment": dep.name, "version": doc["version"], "path": str(dep.published_table),
                  "table": dg.MetadataValue.md(table_markdown(doc["table"]["ranges"])), "rollback": True},
    )
    yield dg.Output(doc["version"])


@dg.job(description="Roll a deployment's published table back to the previous version (as a new version).")
def rollback_published_table():
    rollback_published_table_op()
