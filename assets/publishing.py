"""``published_table``: the versioned, atomic export the controller loads; the rollback op."""

from typing import Any

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets import OWNERS
from tabletune_pipelines.deployments import deployments_running, serving_speculative_config
from tabletune_pipelines.errors import TableTuneError
from tabletune_pipelines.fleet import Deployment
from tabletune_pipelines.identity_match import identity_mismatches
from tabletune_pipelines.orchestration.metadata import check_result, image_metadata, json_md
from tabletune_pipelines.orchestration.partitions import engine_identity_partitions
from tabletune_pipelines.orchestration.resources import EngineResource, FleetResource, TuningPolicy, store_from
from tabletune_pipelines.orchestration.tags import ENGINE_TAG
from tabletune_pipelines.published import check_publish_targets, controller_fields, served_plot_path
from tabletune_pipelines.tuning.gates import Gate, blocking_table_gates, served_gate
from tabletune_pipelines.tuning.report import (
    boundaries_markdown,
    loss_text,
    served_goodput_plot,
    table_markdown,
    within_noise_markdown,
    write_plot,
)

ROLLBACK_HOWTO = (
    "Roll back with the job `rollback_published_table` (config: `deployment`), e.g.\n\n"
    "`dg launch --job rollback_published_table --config-json "
    "'{\"ops\": {\"rollback_published_table_op\": {\"config\": {\"deployment\": \"<name>\"}}}}'`\n\n"
    "In a fleet of several engine groups, also give the run the deployment's engine tag, so the run queue "
    "serialises it with that engine's runs: the launchpad's tags, or `dagster job launch -j "
    "rollback_published_table --tags '{\"tabletune/engine\": \"<engine group>\"}' ...`.")


class PublishConfig(dg.Config):
    """``deployments``: publish only to these (default: every deployment running this identity now).
    ``force``: publish a new version even if the current one already holds the same table."""

    deployments: list[str] = []
    force: bool = False


def publication_kwargs(dep: Deployment, engine: EngineResource, table=None, store=None) -> dict[str, Any]:
    """Keyword arguments of ``store.publish`` / ``store.rollback`` for one deployment: the base
    ``--speculative-config`` and further fields of the published document (``document_fields``:
    keyword arguments of ``published.published_document``; add new document fields here). With
    ``table`` and ``store``, the controller also gets the table's engine identity and prior."""
    identity = prior = None
    if table is not None and store is not None:
        identity = store.find_identity(table.identity_key)
        try:
            prior = store.acceptance_prior(table.prior_id)
        except TableTuneError:
            prior = None
    return {"base_speculative_config": serving_speculative_config(dep, engine.local_model_path),
            "document_fields": controller_fields(identity=identity, prior=prior, controller=dep.controller,
                                                 live_counters=dep.live_counters)}


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
        "Refuses a table that fails a blocking gate, so the last published table stays in place. Before it "
        "publishes, the table is verified by served goodput against every fixed k in one launch "
        "(check served_goodput_verified; EngineResource served_verification)."
    ),
    check_specs=[
        dg.AssetCheckSpec("served_goodput_verified", asset="published_table", blocking=True,
                          description="Served goodput in one launch, closed loop at ~3 loads up to max_num_seqs, the "
                                      "table against every fixed k in rotating rounds: passes only if at every load "
                                      "the table is within the paired noise (or 3%) of the best fixed k "
                                      "(docs/evaluation.md, \"Served verification\"). A failure publishes nothing: "
                                      "the previous table stays."),
    ],
)
def published_table(context: dg.AssetExecutionContext, config: PublishConfig, duckdb: DuckDBResource,
                    fleet: FleetResource, engine: EngineResource, policy: TuningPolicy):
    key = context.partition_key
    store = store_from(duckdb)
    table = store.latest_table(key)
    if table is None:
        raise dg.Failure(description=f"no draft_length_table for {key}; materialize it first (nothing published)")
    # The blocking gates again: a table that failed them is never published, whichever run tries.
    failed = [g for g in blocking_table_gates(table, policy.max_predicted_loss) if not g.passed]
    if failed:
        raise dg.Failure(description=(
            f"refusing to publish table {table.table_id} of {key}: " + "; ".join(g.description for g in failed)
            + ". The previously published tables are untouched."))
    the_fleet = fleet.load()
    if config.deployments:
        targets, notes = [the_fleet.deployment(n) for n in config.deployments], []
    else:
        targets, notes = deployments_running(key, the_fleet, engine.current_identity)
        for n in notes:
            context.log.warning(f"not publishing to {n}")
    if not targets:
        raise dg.Failure(description=(f"no deployment of {the_fleet.source} runs engine identity {key} now; nothing "
                                      "published" + (f" ({'; '.join(notes)})" if notes else "")))
    rows = ["| deployment | version | file | --speculative-config |", "|---|---|---|---|"]
    published, unchanged = [], []
    to_publish = []
    for dep in targets:
        pubs = store.publications(dep.name)
        if pubs and pubs[-1]["table_id"] == table.table_id and not config.force and dep.published_table.exists():
            unchanged.append(dep.name)
            rows.append(f"| {dep.name} | v{pubs[-1]['version']} (unchanged) | `{dep.published_table}` | "
                        f"`{dep.speculative_config_path}` |")
        else:
            to_publish.append(dep)
    for dep in to_publish:  # a target TableTune may not replace is refused before the verification's launch
        check_publish_targets(dep.published_table, dep.name)
    # Served verification (blocking): the table against every fixed k in one launch, before anything is written.
    gate, section, png, plot_md = _served_verification(context, store, engine, table, key, to_publish)
    if not gate.passed:
        yield _check(gate, plot_md)
        current = ", ".join(f"{d.name} v{n}" if (n := store.latest_publication_version(d.name)) else
                            f"{d.name}: none yet" for d in to_publish)
        raise dg.Failure(description=(
            f"refusing to publish table {table.table_id} of {key}: {gate.description}. Nothing was published; the "
            f"previously published tables stay ({current})."))
    for dep in to_publish:
        fields = publication_kwargs(dep, engine, table, store)
        if section is not None:
            plot_name = _write_served_plot(context, dep, png)
            fields["document_fields"] = {**fields["document_fields"],
                                         "served_verification": {**section, "plot": plot_name}}
        doc = store.publish(dep.name, table, dep.published_table, note=f"identity {key}, prior {table.prior_id}",
                            **fields)  # the companion too, under one lock
        context.log.info(f"published {table.table_id} to {dep.name} as v{doc['version']}: {dep.published_table}")
        published.append({"deployment": dep.name, "version": doc["version"], "path": str(dep.published_table)})
        rows.append(f"| {dep.name} | v{doc['version']} | `{dep.published_table}` | `{dep.speculative_config_path}` |")
    yield dg.MaterializeResult(
        check_results=[_check(gate, plot_md)],
        metadata={
            "table": dg.MetadataValue.md(table_markdown(table.ranges)),
            "table_id": table.table_id,
            "identity_key": key,
            "prior_id": table.prior_id,
            "predicted_worst_loss": float(table.predicted_worst_loss),
            "predicted_worst_loss_lcb": float(table.predicted_worst_loss_lcb or 0.0),
            "predicted_worst_loss_ucb": float(table.predicted_worst_loss_ucb or 0.0),
            "predicted_loss": loss_text(table),
            "ranges": len(table.ranges),
            "boundaries": dg.MetadataValue.md(boundaries_markdown(table)),
            "k_within_noise": dg.MetadataValue.md(within_noise_markdown(table)),
            "cells_remeasured": table.cells_remeasured,
            "publications": dg.MetadataValue.md("\n".join(rows)),
            "published": dg.MetadataValue.json(published),
            "unchanged": dg.MetadataValue.json(unchanged),
            "dagster/row_count": len(published),
            "speculative_config": json_md(table.speculative_config(
                serving_speculative_config(targets[0], engine.local_model_path))),
            "rollback": dg.MetadataValue.md(ROLLBACK_HOWTO),
            "skipped_deployments": dg.MetadataValue.json(notes),
            "served_verification": dg.MetadataValue.text(gate.description),
            **({"served_goodput": dg.MetadataValue.md(gate.comparison)} if gate.comparison else {}),
            **plot_md,
        },
    )


def _check(gate: Gate, extra: dict) -> dg.AssetCheckResult:
    """The gate's check result with the plot's metadata."""
    r = check_result(gate)
    return dg.AssetCheckResult(check_name=r.check_name, passed=r.passed, severity=r.severity,
                               metadata={**r.metadata, **extra}, description=r.description)


def _served_verification(context: dg.AssetExecutionContext, store, engine: EngineResource, table, key: str,
                         to_publish: list[Deployment]) -> tuple[Gate, dict | None, bytes | None, dict]:
    """The check ``served_goodput_verified``: its gate, the published file's section, the plot and its metadata."""
    if not to_publish:
        return served_gate(None, disabled_reason=f"every target already holds table {table.table_id}; nothing new "
                                                 "to publish"), None, None, {}
    try:
        opts = engine.served_verification_options()
    except TableTuneError as exc:
        raise dg.Failure(description=f"EngineResource served_verification: {exc} (nothing published)") from exc
    if not opts.enabled:
        return served_gate(None, disabled_reason="served verification is off (EngineResource served_verification: "
                                                 "{enabled: false}); the table publishes on its predicted figures "
                                                 "alone"), None, None, {}
    identity = store.find_identity(key)
    if identity is None:
        raise dg.Failure(description=f"engine identity {key} is not in the store; cannot verify table {table.table_id}")
    try:
        prior = store.acceptance_prior(table.prior_id)
    except TableTuneError:
        prior = None
    try:
        result = engine.verify_served(identity, to_publish[0], table, prior, context.log)
    except TableTuneError as exc:
        gate = Gate("served_goodput_verified", False,
                    f"the served verification could not run ({exc}); set EngineResource served_verification "
                    "{enabled: false} to publish without it", {"status": "error"})
        return gate, None, None, {}
    gate = served_gate(result)
    png = served_goodput_plot(result, f"{key}\ntable {[list(r) for r in table.ranges]}")
    shown = image_metadata(png, f"{key}-{table.table_id}-served")
    plot_md = {"served_goodput_plot": dg.MetadataValue.md(shown["goodput_plot"].value.replace(
                   "goodput vs batch size", "served goodput vs load", 1)),
               "served_goodput_plot_path": shown["goodput_plot_path"]}
    return gate, result.to_dict(), png, plot_md


def _write_served_plot(context: dg.AssetExecutionContext, dep: Deployment, png: bytes | None) -> str | None:
    """The plot beside the published table (``<stem>.served-verification.png``); its file name, or None."""
    if png is None:
        return None
    path = served_plot_path(dep.published_table)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # publishing creates it too
        write_plot(path, png)
    except (TableTuneError, OSError) as exc:
        context.log.warning(f"{dep.name}: served verification plot not written ({exc})")
        return None
    return path.name


class RollbackConfig(dg.Config):
    """The deployment whose published table goes back one version."""

    deployment: str


@dg.op(tags={"kind": "duckdb"}, description="Re-publish the version before the current one, as a new version.")
def rollback_published_table_op(context: dg.OpExecutionContext, config: RollbackConfig, duckdb: DuckDBResource,
                                fleet: FleetResource, engine: EngineResource):
    store = store_from(duckdb)
    try:
        dep = fleet.load().deployment(config.deployment)
        # The old version's identity and prior come back with it (store.rollback); the deployment's
        # controller settings and live_counters are today's.
        doc = store.rollback(dep.name, dep.published_table, **publication_kwargs(dep, engine))
    except TableTuneError as exc:
        raise dg.Failure(description=f"cannot roll back {config.deployment}: {exc}") from exc
    identity_key = doc["table"]["identity_key"]
    context.log.info(f"{dep.name}: rolled back; now v{doc['version']} ({doc['table']['ranges']})")
    tag = context.run.tags.get(ENGINE_TAG)
    if tag != dep.group:
        context.log.warning(f"this run's {ENGINE_TAG} tag is {tag!r}, not {dep.name}'s engine group {dep.group!r}: the "
                            "run queue did not serialise it with that engine's runs (the publication lock still "
                            "kept the store and the file in step)")
    try:
        running = engine.current_identity(dep)
    except TableTuneError as exc:
        context.log.warning(f"{dep.name}: could not learn the engine it runs now ({exc}); v{doc['version']} was made "
                            f"for {identity_key}")
    else:
        differ = identity_mismatches(doc["identity"], running.to_dict(), running_name=f"{dep.name}'s now")
        if differ:
            context.log.warning(f"{dep.name}: v{doc['version']} was made for engine {identity_key}, not the one it "
                                f"runs now ({'; '.join(differ)}): its controller refuses this file and serves on the "
                                "engine's own table until a table of the current engine is published")
    partitions = context.instance.get_dynamic_partitions(engine_identity_partitions.name)
    yield dg.AssetMaterialization(
        asset_key="published_table",
        partition=identity_key if identity_key in partitions else None,
        description=f"rollback of {dep.name}",
        metadata={"deployment": dep.name, "version": doc["version"], "path": str(dep.published_table),
                  "identity_key": identity_key, "prior_id": (doc.get("prior") or {}).get("prior_id") or "",
                  "table": dg.MetadataValue.md(table_markdown(doc["table"]["ranges"])), "rollback": True},
    )
    yield dg.Output(doc["version"])
